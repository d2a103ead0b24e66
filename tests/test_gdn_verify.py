"""Speculative ReplaySSM Gated DeltaNet: verify + accept against the references and against one token at a time."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from replayssm_kernels import gdn
from replayssm_kernels.gdn.cache import dequantize_read

gdn_verify = importlib.import_module("replayssm_kernels.gdn.verify")
# the fold launch's settings where a row folds in the verify's own programs (a test asking for the launch)
FOLDS = gdn_verify.FoldConfig(rows=128, warps=4, programs_per_sm=4, precision="tf32x3", ksplit=2, stream=False,
                              prefetch=False)


def config(cache, batch: int, fold: dict | None = None, **fields):
    """The VERIFY_LAUNCH row `verify` takes on this cache, with `fields` put in and, given `fold`, its folds in a
    launch of their own with those fields of its FoldConfig."""
    row = gdn_verify.VERIFY_LAUNCH[gdn_verify.select_verify(cache, batch)]
    if fold is not None:
        fields["fold"] = dataclasses.replace(row.fold or FOLDS, **fold)
    return dataclasses.replace(row, **fields)

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, None: None}
NAN = float("nan")


@pytest.fixture(autouse=True)
def one_thread():
    # The references are many tiny ops: with pytest-xdist on two cores, torch's thread pool only contends.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_cache(shape, W, device, *, state="fp32", read=None, io="bf16", max_draft=0, buffer="fp32"):
    nslots, H, HV, K, V = shape
    cache = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype=state, read_dtype=read, io_dtype=io,
                                   max_draft=max_draft, buffer_dtype=buffer, device=device)
    cache.load(torch.randn(nslots, HV, V, K, device=device) * 0.5)
    return cache


def poison(cache) -> None:
    """NaN in every buffer entry: an entry read before it is written (past the fill) turns outputs into NaN."""
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta", "buf_t"):
        if getattr(cache, name) is not None:
            getattr(cache, name).fill_(NAN)


def assert_caches_close(got, want, assert_close):
    """Every cache tensor, including the NaN left in entries neither side has written."""
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert not got.arrivals.any(), "arrival counters not back to zero"
    assert_close(got.checkpoint, want.checkpoint, got.state_dtype, what="checkpoint")
    dtypes = (got.state_dtype,) + ((got.read_dtype,) if got.read_dtype else ())
    if got.read_copy is not None:
        read_got = dequantize_read(got.read_copy, got.read_scale)
        assert_close(read_got, dequantize_read(want.read_copy, want.read_scale), *dtypes, what="read copy")
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta"):
        if getattr(got, name) is not None:
            assert_close(getattr(got, name), getattr(want, name), *dtypes, what=name)


# (state, read copy, io, W, T, key_pass: the key products from a launch of their own (2: each value head's weights too),
# mma: the tile's products on the tensor cores: fp32 tiles in two TF32 passes against 16-bit drafts or three against
# fp32 ones, a 2-byte tile in its own dtype with drafts of the same, an fp8 tile in one; 2: also ksplit=2, the
# products and a fold in K halves, and fold_stages=2, the fold's loop pipelined)
VERIFY_CASES = [
    ("bf16", None, "fp32", 3, 2, 0, 0),
    ("fp32", "fp8", "fp16", 3, 4, 1, 0),
    ("fp32", None, "bf16", 4, 3, 1, 2),
    ("fp32", "fp8", "fp16", 3, 4, 0, 1),
    ("bf16", None, "bf16", 4, 3, 2, 2),
    ("fp32", None, "fp32", 3, 4, 2, 1),
]


@pytest.mark.parametrize("state,read,io,W,T,key_pass,mma", VERIFY_CASES,
                         ids=[f"B3-H2-HV6-K24-V20-W{w}-T{t}-{s}-{r or 'full'}-{i}{'-key-pass' * bool(p)}"
                              f"{'2' * (p == 2)}{'-mma' if m else ''}{'-ksplit2' if m == 2 else ''}"
                              for s, r, i, w, t, p, m in VERIFY_CASES])
def test_verify_accept_matches_reference(device, assert_close, state, read, io, W, T, key_pass, mma):
    """Cycles of verify + accept with random acceptance, fills past W (flush-first verifies) and a replay step
    among them, unwritten entries NaN: outputs every call, then every cache tensor."""
    _verify_cycles(device, assert_close, state, read, io, W, T, key_pass, mma)


@pytest.mark.parametrize("key_pass,mma", [(0, 0), (2, 2)], ids=["key-pass0", "key-pass2-mma-ksplit2"])
def test_verify_accept_with_2_byte_buffers(device, assert_close, key_pass, mma):
    """A bf16 state's cache with its updates and keys buffered in bf16: the same cycles."""
    _verify_cycles(device, assert_close, "bf16", None, "bf16", 4, 3, key_pass, mma, buffer="bf16")


