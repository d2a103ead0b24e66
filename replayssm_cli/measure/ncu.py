"""Nsight Compute as the check on the cost model: measured DRAM and L2 bytes, FLOPs and time of our kernels."""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

# What `measure` asks ncu for; a run without these is not a measurement.
CORE_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "gpu__time_duration.sum",
)

# The instruction counters behind the SpeedOfLight roofline sections (FP64, FP32, FP16 pipes).
PRECISIONS = {"fp64": "d", "fp32": "f", "fp16": "h"}
# FLOPs per thread instruction: an FMA is two; half-precision instructions are packed pairs (HADD2, HFMA2).
FLOP_WEIGHTS = {
    "fp64": {"add": 1, "mul": 1, "fma": 2},
    "fp32": {"add": 1, "mul": 1, "fma": 2},
    "fp16": {"add": 2, "mul": 2, "fma": 4},
}
# Tensor-core work, already counted in operations (two per multiply-add); the src_* paths do not overlap.
TENSOR_PATHS = (
    "sm__ops_path_tensor_src_fp64",
    "sm__ops_path_tensor_src_tf32_dst_fp32",
    "sm__ops_path_tensor_src_bf16_dst_fp32",
    "sm__ops_path_tensor_src_fp16",
    "sm__ops_path_tensor_src_fp8_sparsity_off",
    "sm__ops_path_tensor_src_fp8_sparsity_on",
)
L2_WRITE_SECTORS = "lts__t_sectors_srcunit_tex_op_write.sum"
SECTOR_BYTES = 32

FLOP_METRICS = tuple(
    f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in PRECISIONS.values() for op in ("add", "mul", "fma")
) + tuple(f"{path}.sum" for path in TENSOR_PATHS)
# Asked for as well; those this GPU's ncu does not know are dropped and the run repeated without them.
OPTIONAL_METRICS = FLOP_METRICS + (L2_WRITE_SECTORS,)


@dataclass(frozen=True)
class KernelKind:
    """What one of our Triton kernels is: its name (a substring of ncu's kernel name) and what it serves."""

    name: str
    op: str
    variants: tuple[str, ...]
    phase: str | None  # None: the kernel serves every phase (a runtime branch decides flush or not)


# The mapping from ncu kernel names to our kernels: the launched @triton.jit functions of kernels/mamba2/*.py and
# kernels/gdn/*.py (ncu names a Triton kernel by its function name). A kernel no decode step launches (materialize,
# the snapshot copy of an accept that serving engines do as a pointer move) serves no variant.
# tests/test_ncu.py checks that every launched kernel is listed here and that every entry still exists.
KERNELS: tuple[KernelKind, ...] = (
    KernelKind("mamba2_decode_kernel", "mamba2", ("conventional",), None),
    KernelKind("mamba2_replay_kernel", "mamba2", ("replay", "split"), None),
    KernelKind("mamba2_flush_kernel", "mamba2", ("replay", "split"), None),
    KernelKind("mamba2_heads_kernel", "mamba2", ("replay", "split"), None),
    KernelKind("mamba2_decode_multi_kernel", "mamba2", ("spec-conventional",), None),
    KernelKind("mamba2_verify_bc_kernel", "mamba2", ("spec-replay",), None),
    KernelKind("mamba2_verify_kernel", "mamba2", ("spec-replay",), None),
    KernelKind("mamba2_accept_kernel", "mamba2", ("spec-replay",), None),
    KernelKind("mamba2_accept_snapshot_kernel", "mamba2", (), None),
    KernelKind("mamba2_materialize_kernel", "mamba2", (), None),
    KernelKind("_decode_kernel", "gdn", ("conventional",), None),
    KernelKind("_replay_kernel", "gdn", ("replay", "split"), None),
    KernelKind("_flush_kernel", "gdn", ("replay", "split"), None),
    KernelKind("_decode_multi_kernel", "gdn", ("spec-conventional",), None),
    KernelKind("_verify_list_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_verify_gram_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_verify_fold_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_verify_weights_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_verify_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_accept_kernel", "gdn", ("spec-replay",), None),
    KernelKind("_accept_snapshot_kernel", "gdn", (), None),
)

