"""Conventional Gated DeltaNet decode and its snapshot-writing speculative path, against the references."""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import gdn
from replayssm_kernels.gdn.decode import DECODE_LAUNCH, DecodeConfig

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAN = float("nan")


@pytest.fixture(autouse=True)
def one_thread():
    # The references are many tiny ops: with pytest-xdist on two cores, torch's thread pool only contends.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rows(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


DECODE_CASES = [(s, i) for s in DT for i in DT]


@pytest.mark.parametrize("state,io", DECODE_CASES, ids=[f"B3-H2-HV6-K24-V20-{s}-{i}" for s, i in DECODE_CASES])
def test_decode_matches_reference(device, assert_close, state, io):
    """Two steps with a padding row and permuted slots: outputs and the updated state pool."""
    B, H, HV, K, V = 3, 2, 6, 24, 20
    got = torch.randn(5, HV, V, K, device=device).to(DT[state])
    want = got.clone()
    slots = rows([4, -1, 1], device)
    for step in range(2):
        inp = gdn.random_inputs(B, H, HV, K, V, io_dtype=DT[io], device=device)
        out = torch.full((B, HV, V), NAN, dtype=DT[io], device=device)
        y = gdn.decode(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out)
        y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        assert y is out
        assert_close(y, y_ref, DT[io], DT[state], what=f"o at step {step}")
        assert_close(got, want, DT[state], what=f"state after step {step}")
    assert torch.equal(got[[0, 2, 3]], want[[0, 2, 3]])


def test_decode_without_slots_updates_row_b_in_slot_b(device, assert_close):
    """No slot table: row b reads and writes slot b of a larger pool, and the slots past the batch are untouched."""
    B, H, HV, K, V = 3, 2, 4, 24, 20
    got = torch.randn(5, HV, V, K, device=device)
    want = got.clone()
    for step in range(2):
        inp = gdn.random_inputs(B, H, HV, K, V, device=device)
        out = torch.full((B, HV, V), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.decode(got, **inp, use_qk_l2norm_in_kernel=True, out=out)
        y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=rows([0, 1, 2], device))
        assert_close(y, y_ref, torch.bfloat16, torch.float32, what=f"o at step {step}")
        assert_close(got, want, torch.float32, what=f"state after step {step}")
    assert torch.equal(got[3:], want[3:])


STRIDED_CASES = [(False, None), (True, None), (True, DECODE_LAUNCH["decode"])]


@pytest.mark.parametrize("l2norm,config", STRIDED_CASES,
                         ids=["B2-H1-HV4-K16-V32-fp32-fp32", "B2-H1-HV4-K16-V32-fp32-fp32-l2norm",
                              "B2-H1-HV4-K16-V32-fp32-fp32-l2norm-state-first-block-strides"])
def test_decode_strided_pool_and_scale(device, assert_close, l2norm, config):
    """A state pool that is a strided view, q/k/v views of one fused projection, and an explicit scale; block_strides
    compiles strides in only for a contiguous (HV, V, K) block, which this view is not."""
    B, H, HV, K, V = 2, 1, 4, 16, 32
    pool = torch.randn(3, V, HV, K + 3, device=device)
    state = pool[..., :K].transpose(1, 2)
    want = state.clone()
    fused = torch.randn(B, 2 * H * K + HV * V, device=device)
    q = fused[:, :K].view(B, H, K)
    k = fused[:, K : 2 * K].view(B, H, K)
    v = fused[:, 2 * K :].view(B, HV, V)
    if not l2norm:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    g = -torch.rand(B, HV, device=device)
    beta = torch.rand(B, HV, device=device)
    kw = dict(scale=0.3, use_qk_l2norm_in_kernel=l2norm, slots=rows([2, 0], device))
    y = gdn.decode(state, q, k, v, g, beta, **kw, config=config)
    y_ref = gdn.decode_ref(want, q, k, v, g, beta, **kw)
    assert_close(y, y_ref, torch.float32, what="o")
    assert_close(pool[..., :K].transpose(1, 2), want, torch.float32, what="state, through the pool")
    assert not torch.equal(pool[1], torch.zeros_like(pool[1])) and torch.equal(state[1], want[1])


