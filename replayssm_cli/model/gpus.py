"""GPU datasheets (profiles/gpus/*.toml), detection through NVML, measured ceilings and their cache, clock sampling."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from replayssm_cli.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

SPEC_FIELDS = ("hbm_gbs", "fp32_tflops", "tf32_tflops", "bf16_tflops", "fp8_tflops", "l2_mib", "sm_count", "memory_gib")
# Figures a GPU may lack (0 = no such unit, e.g. FP8 on the A100).
OPTIONAL_ZERO = ("fp8_tflops",)
NO_GPU_HINT = "name a GPU with --gpu KEY (e.g. --gpu h200; see `replayssm gpu --gpu list`) for the commands that can work from its spec"
CACHE_ENV = "REPLAYSSM_CACHE_DIR"
CACHE_VERSION = 1

THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's datasheet figures (tensor rates dense, not sparse), each with its source."""

    key: str
    name: str
    match: tuple[str, ...]
    hbm_gbs: float
    fp32_tflops: float
    tf32_tflops: float
    bf16_tflops: float
    fp8_tflops: float
    l2_mib: float
    sm_count: int
    memory_gib: float
    sources: dict[str, str] = field(default_factory=dict)
    compute_capability: str | None = None
    memory_type: str | None = None
    estimated: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["match"] = list(self.match)
        return d


_RATES = ("copy_gbs", "read_gbs", "fp32_tflops", "bf16_tflops", "tf32_tflops", "l2_gbs")
_REQUIRED_RATES = ("copy_gbs", "fp32_tflops", "bf16_tflops")


@dataclass(frozen=True)
class Ceilings:
    """The rates the roofline and the profiler's '% of ceiling' use: measured where cached, else the datasheet's."""

    copy_gbs: float
    read_gbs: float | None
    fp32_tflops: float
    bf16_tflops: float
    tf32_tflops: float | None
    l2_gbs: float | None
    source: str
    measured_at: str | None
    driver: str | None
    gpu_name: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "ceilings") -> "Ceilings":
        """Ceilings from their JSON form, every rate checked (a positive finite number); UserError naming `where`
        and the field otherwise. Unknown keys are left out."""
        if not isinstance(d, dict):
            raise UserError(f"{where} are not a JSON object of ceilings (got {type(d).__name__})")
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            value = d.get(name)
            if name in _RATES:
                if value is None and name not in _REQUIRED_RATES:
                    values[name] = None
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                    got = "missing" if value is None else f"{value!r:.40}"
                    raise UserError(f"{where}: {name} must be a positive number, got {got}")
                values[name] = float(value)
            elif name == "details":
                values[name] = value if isinstance(value, dict) else {}
            elif value is None and name in ("measured_at", "driver"):
                values[name] = None
            elif not isinstance(value, str):
                raise UserError(f"{where}: {name} must be a string, got {'nothing' if value is None else repr(value)[:40]}")
            else:
                values[name] = value
        return cls(**values)


@dataclass
class DetectedGpu:
    """What NVML (and CUDA, for the SM count) says about one GPU."""

    index: int
    name: str
    uuid: str | None
    compute_capability: str | None
    memory_total: int | None
    memory_free: int | None
    max_sm_clock_mhz: int | None
    max_mem_clock_mhz: int | None
    bus_width_bits: int | None
    power_limit_w: float | None
    driver: str | None
    sm_count: int | None
    sm_count_source: str | None
    spec: GpuSpec | None

    @property
    def theoretical_gbs(self) -> float | None:
        """Peak DRAM bandwidth from clocks and bus width: 2 transfers per memory clock (DDR) x bus bytes, GB/s."""
        if not self.max_mem_clock_mhz or not self.bus_width_bits:
            return None
        return 2 * self.max_mem_clock_mhz * 1e6 * self.bus_width_bits / 8 / 1e9

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "spec"}
        d["theoretical_gbs"] = self.theoretical_gbs
        d["spec"] = self.spec.key if self.spec else None
        return d


def _gpus_dir() -> Path:
    return Path(str(resources.files("replayssm_profiles") / "gpus"))


@lru_cache(maxsize=None)
def list_gpus() -> list[GpuSpec]:
    """Every GPU spec file, sorted by key."""
    return [_load_spec(p) for p in sorted(_gpus_dir().glob("*.toml"))]


