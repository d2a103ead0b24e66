"""Every kernel with every launch row its shipped tables can choose, compiled ahead of time for each GPU generation on
the CPU (nothing launched): registers, spills and shared memory per kernel, row and target, against a baseline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from replayssm_cli.errors import UserError

TARGETS = (80, 86, 89, 90, 100, 120)
BASELINE = Path(str(resources.files("replayssm_profiles") / "reference" / "compile-spills.json"))
BASELINE_SCHEMA = 1
# The layer shapes of the shipped presets: Mamba-2 (P, N) and GDN (K, V) head dimensions; a row keyed by shape is
# compiled at the first of these it covers, else at the first of EXTRA_SHAPES.
MAMBA2_SHAPES = ((64, 128), (64, 256), (128, 256))
MAMBA2_EXTRA_SHAPES = ((64, 64), (128, 128))
MAMBA2_HEADS, MAMBA2_GROUPS = 128, 8
GDN_HEADS, GDN_VALUE_HEADS, GDN_K, GDN_V = 16, 64, 128, 128
BATCH, WINDOW, DRAFT = 4, 16, 4


@dataclass(frozen=True)
class Case:
    """One launch row of one public kernel function, in one cache configuration."""

    op: str
    entry: str
    row: str
    config: str
    # the oldest target the configuration exists on (an fp8 read copy: sm_89)
    min_arch: int = 80

    @property
    def key(self) -> str:
        return f"{self.op} {self.entry} {self.row} {self.config}"


class CompileOnly:
    """A stand-in CUDA driver for a machine without a GPU: it names the target and never launches."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        # Triton keeps compiled kernels per device: one "device" per target keeps two targets' kernels apart
        return self.target.arch

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return divmod(self.target.arch, 10)


def _module(name: str):
    """A kernel module by its dotted name under replayssm_kernels (the packages export functions of the same names)."""
    import importlib

    return importlib.import_module(f"replayssm_kernels.{name}")


def _mamba2_shape(row: str) -> tuple[int, int]:
    """The (P, N) a Mamba-2 row is compiled at: the bounds its name carries (decode's and materialize's rows are by
    shape), the first preset shape beyond them for a row without an upper bound, else the Nemotron-3-Super layer's."""
    bounds = dict(re.findall(r"-([np])(\d+)", row))
    if bounds:
        return int(bounds.get("p", 64)), int(bounds["n"])
    if row.startswith(("decode", "materialize")) and not row.endswith("-small"):
        return 64, 256
    return MAMBA2_SHAPES[0]


def cases() -> list[Case]:
    """Every (op, public function, launch row, cache configuration) the compile check covers."""
    gr = _module("gdn.replay")
    md, mr, mv = _module("mamba2.decode"), _module("mamba2.replay"), _module("mamba2.verify")

    def width(row: str) -> str:
        return "bf16" if "-bf16" in row else "fp32"

    out: list[Case] = []
    for entry in ("decode", "decode_multi"):
        out += [Case("mamba2", entry, row, width(row)) for row in md.DECODE_LAUNCH
                if entry == "decode" or not row.endswith("-small")]
    out.append(Case("mamba2", "accept_snapshot", "decode-fp32-n128", "fp32"))
    for row in mr.STEP_LAUNCH:
        state = width(row)
        if "-split" in row:
            configs = ["fp32→bf16", "fp32→fp8"] if state == "fp32" else ["bf16→fp8"]
        elif row.endswith("-small"):
            # a small grid's split-precision steps take its rows too
            configs = [state] + (["fp32→bf16", "fp32→fp8"] if state == "fp32" else ["bf16→fp8"])
        else:
            configs = [state]
        out += [Case("mamba2", "replay", row, c, 89 if c.endswith("fp8") else 80) for c in configs]
    out += [Case("mamba2", "materialize", row, width(row)) for row in mr.MATERIALIZE_LAUNCH]
    out += [Case("mamba2", "verify", row, width(row)) for row in mv.VERIFY_LAUNCH]
    out.append(Case("mamba2", "accept", "accept", "fp32"))

    gv = _module("gdn.verify")
    for name in ("decode", "decode-small"):
        out.append(Case("gdn", "decode", name, "fp32"))
        out.append(Case("gdn", "decode", name.replace("decode", "decode-bf16"), "bf16"))
    out.append(Case("gdn", "decode_multi", "decode-multi", "fp32"))
    out.append(Case("gdn", "accept_snapshot", "accept-snapshot", "fp32"))
    for name in [*gr.REPLAY_LAUNCH, *gv.VERIFY_LAUNCH]:
        entry = name.split("-")[0]
        if "-q8" in name:
            configs = ["int8", "int8+sr", "fp8"]
        elif "-fp8" in name:
            configs = ["fp32→fp8"]
        elif "-split" in name:
            configs = ["fp32→bf16"]
        elif entry == "replay":
            configs = ["fp32", "bf16"]
        else:
            configs = ["fp32"]
        out += [Case("gdn", entry, name, c, 89 if c.endswith("fp8") else 80) for c in configs]
    out.append(Case("gdn", "accept", "accept", "fp32"))
    out.append(Case("gdn", "materialize", "-", "fp32"))
    return out + _precision_cases(out)