# (state, read copy, io, key_pass, mma as above, the fold launch's fields): items of fewer rows and programs, fp32
# FMAs or 3xTF32, the folds on a second stream, an item's entry loaded ahead, the key products in K halves, the
# drafts' keys from each key head's first value head (arrive False), each program's fill from the weights launch
FOLD_CASES = [
    ("fp32", None, "bf16", 2, 2, {}, {}),
    ("fp32", "fp8", "fp16", 1, 0, {"rows": 8}, {}),
    ("fp32", "bf16", "bf16", 1, 1, {"programs_per_sm": 1, "warps": 1, "stream": True}, {}),
    ("bf16", None, "bf16", 2, 2, {"rows": 16, "precision": "tf32x3", "ksplit": 2}, {"fold_stages": 2}),
    ("fp32", None, "fp16", 0, 0, {"rows": 8, "programs_per_sm": 1, "prefetch": True}, {"arrive": False}),
    ("bf16", None, "fp32", 2, 2, {}, {"arrive": False, "weights_fill": True}),
]


@pytest.mark.parametrize("state,read,io,key_pass,mma,fold,fields", FOLD_CASES,
                         ids=[f"{s}-{r or 'full'}-{i}-key-pass{p}-mma{m}" + "".join(f"-{k}{v}" for k, v in f.items())
                              + "".join(f"-{k}{v}" for k, v in x.items()) for s, r, i, p, m, f, x in FOLD_CASES])
def test_verify_accept_folds_in_a_launch_of_their_own(device, assert_close, state, read, io, key_pass, mma, fold,
                                                     fields):
    """`_verify_list_kernel` lists the heads that fold and `_verify_fold_kernel` folds them before the verify; the
    same cycles, flush-first verifies among them."""
    _verify_cycles(device, assert_close, state, read, io, 4, 3, key_pass, mma, fold=fold, **fields)


# (state, W, the fold launch's fields or None for folds in the verify, fold_window)
EVERY_ROW_CASES = [
    ("fp32", 4, {"programs_per_sm": 1, "prefetch": False}, 0), ("fp32", 16, {"programs_per_sm": 2}, 1),
    ("fp32", 16, {"programs_per_sm": 2}, 2), ("bf16", 16, None, 2),
]


@pytest.mark.parametrize("state,W,fold,window", EVERY_ROW_CASES,
                         ids=[f"{s}-W{w}-" + ("own-folds" if f is None else "fold-launch" + "".join(
                             f"-{k}{v}" for k, v in f.items())) + f"-fold-window{x}" for s, w, f, x in EVERY_ROW_CASES])
def test_fold_launch_takes_every_row_at_once(device, assert_close, state, W, fold, window):
    """Every row of a permuted slot table folds in the same verify, in items of 8 rows, each program (one or two on
    the CPU) taking items of several rows and heads in turn; at W = 16 the rows' fills W to W + 3 (with fold_window
    a fill of W in a product over 16 entries, past it over 32, or with 2 over 16 and the rest one by one; without a
    fold launch the same in the verify's own fold): outputs, then every cache tensor."""
    T, (B, H, HV, K, V) = 4, (4, 2, 4, 16, 20)
    got = make_cache((6, H, HV, K, V), W, device, state=state, max_draft=T)
    poison(got)
    want = got.clone()
    slots = torch.tensor([4, 1, 5, 0], dtype=torch.int32, device=device)
    if fold is None:
        cfg = config(got, B, key_pass=2, mma=True, fold=None, fold_window=window)
        cfg = dataclasses.replace(cfg, fold=None, arrive=True)
    else:
        cfg = config(got, B, key_pass=2, mma=True, fold={"precision": "ieee", "ksplit": 1, "rows": 8, **fold},
                     fold_window=window)
    for _ in range(W - 1):
        inp = gdn.random_inputs(B, H, HV, K, V, device=device)
        gdn.replay(got, **inp, slots=slots)
        gdn.replay_ref(want, **inp, slots=slots)
    for step in range(2):
        inp = gdn.random_inputs(B, H, HV, K, V, T=T, device=device)
        out = torch.full((B, T, HV, V), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.verify(got, **inp, slots=slots, out=out, config=cfg)
        y_ref = gdn.verify_ref(want, **inp, slots=slots)
        assert_close(y, y_ref, torch.bfloat16, DT[state], what=f"o at step {step}")
        if step == 0:
            n = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=device)
            gdn.accept(got, n, slots)
            gdn.accept_ref(want, n, slots)
            assert got.fill[slots.long(), 0].tolist() == [W, W + 1, W + 2, W + 3]
    assert_caches_close(got, want, assert_close)
    assert_close(gdn.materialize(got), gdn.materialize_ref(want), DT[state], what="materialized state")