def gpu_keys() -> list[str]:
    return [s.key for s in list_gpus()]


def load_gpu(key_or_name: str) -> GpuSpec:
    """A GPU spec by file key ('h200'), by its name, or by an NVML device name; UserError listing the keys otherwise."""
    wanted = key_or_name.strip().lower()
    for spec in list_gpus():
        if wanted in (spec.key, spec.name.lower()):
            return spec
    spec = match_spec(key_or_name)
    if spec is not None:
        return spec
    raise UserError(f"unknown GPU {key_or_name!r}; valid keys: {', '.join(gpu_keys())}")


def match_spec(device_name: str) -> GpuSpec | None:
    """The spec whose match string appears in an NVML device name as a whole word (longest match wins)."""
    best: tuple[int, GpuSpec] | None = None
    for spec in list_gpus():
        for m in spec.match:
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(m)}(?![A-Za-z0-9])", device_name, flags=re.IGNORECASE):
                if best is None or len(m) > best[0]:
                    best = (len(m), spec)
    return best[1] if best else None


def _load_spec(path: Path) -> GpuSpec:
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where} is not valid TOML ({exc})") from None
    missing = [k for k in ("name", "match", *SPEC_FIELDS) if k not in data]
    if missing:
        raise UserError(f"GPU spec {where}: missing {', '.join(missing)}")
    values: dict[str, Any] = {}
    for k in SPEC_FIELDS:
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (v == 0 and k not in OPTIONAL_ZERO):
            raise UserError(f"GPU spec {where}: {k} must be a positive number, got {v!r}")
        values[k] = int(v) if k == "sm_count" else float(v)
    sources = {str(k): str(v) for k, v in data.get("sources", {}).items()}
    estimated = {str(k): str(v) for k, v in data.get("estimated", {}).items()}
    unsourced = [k for k in SPEC_FIELDS if k not in sources and k not in estimated]
    if unsourced:
        raise UserError(f"GPU spec {where}: no source for {', '.join(unsourced)}")
    match = data["match"]
    if not (isinstance(match, list) and match and all(isinstance(m, str) and m for m in match)):
        raise UserError(f"GPU spec {where}: match must be a non-empty list of strings")
    return GpuSpec(
        key=path.stem,
        name=str(data["name"]),
        match=tuple(match),
        sources=sources,
        compute_capability=data.get("compute_capability"),
        memory_type=data.get("memory_type"),
        estimated=estimated,
        notes={str(k): str(v) for k, v in data.get("notes", {}).items()},
        **values,
    )


def _nvml():
    """The pynvml module, initialised; UserError (one line, mentions --gpu) when NVML, the driver or a GPU is missing."""
    try:
        import pynvml
    except ImportError:
        raise UserError("nvidia-ml-py is not installed, so no GPU can be detected", NO_GPU_HINT) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise UserError(f"no NVIDIA GPU or driver found (NVML: {_nvml_text(exc)})", NO_GPU_HINT) from None
    return pynvml


