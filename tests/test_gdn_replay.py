"""ReplaySSM Gated DeltaNet step: against its reference and conventional decode; the cache's slot operations."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from replayssm_kernels import gdn
from replayssm_kernels.gdn.cache import dequantize_read

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, None: None}
NAN = float("nan")
gdn_replay = importlib.import_module("replayssm_kernels.gdn.replay")


@pytest.fixture(autouse=True)
def one_thread():
    # The references are many tiny ops: with pytest-xdist on two cores, torch's thread pool only contends.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_cache(shape, W, device, *, state="fp32", read=None, io="bf16", max_draft=0, load=True, buffer="fp32"):
    nslots, H, HV, K, V = shape
    cache = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype=state, read_dtype=read, io_dtype=io,
                                   max_draft=max_draft, buffer_dtype=buffer, device=device)
    if load:
        cache.load(torch.randn(nslots, HV, V, K, device=device) * 0.5)
    return cache


def poison(cache) -> None:
    """NaN in every buffer entry: an entry read before it is written (past the fill) turns outputs into NaN."""
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta", "buf_t"):
        if getattr(cache, name) is not None:
            getattr(cache, name).fill_(NAN)


def staggered(slots: list[int], step: int, device) -> torch.Tensor:
    """Row r joins at step r, so the rows' fills (and flushes) are r steps apart."""
    return torch.tensor([s if step >= r else -1 for r, s in enumerate(slots)], dtype=torch.int32, device=device)


def read_values(cache) -> torch.Tensor:
    return dequantize_read(cache.read_copy, cache.read_scale)


def assert_caches_close(got, want, assert_close):
    """Every cache tensor, including the NaN left in entries neither side has written."""
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert_close(got.checkpoint, want.checkpoint, got.state_dtype, what="checkpoint")
    if got.read_copy is not None:
        assert_close(read_values(got), read_values(want), got.read_dtype, got.state_dtype, what="read copy")
    dtypes = (got.state_dtype,) + ((got.read_dtype,) if got.read_dtype else ())
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta"):
        if getattr(got, name) is not None:
            assert_close(getattr(got, name), getattr(want, name), *dtypes, what=name)
    assert not got.arrive.any(), "row-block arrival counters not back to zero"
    assert not got.work[:2].any(), "the flush list's counters not back to zero"
    if got.arrivals is not None:
        assert not got.arrivals.any(), "arrival counters not back to zero"


# (state, read copy, io, W, the buffered updates' and keys' dtype: fp32 or a 2-byte state's own)
REF_CASES = [
    ("fp32", None, "bf16", 4, "fp32"),
    ("bf16", None, "fp16", 3, "fp32"),
    ("fp16", None, "fp32", 5, "fp32"),
    ("fp32", "bf16", "bf16", 4, "fp32"),
    ("fp32", "fp16", "fp32", 2, "fp32"),
    ("fp32", "fp8", "bf16", 4, "fp32"),
    ("bf16", "fp8", "fp16", 1, "fp32"),
    ("bf16", None, "bf16", 3, "bf16"),
    ("fp16", "fp8", "fp16", 2, "fp16"),
]


@pytest.mark.parametrize("state,read,io,W,buffer", REF_CASES,
                         ids=[f"B3-H2-HV6-K24-V20-W{w}-{s}-{r or 'full'}-{i}" + (f"-buffers-{b}" if b != "fp32" else "")
                              for s, r, i, w, b in REF_CASES])
def test_replay_matches_reference(device, assert_close, state, read, io, W, buffer):
    """Staggered rows over 2W + 2 steps, unwritten entries NaN: outputs every step, then every cache tensor."""
    shape = (5, 2, 6, 24, 20)
    got = make_cache(shape, W, device, state=state, read=read, io=io, buffer=buffer)
    assert got.buf_u.dtype == got.buf_k.dtype == got.buffer_dtype == DT[buffer]
    poison(got)
    want = got.clone()
    slots = [3, 0, 4]
    for step in range(2 * W + 2):
        inp = gdn.random_inputs(3, 2, 6, 24, 20, io_dtype=DT[io], device=device)
        rows = staggered(slots, step, device)
        out = torch.full((3, 6, 20), NAN, dtype=DT[io], device=device)
        y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=rows, out=out)
        y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        assert_close(y, y_ref, DT[io], DT[state], *([DT[read]] if read else []), what=f"o at step {step}")
    assert_caches_close(got, want, assert_close)
    assert_close(gdn.materialize(got), gdn.materialize_ref(want), DT[state], what="materialized state")
    subset = torch.tensor([4, 1], device=device)
    assert_close(gdn.materialize(got, subset), gdn.materialize_ref(want, subset), DT[state], what="materialized subset")