STEP_VARIANTS = ("conventional", "replay", "split", "spec-conventional", "spec-replay")


def kernels_for(op: str, variant: str) -> tuple[KernelKind, ...]:
    """The kernels one decode step of (op, variant) launches."""
    return tuple(k for k in KERNELS if k.op == op and variant in k.variants)


def match_kernel(name: str, op: str | None = None, variant: str | None = None) -> KernelKind | None:
    """Our kernel that an ncu kernel name refers to, or None; the longest matching name wins."""
    found = [
        k
        for k in KERNELS
        if k.name in name and (op is None or k.op == op) and (variant is None or variant in k.variants)
    ]
    return max(found, key=lambda k: len(k.name)) if found else None


def kernel_regex(kinds: Iterable[KernelKind]) -> str:
    """An ncu `-k regex:` filter that takes the kernels whose names contain one of these (as match_kernel does)."""
    names = sorted({k.name for k in kinds})
    if not names:
        raise ValueError("no kernels to profile: the kernel table has no entry for this op and variant")
    return "regex:" + "|".join(re.escape(n) for n in names)


_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?$")
_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME_NS = {
    "ns": 1.0, "nsecond": 1.0, "nanosecond": 1.0,
    "us": 1e3, "usecond": 1e3, "microsecond": 1e3,
    "ms": 1e6, "msecond": 1e6, "millisecond": 1e6,
    "s": 1e9, "second": 1e9, "sec": 1e9,
}
_COUNTS = ("byte", "inst", "cycle", "flop", "sector", "request", "warp", "thread", "block", "register", "hz")


def _count_unit(unit: str) -> tuple[float, str] | None:
    for base in _COUNTS:
        if unit.lower().endswith(base):
            prefix = unit[: len(unit) - len(base)]
            if prefix in _BINARY:
                return _BINARY[prefix], base
            if prefix in _SI:
                return _SI[prefix], base
    return None


def unit_scale(unit: str) -> tuple[float, str]:
    """The factor that takes a value in `unit` to our base unit, and that base unit's name.

    Bytes and other counts lose their prefix (Kbyte -> byte, decimal; KiB-style prefixes binary), times go to
    ns, rates go to per second (Gbyte/second -> byte/second, cycle/nsecond -> cycle/second), frequencies to hz.
    An unknown unit is kept as it is with factor 1.
    """
    unit = unit.strip()
    if not unit:
        return 1.0, ""
    if "/" in unit:
        num, _, den = unit.partition("/")
        if den in _TIME_NS:
            top = unit_scale(num)
            return top[0] * 1e9 / _TIME_NS[den], f"{top[1]}/second"
        top = unit_scale(num)
        return top[0], f"{top[1]}/{den}"
    if unit in _TIME_NS:
        return _TIME_NS[unit], "ns"
    if unit.endswith("B") and unit[:-1] in {**_SI, **_BINARY}:
        unit = unit[:-1] + "byte"
    count = _count_unit(unit)
    if count is not None:
        return count
    return 1.0, unit


def parse_value(cell: str) -> float | str | None:
    """One cell of ncu's raw page: a number without its thousands separators, None for n/a, else the text."""
    text = cell.strip()
    if not text or "n/a" in text.lower():
        return None
    if _NUMBER.match(text):
        return float(text.replace(",", ""))
    return text


_IDENTITY = {
    "ID": "id",
    "Process ID": "pid",
    "Process Name": "process",
    "Kernel Name": "kernel",
    "Block Size": "block",
    "Grid Size": "grid",
    "Stream": "stream",
    "Device": "device",
}