def _nvml_text(exc: Exception) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(pynvml, fn, *args):
    """An NVML query, or None where the GPU or driver does not support it."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def detect(index: int = 0) -> DetectedGpu:
    """Detect GPU `index` through NVML and match it to its spec file.

    Name, compute capability, memory, max SM and memory clocks, bus width, power limit and driver come
    from NVML; the SM count from CUDA (torch) when it can see the device, else from the spec, since
    NVML does not report it on every GPU. Raises UserError (one line, mentioning --gpu) when NVML,
    the driver or the GPU is missing.
    """
    pynvml = _nvml()
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise UserError(f"GPU index {index} does not exist; NVML sees {count} GPU(s)", NO_GPU_HINT if count == 0 else None)
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        uuid = _optional(pynvml, pynvml.nvmlDeviceGetUUID, handle)
        cc = _optional(pynvml, pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        mem = _optional(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
        sm_clock = _optional(pynvml, pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
        mem_clock = _optional(pynvml, pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
        bus = _optional(pynvml, pynvml.nvmlDeviceGetMemoryBusWidth, handle)
        power_mw = _optional(pynvml, pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        driver = _optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
    except pynvml.NVMLError as exc:
        raise UserError(f"NVML could not query GPU {index} ({_nvml_text(exc)})", NO_GPU_HINT) from None
    finally:
        _optional(pynvml, pynvml.nvmlShutdown)
    spec = match_spec(name)
    uuid_text = _text(uuid) if uuid is not None else None
    sm_count, sm_source = _cuda_sm_count(index, uuid_text)
    if sm_count is None and spec is not None:
        sm_count, sm_source = spec.sm_count, f"spec {spec.key}"
    return DetectedGpu(
        index=index,
        name=name,
        uuid=uuid_text,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        memory_total=int(mem.total) if mem is not None else None,
        memory_free=int(mem.free) if mem is not None else None,
        max_sm_clock_mhz=int(sm_clock) if sm_clock else None,
        max_mem_clock_mhz=int(mem_clock) if mem_clock else None,
        bus_width_bits=int(bus) if bus else None,
        power_limit_w=power_mw / 1000 if power_mw else None,
        driver=_text(driver) if driver is not None else None,
        sm_count=sm_count,
        sm_count_source=sm_source,
        spec=spec,
    )


def _cuda_index(index: int, uuid: str | None) -> int | None:
    """The CUDA (torch) device index of NVML device `index`: matched by UUID, since CUDA_VISIBLE_DEVICES may reorder."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    for i in range(torch.cuda.device_count()):
        props_uuid = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or "")
        if uuid and props_uuid and props_uuid in uuid:
            return i
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and index < torch.cuda.device_count():
        return index
    return None


def _cuda_sm_count(index: int, uuid: str | None) -> tuple[int | None, str | None]:
    """The SM count CUDA reports for NVML device `index`, and where it came from."""
    cuda_index = _cuda_index(index, uuid)
    if cuda_index is None:
        return None, None
    import torch

    return int(torch.cuda.get_device_properties(cuda_index).multi_processor_count), "CUDA"


def cache_path() -> Path:
    """The ceilings cache file: $REPLAYSSM_CACHE_DIR/ceilings.json, else in the user's cache directory."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("replayssm")
    return Path(base) / "ceilings.json"


def _cache_key(gpu_name: str, driver: str | None) -> str:
    return f"{gpu_name}|driver {driver or 'unknown'}"


def _read_cache() -> tuple[dict[str, Any], str | None]:
    """The cache's entries, and what is wrong with the file when it cannot be read (None when fine or absent)."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return {}, f"the ceilings cache {path} cannot be read ({exc.__class__.__name__}: {exc})"
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        return {}, f"the ceilings cache {path} is not a replayssm ceilings cache"
    if data.get("version") != CACHE_VERSION:
        return {}, f"the ceilings cache {path} has version {data.get('version')!r}; this replayssm reads {CACHE_VERSION}"
    return data["entries"], None


def _cached(gpu_name: str, driver: str | None) -> tuple[Ceilings | None, str | None]:
    entries, problem = _read_cache()
    key = _cache_key(gpu_name, driver)
    if problem or key not in entries:
        return None, problem
    try:
        return Ceilings.from_dict(entries[key], f"the ceilings cache {cache_path()}, entry {key!r}"), None
    except UserError as exc:
        return None, exc.message


def cached_ceilings(gpu_name: str, driver: str | None) -> Ceilings | None:
    """The ceilings measured earlier on a GPU of this name under this driver, or None (with one warning line
    when the cache holds them but they cannot be read)."""
    ceilings, problem = _cached(gpu_name, driver)
    if problem:
        _warn_once(f"{problem}: no measured ceilings used")
    return ceilings


def save_ceilings(ceilings: Ceilings) -> Path:
    """Store measured ceilings under their GPU name and driver (atomic rewrite); returns the cache file."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries, _ = _read_cache()
    entries[_cache_key(ceilings.gpu_name, ceilings.driver)] = ceilings.to_dict()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"version": CACHE_VERSION, "entries": entries}, f, indent=2)
    os.replace(tmp, path)
    return path


def datasheet_ceilings(spec: GpuSpec) -> Ceilings:
    """The spec's own figures as ceilings, marked 'datasheet' (copy and read both at the datasheet DRAM rate)."""
    return Ceilings(
        copy_gbs=spec.hbm_gbs,
        read_gbs=spec.hbm_gbs,
        fp32_tflops=spec.fp32_tflops,
        bf16_tflops=spec.bf16_tflops,
        tf32_tflops=spec.tf32_tflops,
        l2_gbs=None,
        source="datasheet",
        measured_at=None,
        driver=None,
        gpu_name=spec.name,
    )


