"""GDN split precision: the read copy's rounding reaches non-flush outputs, never the checkpoint."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from replayssm_kernels import gdn

STEPS = 2000
READ = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


@pytest.fixture(autouse=True)
def one_thread():
    # The references are many tiny ops: with pytest-xdist on two cores, torch's thread pool only contends.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _slow_inputs(H, HV, K, V, device="cpu"):
    """One step with no decay and beta = 0.01: the state changes slowly, so a bf16 state's rounding piles up."""
    inp = gdn.random_inputs(1, H, HV, K, V, io_dtype=torch.float32, device=device)
    inp["g"] = torch.zeros(1, HV, device=device)
    inp["beta"] = torch.full((1, HV), 0.01, device=device)
    return inp


def _rel(got, exact) -> float:
    return ((got.double() - exact).abs().max() / exact.abs().max()).item()


def test_split_precision_error_stays_bounded_over_2000_steps():
    """References, 2000 steps, W = 8: with a bf16 read copy over an fp32 checkpoint the output error stays at
    the bf16 level with no growth and every stored checkpoint is within fp32 rounding of the fp64 state, while
    a bf16 conventional state's error keeps growing."""
    H, HV, K, V, W = 1, 2, 8, 8, 8
    start = torch.randn(1, HV, V, K)
    split = gdn.ReplayCache.create(1, H, HV, K, V, W, state_dtype="fp32", read_dtype="bf16", io_dtype="fp32",
                                   device="cpu")
    split.load(start)
    conv = start.to(torch.bfloat16)
    exact = start.double()
    err_split, err_conv, err_checkpoint = [], [], []
    for step in range(STEPS):
        inp = _slow_inputs(H, HV, K, V)
        y_split = gdn.replay_ref(split, **inp, use_qk_l2norm_in_kernel=True)
        y_conv = gdn.decode_ref(conv, **inp, use_qk_l2norm_in_kernel=True)
        y_exact = gdn.decode_ref(exact, **{k: v.double() for k, v in inp.items()}, use_qk_l2norm_in_kernel=True)
        err_split.append(_rel(y_split, y_exact))
        err_conv.append(_rel(y_conv, y_exact))
        if step % W == W - 1:
            assert not split.fill.any()
            err_checkpoint.append(_rel(split.checkpoint, exact))
    quarter = STEPS // 4
    first_split, last_split = max(err_split[:quarter]), max(err_split[-quarter:])
    first_conv, last_conv = sum(err_conv[:quarter]) / quarter, sum(err_conv[-quarter:]) / quarter
    assert max(err_checkpoint) < 1e-5, f"checkpoint error {max(err_checkpoint):.3g}: read-copy rounding reached it"
    assert last_split < 4 * 2.0**-8, f"split-precision error {last_split:.3g} is above the bf16 level"
    assert last_split < 2 * first_split, f"split-precision error grew from {first_split:.3g} to {last_split:.3g}"
    assert last_conv > 1.5 * first_conv, f"bf16 conventional error {first_conv:.3g} -> {last_conv:.3g} did not grow"
    assert last_conv > 5 * last_split


_R = importlib.import_module("replayssm_kernels.gdn.replay").REPLAY_LAUNCH
SPLIT_CASES = [(r, 4, None) for r in READ] + [("fp16", 9, None), ("bf16", 9, _R["replay-split-small"]),
                                              ("fp8", 9, _R["replay-fp8-small"])]


@pytest.mark.parametrize("read,W,config", SPLIT_CASES,
                         ids=[f"B2-H1-HV2-K12-V10-W{w}-fp32-{r}-fp32" + ("-one-launch" if c else "")
                              for r, w, c in SPLIT_CASES])
