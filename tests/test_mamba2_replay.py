"""ReplaySSM Mamba-2 step: against its reference, against conventional decode, and the cache's slot operations."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from replayssm_kernels import common, mamba2
from replayssm_kernels.common import LIST_ENTRY, LIST_HEADER
from replayssm_kernels.mamba2.replay import STEP_LAUNCH, StepConfig

replay_mod = importlib.import_module("replayssm_kernels.mamba2.replay")

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, None: None}
NAN = float("nan")


def make_cache(shape, W, device, *, state="fp32", read=None, io="bf16", max_draft=0, load=True):
    nslots, H, P, N, G = shape
    cache = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype=state, read_dtype=read, io_dtype=io,
                                      max_draft=max_draft, device=device)
    if load:
        cache.load(torch.randn(nslots, H, P, N, device=device))
    return cache


def poison(cache) -> None:
    """NaN in every buffer entry: an entry read before it is written (past the fill) turns outputs into NaN."""
    for name in ("x_buf", "b_buf", "dt_buf", "lam_buf"):
        getattr(cache, name).fill_(NAN)


def staggered(slots: list[int], step: int, device) -> torch.Tensor:
    """Row r joins at step r, so the rows' fills (and flushes) are r steps apart."""
    return torch.tensor([s if step >= r else -1 for r, s in enumerate(slots)], dtype=torch.int32, device=device)


def assert_caches_close(got, want, assert_close):
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert not got.arrive.any(), "P-block arrival counters not back to zero"
    assert not got.work[:2].any(), "the flush list's counters not back to zero"
    assert_close(got.checkpoint, want.checkpoint, got.state_dtype, what="checkpoint")
    if got.read_copy is not None:
        scale_g = None if got.read_scale is None else got.read_scale
        scale_w = None if want.read_scale is None else want.read_scale
        deq_g = mamba2.reference.dequantize_ref(got.read_copy, scale_g, torch.float32)
        deq_w = mamba2.reference.dequantize_ref(want.read_copy, scale_w, torch.float32)
        assert_close(deq_g, deq_w, got.read_dtype, what="read copy")
    for s in range(got.checkpoint.shape[0]):
        f = int(got.fill[s, 0])
        assert torch.equal(got.x_buf[s, :, :f], want.x_buf[s, :, :f]), f"x buffer of slot {s}"
        assert torch.equal(got.b_buf[s, :, :f], want.b_buf[s, :, :f]), f"B buffer of slot {s}"
        assert_close(got.dt_buf[s, :, :f], want.dt_buf[s, :, :f], torch.float32, what=f"dt buffer of slot {s}")
        assert_close(got.lam_buf[s, :, :f], want.lam_buf[s, :, :f], torch.float32, what=f"lam buffer of slot {s}")


# The shipped rows' state and copy dtypes at bf16 inputs are tests/test_launch_rows.py's; here the other dtypes
REF_CASES = [
    ("bf16", None, "fp16", 3),
    ("fp16", None, "fp32", 5),
    ("fp32", "fp16", "fp32", 2),
    ("bf16", "fp8", "fp16", 1),
]


@pytest.mark.parametrize("state,read,io,W", REF_CASES,
                         ids=[f"B3-H4-P24-N20-G2-W{w}-{s}-{r or 'full'}-{i}" for s, r, i, w in REF_CASES])
def test_replay_matches_reference(device, assert_close, state, read, io, W):
    """Staggered rows over 2W + 2 steps: outputs every step, then every cache tensor and materialize."""
    shape = (5, 4, 24, 20, 2)
    got = make_cache(shape, W, device, state=state, read=read, io=io)
    want = got.clone()
    slots = [3, 0, 4]
    for step in range(2 * W + 2):
        inp = mamba2.random_inputs(3, 4, 24, 20, 2, io_dtype=DT[io], device=device)
        rows = staggered(slots, step, device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows,
                          out=torch.full((3, 4, 24), NAN, dtype=DT[io], device=device))
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, DT[io], DT[state], *([DT[read]] if read else []), what=f"y at step {step}")
    assert_caches_close(got, want, assert_close)
    assert_close(mamba2.materialize(got), mamba2.materialize_ref(want), DT[state], what="materialized state")
    assert_close(mamba2.materialize(got, [4, 1]), mamba2.materialize_ref(want, torch.tensor([4, 1])), DT[state],
                 what="materialized subset")