def parse_raw_csv(text: str) -> list[dict[str, Any]]:
    """Parse `ncu --csv --page raw` output into one dict per profiled kernel launch.

    The text may carry ncu's own lines (==PROF==, ==WARNING==) and the program's output around the table. The
    table has two header rows (metric names, then units) and one row per launch; numbers may carry thousands
    separators, cells may read "(!) n/a". Each dict has "id", "kernel", "block", "grid", "process", "pid",
    "stream", "device", "metrics" (name -> value in base units: bytes, ns, per-second rates, counts; text where
    the cell is not a number, None where n/a) and "units" (name -> base unit). A text with no table gives [].
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    table = [line for line in lines[start:] if line.startswith('"')]
    rows = list(csv.reader(table))
    if len(rows) < 2:
        return []
    names, units = rows[0], rows[1]
    scales = [unit_scale(u) for u in units]
    records = []
    for row in rows[2:]:
        if len(row) != len(names):
            continue
        record: dict[str, Any] = {key: None for key in _IDENTITY.values()}
        metrics: dict[str, Any] = {}
        base_units: dict[str, str] = {}
        for name, cell, (factor, base) in zip(names, row, scales):
            if name in _IDENTITY:
                record[_IDENTITY[name]] = cell.strip()
                continue
            value = parse_value(cell)
            metrics[name] = value * factor if isinstance(value, float) else value
            base_units[name] = base
        for key in ("id", "pid", "stream", "device"):
            value = parse_value(record[key] or "")
            record[key] = int(value) if isinstance(value, float) else value
        record["metrics"] = metrics
        record["units"] = base_units
        records.append(record)
    return records


def _number(metrics: dict[str, Any], name: str) -> float | None:
    value = metrics.get(name)
    return value if isinstance(value, float) else None


def _count(metrics: dict[str, Any], counter: str) -> float | None:
    """A counter's total: its `.sum`, or its `.sum.per_cycle_elapsed` rate times the elapsed cycles of its unit."""
    for unit in ("smsp", "sm"):
        name = f"{unit}__{counter}"
        total = _number(metrics, f"{name}.sum")
        if total is not None:
            return total
        rate = _number(metrics, f"{name}.sum.per_cycle_elapsed")
        cycles = _number(metrics, f"{unit}__cycles_elapsed.avg")
        if rate is not None and cycles is not None:
            return rate * cycles
    return None


def kernel_flops(metrics: dict[str, Any]) -> dict[str, float | None]:
    """FLOPs of one launch per precision (fp64, fp32, fp16 from the SASS counters; tensor from the tensor paths).

    Per precision: add + mul + 2·fma (fp16: twice that, packed pairs), the formula of ncu's SpeedOfLight
    roofline sections. A precision whose counters are absent is None; "total" sums those present (None if none).
    """
    out: dict[str, float | None] = {}
    for precision, letter in PRECISIONS.items():
        parts = [
            (_count(metrics, f"sass_thread_inst_executed_op_{letter}{op}_pred_on"), weight)
            for op, weight in FLOP_WEIGHTS[precision].items()
        ]
        present = [(c, w) for c, w in parts if c is not None]
        out[precision] = sum(c * w for c, w in present) if present else None
    tensor = [_number(metrics, f"{path}.sum") for path in TENSOR_PATHS]
    tensor = [t for t in tensor if t is not None]
    out["tensor"] = sum(tensor) if tensor else None
    present = [v for v in out.values() if v is not None]
    out["total"] = sum(present) if present else None
    return out