# Beyond the shipped rows (tests/test_launch_rows.py): a non-flush step's tile streamed in chunks (narrower K
# pieces), a head's rows over five programs counting their arrivals lane by lane, a flush launch's items of fewer rows.
_R = gdn_replay.REPLAY_LAUNCH
VARIANTS = [
    ("chunks", "bf16", dataclasses.replace(_R["replay"], chunk=8, piece=4)),
    ("chunks-two-launch", "fp8", dataclasses.replace(_R["replay-fp8"], chunk=16, piece=8)),
    ("rows4-lane-count", None, dataclasses.replace(_R["replay-small"], rows=4, chunk=4, piece=8)),
    ("flush-items8", "fp16", dataclasses.replace(_R["replay-split"], rows=16, chunk=16, piece=8,
                                                 flush=dataclasses.replace(_R["replay-split"].flush, rows=8))),
]


@pytest.mark.parametrize("read,config", [v[1:] for v in VARIANTS],
                         ids=[f"B3-H2-HV4-K24-V20-W3-fp32-{v[1] or 'full'}-{v[0]}" for v in VARIANTS])
def test_replay_launch_variants_match_reference(device, assert_close, read, config):
    """Staggered rows through flushes, from NaN-poisoned buffers, against the reference."""
    _replay_staggered((4, 2, 4, 24, 20), 5, "fp32", read, config, device, assert_close)


def _replay_staggered(shape, steps, state, read, config, device, assert_close):
    """`steps` steps (W = 3) of three staggered rows from NaN-poisoned buffers: every output, then every cache
    tensor, against the reference."""
    _, H, HV, K, V = shape
    got = make_cache(shape, 3, device, state=state, read=read)
    poison(got)
    want = got.clone()
    slots = [2, 0, 3]
    for step in range(steps):
        inp = gdn.random_inputs(3, H, HV, K, V, device=device)
        rows = staggered(slots, step, device)
        out = torch.full((3, HV, V), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=rows, out=out, config=config)
        y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, DT[state], *([DT[read]] if read else []), what=f"o at step {step}")
    assert_caches_close(got, want, assert_close)