def shipped_ceilings(spec: GpuSpec) -> Ceilings | None:
    """The ceilings measured on a GPU of this spec and shipped in profiles/reference/ceilings/<key>.json, or None."""
    return _shipped(spec)[0]


def _shipped(spec: GpuSpec) -> tuple[Ceilings | None, str | None]:
    from importlib import resources

    path = resources.files("replayssm_profiles") / "reference" / "ceilings" / f"{spec.key}.json"
    if not path.is_file():
        return None, None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return None, f"the shipped ceilings {path} cannot be read ({exc.__class__.__name__}: {exc})"
    try:
        ceilings = Ceilings.from_dict(doc.get("ceilings") if isinstance(doc, dict) else None, f"the shipped ceilings {path}")
    except UserError as exc:
        return None, exc.message
    return replace(ceilings, source=f"{ceilings.source} (shipped reference)"), None


def ceilings_for(spec: GpuSpec, detected: DetectedGpu | None = None) -> Ceilings:
    """The ceilings to use: a cached measurement of the detected GPU under its driver if there is one, else one
    shipped for its spec under the same GPU name and driver, else the datasheet; for a GPU named rather than
    detected, the measurement shipped for its spec where there is one. Recorded ceilings that cannot be read
    are one warning line naming the figures used instead, never a silent replacement."""
    problems: list[str] = []
    chosen: Ceilings | None = None
    if detected is not None:
        cached, problem = _cached(detected.name, detected.driver)
        problems += [problem] if problem else []
        chosen = cached
        if chosen is None:
            # A measurement shipped for this GPU under the same driver stands in for one cached here.
            shipped, problem = _shipped(spec)
            problems += [problem] if problem else []
            if shipped is not None and (shipped.gpu_name, shipped.driver) == (detected.name, detected.driver):
                chosen = shipped
    else:
        chosen, problem = _shipped(spec)
        problems += [problem] if problem else []
    chosen = chosen or datasheet_ceilings(spec)
    for problem in problems:
        _warn_once(f"{problem}: using the {chosen.source} figures instead ({format_gbs(chosen.copy_gbs)} copy, "
                   f"{format_tflops(chosen.fp32_tflops)} FP32)")
    return chosen


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    from replayssm_cli.console import warn

    if message not in _WARNED:
        _WARNED.add(message)
        warn(message)


def measure_ceilings(device_index: int = 0, progress: bool = True) -> Ceilings:
    """Measure the ceilings on GPU `device_index` (NVML numbering) with kernels, no CUDA graph; cache and return them.

    Device-to-device copy (bytes read plus written), a read-only stream, an FP32 FMA loop and BF16 and
    TF32 matrix products; each the median of timed runs after warm-up, timed with CUDA events. The
    result is cached under the GPU's name and driver. Raises UserError without CUDA.
    """
    try:
        import torch
    except ImportError:
        raise UserError("measuring ceilings needs torch with CUDA, which is not installed") from None
    if not torch.cuda.is_available():
        raise UserError("measuring ceilings needs a CUDA GPU, and torch sees none", NO_GPU_HINT)
    from replayssm_cli.measure import ceilings as rates

    detected = detect(device_index)
    cuda_index = _cuda_index(device_index, detected.uuid)
    if cuda_index is None:
        raise UserError(f"CUDA does not see NVML GPU {device_index} ({detected.name}); check CUDA_VISIBLE_DEVICES")
    device = torch.device("cuda", cuda_index)
    results = rates.run_all(device, progress=progress, l2_mib=detected.spec.l2_mib if detected.spec else None)
    ceilings = Ceilings(
        copy_gbs=results["copy_gbs"],
        read_gbs=results["read_gbs"],
        fp32_tflops=results["fp32_tflops"],
        bf16_tflops=results["bf16_tflops"],
        tf32_tflops=results["tf32_tflops"],
        l2_gbs=results["l2_gbs"],
        source=f"measured {datetime.now(timezone.utc):%Y-%m-%d}, driver {detected.driver}",
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        driver=detected.driver,
        gpu_name=detected.name,
        details=results["details"],
    )
    save_ceilings(ceilings)
    return ceilings