# How the stored-precision paths are compiled: every row of the functions that store a state, with an int8
# checkpoint rounded stochastically (the 8-bit rows with their scales and the random draws together); the first row
# of each with a bf16 state rounded stochastically and with an fp8 checkpoint (sm_89 and newer).
STORE_ENTRIES = ("decode", "replay", "verify")


def _precision_cases(cases: list[Case]) -> list[Case]:
    out: list[Case] = []
    for op in ("mamba2", "gdn"):
        for entry in STORE_ENTRIES:
            # rows of a read copy keep their checkpoint (a read copy over an 8-bit one is refused)
            rows = list(dict.fromkeys(c.row for c in cases if c.op == op and c.entry == entry and "→" not in c.config
                                      and "-split" not in c.row and "-fp8" not in c.row and "-q8" not in c.row))
            out += [Case(op, entry, row, "int8+sr") for row in rows]
            if rows:
                out += [Case(op, entry, rows[0], "bf16+sr"), Case(op, entry, rows[0], "fp8", 89)]
    return out


def select(op: str | None = None, function: str | None = None) -> list[int]:
    """The indices of cases() of `op` and public function `function` (None: all)."""
    every = cases()
    functions = sorted({c.entry for c in every})
    if function is not None and function not in functions:
        raise UserError(f"--function {function!r} is not a kernel function", f"use one of {', '.join(functions)}")
    chosen = [i for i, c in enumerate(every) if op in (None, c.op) and function in (None, c.entry)]
    if not chosen:
        raise UserError(f"{op} has no kernel function {function!r}", "drop --op or --function")
    return chosen


def _dtypes(config: str):
    """(state dtype, read dtype or None) of a case's config: "fp32", "fp32→bf16", "int8+sr" (+sr: rounded
    stochastically)."""
    import torch

    names = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
    state, _, read = config.removesuffix("+sr").partition("→")
    return names[state], (names[read] if read else None)


def _fp8_what(config: str) -> str:
    return "fp8 read copies" if "→" in config else "fp8 states"


def _rounding(config: str) -> str:
    return "stochastic" if config.endswith("+sr") else "nearest"


def _store_options(config: str, shape: tuple) -> dict[str, Any]:
    """A conventional step's state_scale (8-bit states: one per row of the pool's `shape` less its last axis) and
    rounding for a case's config."""
    import torch

    from replayssm_kernels import rounding

    state, _ = _dtypes(config)
    out: dict[str, Any] = {}
    if state in rounding.EIGHT_BIT:
        out["state_scale"] = torch.ones(shape[:-1], dtype=torch.float32)
    if _rounding(config) == "stochastic":
        out["rounding"] = rounding.StateRounding.create(shape[0], device="cpu")
    return out