@pytest.mark.parametrize("W", [1, 4, 7], ids=[f"B3-H1-HV2-K12-V10-W{w}-fp32-fp32" for w in (1, 4, 7)])
def test_replay_equals_conventional(device, assert_close, W):
    """k·W + r steps (k = 2, r = 3), staggered: replay and conventional decode both match an fp64 decode."""
    nslots, H, HV, K, V = 4, 1, 2, 12, 10
    start = torch.randn(nslots, HV, V, K, device=device)
    cache = make_cache((nslots, H, HV, K, V), W, device, io="fp32", load=False)
    cache.load(start)
    conv = start.clone()
    exact = start.double()
    slots = [2, 0, 3]
    for step in range(2 * W + 3):
        inp = gdn.random_inputs(3, H, HV, K, V, io_dtype=torch.float32, device=device)
        rows = staggered(slots, step, device)
        y = gdn.replay(cache, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        y_conv = gdn.decode(conv, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        y_exact = gdn.decode_ref(exact, **{k: v.double() for k, v in inp.items()}, use_qk_l2norm_in_kernel=True,
                                 slots=rows)
        live = rows >= 0
        assert_close(y[live], y_exact[live], torch.float32, what=f"replay o at step {step}")
        assert_close(y_conv[live], y_exact[live], torch.float32, what=f"conventional o at step {step}")
    assert_close(gdn.materialize(cache), exact, torch.float32, what="materialized state")
    assert_close(gdn.materialize(cache), conv, torch.float32, what="materialized vs conventional state")


def test_default_slots_are_the_rows(device, assert_close):
    """Without slots, row b uses slot b."""
    got = make_cache((2, 1, 2, 8, 16), 2, device, io="fp32")
    want = got.clone()
    for step in range(3):
        inp = gdn.random_inputs(2, 1, 2, 8, 16, io_dtype=torch.float32, device=device)
        assert_close(gdn.replay(got, **inp), gdn.replay_ref(want, **inp), torch.float32, what=f"o at step {step}")
    assert_caches_close(got, want, assert_close)


def test_rows_flush_on_their_own_step(device):
    """W = 3, rows at fills 0, 1, 2: each row's checkpoint changes only on the step that fills its buffer."""
    cache = make_cache((3, 1, 2, 8, 8), 3, device)
    for row_slots in ([2], [1, 2]):
        inp = gdn.random_inputs(len(row_slots), 1, 2, 8, 8, device=device)
        gdn.replay(cache, **inp, slots=torch.tensor(row_slots, dtype=torch.int32, device=device))
    assert cache.fill[:, 0].tolist() == [0, 1, 2]
    rows = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    for step in range(4):
        before_fill, before_ck = cache.fill[:, 0].tolist(), cache.checkpoint.clone()
        gdn.replay(cache, **gdn.random_inputs(3, 1, 2, 8, 8, device=device), slots=rows)
        for s in range(3):
            flushed = before_fill[s] == 2
            assert int(cache.fill[s, 0]) == (0 if flushed else before_fill[s] + 1)
            assert torch.equal(cache.fill[s], cache.fill[s, :1].expand(2)), "heads of a slot disagree on the fill"
            changed = not torch.equal(cache.checkpoint[s], before_ck[s])
            assert changed == flushed, f"step {step}, slot {s}: checkpoint changed={changed}, flushed={flushed}"


def test_reset_leaves_nothing_of_the_old_request(device):
    """A request in a reset slot gives bit-for-bit the outputs it gives in a fresh cache."""
    shape = (3, 2, 4, 10, 6)
    used = make_cache(shape, 4, device, read="bf16", load=False)
    fresh = make_cache(shape, 4, device, read="bf16", load=False)
    slot = torch.tensor([1], dtype=torch.int32, device=device)
    for _ in range(6):
        gdn.replay(used, **gdn.random_inputs(1, 2, 4, 10, 6, device=device), slots=slot)
    assert int(used.fill[1, 0]) == 2 and used.checkpoint[1].abs().sum() > 0
    used.reset(slot)
    for step in range(5):
        inp = gdn.random_inputs(1, 2, 4, 10, 6, device=device)
        y_used = gdn.replay(used, **inp, slots=slot)
        y_fresh = gdn.replay(fresh, **inp, slots=slot)
        assert torch.equal(y_used, y_fresh), f"step {step}: the old request leaked into the reset slot"


def test_move_keeps_outputs(device, assert_close):
    """Moving a request mid-window keeps its outputs bit for bit; materialize + load keeps them within tolerance."""
    shape = (4, 1, 2, 10, 6)
    cache = make_cache(shape, 3, device, read="fp8")
    rows = torch.tensor([1, 3], dtype=torch.int32, device=device)
    for _ in range(4):
        gdn.replay(cache, **gdn.random_inputs(2, 1, 2, 10, 6, device=device), slots=rows)
    stay, moved, reloaded = cache.clone(), cache.clone(), cache.clone()
    moved.move(torch.tensor([1], device=device), torch.tensor([0], device=device))
    assert int(moved.fill[1, 0]) == 0 and moved.checkpoint[1].abs().sum() == 0
    reloaded.load(gdn.materialize(cache, torch.tensor([1], device=device)), torch.tensor([2], device=device))
    for step in range(3):
        inp = gdn.random_inputs(2, 1, 2, 10, 6, device=device)
        y_stay = gdn.replay(stay, **inp, slots=rows)
        y_moved = gdn.replay(moved, **inp, slots=torch.tensor([0, 3], dtype=torch.int32, device=device))
        y_reloaded = gdn.replay(reloaded, **inp, slots=torch.tensor([2, 3], dtype=torch.int32, device=device))
        assert torch.equal(y_moved, y_stay), f"step {step}: a moved request changed its outputs"
        assert_close(y_reloaded, y_stay, torch.bfloat16, torch.float8_e4m3fn, what=f"reloaded o at step {step}")
    assert torch.equal(gdn.materialize(moved, torch.tensor([0], device=device)),
                       gdn.materialize(stay, torch.tensor([1], device=device)))


def test_load_then_materialize_gives_the_state_back(device, assert_close):
    state = torch.randn(2, 4, 6, 10, device=device)
    for dtype, read in (("fp32", None), ("bf16", "fp8")):
        cache = make_cache((3, 2, 4, 10, 6), 4, device, state=dtype, read=read, load=False)
        cache.load(state, torch.tensor([2, 0], device=device))
        got = gdn.materialize(cache, torch.tensor([2, 0], device=device))
        assert torch.equal(got, state.to(DT[dtype]).float()), f"{dtype} checkpoint"
        assert not cache.fill.any()


def test_padding_rows_touch_nothing(device):
    """Rows with slot -1 leave every cache tensor of every other slot, and their output rows, untouched."""
    cache = make_cache((4, 1, 2, 8, 8), 2, device, read="bf16")
    rows = torch.tensor([-1, 2, -1], dtype=torch.int32, device=device)
    before = cache.clone()
    for _ in range(3):
        out = torch.full((3, 2, 8), NAN, dtype=torch.bfloat16, device=device)
        gdn.replay(cache, **gdn.random_inputs(3, 1, 2, 8, 8, device=device), slots=rows, out=out)
        assert out[[0, 2]].isnan().all() and not out[1].isnan().any()
    for name, t in cache.tensors().items():
        keep = [0, 1, 3]
        assert torch.equal(t[keep], before.tensors()[name][keep]), f"{name} of a slot in no row changed"
    assert not torch.equal(cache.checkpoint[2], before.checkpoint[2])


def _bad_replay(device):
    cache = make_cache((3, 2, 4, 8, 8), 4, device, load=False)
    return cache, gdn.random_inputs(2, 2, 4, 8, 8, device=device)


BAD_REPLAY = {
    "q-io-dtype": (lambda i: i.update(q=i["q"].float()), "q must be torch.bfloat16 like the cache's io_dtype"),
    "key-heads": (lambda i: i.update(q=i["q"][:, :1], k=i["k"][:, :1]), "but the cache has"),
    "v-shape": (lambda i: i.update(v=i["v"][:, :, :4]), "but the cache has"),
    "beta-shape": (lambda i: i.update(beta=i["beta"][:, :2]), "beta must have shape"),
    "slots-range": (lambda i: i.update(slots=torch.tensor([0, 7], dtype=torch.int32)), "slots must be in"),
    "batch-without-slots": (lambda i: i.update(**gdn.random_inputs(4, 2, 4, 8, 8)), "batch 4 must not exceed"),
    "out-shape": (lambda i: i.update(out=torch.zeros(2, 4, 7, dtype=torch.bfloat16)), "out must be a"),
    "config-correction-no-copy": (lambda i: i.update(config=dataclasses.replace(_R["replay"], correction="tf32")),
                                  "correction 'tf32' .* applies only to a bf16 or fp16 read copy; this cache has no "
                                  "read copy"),
    "config-tf32-fp32": (lambda i: i.update(config=dataclasses.replace(_R["replay"], precision="tf32")),
                         "'tf32' .* applies only to a 2-byte checkpoint"),
}


@pytest.mark.parametrize("case", list(BAD_REPLAY))
def test_replay_bad_input(device, case):
    """One ValueError naming the argument, raised before any launch: the cache is untouched."""
    cache, inp = _bad_replay(device)
    BAD_REPLAY[case][0](inp)
    inp = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    before = cache.clone()
    with pytest.raises(ValueError, match=BAD_REPLAY[case][1]):
        gdn.replay(cache, **inp)
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name])