def kernel_totals(record: dict[str, Any]) -> dict[str, float | None]:
    """What one launch moved and did, in bytes, FLOPs and ns; None where the run did not collect it.

    dram_bytes is read + written, or ncu's dram__bytes (or its per-second rate times the duration) when the
    read/write split was not collected. l2_write_bytes counts the sectors SMs wrote into L2: unlike
    dram_write, it includes writes still dirty in L2 when the kernel ended.
    """
    m = record["metrics"]
    ns = _number(m, "gpu__time_duration.sum")
    read = _number(m, "dram__bytes_read.sum")
    write = _number(m, "dram__bytes_write.sum")
    if read is not None and write is not None:
        dram = read + write
    else:
        dram = _number(m, "dram__bytes.sum")
        rate = _number(m, "dram__bytes.sum.per_second")
        if dram is None and rate is not None and ns is not None:
            dram = rate * ns * 1e-9
    l2 = _number(m, "lts__t_bytes.sum")
    sectors = _number(m, L2_WRITE_SECTORS)
    flops = kernel_flops(m)
    return {
        "dram_read": read,
        "dram_write": write,
        "dram_bytes": dram,
        "l2_bytes": l2,
        "l2_write_bytes": sectors * SECTOR_BYTES if sectors is not None else None,
        "flops": flops["total"],
        "flops_fp32": flops["fp32"],
        "flops_tensor": flops["tensor"],
        "ns": ns,
    }


def ncu_candidates() -> list[str]:
    """Where ncu may live: PATH, then the newest /opt/nvidia/nsight-compute/*/ncu, then /usr/local/cuda/bin/ncu."""
    found = []
    on_path = shutil.which("ncu")
    if on_path:
        found.append(on_path)

    def version_key(path: str) -> list[int]:
        return [int(x) for x in re.findall(r"\d+", Path(path).parent.name)]

    found += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), key=version_key, reverse=True)
    found.append("/usr/local/cuda/bin/ncu")
    return [p for p in found if os.path.isfile(p) and os.access(p, os.X_OK)]


def ncu_binary() -> str | None:
    """The ncu executable to use, or None."""
    found = ncu_candidates()
    return found[0] if found else None


_PROBE = (
    "import torch; x = torch.rand(1 << 22, device='cuda'); y = x * 2.0; torch.cuda.synchronize()"
)


def _ncu_problem(output: str) -> str | None:
    """The one-line reason an ncu run failed, from its output, or None if it names none."""
    if "ERR_NVGPUCTRPERM" in output:
        return (
            "ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): run as root or load the "
            "driver with NVreg_RestrictProfilingToAdminUsers=0"
        )
    errors = [line.strip() for line in output.splitlines() if line.startswith("==ERROR==")]
    if errors:
        return errors[0].removeprefix("==ERROR==").strip()
    if "No kernels were profiled" in output:
        return "ncu profiled no kernel"
    return None


