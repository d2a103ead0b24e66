"""Conventional Mamba-2 decode, decode_multi and accept_snapshot against their references."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from replayssm_kernels import common, mamba2
from replayssm_kernels.mamba2.decode import DecodeConfig

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAN = float("nan")


def _state(nslots, H, P, N, dtype, device):
    return torch.randn(nslots, H, P, N).to(device, dtype)


COMBOS = [(s, i) for s in ("fp32", "bf16", "fp16") for i in ("bf16", "fp16", "fp32")]


@pytest.mark.parametrize("state_dtype,io_dtype", COMBOS, ids=[f"B3-H4-P24-N20-G2-{s}-{i}" for s, i in COMBOS])
def test_decode_every_dtype(device, assert_close, state_dtype, io_dtype):
    """B3-H4-P24-N20-G2: padding row, D, z, dt_bias, softplus; outputs and the whole state pool."""
    nslots, batch, H, P, N, G = 5, 3, 4, 24, 20, 2
    sd, io = DT[state_dtype], DT[io_dtype]
    state = _state(nslots, H, P, N, sd, device)
    inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=io, device=device)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    got_state, want_state = state.clone(), state.clone()
    y = mamba2.decode(got_state, **inp, dt_softplus=True, slots=slots, out=torch.full((batch, H, P), NAN, dtype=io,
                                                                                     device=device))
    want = mamba2.decode_ref(want_state, **inp, dt_softplus=True, slots=slots)
    assert_close(y, want, io, sd, what="y")
    assert_close(got_state, want_state, sd, what="state")
    assert y[1].isnan().all(), "a padding row's output was written"
    for s in (1, 2, 4):
        assert torch.equal(got_state[s], state[s]), f"slot {s} is in no row but changed"


@pytest.mark.parametrize("shape", [(2, 2, 16, 16, 1), (1, 3, 5, 7, 3)], ids=["B2-H2-P16-N16-G1", "B1-H3-P5-N7-G3"])
def test_decode_plain(device, assert_close, shape):
    """No D, z, dt_bias, softplus or slots (row b -> slot b), and a P-block narrower than P."""
    batch, H, P, N, G = shape
    state = _state(batch + 1, H, P, N, torch.float32, device)
    inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.float32, device=device, optional=False)
    got_state, want_state = state.clone(), state.clone()
    y = mamba2.decode(got_state, **inp, config=DecodeConfig(rows=4, warps=4))
    want = mamba2.decode_ref(want_state, **inp)
    assert_close(y, want, torch.float32, what="y")
    assert_close(got_state, want_state, torch.float32, what="state")
    assert torch.equal(got_state[batch], state[batch])


def test_decode_strided_pool(device, assert_close):
    """A state pool that is a view into a larger buffer (strided slots and heads) is updated in place."""
    H, P, N, G = 2, 8, 12, 1
    base = torch.randn(4, H + 1, P + 3, N).to(device)
    state = base[:, 1:, 3:, :]
    inp = mamba2.random_inputs(2, H, P, N, G, io_dtype=torch.float32, device=device)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=device)
    want_state = state.clone()
    before = base.clone()
    y = mamba2.decode(state, **inp, dt_softplus=True, slots=slots)
    want = mamba2.decode_ref(want_state, **inp, dt_softplus=True, slots=slots)
    assert_close(y, want, torch.float32, what="y")
    assert_close(state, want_state, torch.float32, what="state")
    assert torch.equal(base[:, 0], before[:, 0]) and torch.equal(base[:, :, :3], before[:, :, :3])


@pytest.mark.parametrize("T,state_dtype", [(1, "fp32"), (3, "bf16"), (4, "fp16")],
                         ids=[f"B3-H4-P12-N10-G2-T{t}-{s}-bf16" for t, s in [(1, "fp32"), (3, "bf16"), (4, "fp16")]])
def test_decode_multi(device, assert_close, T, state_dtype):
    """B3-H4-P12-N10-G2: snapshots per draft, state untouched, accept_snapshot restores the chosen one."""
    nslots, batch, H, P, N, G = 4, 3, 4, 12, 10, 2
    sd = DT[state_dtype]
    state = _state(nslots, H, P, N, sd, device)
    inp = mamba2.random_inputs(batch, H, P, N, G, T=T, io_dtype=torch.bfloat16, device=device)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32, device=device)
    snaps = torch.full((nslots, T + 1, H, P, N), NAN, dtype=sd, device=device)
    want_snaps = snaps.clone()
    y = mamba2.decode_multi(state, snaps, **inp, dt_softplus=True, slots=slots,
                            out=torch.full((batch, T, H, P), NAN, dtype=torch.bfloat16, device=device))
    want = mamba2.decode_multi_ref(state, want_snaps, **inp, dt_softplus=True, slots=slots)
    assert_close(y, want, torch.bfloat16, sd, what="y")
    assert_close(snaps, want_snaps, sd, what="snapshots")
    assert y[1].isnan().all()

    n = torch.tensor([T, 1, 0], dtype=torch.int32, device=device)
    got_state, want_state = state.clone(), state.clone()
    mamba2.accept_snapshot(got_state, snaps, n, slots)
    mamba2.accept_snapshot_ref(want_state, snaps, n, slots)
    assert torch.equal(got_state[2], snaps[2, T - 1])
    assert torch.equal(got_state[0], state[0]), "a row with n = 0 must keep its state"
    assert torch.equal(got_state, want_state)


def _decode_args(device):
    nslots, batch, H, P, N, G = 3, 2, 4, 8, 8, 2
    state = torch.zeros(nslots, H, P, N, device=device)
    inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.float32, device=device)
    return state, inp


BAD_DECODE = {
    "x-shape": (lambda s, i: i.update(x=i["x"][:, :, :-1]), "x must have shape"),
    "x-dtype": (lambda s, i: i.update(x=i["x"].to(torch.int32)), "x must be"),
    "dt-shape": (lambda s, i: i.update(dt=i["dt"][:, :1]), "dt must have shape"),
    "A-dtype": (lambda s, i: i.update(A=i["A"].double()), "A must be"),
    "B-groups": (lambda s, i: i.update(B=torch.zeros(2, 3, 8), C=torch.zeros(2, 3, 8)), "G = 3 groups"),
    "C-device": (lambda s, i: i.update(C=i["C"].to("meta")), "C must be on"),
    "z-stride": (lambda s, i: i.update(z=i["z"].transpose(1, 2).contiguous().transpose(1, 2)), "z must have unit"),
    "slots-range": (lambda s, i: i.update(slots=torch.tensor([0, 3], dtype=torch.int32)), "slots must be in"),
    "slots-repeat": (lambda s, i: i.update(slots=torch.tensor([1, 1], dtype=torch.int32)), "must not repeat"),
    "slots-dtype": (lambda s, i: i.update(slots=torch.tensor([0, 1.0])), "slots must be"),
}


@pytest.mark.parametrize("case", list(BAD_DECODE))
def test_decode_bad_input(device, case):
    state, inp = _decode_args(device)
    mutate, message = BAD_DECODE[case]
    mutate(state, inp)
    if "slots" in inp and inp["slots"].device != state.device:
        inp["slots"] = inp["slots"].to(device)
    if inp["B"].device != state.device and case == "B-groups":
        inp["B"], inp["C"] = inp["B"].to(device), inp["C"].to(device)
    before = state.clone()
    with pytest.raises(ValueError, match=message):
        mamba2.decode(state, **inp, dt_softplus=True)
    assert torch.equal(state, before)


def test_decode_bad_state(device):
    _, inp = _decode_args(device)
    with pytest.raises(ValueError, match="state must have shape"):
        mamba2.decode(torch.zeros(3, 4, 8, device=device), **inp)
    with pytest.raises(ValueError, match="state must have unit stride"):
        mamba2.decode(torch.zeros(3, 4, 8, 8, device=device).transpose(2, 3), **inp)
    with pytest.raises(ValueError, match="state must be"):
        mamba2.decode(torch.zeros(3, 4, 8, 8, device=device, dtype=torch.float64), **inp)


def test_decode_multi_bad_input(device):
    state = torch.zeros(3, 4, 8, 8, device=device)
    inp = mamba2.random_inputs(2, 4, 8, 8, 2, T=3, io_dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="snapshots holds 2 positions"):
        mamba2.decode_multi(state, torch.zeros(3, 2, 4, 8, 8, device=device), **inp)
    with pytest.raises(ValueError, match="snapshots must be"):
        mamba2.decode_multi(state, torch.zeros(3, 3, 4, 8, 8, device=device, dtype=torch.bfloat16), **inp)
    big = mamba2.random_inputs(1, 4, 8, 8, 2, T=9, io_dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="T must be in"):
        mamba2.decode_multi(state, torch.zeros(3, 9, 4, 8, 8, device=device), **big)
    with pytest.raises(ValueError, match="n_accepted must be in"):
        mamba2.accept_snapshot(state, torch.zeros(3, 3, 4, 8, 8, device=device),
                               torch.tensor([4, 0], dtype=torch.int32, device=device))


@pytest.mark.gpu
def test_decode_cuda_graph():
    """A captured loop of decode steps gives the eager loop's outputs and state, with no host sync inside."""
    device = "cuda"
    nslots, batch, H, P, N, G = 6, 4, 8, 64, 128, 2
    state = torch.randn(nslots, H, P, N, device=device)
    steps = [mamba2.random_inputs(batch, H, P, N, G, device=device) for _ in range(3)]
    slots = torch.tensor([5, -1, 0, 2], dtype=torch.int32, device=device)
    eager_state = state.clone()
    eager = [mamba2.decode(eager_state, **inp, dt_softplus=True, slots=slots) for inp in steps]
    graph_state = state.clone()
    mamba2.decode(graph_state.clone(), **steps[0], dt_softplus=True, slots=slots)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [mamba2.decode(graph_state, **inp, dt_softplus=True, slots=slots) for inp in steps]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs, eager):
        torch.testing.assert_close(a[[0, 2, 3]], b[[0, 2, 3]], rtol=0, atol=0)
    torch.testing.assert_close(graph_state, eager_state, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal, which needs a machine without CUDA")
def test_decode_on_cpu_without_interpreter_is_refused():
    """CPU tensors without TRITON_INTERPRET=1 get one ValueError line, not a Triton traceback."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from replayssm_kernels import mamba2\n"
        "inp = mamba2.random_inputs(1, 2, 4, 4, 1)\n"
        "try:\n"
        "    mamba2.decode(torch.zeros(1, 2, 4, 4), **inp)\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ValueError: the tensors are on the CPU" in done.stdout, done.stdout + done.stderr


def test_decode_rows_by_grid(monkeypatch):
    """An fp32 state on at most 16 (row, head) programs per SM takes the small-grid row; larger grids, the CPU and
    2-byte states the rows by N."""
    import importlib

    decode_mod = importlib.import_module("replayssm_kernels.mamba2.decode")
    monkeypatch.setattr(common, "sm_count", lambda device: 132)

    def pool(itemsize, N, device="cuda"):
        return SimpleNamespace(element_size=lambda: itemsize, shape=(1, 128, 64, N), device=torch.device(device))

    assert [decode_mod.select(pool(4, 128), b) for b in (16 * 132 // 128, 16 * 132 // 128 + 1, None)] == [
        "decode-fp32-small", "decode-fp32-n128", "decode-fp32-n128"]
    assert [decode_mod.select(pool(2, n), 1) for n in (64, 128, 256)] == [
        "decode-bf16-n64", "decode-bf16-n128", "decode-bf16"]
    monkeypatch.undo()
    assert decode_mod.select(pool(4, 256, "cpu"), 1) == "decode-fp32"