def decode_reasons(mask: int) -> list[str]:
    """NVML clock-event (throttle) reason bits as names."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    if rest:
        names.append(f"other_0x{rest:x}")
    return names


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


class ClockSampler:
    """Samples SM clock, memory clock, power and throttle reasons in a background thread while the block runs.

        with ClockSampler(index=0) as clocks:
            run_benchmark()
        clocks.summary()  # {'sm_mhz': {'min','median','max'}, 'mem_mhz': ..., 'power_w': ..., 'reasons': [...]}

    NVML missing raises UserError on entry unless required=False, in which case summary() is None.
    """

    def __init__(self, index: int = 0, interval_s: float = 0.05, required: bool = True):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.index = index
        self.interval_s = interval_s
        self.required = required
        self.sm_mhz: list[float] = []
        self.mem_mhz: list[float] = []
        self.power_w: list[float] = []
        self.reasons: set[str] = set()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml = None
        self._handle = None

    def __enter__(self) -> "ClockSampler":
        try:
            self._pynvml = _nvml()
            try:
                self._handle = self._pynvml.nvmlDeviceGetHandleByIndex(self.index)
            except self._pynvml.NVMLError as exc:
                _optional(self._pynvml, self._pynvml.nvmlShutdown)
                raise UserError(f"NVML cannot sample GPU {self.index} ({_nvml_text(exc)})") from None
        except UserError as exc:
            if self.required:
                raise
            self.error = exc.line()
            self._pynvml = None
            return self
        self.sample()
        self._thread = threading.Thread(target=self._run, name="replayssm-clocks", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._pynvml is not None:
            self.sample()
            _optional(self._pynvml, self._pynvml.nvmlShutdown)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        """Take one sample now (each query may be unsupported on a given GPU; those are skipped)."""
        nv, h = self._pynvml, self._handle
        if nv is None:
            return
        sm = _optional(nv, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        mem = _optional(nv, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        power = _optional(nv, nv.nvmlDeviceGetPowerUsage, h)
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = _optional(nv, reasons_fn, h) if reasons_fn is not None else None
        if sm:
            self.sm_mhz.append(float(sm))
        if mem:
            self.mem_mhz.append(float(mem))
        if power:
            self.power_w.append(power / 1000)
        if mask is not None:
            self.reasons.update(r for r in decode_reasons(int(mask)) if r != "gpu_idle")

    def summary(self) -> dict[str, Any] | None:
        """min/median/max of each series, the set of throttle reasons seen, the sample count; None without NVML."""
        if self._pynvml is None and self.error:
            return None
        return {
            "sm_mhz": _stats(self.sm_mhz),
            "mem_mhz": _stats(self.mem_mhz),
            "power_w": _stats(self.power_w),
            "reasons": sorted(self.reasons),
            "samples": len(self.sm_mhz),
        }


def sample_clocks(index: int = 0) -> dict[str, Any]:
    """One reading of SM clock, memory clock, power and throttle reasons (UserError without NVML)."""
    with ClockSampler(index=index, interval_s=3600) as sampler:
        pass
    return sampler.summary() or {}


def format_gbs(gbs: float | None) -> str:
    """A bandwidth for people: TB/s with two decimals from 1000 GB/s up, else GB/s."""
    if gbs is None:
        return "-"
    return f"{gbs / 1000:.2f} TB/s" if gbs >= 1000 else f"{gbs:.0f} GB/s"


def format_tflops(tflops: float | None) -> str:
    if tflops is None:
        return "-"
    return f"{tflops:,.1f} TFLOP/s"


def launch_table(compute_capability: str | None) -> dict[str, Any] | None:
    """The kernels' launch table for a GPU of this compute capability ("9.0"): its family, whether its rows were
    tuned there, what the family lacks; None when the capability is unknown."""
    from replayssm_kernels import families

    if not compute_capability:
        return None
    major, _, minor = compute_capability.partition(".")
    try:
        family = families.family_of(int(major) * 10 + int(minor or 0))
    except ValueError as exc:
        return {"family": None, "table": None, "tuned": False, "error": str(exc)}
    return {"family": family.name, "table": family.table(), "tuned": family.tuned, "fp8": family.fp8,
            "pdl": family.pdl, "shared_kib_per_sm": family.shared_kib}