@pytest.mark.parametrize("state,io,key_pass,mma", [("fp32", "bf16", 2, 2), ("bf16", "fp32", 1, 1)],
                         ids=["fp32-bf16-key-pass2-mma-ksplit2", "bf16-fp32-key-pass1-mma"])
def test_verify_accept_folds_in_the_verify(device, assert_close, state, io, key_pass, mma):
    """No fold launch, with the key-product pass (the small grids' rows): each folding row's verify program folds
    first."""
    _verify_cycles(device, assert_close, state, None, io, 4, 3, key_pass, mma, own_folds=True)


def _verify_cycles(device, assert_close, state, read, io, W, T, key_pass, mma, buffer="fp32", fold=None,
                   own_folds=False, **fields):
    B, H, HV, K, V = 3, 2, 6, 24, 20
    got = make_cache((5, H, HV, K, V), W, device, state=state, read=read, io=io, max_draft=T, buffer=buffer)
    assert got.buf_u.dtype == got.buf_k.dtype == DT[buffer]
    poison(got)
    want = got.clone()
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    gen = torch.Generator().manual_seed(1)
    fills = []
    for step in range(7):
        if step == 4:
            inp = gdn.random_inputs(B, H, HV, K, V, io_dtype=DT[io], device=device)
            out = torch.full((B, HV, V), NAN, dtype=DT[io], device=device)
            y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out)
            y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        else:
            inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=DT[io], device=device)
            out = torch.full((B, T, HV, V), NAN, dtype=DT[io], device=device)
            cfg = config(got, B, fold=fold, **{"key_pass": key_pass, "mma": bool(mma), "ksplit": max(mma, 1),
                                               "fold_stages": max(mma, 1), **fields})
            if own_folds:
                cfg = dataclasses.replace(cfg, fold=None, arrive=True)
            y = gdn.verify(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, config=cfg)
            y_ref = gdn.verify_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
            n = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32).to(device)
            n[0] = T if step % 2 else n[0]
            gdn.accept(got, n, slots)
            gdn.accept_ref(want, n, slots)
        assert_close(y, y_ref, DT[io], DT[state], *([DT[read]] if read else []), what=f"o at step {step}")
        fills.append(int(got.fill[3, 0]))
    assert max(fills) >= W, f"no verify flushed first (fills {fills})"
    assert_caches_close(got, want, assert_close)
    assert_close(gdn.materialize(got), gdn.materialize_ref(want), DT[state], what="materialized state")


@pytest.mark.parametrize("read", [None, "bf16"], ids=["B2-H1-HV3-K16-V12-W5-T3-fp32-full-fp32",
                                                     "B2-H1-HV3-K16-V12-W5-T3-fp32-bf16-fp32"])
def test_speculative_equals_one_token_at_a_time(device, assert_close, read):
    """The accepted drafts' outputs and the state after them equal replaying those tokens one step at a time."""
    B, H, HV, K, V, W, T = 2, 1, 3, 16, 12, 5, 3
    spec = make_cache((B, H, HV, K, V), W, device, read=read, io="fp32", max_draft=T)
    single = spec.clone()
    exact = gdn.materialize(spec).double()
    gen = torch.Generator().manual_seed(2)
    for cycle in range(5):
        inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.float32, device=device)
        y = gdn.verify(spec, **inp, use_qk_l2norm_in_kernel=True)
        n = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32).to(device)
        gdn.accept(spec, n)
        for t in range(T):
            live = torch.tensor([b if t < n[b] else -1 for b in range(B)], dtype=torch.int32, device=device)
            one = {name: x[:, t] for name, x in inp.items()}
            y_one = gdn.replay(single, **one, use_qk_l2norm_in_kernel=True, slots=live)
            y_exact = gdn.decode_ref(exact, **{k: x.double() for k, x in one.items()}, use_qk_l2norm_in_kernel=True,
                                     slots=live)
            ok = live >= 0
            dtypes = (torch.float32,) + ((torch.bfloat16,) if read else ())
            assert_close(y[ok, t], y_one[ok], *dtypes, what=f"draft {t} of cycle {cycle} against one step")
            assert_close(y[ok, t], y_exact[ok], *dtypes, what=f"draft {t} of cycle {cycle} against fp64")
    assert_close(gdn.materialize(spec), gdn.materialize(single), torch.float32, what="state")
    assert_close(gdn.materialize(spec), exact, torch.float32, what="state against fp64")