def test_split_kernel_checkpoint_matches_full_precision(device, assert_close, read, W, config):
    """Kernels, 3 windows, staggered rows: the split cache's checkpoint and materialized state equal an
    fp32-only cache's to fp32 rounding, and its outputs differ from that cache's only by the read dtype; the
    flushes in a launch of their own or, "one-launch", in the non-flush steps' launch."""
    nslots, H, HV, K, V = 3, 1, 2, 12, 10
    start = torch.randn(nslots, HV, V, K, device=device)
    split = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype="fp32", read_dtype=read, io_dtype="fp32",
                                   device=device)
    full = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype="fp32", io_dtype="fp32", device=device)
    split.load(start)
    full.load(start)
    for step in range(3 * W):
        inp = gdn.random_inputs(2, H, HV, K, V, io_dtype=torch.float32, device=device)
        rows = torch.tensor([2, 0 if step >= 1 else -1], dtype=torch.int32, device=device)
        y_split = gdn.replay(split, **inp, use_qk_l2norm_in_kernel=True, slots=rows, config=config)
        y_full = gdn.replay(full, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        live = rows >= 0
        assert_close(y_split[live], y_full[live], READ[read], what=f"o at step {step}")
    assert_close(split.checkpoint, full.checkpoint, torch.float32, what="checkpoint")
    assert_close(gdn.materialize(split), gdn.materialize(full), torch.float32, what="materialized state")


@pytest.mark.gpu
def test_split_kernel_2000_steps_on_gpu():
    """The kernels over 2000 steps on the GPU: output error bounded and flat, checkpoint at fp32 rounding."""
    H, HV, K, V, W = 2, 8, 64, 64, 16
    start = torch.randn(1, HV, V, K, device="cuda")
    split = gdn.ReplayCache.create(1, H, HV, K, V, W, state_dtype="fp32", read_dtype="bf16", io_dtype="fp32",
                                   device="cuda")
    split.load(start)
    exact = start.double()
    err_split, err_checkpoint = [], []
    for step in range(STEPS):
        inp = _slow_inputs(H, HV, K, V, device="cuda")
        y_split = gdn.replay(split, **inp, use_qk_l2norm_in_kernel=True)
        y_exact = gdn.decode_ref(exact, **{k: v.double() for k, v in inp.items()}, use_qk_l2norm_in_kernel=True)
        err_split.append(_rel(y_split, y_exact))
        if step % W == W - 1:
            err_checkpoint.append(_rel(split.checkpoint, exact))
    quarter = STEPS // 4
    # fp32 rounding and, under the small-grid row's one-pass TF32 correction, about 2^-20 of the state per flush
    assert max(err_checkpoint) < 1e-5
    assert max(err_split[-quarter:]) < 2 * max(err_split[:quarter])


def test_fp8_copy_refuses_one_pass_correction(device):
    """A flush's correction in one TF32 pass takes a 2-byte copy; an fp8 copy's checkpoint - copy is too
    large for it: refused before either launch of a two-launch step, the cache unchanged."""
    cache = gdn.ReplayCache.create(2, 1, 2, 12, 10, 4, state_dtype="fp32", read_dtype="fp8", io_dtype="fp32",
                                   device=device)
    cache.load(torch.randn(2, 2, 10, 12, device=device))
    before = {name: t.view(torch.uint8).clone() for name, t in cache.tensors().items() if t.dtype.itemsize == 1}
    before.update({name: t.clone() for name, t in cache.tensors().items() if t.dtype.itemsize > 1})
    inp = gdn.random_inputs(2, 1, 2, 12, 10, io_dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match=r"correction 'tf32' .* applies only to a bf16 or fp16 read copy; this cache "
                                         r"has a torch.float8_e4m3fn read copy"):
        gdn.replay(cache, **inp, config=_R["replay-split"])
    for name, t in cache.tensors().items():
        assert torch.equal(t.view(torch.uint8) if t.dtype.itemsize == 1 else t, before[name]), name


def test_split_flush_register_cap_by_rounds():
    """A copy's flush launch runs at its round_cap's 255 registers (2 four-warp programs per SM, each faster) where a staggered
    step's flushes take no more rounds of resident programs than at 168 (3 per SM), as measured on an H200 (132 SMs,
    Qwen3.5-122B's 64 value heads of 128 rows, W = 16; benchmarks/notes/run-68.md): 255 at batch 16 to 64 and at 128, 168 at 96
    (384 heads: one round at 168, two at 255), 256 and 512; never on the CPU, nor without round_cap."""
    flush_cap = importlib.import_module("replayssm_kernels.common").flush_cap
    replay = importlib.import_module("replayssm_kernels.gdn.replay")
    rows = (("replay-split", (48, 64, 96, 128, 256, 512), 1), ("replay-split-medium", (16, 32), 2),
            ("replay-fp8", (64, 96), 1))
    for row, batches, per_head in rows:
        flush = replay.REPLAY_LAUNCH[row].flush
        assert min(flush.rows, 128) == 128 // per_head
        caps = [flush_cap(flush.maxnreg, flush.round_cap, -(-batch // 16) * 64 * per_head, flush.warps,
                          replay.FLUSH_PROGRAMS_PER_SM, 132) for batch in batches]
        assert caps == {"replay-split": [255, 255, 168, 255, 168, 168], "replay-split-medium": [255, 255],
                        "replay-fp8": [255, 168]}[row], row
    assert flush_cap(168, 255, 256, 4, 6, 0) == 168 and flush_cap(168, None, 256, 4, 6, 132) == 168


def test_split_flush_launch_counts_a_staggered_step(monkeypatch, device):
    """The flush launch asks `flush_cap` about the items of batch / W rows' heads (a staggered step), not of every
    row: at batch 10, W = 4, 2 value heads of 20 rows in 32-row items, 3 rows' 6 items (the flush row's settings
    given, so that a GPU's small-grid row and the CPU's large one ask the same)."""
    asked = []

    def record(maxnreg, fcap, items, num_warps, pps, sms):
        asked.append((maxnreg, fcap, items))
        return maxnreg

    monkeypatch.setattr(importlib.import_module("replayssm_kernels.common"), "flush_cap", record)
    cache = gdn.ReplayCache.create(10, 1, 2, 12, 20, 4, state_dtype="fp32", read_dtype="bf16", io_dtype="fp32",
                                   device=device)
    cache.load(torch.randn(10, 2, 20, 12, device=device))
    gdn.replay(cache, **gdn.random_inputs(10, 1, 2, 12, 20, io_dtype=torch.float32, device=device),
               config=dataclasses.replace(_R["replay-split"], flush=dataclasses.replace(_R["replay-split"].flush, rows=32)))
    assert asked == [(168, 255, 6)]


def test_split_drift_script(device):
    """benchmarks/split_drift.py on a small shape: the split checkpoint at fp32 rounding of the exact recurrence,
    the outputs at the bf16 copy's level; a launch setting that is not key=integer is one line and exit 2."""
    from benchmark_scripts import load, run

    drift = load("split_drift")
    row = drift.drift(2, 3 * 4, 4, "bf16", {}, 0, shape={"H": 1, "HV": 2, "K": 16, "V": 16}, device=device)
    assert 0 < row["checkpoint_split_max"] < 1e-5 and 0 < row["checkpoint_fp32_max"] < 1e-5
    assert 2.0**-12 < row["output_last_quarter"] < 2.0**-6
    bad = run("split_drift", "--launch", "correction")
    assert bad.returncode == 2 and "'correction' is not field=integer" in bad.stderr and "Traceback" not in bad.stderr