def _row(name: str, **fields) -> StepConfig:
    return dataclasses.replace(STEP_LAUNCH[name], **fields)


# Beyond the shipped rows (tests/test_launch_rows.py): P split over programs of under 16 rows (the flush's 16-row
# chunk masked to the program's rows) and a heads row on one head per group (a non-flush launch of (row, head)
# programs that lists the flushes for a second launch).
VARIANTS = [
    ("rows4", _row("replay-fp32-small", rows=4, chunk=4), "fp32", None, 1),
    ("rows8-early", _row("replay-fp32-small", rows=8, chunk=8), "fp32", "bf16", 1),
    ("heads-one-per-group", STEP_LAUNCH["replay-fp32-split-large"], "fp32", "fp8", 2),
    ("heads-one-per-group-tail", STEP_LAUNCH["replay-bf16-large"], "bf16", None, 2),
]


@pytest.mark.parametrize("config,state,read,G", [v[1:] for v in VARIANTS], ids=[
    f"B3-H2-P48-N20-G{v[4]}-W4-{v[2]}-{v[3] or 'full'}-{v[0]}" for v in VARIANTS])
def test_replay_launch_variants(device, assert_close, config, state, read, G):
    """Staggered rows from NaN-poisoned buffers: every output, then every cache tensor, as the reference."""
    _replay_staggered((5, 2, 48, 20, G), config, state, read, device, assert_close)