def test_verify_twice_before_accept_overwrites_the_drafts(device, assert_close):
    """A second verify (with fills past W) replaces the first one's drafts: accept commits the second's."""
    B, H, HV, K, V, W, T = 2, 1, 2, 8, 8, 3, 2
    got = make_cache((B, H, HV, K, V), W, device, io="fp32", max_draft=T)
    want = got.clone()
    for n in (2, 2):
        for cache, verify, accept in ((got, gdn.verify, gdn.accept), (want, gdn.verify_ref, gdn.accept_ref)):
            verify(cache, **gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.float32, device=device,
                                              generator=torch.Generator().manual_seed(n)))
            accept(cache, torch.full((B,), n, dtype=torch.int32, device=device))
    assert int(got.fill[0, 0]) == 4
    for seed in (5, 6):
        inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.float32, device=device,
                                generator=torch.Generator().manual_seed(seed))
        assert_close(gdn.verify(got, **inp), gdn.verify_ref(want, **inp), torch.float32, what=f"verify {seed}")
    n = torch.tensor([1, 2], dtype=torch.int32, device=device)
    gdn.accept(got, n)
    gdn.accept_ref(want, n)
    assert_caches_close(got, want, assert_close)


# Beyond the shipped rows: the tile in 16-row chunks in one-warp programs, and 64-row chunks with the key pass and
# the tensor cores, through a read copy's rounds that flush first
CONFIGS = [{"chunk": 16, "warps": 1}, {"chunk": 64, "key_pass": 1, "mma": True, "ksplit": 2, "warps": 2}]


@pytest.mark.parametrize("fields", CONFIGS, ids=["chunk16-warps1", "chunk64-key-pass-mma-ksplit2-warps2"])
def test_verify_launch_settings_match_reference(device, assert_close, fields):
    """Other chunkings of the tile, the flush and the K pieces give the reference's outputs and cache, flushes first
    included (B2-H1-HV2-K40-V24-W3-T2-fp32-bf16-fp32)."""
    B, H, HV, K, V, W, T = 2, 1, 2, 40, 24, 3, 2
    got = make_cache((3, H, HV, K, V), W, device, read="bf16", io="fp32", max_draft=T)
    poison(got)
    want = got.clone()
    slots = torch.tensor([2, 0], dtype=torch.int32, device=device)
    fills = []
    for step in range(4):
        inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.float32, device=device)
        out = torch.full((B, T, HV, V), NAN, device=device)
        y = gdn.verify(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out,
                       config=config(got, B, **fields))
        y_ref = gdn.verify_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        assert_close(y, y_ref, torch.float32, torch.bfloat16, what=f"o at step {step}")
        n = torch.tensor([T, step % (T + 1)], dtype=torch.int32, device=device)
        gdn.accept(got, n, slots)
        gdn.accept_ref(want, n, slots)
        fills.append(int(got.fill[2, 0]))
    assert any(b < a for a, b in zip(fills, fills[1:])), f"no verify flushed first (fills {fills})"
    assert_caches_close(got, want, assert_close)