def _drive_state(ops, entry: str, dims: tuple, dtype, inp: dict, tokens: dict, precision: str, **options) -> None:
    """decode, decode_multi or accept_snapshot of op module `ops` on a state pool of per-slot `dims`."""
    import torch

    slots = torch.arange(BATCH, dtype=torch.int32)
    state = torch.zeros(BATCH, *dims, dtype=dtype)
    snaps = torch.zeros(BATCH, DRAFT, *dims, dtype=dtype)
    if entry == "decode":
        ops.decode(state, **inp, slots=slots, check=False, **options, **_store_options(precision, tuple(state.shape)))
    elif entry == "decode_multi":
        ops.decode_multi(state, snaps, **tokens, slots=slots, check=False, **options)
    else:
        ops.accept_snapshot(state, snaps, torch.ones(BATCH, dtype=torch.int32), slots=slots, check=False,
                            config=options.get("config"))


def _drive_mamba2(case: Case) -> None:
    """Call the Mamba-2 function of `case` with its launch row passed as config=."""
    import torch

    from replayssm_kernels import mamba2 as m

    md, mr, mv = _module("mamba2.decode"), _module("mamba2.replay"), _module("mamba2.verify")
    H, G = MAMBA2_HEADS, MAMBA2_GROUPS
    state, read = _dtypes(case.config)
    slots = torch.arange(BATCH, dtype=torch.int32)
    P, N = _mamba2_shape(case.row)
    table = {"decode": md.DECODE_LAUNCH, "decode_multi": md.DECODE_LAUNCH, "replay": mr.STEP_LAUNCH,
             "materialize": mr.MATERIALIZE_LAUNCH, "verify": mv.VERIFY_LAUNCH}.get(case.entry, {})
    config = table.get(case.row)
    inp = m.random_inputs(BATCH, H, P, N, G, io_dtype=torch.bfloat16)
    tokens = m.random_inputs(BATCH, H, P, N, G, T=DRAFT, io_dtype=torch.bfloat16)
    if case.entry in ("decode", "decode_multi", "accept_snapshot"):
        _drive_state(m, case.entry, (H, P, N), state, inp, tokens, case.config, dt_softplus=True, config=config)
        return
    cache = m.ReplayCache.create(BATCH, H, P, N, G, WINDOW, state_dtype=state, read_dtype=read,
                                 io_dtype="bf16", max_draft=DRAFT if case.entry in ("verify", "accept") else 0,
                                 rounding=_rounding(case.config), device="cpu")
    if case.entry == "replay":
        m.replay(cache, **inp, dt_softplus=True, slots=slots, check=False, config=config)
    elif case.entry == "materialize":
        m.materialize(cache, slots, config=config)
    else:
        m.verify(cache, **tokens, dt_softplus=True, slots=slots, check=False, config=config)
        if case.entry == "accept":
            m.accept(cache, torch.ones(BATCH, dtype=torch.int32), slots, check=False)


def _drive_gdn(case: Case) -> None:
    """Call the GDN function of `case` with its launch row passed as config=."""
    import torch

    from replayssm_kernels import families
    from replayssm_kernels import gdn as g

    gd, gr, gv = _module("gdn.decode"), _module("gdn.replay"), _module("gdn.verify")
    H, HV, K, V = GDN_HEADS, GDN_VALUE_HEADS, GDN_K, GDN_V
    state, read = _dtypes(case.config)
    slots = torch.arange(BATCH, dtype=torch.int32)
    config = {**gd.DECODE_LAUNCH, **gr.REPLAY_LAUNCH, **gv.VERIFY_LAUNCH}.get(case.row)
    config = families.as_selected(config, torch.device("cpu"))
    inp = g.random_inputs(BATCH, H, HV, K, V, io_dtype=torch.bfloat16)
    tokens = g.random_inputs(BATCH, H, HV, K, V, T=DRAFT, io_dtype=torch.bfloat16)
    if case.entry in ("decode", "decode_multi", "accept_snapshot"):
        _drive_state(g, case.entry, (HV, V, K), state, inp, tokens, case.config, use_qk_l2norm_in_kernel=True,
                     config=config)
        return
    cache = g.ReplayCache.create(BATCH, H, HV, K, V, WINDOW, state_dtype=state, read_dtype=read,
                                 io_dtype="bf16", max_draft=DRAFT if case.entry in ("verify", "accept") else 0,
                                 rounding=_rounding(case.config), device="cpu")
    if case.entry == "replay":
        g.replay(cache, **inp, use_qk_l2norm_in_kernel=True, slots=slots, check=False, config=config)
    elif case.entry == "verify":
        g.verify(cache, **tokens, use_qk_l2norm_in_kernel=True, slots=slots, check=False, config=config)
    elif case.entry == "accept":
        g.accept(cache, torch.ones(BATCH, dtype=torch.int32), slots, check=False)
    else:
        g.materialize(cache, slots)