BAD_CREATE = {
    "window-0": (dict(window=0), "window must be an integer in"),
    "window-65": (dict(window=65), "window must be an integer in"),
    "max-draft": (dict(max_draft=9), "max_draft must be"),
    "read-dtype": (dict(read_dtype="fp32"), "read_dtype must be one of bf16, fp16, fp8"),
    "read-not-narrower": (dict(state_dtype="bf16", read_dtype="fp16"), "must be narrower"),
    "state-dtype": (dict(state_dtype=torch.float64), "state_dtype must be one of"),
    "buffer-narrower": (dict(buffer_dtype="bf16"), "buffer_dtype must be fp32 or the state dtype"),
    "buffer-other": (dict(state_dtype="fp16", buffer_dtype="bf16"), "buffer_dtype must be fp32 or the state dtype"),
    "buffer-fp8": (dict(buffer_dtype="fp8"), "buffer_dtype must be one of fp32, bf16, fp16"),
    "heads": (dict(HV=3), "HV=3 must be a multiple of H=2"),
    "K": (dict(K=320), "at most 256"),
}


@pytest.mark.parametrize("case", list(BAD_CREATE))
def test_cache_bad_arguments(device, case):
    kwargs = dict(nslots=2, H=2, HV=4, K=8, V=8, window=4, state_dtype="fp32", io_dtype="bf16", device=device)
    kwargs.update(BAD_CREATE[case][0])
    with pytest.raises(ValueError, match=BAD_CREATE[case][1]):
        gdn.ReplayCache.create(**kwargs)