def test_verify_and_replay_take_their_small_grid_rows_under_two_programs_per_sm(monkeypatch):
    """The launch row follows the grid: batch x HV programs under two per SM take the -small row, under 16 the verify's
    and a read copy's replay their -medium rows, a read copy its own."""
    gdn_replay = importlib.import_module("replayssm_kernels.gdn.replay")
    monkeypatch.setattr(importlib.import_module("replayssm_kernels.common"), "sm_count", lambda device: 132)
    cache = gdn.ReplayCache.create(64, 1, 64, 8, 8, 4, state_dtype="fp32", io_dtype="bf16", max_draft=2, device="cpu")
    split = gdn.ReplayCache.create(64, 1, 64, 8, 8, 4, state_dtype="fp32", read_dtype="bf16", io_dtype="bf16",
                                   max_draft=2, device="cpu")
    fp8 = gdn.ReplayCache.create(64, 1, 64, 8, 8, 4, state_dtype="fp32", read_dtype="fp8", io_dtype="bf16",
                                 device="cpu")
    select, select_verify = gdn_replay.select, gdn_verify.select_verify
    assert [select_verify(cache, b) for b in (4, 5, 32, 33)] == ["verify-small", "verify-medium", "verify-medium",
                                                                "verify"]
    assert [select(cache, b) for b in (4, 5, 33)] == ["replay-small", "replay", "replay"]
    assert select_verify(split, 1) == "verify-split"
    # a copy's staggered flushes on medium grids take items of fewer rows than a head's
    assert [select(split, b) for b in (4, 5, 33)] == ["replay-split-small", "replay-split-medium", "replay-split"]
    assert [select(fp8, b) for b in (4, 5, 33)] == ["replay-fp8-small", "replay-fp8-medium", "replay-fp8"]
    # an 8-bit checkpoint takes the fp8 copy's rows, on a large grid at its own register cap
    int8 = gdn.ReplayCache.create(64, 1, 64, 8, 8, 4, state_dtype="int8", io_dtype="bf16", device="cpu")
    assert [select(int8, b) for b in (4, 5, 33)] == ["replay-fp8-small", "replay-fp8-medium", "replay-q8"]
    monkeypatch.undo()
    assert select_verify(cache, 1) == "verify" and select(split, 1) == "replay-split"


def test_verify_and_accept_bad_input(device):
    cache = make_cache((3, 1, 2, 8, 8), 4, device, io="fp32", max_draft=2)
    with pytest.raises(ValueError, match="verify takes 1 to the cache's max_draft=2"):
        gdn.verify(cache, **gdn.random_inputs(2, 1, 2, 8, 8, T=3, io_dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="max_draft=0"):
        gdn.verify(make_cache((3, 1, 2, 8, 8), 4, device, io="fp32"),
                   **gdn.random_inputs(2, 1, 2, 8, 8, T=1, io_dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="q must have shape"):
        gdn.verify(cache, **gdn.random_inputs(2, 1, 2, 8, 8, io_dtype=torch.float32, device=device))
    gdn.verify(cache, **gdn.random_inputs(2, 1, 2, 8, 8, T=2, io_dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match=r"n_accepted must be in \[0, 2\]"):
        gdn.accept(cache, torch.tensor([3, 0], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"slots must have shape \(3,\)"):
        gdn.accept(cache, torch.tensor([1, 0, 1], dtype=torch.int32, device=device),
                   torch.tensor([0, 1], dtype=torch.int32, device=device))
    assert not cache.fill.any()
    inp = gdn.random_inputs(2, 1, 2, 8, 8, T=2, io_dtype=torch.float32, device=device)
    split = make_cache((3, 1, 2, 8, 8), 4, device, read="bf16", io="fp32", max_draft=2)
    for got, fields in ((split, {"mma": True, "key_pass": 2}), (cache, {"mma": False, "key_pass": 2})):
        before = got.clone()
        with pytest.raises(ValueError, match="key_pass 2 .* takes mma and no read copy"):
            gdn.verify(got, **inp, config=config(got, 2, **fields))
        assert torch.equal(got.checkpoint, before.checkpoint) and torch.equal(got.fill, before.fill)


@pytest.mark.gpu
@pytest.mark.parametrize("fields", [{}, {"key_pass": 1, "weights_fill": False}, {"fold": None, "arrive": True},
                                    {"fold_window": 1}, {"fold_window": 0}],
                         ids=["row", "key-pass1", "own-folds", "fold-window1", "fold-window0"])
def test_verify_qwen_shape_on_gpu(assert_close, fields):
    """The Qwen3.5-122B layer shape, T = 4, fills crossing W, against the references."""
    shape = (4, 16, 64, 128, 128)
    got = make_cache(shape, 16, "cuda", max_draft=4)
    want = got.clone()
    slots = torch.tensor([2, 0, -1, 3], dtype=torch.int32, device="cuda")
    for step in range(8):
        inp = gdn.random_inputs(4, 16, 64, 128, 128, T=4, device="cuda")
        out = torch.full_like(inp["v"], NAN)
        y = gdn.verify(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, config=config(got, 4, **fields))
        y_ref = gdn.verify_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        ok = slots >= 0
        assert_close(y[ok], y_ref[ok], torch.bfloat16, what=f"o at step {step}")
        n = torch.randint(0, 5, (4,), dtype=torch.int32, device="cuda")
        gdn.accept(got, n, slots)
        gdn.accept_ref(want, n, slots)
    assert_close(gdn.materialize(got), gdn.materialize_ref(want), torch.float32, what="state")