# Beyond the shipped rows (tests/test_launch_rows.py): a head's rows over programs of 4 and 16 rows, with and
# without the state read first and the strides compiled in.
ROW_CASES = [DecodeConfig(rows=16, state_first=True), DecodeConfig(rows=4, block_strides=True)]


@pytest.mark.parametrize("config", ROW_CASES, ids=["B3-H2-HV6-K24-V20-rows16-state-first-fp32-bf16",
                                                   "B3-H2-HV6-K24-V20-rows4-block-strides-fp32-bf16"])
def test_decode_rows_per_program(device, assert_close, config):
    """A head's rows over several programs (rows < V), masked past V."""
    B, H, HV, K, V = 3, 2, 6, 24, 20
    got = torch.randn(4, HV, V, K, device=device)
    want = got.clone()
    slots = rows([3, -1, 0], device)
    for _ in range(2):
        inp = gdn.random_inputs(B, H, HV, K, V, io_dtype=torch.bfloat16, device=device)
        out = torch.full((B, HV, V), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.decode(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, config=config)
        y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        assert_close(y[[0, 2]], y_ref[[0, 2]], torch.bfloat16, torch.float32, what="o")
        assert out[1].isnan().all(), "a padding row's output was written"
    assert_close(got, want, torch.float32, what="state")


MULTI_CASES = [("fp32", "bf16", 3), ("bf16", "fp32", 4), ("fp16", "fp16", 1)]


@pytest.mark.parametrize("state,io,T", MULTI_CASES,
                         ids=[f"B3-H2-HV4-K12-V20-T{t}-{s}-{i}" for s, i, t in MULTI_CASES])
def test_decode_multi_and_accept_snapshot(device, assert_close, state, io, T):
    """Snapshots and outputs against the reference; accepting n then equals n conventional steps."""
    B, H, HV, K, V = 3, 2, 4, 12, 20
    start = torch.randn(4, HV, V, K, device=device).to(DT[state])
    got, want, stepped = start.clone(), start.clone(), start.clone()
    snaps = torch.full((4, T, HV, V, K), NAN, device=device).to(DT[state])
    snaps_ref = snaps.clone()
    slots = rows([3, -1, 0], device)
    inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=DT[io], device=device)
    out = torch.full((B, T, HV, V), NAN, dtype=DT[io], device=device)
    y = gdn.decode_multi(got, snaps, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out)
    y_ref = gdn.decode_multi_ref(want, snaps_ref, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
    assert torch.equal(got, start), "decode_multi changed the state"
    assert_close(y, y_ref, DT[io], DT[state], what="o")
    assert_close(snaps, snaps_ref, DT[state], what="snapshots")
    n = rows([T, min(2, T), 0], device)
    gdn.accept_snapshot(got, snaps, n, slots)
    gdn.accept_snapshot_ref(want, snaps_ref, n, slots)
    assert_close(got, want, DT[state], what="state after accept")
    assert torch.equal(got[0], start[0]), "a row that accepted nothing changed its state"
    for t in range(T):
        one = {name: x[:, t] for name, x in inp.items()}
        y_t = gdn.decode(stepped, **one, use_qk_l2norm_in_kernel=True, slots=rows([3, -1, -1], device))
        assert_close(y[0, t], y_t[0], DT[io], DT[state], what=f"draft {t} against one step at a time")
    assert_close(got[3], stepped[3], DT[state], what="accepted state against T steps")


def _decode_args(device):
    state = torch.zeros(3, 4, 8, 16, device=device)
    return state, gdn.random_inputs(2, 2, 4, 16, 8, io_dtype=torch.float32, device=device)


BAD_DECODE = {
    "heads": (lambda s, i: i.update(v=i["v"][:, :3], g=i["g"][:, :3], beta=i["beta"][:, :3]), "multiple of q's H"),
    "k-shape": (lambda s, i: i.update(k=i["k"][:, :, :8]), "k must have the shape of q"),
    "g-shape": (lambda s, i: i.update(g=i["g"][:1]), "g must have shape"),
    "q-int": (lambda s, i: i.update(q=i["q"].int()), "q must be a floating-point tensor"),
    "q-fp64": (lambda s, i: i.update(q=i["q"].double(), k=i["k"].double()), "q must be fp32, bf16 or fp16"),
    "state-shape": (lambda s, i: i.update(state=torch.zeros(3, 4, 8, 8)), "state must have shape"),
    "state-dtype": (lambda s, i: i.update(state=s.double()), "state must be one of fp32, bf16, fp16, fp8, int8"),
    "slots-dtype": (lambda s, i: i.update(slots=torch.zeros(2)), "slots must be int32 or int64"),
    "slots-range": (lambda s, i: i.update(slots=torch.tensor([0, 3], dtype=torch.int32)), "slots must be in"),
    "slots-repeat": (lambda s, i: i.update(slots=torch.tensor([1, 1], dtype=torch.int32)), "must not repeat"),
    "batch-without-slots": (lambda s, i: i.update(**gdn.random_inputs(4, 2, 4, 16, 8, io_dtype=torch.float32)),
                            "batch 4 must not exceed"),
    "scale": (lambda s, i: i.update(scale=-1.0), "scale must be a positive"),
    "out-dtype": (lambda s, i: i.update(out=torch.zeros(2, 4, 8, dtype=torch.bfloat16)), "out must be a"),
}


@pytest.mark.parametrize("case", list(BAD_DECODE))
def test_decode_bad_input(device, case):
    """One ValueError naming the argument, raised before any launch: the state is untouched."""
    state, inp = _decode_args(device)
    BAD_DECODE[case][0](state, inp)
    state = inp.pop("state", state)
    inp = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    before = state.clone()
    with pytest.raises(ValueError, match=BAD_DECODE[case][1]):
        gdn.decode(state, **inp)
    assert torch.equal(state, before)


def test_decode_multi_and_accept_snapshot_bad_input(device):
    state = torch.zeros(3, 4, 8, 16, device=device)
    inp = gdn.random_inputs(2, 2, 4, 16, 8, T=3, io_dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="snapshots must have shape"):
        gdn.decode_multi(state, torch.zeros(3, 2, 4, 8, 16, device=device), **inp)
    with pytest.raises(ValueError, match="snapshots must have the dtype"):
        gdn.decode_multi(state, torch.zeros(3, 3, 4, 8, 16, device=device, dtype=torch.bfloat16), **inp)
    snaps = torch.zeros(3, 3, 4, 8, 16, device=device)
    with pytest.raises(ValueError, match=r"n_accepted must be in \[0, 3\]"):
        gdn.accept_snapshot(state, snaps, rows([1, 4], device))
    with pytest.raises(ValueError, match="n_accepted must be int32 or int64"):
        gdn.accept_snapshot(state, snaps, torch.ones(2, device=device))


def test_kernels_refuse_cpu_tensors_without_the_interpreter(monkeypatch):
    """On the CPU without TRITON_INTERPRET the kernels would fail deep in Triton: a ValueError says why first."""
    from replayssm_kernels import common

    monkeypatch.setattr("triton.runtime.interpreter.InterpretedFunction", type("NotThis", (), {}))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        common.check_device(torch.device("cpu"), object())


@pytest.mark.gpu
def test_decode_qwen_shape_on_gpu(assert_close):
    """The Qwen3.5-122B layer shape (H=16, HV=64, K=V=128) at batch 8, fp32 and bf16 state, bf16 io."""
    B, H, HV, K, V = 8, 16, 64, 128, 128
    for state_dtype in (torch.float32, torch.bfloat16):
        got = (torch.randn(B, HV, V, K, device="cuda") * 0.1).to(state_dtype)
        want = got.clone()
        slots = torch.randperm(B, device="cuda").to(torch.int32)
        for step in range(3):
            inp = gdn.random_inputs(B, H, HV, K, V, device="cuda")
            y = gdn.decode(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
            y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
            assert_close(y, y_ref, torch.bfloat16, state_dtype, what=f"o at step {step}")
        assert_close(got, want, state_dtype, what="state")