def test_cache_slot_operations_check_slots(device):
    cache = make_cache((3, 1, 2, 8, 8), 2, device, load=False)
    with pytest.raises(ValueError, match="slots must be in"):
        cache.reset(torch.tensor([3], device=device))
    with pytest.raises(ValueError, match="state must have shape"):
        cache.load(torch.zeros(2, 2, 8, 8, device=device), torch.tensor([0], device=device))
    with pytest.raises(ValueError, match="must not share"):
        cache.move(torch.tensor([0], device=device), torch.tensor([0], device=device))
    with pytest.raises(ValueError, match="cache must be a ReplayCache"):
        gdn.replay(None, **gdn.random_inputs(1, 1, 2, 8, 8, device=device))


@pytest.mark.gpu
def test_replay_loop_in_cuda_graph():
    """Two windows of replay steps at the Qwen3.5 shape captured once (fills on the device) equal the eager loop."""
    device = "cuda"
    shape = (8, 16, 64, 128, 128)
    W = 4
    eager = make_cache(shape, W, device, read="bf16")
    graphed = eager.clone()
    rows = torch.tensor([7, 0, -1, 3], dtype=torch.int32, device=device)
    for s, lead in ((7, 1), (0, 2), (3, 3)):
        for _ in range(lead):
            inp = gdn.random_inputs(1, 16, 64, 128, 128, device=device)
            one = torch.tensor([s], dtype=torch.int32, device=device)
            gdn.replay(eager, **inp, use_qk_l2norm_in_kernel=True, slots=one)
            gdn.replay(graphed, **inp, use_qk_l2norm_in_kernel=True, slots=one)
    steps = [gdn.random_inputs(4, 16, 64, 128, 128, device=device) for _ in range(2 * W)]
    ys_eager = [gdn.replay(eager, **inp, use_qk_l2norm_in_kernel=True, slots=rows) for inp in steps]
    warm = graphed.clone()
    gdn.replay(warm, **steps[0], use_qk_l2norm_in_kernel=True, slots=rows, check=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [gdn.replay(graphed, **inp, use_qk_l2norm_in_kernel=True, slots=rows) for inp in steps]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(ys, ys_eager):
        torch.testing.assert_close(a[[0, 1, 3]], b[[0, 1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(graphed.checkpoint, eager.checkpoint, rtol=0, atol=0)
    torch.testing.assert_close(graphed.fill, eager.fill, rtol=0, atol=0)


@pytest.mark.gpu
def test_replay_qwen_shape_on_gpu(assert_close):
    """The Qwen3.5-122B layer shape, staggered rows over a window and a half, against the reference."""
    shape = (6, 16, 64, 128, 128)
    for read in (None, "bf16", "fp8"):
        got = make_cache(shape, 16, "cuda", read=read)
        want = got.clone()
        rows = torch.tensor([5, 1, 3, -1], dtype=torch.int32, device="cuda")
        for step in range(24):
            live = torch.tensor([s if step >= 5 * r else -1 for r, s in enumerate(rows.tolist())],
                                dtype=torch.int32, device="cuda")
            inp = gdn.random_inputs(4, 16, 64, 128, 128, device="cuda")
            y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=live)
            y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=live)
            ok = live >= 0
            dtypes = (torch.bfloat16,) + ((DT[read],) if read else ())
            assert_close(y[ok], y_ref[ok], *dtypes, what=f"{read} o at step {step}")
        assert_close(gdn.materialize(got), gdn.materialize_ref(want), torch.float32, what=f"{read} state")
