"""Per-layer SSM shapes, the one currency between presets, the cost model, the profiler and the tuner."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Union

from replayssm_cli.model.dtypes import EIGHT_BIT, itemsize

# Bytes of the fp32 scale each row of an 8-bit state carries.
SCALE_BYTES = 4


@dataclass(frozen=True)
class Mamba2Shape:
    """One Mamba-2 layer: H heads of dimension P, state dimension N, G groups sharing B and C."""

    H: int
    P: int
    N: int
    G: int
    op: str = "mamba2"

    def __post_init__(self) -> None:
        _check_dims(self)

    @property
    def state_elems(self) -> int:
        return self.H * self.P * self.N

    @property
    def state_rows(self) -> int:
        """Rows of the state, each (head, p) over N: what an 8-bit state scales one by one."""
        return self.H * self.P

    def label(self) -> str:
        return f"H{self.H}-P{self.P}-N{self.N}-G{self.G}"


@dataclass(frozen=True)
class GDNShape:
    """One Gated DeltaNet layer: H key heads, HV value heads (a multiple of H), key dim K, value dim V."""

    H: int
    HV: int
    K: int
    V: int
    op: str = "gdn"

    def __post_init__(self) -> None:
        _check_dims(self)

    @property
    def state_elems(self) -> int:
        return self.HV * self.V * self.K

    @property
    def state_rows(self) -> int:
        """Rows of the state, each (value head, v) over K."""
        return self.HV * self.V

    def label(self) -> str:
        return f"H{self.H}-HV{self.HV}-K{self.K}-V{self.V}"


SSMShape = Union[Mamba2Shape, GDNShape]


def _check_dims(shape: Mamba2Shape | GDNShape) -> None:
    """Every dimension a positive integer, so that no size, stride or ratio computed from a shape divides by zero."""
    for f in fields(shape):
        value = getattr(shape, f.name)
        if f.name != "op" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{type(shape).__name__}.{f.name} must be a positive integer, got {value!r}")


def state_bytes(shape: SSMShape, dtype: str) -> int:
    """Bytes of one sequence's recurrent state in one layer (an 8-bit state's with its row scales)."""
    return shape.state_elems * itemsize(dtype) + (shape.state_rows * SCALE_BYTES if dtype in EIGHT_BIT else 0)
