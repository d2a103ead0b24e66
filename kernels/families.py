"""GPU generations the kernels support: what each chip lacks, its limits, and which launch table it takes."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Family:
    """One GPU generation, named by its compute capability, and the launch table it takes."""

    name: str
    # compute capabilities (major * 10 + minor) of the family
    archs: tuple[int, ...]
    # examples, for messages and `replayssm gpu`
    gpus: str
    # shared memory per SM, KiB; a block may take all but 1 KiB of it
    shared_kib: int
    # float8 e4m3 conversions (the fp8 read copies)
    fp8: bool
    # programmatic dependent launch (a launch row's pdl)
    pdl: bool
    # whether its launch rows were tuned on a GPU of this family, or carried over from sm_90's untuned
    tuned: bool

    @property
    def shared_per_block(self) -> int:
        """The most shared memory one program may take, bytes."""
        return (self.shared_kib - 1) * 1024

    def table(self) -> str:
        """Which launch table this family takes, in a line."""
        if self.tuned:
            return f"{self.name} table (tuned on an NVIDIA H200)"
        if self.pdl:
            return f"{TUNED.name} table carried over untuned"
        return f"{TUNED.name} table carried over untuned, without programmatic dependent launch"


FAMILIES = (
    Family("sm_80", (80, 87), "A100, A30", 164, fp8=False, pdl=False, tuned=False),
    Family("sm_86", (86,), "A10, A40, RTX 3090", 100, fp8=False, pdl=False, tuned=False),
    Family("sm_89", (89,), "L4, L40S, RTX 4090", 100, fp8=True, pdl=False, tuned=False),
    Family("sm_90", (90,), "H100, H200", 228, fp8=True, pdl=True, tuned=True),
    Family("sm_100", (100, 103), "B200, B300", 228, fp8=True, pdl=True, tuned=False),
    Family("sm_120", (120, 121), "RTX 5090, RTX PRO 6000", 100, fp8=True, pdl=True, tuned=False),
)
TUNED = next(f for f in FAMILIES if f.tuned)


class UnsupportedOnChip(ValueError):
    """A kernel feature or launch row this chip lacks; the message names the feature, the chip and the
    alternative."""


def family_of(arch: int) -> Family:
    """The family of compute capability `arch` (major * 10 + minor); ValueError for one the kernels do not support."""
    for family in FAMILIES:
        if arch in family.archs:
            return family
    supported = ", ".join(f.name for f in FAMILIES)
    raise UnsupportedOnChip(f"sm_{arch} is not a GPU generation these kernels support ({supported})")


def capability(device: torch.device) -> int | None:
    """The compute capability of a CUDA device as major * 10 + minor; None for the CPU (Triton's interpreter)."""
    if device.type != "cuda":
        return None
    major, minor = _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())
    return major * 10 + minor


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_family(device: torch.device) -> Family | None:
    """The family of the GPU `device` is on; None for the CPU."""
    arch = capability(device)
    return None if arch is None else family_of(arch)


def _chip(arch: int, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else None
    return f"sm_{arch}" + (f" ({name})" if name else "")


def check_read_dtype(read_dtype, device: torch.device) -> None:
    """Refuse an fp8 read copy on a chip without e4m3 conversions (before sm_89)."""
    _check_fp8(read_dtype, device, "fp8 read copies", "--read-dtype bf16 (read_dtype='bf16')")


def check_state_dtype(state_dtype, device: torch.device) -> None:
    """Refuse an fp8 state or checkpoint on a chip without e4m3 conversions (before sm_89)."""
    _check_fp8(state_dtype, device, "fp8 states", "--state-dtype int8 (state_dtype='int8')")


def _check_fp8(dtype, device: torch.device, what: str, alternative: str) -> None:
    arch = capability(device)
    if arch is None or dtype != torch.float8_e4m3fn or family_of(arch).fp8:
        return
    raise UnsupportedOnChip(f"{what} need sm_89 or newer (float8 e4m3 conversions); this GPU is "
                            f"{_chip(arch, device)}: use {alternative}")


def pdl(wanted: bool, asked: bool, device: torch.device) -> bool:
    """Whether a launch row's programmatic dependent launch runs on this device: never on the CPU (the interpreter runs
    launches in order); a row carried over from sm_90 to a family without it goes without, and one a caller asked
    for (`asked`) there is refused."""
    arch = capability(device)
    if arch is None or not wanted:
        return False
    if family_of(arch).pdl:
        return True
    if asked:
        raise UnsupportedOnChip(f"pdl (programmatic dependent launch) needs sm_90 or newer; this GPU is "
                                f"{_chip(arch, device)}: take a launch row without it (pdl=False)")
    return False


def as_selected(config, device: torch.device):
    """A shipped launch row as `select` gives it on this device: a row carried over from sm_90 to a family without
    programmatic dependent launch goes without it (a config passed explicitly keeps it, and `pdl` refuses it)."""
    arch = capability(device)
    if getattr(config, "pdl", False) and arch is not None and not family_of(arch).pdl:
        return replace(config, pdl=False)
    return config


def refuse_out_of_resources(fn):
    """Turn Triton's out-of-resources error at a launch (a row needs more shared memory or registers than the chip
    has) into one line naming the row's need, the chip and the alternative."""
    from triton.runtime.errors import OutOfResources

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OutOfResources as exc:
            device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
            raise UnsupportedOnChip(
                f"{fn.__name__}: the launch row needs {exc.name} {exc.required}, over the {exc.limit} of "
                f"{_chip(capability(device), device)}: pass launch= a row with fewer STAGES or smaller blocks "
                "(`replayssm check --compile` lists what each row needs)") from None

    return wrapper