def _replay_staggered(shape, config, state, read, device, assert_close, W=4):
    """2W + 2 steps of three staggered rows from NaN-poisoned buffers: every output, then every cache tensor."""
    _, H, P, N, G = shape
    got = make_cache(shape, W, device, state=state, read=read)
    poison(got)
    want = got.clone()
    slots = [3, 0, 4]
    for step in range(2 * W + 2):
        inp = mamba2.random_inputs(3, H, P, N, G, io_dtype=torch.bfloat16, device=device)
        rows = staggered(slots, step, device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows, config=config,
                          out=torch.full((3, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, DT[state], *([DT[read]] if read else []), what=f"y at step {step}")
    assert_caches_close(got, want, assert_close)


@pytest.mark.parametrize("row,state", [("replay-fp32-split-large", "fp32"), ("replay-bf16-large", "bf16")],
                         ids=["B3-H8-P48-N20-G2-W4-fp32-full-heads", "B3-H8-P48-N20-G2-W4-bf16-full-heads-tail"])
def test_replay_flushes_of_many_rows_in_one_program(device, assert_close, monkeypatch, row, state):
    """Every row flushing on the same step, their heads in one list that one program of the flushes walks: items
    of different rows and slots follow one another. Outputs every step, then every cache tensor, as the
    reference."""
    monkeypatch.setattr(replay_mod, "FLUSH_PROGRAMS_PER_SM", 1)
    shape, W = (5, 8, 48, 20, 2), 4
    _, H, P, N, G = shape
    got = make_cache(shape, W, device, state=state)
    poison(got)
    want = got.clone()
    rows = torch.tensor([3, 0, 4], dtype=torch.int32, device=device)
    for step in range(2 * W + 1):
        inp = mamba2.random_inputs(3, H, P, N, G, io_dtype=torch.bfloat16, device=device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows, config=STEP_LAUNCH[row],
                          out=torch.full((3, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, DT[state], what=f"y at step {step}")
        # the list ready for the next step: its header (counters) and its entries' flags (TAIL) zero
        header = got.work[:LIST_HEADER.value].cpu()
        entries = got.work[LIST_HEADER.value:].view(-1, LIST_ENTRY.value).cpu()
        assert not header.any() and not entries[:, 3].any(), (
            f"list left header {header.tolist()}, {int(entries[:, 3].count_nonzero())} flags set after step {step}")
    assert_caches_close(got, want, assert_close)


def test_replay_rows_by_grid(monkeypatch):
    """`select` by programs per SM on a 132-SM GPU at H = 128: under 2 the small-grid rows (split steps too), from 80
    the large-grid rows, between them and on the CPU the medium rows."""
    from types import SimpleNamespace

    monkeypatch.setattr(common, "sm_count", lambda device: 132)

    def cache(state, copy, device="cuda"):
        return SimpleNamespace(shape=(600, 128, 64, 128, 8), device=torch.device(device),
                               read_copy=object() if copy else None, checkpoint=torch.empty(0, dtype=DT[state]))

    assert [replay_mod.select(cache("fp32", True), b) for b in (2, 3, 82, 83)] == [
        "replay-fp32-small", "replay-fp32-split", "replay-fp32-split", "replay-fp32-split-large"]
    assert [replay_mod.select(cache("bf16", False), b) for b in (1, 64, 512)] == [
        "replay-bf16-small", "replay-bf16", "replay-bf16-large"]
    monkeypatch.undo()
    assert replay_mod.select(cache("fp32", True, "cpu"), 512) == "replay-fp32-split"


def test_rows_per_program_take_whole_heads_they_do_not_divide():
    """A row's rows of P per program where they divide P, else one program over a head of at most two of them (P up
    to a power of two)."""
    row = STEP_LAUNCH["replay-fp32-large"]
    assert row.rows == 64
    assert [replay_mod.rows_per_program(row, P) for P in (12, 64, 80, 128, 160)] == [16, 64, 128, 64, 64]
    assert replay_mod.rows_per_program(STEP_LAUNCH["replay-fp32-small"], 80) == STEP_LAUNCH["replay-fp32-small"].rows


@pytest.mark.parametrize("W", [1, 4, 7], ids=["B3-H2-P12-N12-G1-W1-fp32-fp32", "B3-H2-P12-N12-G1-W4-fp32-fp32",
                                              "B3-H2-P12-N12-G1-W7-fp32-fp32"])
def test_replay_equals_conventional(device, assert_close, W):
    """k·W + r steps (k = 2, r = 3), staggered: replay and conventional decode both match an fp64 decode."""
    nslots, H, P, N, G = 4, 2, 12, 12, 1
    start = torch.randn(nslots, H, P, N, device=device)
    cache = make_cache((nslots, H, P, N, G), W, device, io="fp32", load=False)
    cache.load(start)
    conv = start.clone()
    exact = start.double()
    slots = [2, 0, 3]
    for step in range(2 * W + 3):
        inp = mamba2.random_inputs(3, H, P, N, G, io_dtype=torch.float32, device=device)
        rows = staggered(slots, step, device)
        y = mamba2.replay(cache, **inp, dt_softplus=True, slots=rows)
        y_conv = mamba2.decode(conv, **inp, dt_softplus=True, slots=rows)
        y_exact = mamba2.decode_ref(exact, **{k: v.double() for k, v in inp.items()}, dt_softplus=True, slots=rows)
        live = rows >= 0
        assert_close(y[live], y_exact[live], torch.float32, what=f"replay y at step {step}")
        assert_close(y_conv[live], y_exact[live], torch.float32, what=f"conventional y at step {step}")
    assert_close(mamba2.materialize(cache), exact, torch.float32, what="materialized state")
    assert_close(mamba2.materialize(cache), conv, torch.float32, what="materialized vs conventional state")


def test_default_slots_are_the_rows(device, assert_close):
    """Without slots, row b uses slot b: replay, verify and accept match their references."""
    got = make_cache((2, 2, 6, 10, 2), 2, device, io="fp32", max_draft=2)
    want = got.clone()
    for _ in range(3):
        inp = mamba2.random_inputs(2, 2, 6, 10, 2, io_dtype=torch.float32, device=device)
        assert_close(mamba2.replay(got, **inp), mamba2.replay_ref(want, **inp), torch.float32, what="replay y")
    inp = mamba2.random_inputs(2, 2, 6, 10, 2, T=2, io_dtype=torch.float32, device=device)
    assert_close(mamba2.verify(got, **inp), mamba2.verify_ref(want, **inp), torch.float32, what="verify y")
    n = torch.tensor([2, 1], dtype=torch.int32, device=device)
    mamba2.accept(got, n)
    mamba2.accept_ref(want, n)
    assert_caches_close(got, want, assert_close)


def test_rows_flush_on_their_own_step(device):
    """W = 3, rows at fills 0, 1, 2: each row's checkpoint changes only on the step that fills its buffer."""
    cache = make_cache((3, 2, 8, 8, 1), 3, device)
    for step, row_slots in enumerate([[2], [1, 2]]):
        inp = mamba2.random_inputs(len(row_slots), 2, 8, 8, 1, device=device)
        mamba2.replay(cache, **inp, dt_softplus=True, slots=torch.tensor(row_slots, dtype=torch.int32, device=device))
    assert cache.fill[:, 0].tolist() == [0, 1, 2]
    rows = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    for step in range(6):
        before_fill, before_ck = cache.fill[:, 0].tolist(), cache.checkpoint.clone()
        mamba2.replay(cache, **mamba2.random_inputs(3, 2, 8, 8, 1, device=device), dt_softplus=True, slots=rows)
        for s in range(3):
            flushed = before_fill[s] == 2
            assert int(cache.fill[s, 0]) == (0 if flushed else before_fill[s] + 1)
            assert torch.equal(cache.fill[s], cache.fill[s, :1].expand(2)), "heads of a slot disagree on the fill"
            changed = not torch.equal(cache.checkpoint[s], before_ck[s])
            assert changed == flushed, f"step {step}, slot {s}: checkpoint changed={changed}, flushed={flushed}"


def test_reset_leaves_nothing_of_the_old_request(device):
    """A request in a reset slot gives bit-for-bit the outputs it gives in a fresh cache."""
    shape = (3, 2, 10, 6, 2)
    used = make_cache(shape, 4, device, read="bf16", load=False)
    fresh = make_cache(shape, 4, device, read="bf16", load=False)
    slot = torch.tensor([1], dtype=torch.int32, device=device)
    for _ in range(6):
        mamba2.replay(used, **mamba2.random_inputs(1, 2, 10, 6, 2, device=device), dt_softplus=True, slots=slot)
    assert int(used.fill[1, 0]) == 2 and used.checkpoint[1].abs().sum() > 0
    used.reset(slot)
    for step in range(6):
        inp = mamba2.random_inputs(1, 2, 10, 6, 2, device=device)
        y_used = mamba2.replay(used, **inp, dt_softplus=True, slots=slot)
        y_fresh = mamba2.replay(fresh, **inp, dt_softplus=True, slots=slot)
        assert torch.equal(y_used, y_fresh), f"step {step}: the old request leaked into the reset slot"


def test_move_keeps_outputs(device, assert_close):
    """Moving a request mid-window keeps its outputs bit for bit; materialize + load keeps them within tolerance."""
    shape = (4, 2, 10, 6, 2)
    cache = make_cache(shape, 3, device, read="fp8")
    rows = torch.tensor([1, 3], dtype=torch.int32, device=device)
    for _ in range(4):
        mamba2.replay(cache, **mamba2.random_inputs(2, 2, 10, 6, 2, device=device), dt_softplus=True, slots=rows)
    stay, moved, reloaded = cache.clone(), cache.clone(), cache.clone()
    moved.move([1], [0])
    assert int(moved.fill[1, 0]) == 0 and moved.checkpoint[1].abs().sum() == 0
    reloaded.load(mamba2.materialize(cache, [1]), [2])
    for step in range(4):
        inp = mamba2.random_inputs(2, 2, 10, 6, 2, device=device)
        y_stay = mamba2.replay(stay, **inp, dt_softplus=True, slots=rows)
        y_moved = mamba2.replay(moved, **inp, dt_softplus=True, slots=torch.tensor([0, 3], dtype=torch.int32,
                                                                                   device=device))
        y_reloaded = mamba2.replay(reloaded, **inp, dt_softplus=True,
                                   slots=torch.tensor([2, 3], dtype=torch.int32, device=device))
        assert torch.equal(y_moved, y_stay), f"step {step}: a moved request changed its outputs"
        assert_close(y_reloaded, y_stay, torch.bfloat16, torch.float8_e4m3fn, what=f"reloaded y at step {step}")
    assert torch.equal(mamba2.materialize(moved, [0]), mamba2.materialize(stay, [1]))


@pytest.mark.parametrize("G,config", [(2, None), (1, _row("replay-bf16-large", precision="tf32x3"))], ids=["one-launch", "tail"])
def test_padding_rows_touch_nothing(device, G, config):
    """Rows with slot -1 leave every cache tensor of every other slot, and their output rows, untouched (with TAIL,
    their heads programs count as done, or the flushing programs would wait for them)."""
    cache = make_cache((4, 2, 8, 8, G), 2, device, read="bf16")
    rows = torch.tensor([-1, 2, -1], dtype=torch.int32, device=device)
    before = cache.clone()
    for _ in range(3):
        out = torch.full((3, 2, 8), NAN, dtype=torch.bfloat16, device=device)
        mamba2.replay(cache, **mamba2.random_inputs(3, 2, 8, 8, G, device=device), dt_softplus=True, slots=rows,
                      out=out, config=config)
        assert out[[0, 2]].isnan().all() and not out[1].isnan().any()
    for name, t in cache.tensors().items():
        keep = [0, 1, 3]
        assert torch.equal(t[keep], before.tensors()[name][keep]), f"{name} of a slot in no row changed"
    assert not torch.equal(cache.checkpoint[2], before.checkpoint[2])


def _bad_replay(device):
    cache = make_cache((3, 4, 8, 8, 2), 4, device, load=False)
    return cache, mamba2.random_inputs(2, 4, 8, 8, 2, device=device)


BAD_REPLAY = {
    "x-io-dtype": (lambda c, i: i.update(x=i["x"].float()), "x must be bf16"),
    "B-groups": (lambda c, i: i.update(B=i["B"][:, :1], C=i["C"][:, :1]), "B must have the cache's G = 2"),
    "C-shape": (lambda c, i: i.update(C=i["C"][:, :, :4]), "C must have shape"),
    "slots-range": (lambda c, i: i.update(slots=torch.tensor([0, 7], dtype=torch.int32)), "slots must be in"),
    "batch-without-slots": (lambda c, i: i.update(**mamba2.random_inputs(4, 4, 8, 8, 2)), "batch 4 must not exceed"),
    "out-shape": (lambda c, i: i.update(out=torch.zeros(2, 4, 7)), "out must have shape"),
    "config-tf32-fp32": (lambda c, i: i.update(config=_row("replay-fp32", precision="tf32")),
                         "'tf32' .* applies only to a 2-byte checkpoint"),
}


@pytest.mark.parametrize("case", list(BAD_REPLAY))
def test_replay_bad_input(device, case):
    cache, inp = _bad_replay(device)
    BAD_REPLAY[case][0](cache, inp)
    inp = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    before = cache.clone()
    with pytest.raises(ValueError, match=BAD_REPLAY[case][1]):
        mamba2.replay(cache, **inp, dt_softplus=True)
    for name, t in cache.tensors().items():
        assert torch.equal(t, before.tensors()[name])


def test_step_config_refuses_settings_that_do_not_combine():
    with pytest.raises(ValueError, match="StepConfig.warps must be a power of two, got 3"):
        _row("replay-fp32", warps=3)
    with pytest.raises(ValueError, match="precision must be one of ieee, tf32x3, tf32"):
        _row("replay-fp32", precision="fp16")
    with pytest.raises(ValueError, match="apply only to the heads launch"):
        _row("replay-fp32", tail=True)
    with pytest.raises(ValueError, match="early must be False"):
        _row("replay-bf16-large", early=True)


BAD_CREATE = {
    "window-0": (dict(window=0), "window must be an integer in"),
    "window-65": (dict(window=65), "window must be an integer in"),
    "max-draft": (dict(max_draft=9), "max_draft must be"),
    "read-dtype": (dict(read_dtype="fp32"), "read_dtype must be bf16, fp16 or fp8"),
    "state-dtype": (dict(state_dtype=torch.float64), "state_dtype must be"),
    "groups": (dict(G=3), "G = 3 groups"),
}


@pytest.mark.parametrize("case", list(BAD_CREATE))
def test_cache_bad_arguments(device, case):
    kwargs = dict(nslots=2, H=4, P=8, N=8, G=2, window=4, device=device)
    kwargs.update(BAD_CREATE[case][0])
    with pytest.raises(ValueError, match=BAD_CREATE[case][1]):
        mamba2.ReplayCache.create(**kwargs)


def test_cache_slot_operations_check_slots(device):
    cache = make_cache((3, 2, 8, 8, 1), 2, device, load=False)
    with pytest.raises(ValueError, match="slots must be in"):
        cache.reset([3])
    with pytest.raises(ValueError, match="state must have shape"):
        cache.load(torch.zeros(2, 2, 8, 8, device=device), [0])
    with pytest.raises(ValueError, match="must not share"):
        cache.move([0], [0])
    with pytest.raises(ValueError, match="cache must be a ReplayCache"):
        mamba2.replay(None, **mamba2.random_inputs(1, 2, 8, 8, 1, device=device))


def large_grid_steps(batch, H, P, N, G, W, state, read, device, assert_close, config=None):
    """2W + 2 steps of `batch` rows from NaN-poisoned buffers, outputs pre-filled with NaN: row r joins at step
    r % W, so that a W-th of the rows flush each step, and every seventh row is padding. Every output, then every
    cache tensor, as the reference."""
    got = make_cache((batch + 3, H, P, N, G), W, device, state=state, read=read)
    poison(got)
    want = got.clone()
    slots = torch.randperm(batch + 3, device=device)[:batch].to(torch.int32)
    r = torch.arange(batch, device=device)
    for step in range(2 * W + 2):
        rows = torch.where((r % W <= step) & (r % 7 != 3), slots, -1)
        inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.bfloat16, device=device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows, config=config,
                          out=torch.full((batch, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, DT[state], *([DT[read]] if read else []), what=f"y at step {step}")
    assert_caches_close(got, want, assert_close)


LARGE_CASES = [("bf16", None), ("fp32", "bf16"), ("fp32", "fp8"), ("fp32", None)]


@pytest.mark.gpu
@pytest.mark.parametrize("state,read", LARGE_CASES,
                         ids=[f"H128-P64-N128-G8-W16-{s}-{r or 'full'}" for s, r in LARGE_CASES])
def test_large_grid_rows_match_reference(assert_close, state, read):
    """A batch that takes the large-grid rows (80 (row, head) pairs per SM and up: the heads launch, its flushes in
    its own programs for a 2-byte state), where every program of the grid cannot run at once and flushing programs
    wait on heads programs still running: outputs and caches as the reference."""
    device = torch.device("cuda")
    H, P, N, G, W = 128, 64, 128, 8, 16
    batch = 80 * common.sm_count(device) // H + 8
    assert replay_mod.select(make_cache((1, H, P, N, G), W, device, state=state, read=read), batch).endswith("-large")
    large_grid_steps(batch, H, P, N, G, W, state, read, device, assert_close)


@pytest.mark.gpu
def test_replay_loop_in_cuda_graph():
    """Two windows of replay steps captured once (fills on the device, no host sync) equal the eager loop."""
    device = "cuda"
    shape = (8, 8, 64, 128, 2)
    W = 4
    eager = make_cache(shape, W, device, read="bf16")
    graphed = eager.clone()
    rows = torch.tensor([7, 0, -1, 3], dtype=torch.int32, device=device)
    for s, lead in ((7, 1), (0, 2), (3, 3)):
        for _ in range(lead):
            inp = mamba2.random_inputs(1, 8, 64, 128, 2, device=device)
            one = torch.tensor([s], dtype=torch.int32, device=device)
            mamba2.replay(eager, **inp, dt_softplus=True, slots=one)
            mamba2.replay(graphed, **inp, dt_softplus=True, slots=one)
    steps = [mamba2.random_inputs(4, 8, 64, 128, 2, device=device) for _ in range(2 * W)]
    ys_eager = [mamba2.replay(eager, **inp, dt_softplus=True, slots=rows) for inp in steps]
    warm = graphed.clone()
    mamba2.replay(warm, **steps[0], dt_softplus=True, slots=rows, check=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [mamba2.replay(graphed, **inp, dt_softplus=True, slots=rows) for inp in steps]
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(ys, ys_eager):
        torch.testing.assert_close(a[[0, 1, 3]], b[[0, 1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(graphed.checkpoint, eager.checkpoint, rtol=0, atol=0)
    torch.testing.assert_close(graphed.fill, eager.fill, rtol=0, atol=0)
