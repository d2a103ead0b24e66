"""Argument checks of the Mamba-2 entry points; every bad argument is a ValueError naming it."""

from __future__ import annotations

import torch

from replayssm_kernels.common import FLOAT_DTYPES, check_optional, check_tensor


def check_group(H: int, G: int, name: str = "B") -> None:
    if G < 1 or H % G != 0:
        raise ValueError(f"{name} has G = {G} groups, which must divide the H = {H} heads")


def check_inputs(x, dt, A, B, C, D, z, dt_bias, *, H: int, P: int, N: int, device: torch.device, tokens: bool,
                 io_dtypes=FLOAT_DTYPES) -> tuple[int, int | None, int]:
    """The step inputs against the state's (H, P, N); returns (batch, T or None, G)."""
    lead_dims = "(batch, T, " if tokens else "(batch, "
    rank = 4 if tokens else 3
    if not isinstance(x, torch.Tensor) or x.dim() != rank:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape {lead_dims}H, P), got {got}")
    lead = tuple(x.shape[: rank - 2])
    batch, T = lead[0], (lead[1] if tokens else None)
    if batch < 1:
        raise ValueError("x must hold at least one row (batch ≥ 1)")
    check_tensor("x", x, (*lead, H, P), lead_dims + "H, P)", io_dtypes, device)
    check_tensor("dt", dt, (*lead, H), lead_dims + "H)", FLOAT_DTYPES, device, unit_stride=False)
    check_tensor("A", A, (H,), "(H,)", FLOAT_DTYPES, device)
    if not isinstance(B, torch.Tensor) or B.dim() != rank:
        got = tuple(B.shape) if isinstance(B, torch.Tensor) else type(B).__name__
        raise ValueError(f"B must have shape {lead_dims}G, N), got {got}")
    G = B.shape[-2]
    check_group(H, G)
    check_tensor("B", B, (*lead, G, N), lead_dims + "G, N)", io_dtypes, device)
    check_tensor("C", C, (*lead, G, N), lead_dims + "G, N)", FLOAT_DTYPES, device)
    check_optional("D", D, (H,), "(H,)", FLOAT_DTYPES, device)
    check_optional("dt_bias", dt_bias, (H,), "(H,)", FLOAT_DTYPES, device)
    check_optional("z", z, (*lead, H, P), lead_dims + "H, P)", FLOAT_DTYPES, device)
    return batch, T, G


def check_out(out, shape: tuple, dims: str, device: torch.device) -> None:
    check_optional("out", out, shape, dims, FLOAT_DTYPES, device)
