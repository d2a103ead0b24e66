"""Thousands of ReplaySSM steps on the GPU at serving batch sizes, against the conventional kernels and the references.

Every step draws a random slot table over a pool a little larger than the batch, so slots advance on different
steps and every flush phase occurs at every step; the batches take the large-grid launch rows (the heads launch,
its flushes in a second launch or in its own programs) and the default rows. A program that takes the wrong branch
of a step (a race on the fill counter) corrupts the state far beyond these tolerances.
"""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import gdn, mamba2
from replayssm_kernels import common

W = 16
WINDOWS = 64
# fp32 on both sides, summed in different orders: far under this relative to the largest entry
STATE_TOL = 2.0**-10
# the outputs are bf16, and a split step's are read from its copy
Y_TOL = {None: 2.0**-6, "bf16": 2.0**-5, "fp8": 2.0**-2}


def _batch(op: str, grid: str) -> int:
    sms = common.sm_count(torch.device("cuda"))
    if op == "mamba2":
        return 80 * sms // 128 + 8 if grid == "large" else 256
    return 64 if grid == "large" else 256


CASES = [(op, read, grid) for op in ("mamba2", "gdn") for read in (None, "bf16", "fp8") for grid in ("large", "256")]


def _layer(op: str, nslots: int, read):
    """The op's module, its cache and conventional state from the same random states, its inputs and extra
    arguments, at the Nemotron-3-Super (Mamba-2) or Qwen3.5-122B (GDN) layer shape."""
    if op == "mamba2":
        H, P, N, G = 128, 64, 128, 8
        cache = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype="fp32", read_dtype=read,
                                          io_dtype="bf16", device="cuda")
        state = torch.randn(nslots, H, P, N, device="cuda")
        return mamba2, cache, state, lambda b: mamba2.random_inputs(b, H, P, N, G, device="cuda"), \
            {"dt_softplus": True}
    H, HV, K, V = 16, 64, 128, 128
    cache = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype="fp32", read_dtype=read, io_dtype="bf16",
                                   device="cuda")
    state = torch.randn(nslots, HV, V, K, device="cuda") * 0.5
    return gdn, cache, state, lambda b: gdn.random_inputs(b, H, HV, K, V, device="cuda"), \
        {"use_qk_l2norm_in_kernel": True}


@pytest.mark.gpu
@pytest.mark.parametrize("op,read,grid", CASES, ids=[f"{o}-{r or 'full'}-{g}" for o, r, g in CASES])
def test_replay_many_windows_match_conventional(op, read, grid):
    """WINDOWS windows of steps: each step's outputs against the conventional kernel's on the same inputs and
    slots, and the full states (materialized) against the conventional states every 128 steps and at the end."""
    batch = _batch(op, grid)
    nslots = batch + batch // 8
    m, cache, state, inputs, extra = _layer(op, nslots, read)
    cache.load(state)
    y_err = torch.zeros((), device="cuda")
    for step in range(WINDOWS * W):
        slots = torch.randperm(nslots, device="cuda")[:batch].to(torch.int32)
        inp = inputs(batch)
        y_conv = m.decode(state, **inp, **extra, slots=slots, check=False)
        y = m.replay(cache, **inp, **extra, slots=slots, check=False,
                     out=torch.full_like(y_conv, float("nan")))
        scale = y_conv.float().abs().amax().clamp_min(1.0)
        y_err = torch.maximum(y_err, ((y.float() - y_conv.float()).abs().amax() / scale).nan_to_num(float("inf")))
        if step % 128 == 127:
            err = (m.materialize(cache) - state).abs().amax() / state.abs().amax()
            assert err.item() <= STATE_TOL, f"state after step {step}: relative error {err.item():.3g}"
    assert y_err.item() <= Y_TOL[read], f"outputs: relative error {y_err.item():.3g} > {Y_TOL[read]:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["mamba2", "gdn"])
def test_replay_bf16_state_many_windows_match_reference(op, assert_close):
    """A bf16 state at the large-grid batch (Mamba-2's heads launch with its flushes in its own programs) over eight
    windows of random slot tables: outputs and caches as the reference, which rounds where the kernel rounds."""
    batch = _batch(op, "large")
    nslots = batch + batch // 8
    if op == "mamba2":
        H, P, N, G = 128, 64, 128, 8
        got = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype="bf16", io_dtype="bf16", device="cuda")
        got.load(torch.randn(nslots, H, P, N, device="cuda"))

        def inputs():
            return mamba2.random_inputs(batch, H, P, N, G, device="cuda")

        m, extra = mamba2, {"dt_softplus": True}
    else:
        H, HV, K, V = 16, 64, 128, 128
        got = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype="bf16", io_dtype="bf16", device="cuda")
        got.load(torch.randn(nslots, HV, V, K, device="cuda") * 0.5)

        def inputs():
            return gdn.random_inputs(batch, H, HV, K, V, device="cuda")

        m, extra = gdn, {"use_qk_l2norm_in_kernel": True}
    want = got.clone()
    for step in range(8 * W):
        slots = torch.randperm(nslots, device="cuda")[:batch].to(torch.int32)
        inp = inputs()
        y = m.replay(got, **inp, **extra, slots=slots, check=False)
        y_ref = m.replay_ref(want, **inp, **extra, slots=slots)
        assert_close(y, y_ref, torch.bfloat16, torch.bfloat16, what=f"y at step {step}")
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert_close(m.materialize(got), m.materialize_ref(want), torch.bfloat16, what="state")