def drive(case: Case) -> None:
    """Call the public function of `case` with its launch row forced."""
    {"mamba2": _drive_mamba2, "gdn": _drive_gdn}[case.op](case)


def sass(cubin: bytes, *options: str) -> str:
    """cuobjdump's output for a one-kernel cubin (the cuobjdump shipped with Triton)."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tools / "cuobjdump"), *options, f.name], capture_output=True, text=True,
                              check=True).stdout


def resource_usage(cubin: bytes, shared: int) -> dict[str, int]:
    """Registers per thread, spilled bytes (local memory and stack frame) and shared bytes per program (static
    plus Triton's dynamic `shared`) of a one-kernel cubin."""
    fields = dict(re.findall(r"(REG|SHARED|LOCAL|STACK):(\d+)", sass(cubin, "-res-usage")))
    # ptxas places spills in the stack frame (Triton kernels make no calls), so both count as spilled bytes.
    return {"regs": int(fields.get("REG", 0)), "spills": int(fields.get("LOCAL", 0)) + int(fields.get("STACK", 0)),
            "shared": int(fields.get("SHARED", 0)) + shared}


def compiled_kernels(drive: Callable[[], None], arch: int) -> list[tuple[str, Any]]:
    """(kernel name, CompiledKernel) of each launch `drive` makes, compiled for sm_`arch` and not launched; the
    kernels' view of the chip (families.capability) is sm_`arch` meanwhile."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from replayssm_kernels import families

    compiled: list[tuple[str, Any]] = []
    real_run, real_capability = JITFunction.run, families.capability
    saved = {(module, "check_device"): module.check_device for module in _device_checked()}

    def run(self, *a, grid, warmup, **kw):
        kernel = real_run(self, *a, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    driver.set_active(CompileOnly(arch))
    JITFunction.run = run
    families.capability = lambda device: arch
    for module, _ in saved:
        module.check_device = lambda *a, **k: None
    try:
        drive()
    finally:
        JITFunction.run = real_run
        families.capability = real_capability
        for (module, name), fn in saved.items():
            setattr(module, name, fn)
        driver._active = None
    return compiled


def _device_checked() -> list:
    """The kernel modules that refuse CPU tensors outside the interpreter (check_device), imported."""
    return [_module("common")]


def compile_case(index: int, arch: int) -> list[dict[str, Any]]:
    """The rows of cases()[index] compiled for sm_`arch`: one per kernel it launches, or one saying why none."""
    import triton

    from replayssm_kernels import families

    case = cases()[index]
    family = families.family_of(arch)
    base = {"op": case.op, "entry": case.entry, "row": case.row, "config": case.config, "target": f"sm_{arch}",
            "triton": triton.__version__, "tuned": family.tuned}
    if arch < case.min_arch:
        return [dict(base, kernel=None, status="not applicable",
                     error=f"{_fp8_what(case.config)} need sm_{case.min_arch} or newer (float8 e4m3 conversions)")]
    try:
        kernels = compiled_kernels(lambda: drive(case), arch)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        return [dict(base, kernel=None, status="error",
                     error=f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300])]
    if case.entry == "accept":
        # its cache takes a verify's drafts first; the verify's kernels are cases of their own
        kernels = [(name, kernel) for name, kernel in kernels if "accept" in name]
    rows = []
    for name, kernel in kernels:
        usage = resource_usage(kernel.asm["cubin"], kernel.metadata.shared)
        fits = usage["shared"] <= family.shared_per_block
        rows.append(dict(base, kernel=name, **usage, status="ok" if fits else "over shared memory",
                         error=None if fits else f"needs {usage['shared']} B of shared memory per program, "
                         f"{family.name} has {family.shared_per_block}"))
    return rows


def _worker(task: tuple[int, int]) -> list[dict[str, Any]]:
    return compile_case(*task)


def run(arches=TARGETS, indices=None, *, jobs: int | None = None, progress: bool = True) -> list[dict[str, Any]]:
    """Compile every case (or `indices` of cases()) for every target in `arches`, in `jobs` processes; rows in case
    and target order."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise UserError("TRITON_INTERPRET=1 runs the kernels in Triton's interpreter instead of compiling them",
                        "run `replayssm check --compile` without it")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.console import err

    all_cases = cases()
    indices = range(len(all_cases)) if indices is None else indices
    tasks = [(i, arch) for i in indices for arch in arches]
    jobs = jobs or min(len(tasks), os.cpu_count() or 1)
    results: dict[tuple[int, int], list] = {}
    bar = Progress(TextColumn("[bold]compile[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err, transient=True, disable=not progress)
    # a few compiles take less time than starting worker processes that import torch and Triton
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 and len(tasks) > 4 else None
    with bar, pool or contextlib.nullcontext():
        task = bar.add_task("", total=len(tasks))
        step = max(1, len(tasks) // 10)
        for done, (key, rows) in enumerate(zip(tasks, pool.map(_worker, tasks) if pool else map(_worker, tasks)), 1):
            results[key] = rows
            bar.update(task, advance=1, description=f"{all_cases[key[0]].key} sm_{key[1]}")
            if progress and not err.is_terminal and (done % step == 0 or done == len(tasks)):
                err.print(f"compile: {done} of {len(tasks)} compiled (case, target) pairs", highlight=False)
    return [row for key in tasks for row in results[key]]


def _row_key(r: dict) -> str:
    return f"{r['op']} {r['entry']} {r['row']} {r['config']} {r['kernel']} {r['target']}"


def triton_series(version: str) -> str:
    """"3.6" of "3.6.0": the baseline is kept per Triton minor release."""
    return ".".join(version.split(".")[:2])


def load_baseline(path: Path = BASELINE) -> dict[str, dict[str, int]]:
    """{Triton series: {row key: spilled bytes}} from the committed baseline; {} where there is none."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("schema_version") != BASELINE_SCHEMA:
        raise UserError(f"{path} has schema_version {data.get('schema_version')!r}; expected {BASELINE_SCHEMA}")
    return data["spills"]


def judge(rows: list[dict[str, Any]], baseline: dict[str, dict[str, int]]) -> list[str]:
    """One line per failure: a compile error, a row over the chip's shared memory, or spills over the baseline
    (a kernel the baseline lacks counts from zero). Empty when all pass."""
    failures = []
    by_series: dict[str, dict[str, int]] = {}
    for r in rows:
        what = f"{r['op']} {r['entry']} row {r['row']} ({r['config']}) on {r['target']}, triton {r['triton']}"
        if r["status"] in ("error", "over shared memory"):
            failures.append(f"{what}: {r['error']}")
            continue
        if r["kernel"] is None:
            continue
        series = triton_series(r["triton"])
        known = by_series.setdefault(series, baseline.get(series, {}))
        allowed = known.get(_row_key(r), 0)
        if r["spills"] > allowed:
            failures.append(f"{what}: {r['kernel']} spills {r['spills']} B, the baseline {allowed} B")
    return failures


def has_baseline(rows: list[dict[str, Any]], baseline: dict) -> list[str]:
    """The Triton series among `rows` that the baseline does not hold (their spills are judged from zero)."""
    return sorted({triton_series(r["triton"]) for r in rows} - set(baseline))


def write_baseline(rows: list[dict[str, Any]], path: Path = BASELINE) -> None:
    """Record the spills of `rows` as the baseline of their Triton series, keeping the other series'."""
    data = {"schema_version": BASELINE_SCHEMA, "spills": load_baseline(path)}
    for r in rows:
        if r["kernel"] is not None and r["status"] == "ok":
            data["spills"].setdefault(triton_series(r["triton"]), {})[_row_key(r)] = r["spills"]
    for series in data["spills"]:
        data["spills"][series] = dict(sorted(data["spills"][series].items()))
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _short(kernel: str) -> str:
    return re.sub(r"_kernel$", "", re.sub(r"^(mamba2_|_)", "", kernel))


def render(rows: list[dict[str, Any]]):
    """One line per (case, kernel), one column per target: registers / spilled bytes / shared KiB, or why not."""
    from rich import box
    from rich.table import Table

    versions = ", ".join(sorted({r["triton"] for r in rows}))
    targets = list(dict.fromkeys(r["target"] for r in rows))
    tuned = ", ".join(t for t in targets if any(r["tuned"] for r in rows if r["target"] == t)) or "none"
    table = Table(title=f"replayssm check --compile · triton {versions}", header_style="bold", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False,
                  caption="compiled ahead of time on the CPU, nothing launched; each cell: registers per thread / "
                  "spilled bytes / shared KiB per program, from the cubin; rows tuned on " + tuned + ", carried "
                  "over untuned elsewhere", caption_justify="left")
    table.add_column("op, function, launch row, state→read", overflow="fold")
    table.add_column("kernel", overflow="fold")
    for t in targets:
        # "255/1272/49" at most: the case and kernel names fold first
        table.add_column(t, justify="right", no_wrap=True, min_width=11)
    def case_of(r: dict) -> str:
        return f"{r['op']} {r['entry']} {r['row']} {r['config']}"

    # a case's kernels (from the targets where it compiled), so that a target where it does not apply fills each line
    kernels: dict[str, list[str]] = {}
    for r in rows:
        if r["kernel"]:
            names = kernels.setdefault(case_of(r), [])
            if _short(r["kernel"]) not in names:
                names.append(_short(r["kernel"]))
    lines: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        case = case_of(r)
        if r["status"] == "not applicable":
            for kernel in kernels.get(case, ["–"]):
                lines.setdefault((case, kernel), {})[r["target"]] = "[dim]n/a[/]"
            continue
        kernel = _short(r["kernel"]) if r["kernel"] else "–"
        if r["kernel"] is None:
            cell = "[red]error[/]"
        else:
            cell = f"{r['regs']}/{r['spills']}/{r['shared'] / 1024:.0f}"
            if r["spills"]:
                cell = f"[yellow]{cell}[/]"
            if r["status"] != "ok":
                cell = f"[red]{cell}[/]"
        lines.setdefault((case, kernel), {})[r["target"]] = cell
    for (case, kernel), cells in lines.items():
        table.add_row(case, kernel, *(cells.get(t, "") for t in targets))
    return table


def parse_targets(text: str | None) -> tuple[int, ...]:
    """"80,90" or "sm_80,sm_90" to (80, 90); None to every target."""
    if text is None:
        return TARGETS
    arches = []
    for part in text.split(","):
        digits = part.strip().lower().removeprefix("sm_")
        if not digits.isdigit() or int(digits) not in TARGETS:
            raise UserError(f"--target {part.strip()!r} is not one of the targets checked",
                            f"use some of {', '.join(f'sm_{a}' for a in TARGETS)}")
        arches.append(int(digits))
    return tuple(dict.fromkeys(arches))