@lru_cache(maxsize=4)
def _probe(ncu: str, python: str, timeout_s: float) -> tuple[bool, str]:
    cmd = [
        ncu, "--clock-control", "none", "--target-processes", "all", "--csv", "--page", "raw",
        "--metrics", "dram__bytes_read.sum", python, "-c", _PROBE,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"an ncu probe run took over {timeout_s:.0f} s"
    except OSError as exc:
        return False, f"ncu at {ncu} does not run ({exc.strerror or exc})"
    output = done.stdout + "\n" + done.stderr
    records = parse_raw_csv(done.stdout)
    if any(isinstance(r["metrics"].get("dram__bytes_read.sum"), float) for r in records):
        return True, f"ncu at {ncu} reads the GPU's counters"
    problem = _ncu_problem(output) or f"ncu's probe run exited {done.returncode} with no counter values"
    return False, problem


def ncu_available(ncu: str | None = None, *, timeout_s: float = 180.0) -> tuple[bool, str]:
    """Whether Nsight Compute is installed and can read this GPU's counters, and why not.

    Looks for the binary (see ncu_candidates) and profiles one tiny kernel with the clocks left alone; the
    answer is cached for the process.
    """
    binary = ncu or ncu_binary()
    if binary is None:
        return False, "ncu not found (looked on PATH, in /opt/nvidia/nsight-compute/*/ and /usr/local/cuda/bin/)"
    return _probe(binary, sys.executable, timeout_s)


def _json_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


def _spec_field(spec: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        value = spec.get(name)
        if value is not None:
            return value.value if hasattr(value, "value") else value
    return default


def profiled_steps(spec: dict[str, Any]) -> tuple[int, int]:
    """(warm-up steps, profiled steps) for one configuration.

    ReplaySSM's whole-window figure needs a whole window of steps; a single phase or conventional decode needs
    one. Warm-up is a whole number of windows so that a configuration set at one fill is at that fill again.
    """
    variant = _spec_field(spec, "variant", default="conventional")
    phase = _spec_field(spec, "phase", default="avg")
    window = _spec_field(spec, "window")
    if variant in ("replay", "split", "spec-replay") and window:
        return int(window), (int(window) if phase == "avg" else 1)
    return 2, 1


def ncu_command(
    ncu: str, spec_path: str | Path, regex: str, metrics: Sequence[str], python: str | None = None,
    report: str | Path | None = None, *, page: str = "raw", sections: Sequence[str] = (),
) -> list[str]:
    """The ncu command line that profiles one child run (clocks left alone, L2 flushed before each kernel), its CSV
    `page` (raw metrics, or details for `sections`' tables); with `report`, ncu also keeps its .ncu-rep there for
    Nsight Compute's UI."""
    return [
        ncu,
        *(["--export", str(report), "--force-overwrite"] if report is not None else []),
        "--clock-control", "none",
        "--cache-control", "all",
        "--profile-from-start", "off",
        "--target-processes", "all",
        "--print-units", "base",
        "--csv", "--page", page,
        *(arg for section in sections for arg in ("--section", section)),
        "--metrics", ",".join(metrics),
        "-k", regex,
        python or sys.executable, "-m", "replayssm_cli.measure.ncu_child", str(spec_path),
    ]


def _unknown_metrics(output: str, asked: Sequence[str]) -> set[str]:
    if "Failed to find metric" not in output and "Invalid metric" not in output:
        return set()
    named = {m for m in asked if m in output or m.rsplit(".", 1)[0] in output}
    return named or set(OPTIONAL_METRICS)


def summarise(
    records: list[dict[str, Any]], *, op: str, variant: str, layers: int, steps: int
) -> dict[str, Any]:
    """Sum the launches of our kernels over the profiled steps and divide down to one decode step of one layer."""
    per = float(layers * steps)
    ours = [(r, match_kernel(r["kernel"] or "", op, variant)) for r in records]
    ours = [(r, k) for r, k in ours if k is not None]
    totals = [kernel_totals(r) for r, _ in ours]

    def total(key: str) -> float | None:
        values = [t[key] for t in totals]
        if not values or any(v is None for v in values):
            return None
        return sum(values) / per

    launches: dict[str, int] = {}
    for _, kind in ours:
        launches[kind.name] = launches.get(kind.name, 0) + 1
    ns = total("ns")
    return {
        "launches": launches,
        "layers": layers,
        "steps": steps,
        "bytes_read": total("dram_read"),
        "bytes_written": total("dram_write"),
        "dram_bytes": total("dram_bytes"),
        "l2_bytes": total("l2_bytes"),
        "l2_write_bytes": total("l2_write_bytes"),
        "flops": total("flops"),
        "flops_fp32": total("flops_fp32"),
        "flops_tensor": total("flops_tensor"),
        "us": ns / 1e3 if ns is not None else None,
    }


def report_name(spec: dict[str, Any]) -> str:
    """A configuration's .ncu-rep file name: its description in safe characters."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", describe(spec)).strip("_") + ".ncu-rep"


def _imported_records(ncu: str, report: Path, timeout_s: float) -> list[dict[str, Any]]:
    """The raw page of a kept report, for an ncu that writes its results only to the report it exports."""
    done = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"],
                          capture_output=True, text=True, timeout=timeout_s)
    return parse_raw_csv(done.stdout)


def measure_one(
    spec: dict[str, Any], *, ncu: str, timeout_s: float = 600.0, python: str | None = None,
    report_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Profile one configuration in a child process under ncu; a dict with "ok" and the measured figures.

    On failure: {"ok": False, "reason": one line}. On success the figures are per decode step of one layer
    (see summarise), with "kernels" listing the ncu names seen.
    """
    op = _spec_field(spec, "op")
    variant = _spec_field(spec, "variant", default="conventional")
    if op is None:
        return {"ok": False, "reason": "the configuration names no op ('mamba2' or 'gdn')"}
    kinds = kernels_for(op, variant)
    if not kinds:
        return {"ok": False, "reason": f"no kernel of ours is listed for {op} {variant} in replayssm_cli.measure.ncu.KERNELS"}
    warmup, steps = profiled_steps(spec)
    metrics = list(CORE_METRICS + OPTIONAL_METRICS)
    with tempfile.TemporaryDirectory(prefix="replayssm-ncu-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        info_path = Path(tmp) / "info.json"
        spec_path.write_text(
            json.dumps({"case": spec, "warmup": warmup, "steps": steps, "info": str(info_path)}, default=str)
        )
        for _attempt in range(2):
            report = Path(report_dir) / report_name(spec) if report_dir is not None else None
            cmd = ncu_command(ncu, spec_path, kernel_regex(kinds), metrics, python, report)
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return {"ok": False, "reason": f"ncu ran over {timeout_s:.0f} s"}
            output = done.stdout + "\n" + done.stderr
            unknown = _unknown_metrics(output, metrics) & set(OPTIONAL_METRICS)
            if unknown and _attempt == 0:
                metrics = [m for m in metrics if m not in unknown]
                continue
            break
        if not info_path.is_file():
            tail = [line for line in done.stderr.splitlines() if line.strip()][-1:]
            reason = _ncu_problem(output) or (tail[0] if tail else f"ncu exited {done.returncode}")
            return {"ok": False, "reason": f"the profiled run failed: {reason}"}
        info = json.loads(info_path.read_text())
    records = parse_raw_csv(done.stdout)
    if not records and report is not None and report.is_file():
        records = _imported_records(ncu, report, timeout_s)
    if not records:
        return {"ok": False, "reason": _ncu_problem(output) or "ncu profiled no kernel of ours"}
    result = summarise(records, op=op, variant=variant, layers=int(info["layers"]), steps=int(info["steps"]))
    if not result["launches"]:
        names = sorted({r["kernel"] for r in records})
        return {"ok": False, "reason": f"none of the profiled kernels ({', '.join(names)}) is one of ours"}
    result.update(ok=True, reason=None, kernels=sorted({r["kernel"] for r in records}), metrics=metrics)
    if report is not None and report.is_file():
        result["report"] = str(report)
    return result


def measure(
    case_specs: Sequence[dict[str, Any]],
    *,
    ncu: str | None = None,
    timeout_s: float = 600.0,
    progress: bool = True,
    python: str | None = None,
    report_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Measure each configuration once under Nsight Compute, in a child process with the same inputs.

    case_specs are the profiler's case specs (replayssm_cli.measure.bench.make_case takes them; they carry at least
    "op", "variant", and "phase" and "window" where they apply). Returns one dict per spec, in order:
    {"ok": True, "bytes_read", "bytes_written", "dram_bytes", "l2_bytes", "l2_write_bytes", "flops", "us", ...}
    per decode step of one layer, or {"ok": False, "reason": ...}. Identical specs are measured once.
    """
    binary = ncu or ncu_binary()
    if binary is None:
        return [{"ok": False, "reason": "ncu not found"} for _ in case_specs]
    unique: dict[str, dict[str, Any]] = {}
    for spec in case_specs:
        unique.setdefault(_json_key(spec), spec)
    done: dict[str, dict[str, Any]] = {}
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from replayssm_cli.console import err

        with Progress(
            TextColumn("ncu"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
            console=err, transient=True,
        ) as bar:
            task = bar.add_task("", total=len(unique))
            for key, spec in unique.items():
                bar.update(task, description=describe(spec))
                done[key] = measure_one(spec, ncu=binary, timeout_s=timeout_s, python=python, report_dir=report_dir)
                bar.advance(task)
    else:
        for key, spec in unique.items():
            done[key] = measure_one(spec, ncu=binary, timeout_s=timeout_s, python=python, report_dir=report_dir)
    return [done[_json_key(spec)] for spec in case_specs]


def describe(spec: dict[str, Any]) -> str:
    """A short label of a configuration for progress bars and messages."""
    parts = [
        _spec_field(spec, "preset", "op", default="?"),
        _spec_field(spec, "variant", default="?"),
        _spec_field(spec, "phase", default=""),
        f"B{_spec_field(spec, 'batch', default='?')}",
    ]
    window = _spec_field(spec, "window")
    if window:
        parts.append(f"W{window}")
    return " ".join(str(p) for p in parts if p != "")


def case_spec(point: Any, phase: str = "avg", seed: int = 0, layers: int = 1) -> dict[str, Any]:
    """The spec `measure` takes for one profile point (replayssm_cli.measure.profile.Point) and phase.

    The point's own case spec plus the op and the phase (bench.make_case sets every row of a single phase at
    its fill, as the profiler times it). ncu flushes L2 before every kernel, so one layer moves the same bytes
    per layer as the profiler's stack does and keeps the profiled run short.
    """
    spec = dict(point.case_spec(seed))
    spec["op"] = point.op
    spec["phase"] = phase
    spec["layers"] = layers
    if phase != "avg" and point.window:
        spec["flush"] = "aligned"
    return spec


ROW_KEYS = ("preset", "variant", "batch", "window", "state_dtype", "read_dtype", "io_dtype", "draft", "tp")


def specs_for_rows(rows: Sequence[dict[str, Any]], points: Sequence[Any], seed: int = 0) -> list[dict[str, Any] | None]:
    """For each results row, the spec that measures it under ncu, or None (predicted, failed or e2e rows)."""
    specs: list[dict[str, Any] | None] = []
    for row in rows:
        spec = None
        if row.get("kind") == "kernel" and row.get("source") == "measured" and row.get("status") == "ok":
            for point in points:
                if all(getattr(point, key) == row.get(key) for key in ROW_KEYS):
                    spec = case_spec(point, row.get("phase", "avg"), seed)
                    break
        specs.append(spec)
    return specs


def specs_from_rows(rows: Sequence[dict[str, Any]], layers: int = 1) -> list[dict[str, Any] | None]:
    """For each results row, the spec that measures it under ncu, from the case spec the profiler recorded
    in the row (`x_case`), or None for rows that ran no kernel of ours (predicted, failed, e2e, baselines)."""
    specs: list[dict[str, Any] | None] = []
    for row in rows:
        case = row.get("x_case")
        if row.get("kind") != "kernel" or row.get("source") != "measured" or row.get("status") != "ok" or not case:
            specs.append(None)
            continue
        spec = dict(case)
        spec.update(op=row["op"], phase=row.get("phase", "avg"), layers=layers)
        if spec["phase"] != "avg" and row.get("window"):
            spec["flush"] = "aligned"
        specs.append(spec)
    return specs


def ncu_version(ncu: str | None = None) -> str | None:
    """The version line `ncu --version` prints, or None."""
    binary = ncu or ncu_binary()
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if "Version" in line or "version" in line]
    return lines[-1] if lines else None


def _pct(measured: float | None, modelled: float | None) -> float | None:
    if measured is None or not modelled:
        return None
    return 100.0 * (measured - modelled) / modelled


def annotate_rows(
    rows: list[dict[str, Any]],
    specs: Sequence[dict[str, Any] | None],
    *,
    measure_fn: Callable[..., list[dict[str, Any]]] | None = None,
    ncu: str | None = None,
    warn: Callable[[str], None] | None = None,
    report_dir: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Add Nsight Compute's measurements to result rows, in place; rows and specs are parallel lists.

    A row whose spec is None is left alone. Fields added (per decode step of one layer): x_ncu_bytes_read,
    x_ncu_bytes_written, x_ncu_l2_bytes, x_ncu_l2_write_bytes, x_ncu_flops, x_ncu_us, x_ncu_diff_pct
    (measured against modelled DRAM bytes, read plus written, %), x_ncu_flops_diff_pct, and with `report_dir`
    x_ncu_report (the .ncu-rep kept there for each configuration). Where ncu is missing
    or cannot read counters, one line says so through `warn` and the rows come back unchanged.
    """
    if len(rows) != len(specs):
        raise ValueError(f"rows and specs must pair up; got {len(rows)} rows and {len(specs)} specs")
    if warn is None:
        from replayssm_cli.console import warn as console_warn

        warn = console_warn
    wanted = [(row, spec) for row, spec in zip(rows, specs) if spec is not None]
    if not wanted:
        return rows
    if measure_fn is None:
        ok, reason = ncu_available(ncu)
        if not ok:
            warn(f"no Nsight Compute measurement: {reason}")
            return rows
        measure_fn = measure
    keep = {"report_dir": report_dir} if report_dir is not None else {}
    results = measure_fn([spec for _, spec in wanted], ncu=ncu, **keep)
    failed = []
    for (row, spec), got in zip(wanted, results):
        if not got.get("ok"):
            failed.append(f"{describe(spec)} ({got.get('reason')})")
            continue
        modelled = None
        if row.get("bytes_read") is not None and row.get("bytes_written") is not None:
            modelled = row["bytes_read"] + row["bytes_written"]
        row["x_ncu_bytes_read"] = got["bytes_read"]
        row["x_ncu_bytes_written"] = got["bytes_written"]
        row["x_ncu_l2_bytes"] = got["l2_bytes"]
        row["x_ncu_l2_write_bytes"] = got.get("l2_write_bytes")
        row["x_ncu_flops"] = got["flops"]
        row["x_ncu_us"] = got["us"]
        row["x_ncu_diff_pct"] = _pct(got.get("dram_bytes"), modelled)
        row["x_ncu_flops_diff_pct"] = _pct(got["flops"], row.get("flops"))
        if got.get("report"):
            row["x_ncu_report"] = got["report"]
    if failed:
        warn(f"Nsight Compute could not measure {len(failed)} configuration(s): {'; '.join(failed)}")
    return rows


def comparison_table(rows: Sequence[dict[str, Any]], title: str = "Nsight Compute vs the cost model, per decode step per layer"):
    """A rich table of the rows annotate_rows measured (modelled vs measured DRAM MB, differences); None if none."""
    measured = [r for r in rows if r.get("x_ncu_bytes_read") is not None or r.get("x_ncu_diff_pct") is not None]
    if not measured:
        return None
    from rich.table import Table

    def mb(value: Any) -> str:
        return "–" if value is None else f"{value / 1e6:,.2f}"

    def pct(value: Any) -> str:
        return "–" if value is None else f"{value:+.1f}%"

    reports = any(r.get("x_ncu_report") for r in measured)
    table = Table(title=title, header_style="bold")
    for name in ("preset", "variant", "phase", "B", "W", "read model", "read ncu", "write model", "write ncu",
                 "DRAM Δ", "L2 write", "FLOP Δ", "µs ncu") + (("report",) if reports else ()):
        table.add_column(name, justify="left" if name in ("preset", "variant", "phase", "report") else "right")
    for r in measured:
        variant = r["variant"] + (f"→{r['read_dtype']}" if r.get("read_dtype") else "")
        table.add_row(
            r["preset"], variant, r["phase"], str(r["batch"]), "–" if r.get("window") is None else str(r["window"]),
            mb(r.get("bytes_read")), mb(r.get("x_ncu_bytes_read")), mb(r.get("bytes_written")),
            mb(r.get("x_ncu_bytes_written")), pct(r.get("x_ncu_diff_pct")), mb(r.get("x_ncu_l2_write_bytes")),
            pct(r.get("x_ncu_flops_diff_pct")), "–" if r.get("x_ncu_us") is None else f"{r['x_ncu_us']:.1f}",
            *([Path(r["x_ncu_report"]).name if r.get("x_ncu_report") else "–"] if reports else []),
        )
    return table
