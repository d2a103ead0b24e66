"""The cost model pinned to counts done by hand on tiny shapes, and `replayssm cost` through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from replayssm_cli.model.cost import (
    kernel_step_bytes,
    Cost,
    cost_table,
    launches_per_step,
    memory_per_seq,
    predict_us,
    spec_replay_cycle,
    step_cost,
)
from replayssm_cli.model import presets
from replayssm_cli.main import app
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

# Hand counts below, per batch row unless said: bf16 io (2 bytes), fp32 state (4), batch 2, window 4.
M2 = Mamba2Shape(H=2, P=3, N=5, G=1)
GDN = GDNShape(H=1, HV=2, K=3, V=5)
B = 2
W = 4

M2_STATE = 2 * 3 * 5 * 4  # (H, P, N) fp32
M2_INPUTS = (2 * 3 + 2 * 3 + 2 + 1 * 5 + 1 * 5) * 2  # x, z (H, P), dt (H), B, C (G, N)
M2_PARAMS = 3 * 2 * 4  # A, D, dt_bias (H) fp32, once per step
M2_OUT = 2 * 3 * 2  # y (H, P)
M2_ENTRY = (2 * 3 + 1 * 5) * 2 + 2 * 2 * 4  # x (H, P), B (G, N) in io; delta, lam (H) fp32
M2_COUNTERS = 2 * 4  # (H) int32
M2_DRAFT_B = 1 * 5 * 2  # one draft's B (G, N), copied by accept

GDN_STATE = 2 * 5 * 3 * 4  # (HV, V, K) fp32
GDN_INPUTS = (2 * 1 * 3 + 2 * 5 + 2 * 2) * 2  # q, k (H, K), v (HV, V), g, beta (HV)
GDN_OUT = 2 * 5 * 2  # o (HV, V)
GDN_ENTRY = (2 * 5 + 1 * 3 + 2) * 4  # u (HV, V), k (H, K), G (HV) fp32
GDN_COUNTERS = 2 * 4  # (HV) int32
GDN_SPLIT_ENTRY = GDN_ENTRY + 2 * (1 + 4) * 4  # and, under split precision, beta and a row of T (HV, W) fp32
# What a cache holds per slot beside the fills: arrival counts (Mamba-2 one per head, GDN 32 per value head) and
# four int32 of the flush list per head
M2_HELD_COUNTERS = (1 + 1 + 4) * 2 * 4
GDN_HELD_COUNTERS = (1 + 32 + 4) * 2 * 4

NEMOTRON_SUPER = Mamba2Shape(H=128, P=64, N=128, G=8)


def m2(variant, phase="avg", **kw):
    return step_cost(M2, variant, phase, **{"batch": B, "window": W, **kw})


def gdn(variant, phase="avg", **kw):
    return step_cost(GDN, variant, phase, **{"batch": B, "window": W, **kw})


def test_cost_arithmetic():
    a, b = Cost(10, 20, 30), Cost(1, 2, 3)
    assert a + b == Cost(11, 22, 33)
    assert a.total_bytes == 30 and a.intensity == 1.0
    assert a.scaled(2.5) == Cost(25, 50, 75)
    assert a.as_dict()["total_bytes"] == 30


def test_step_cost_mamba2_conventional():
    # FLOPs per head: delta 4, exp(A delta) 2; per p: delta x 1, D x 2, gate 5; per element 5.
    assert m2("conventional") == Cost(
        B * (M2_STATE + M2_INPUTS) + M2_PARAMS,
        B * (M2_STATE + M2_OUT),
        B * 2 * (6 + 3 * (3 + 5) + 5 * 3 * 5),
    )
    # Every phase of a conventional step is the same step.
    assert m2("conventional", "flush") == m2("conventional")


def test_step_cost_mamba2_without_gate():
    assert m2("conventional", has_z=False) == Cost(
        B * (M2_STATE + (2 * 3 + 2 + 2 * 5) * 2) + M2_PARAMS,
        B * (M2_STATE + M2_OUT),
        B * 2 * (6 + 3 * 3 + 5 * 3 * 5),
    )


def test_step_cost_mamba2_replay_phases():
    # Nonflush at fill 1: checkpoint + 1 entry read, this entry written, counters both ways.
    # FLOPs per head: 7 scalars, S0 C 2 per element, 2 buffer terms of 2N + 2P + 4, per p 4 + 5.
    assert m2("replay", "nonflush", fill=1) == Cost(
        B * (M2_STATE + 1 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (M2_ENTRY + M2_OUT + M2_COUNTERS),
        B * 2 * (7 + 2 * 15 + 2 * (2 * 5 + 2 * 3 + 4) + 3 * (4 + 5)),
    )
    # Flush at fill 3: checkpoint + 3 entries read; checkpoint written, this token's entry only in registers.
    # FLOPs per head: 7 scalars, 4 entries of 3 + P, per element 1 + 2*4 + 2, per p 2 + 5.
    assert m2("replay", "flush") == Cost(
        B * (M2_STATE + 3 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (M2_STATE + M2_OUT + M2_COUNTERS),
        B * 2 * (7 + 4 * (3 + 3) + 15 * (1 + 2 * 4 + 2) + 3 * (2 + 5)),
    )


def test_step_cost_mamba2_replay_window_average():
    # Nonflush reads 376 + 76 f bytes at fill f = 0, 1, 2, and the flush 604: see the phase test.
    assert m2("replay") == Cost(
        (376 + 452 + 528 + 604) // 4,
        (3 * 116 + 280) // 4,
        (4 * 84 + 4 * 104 + 4 * 124 + 868) // 4,
    )
    assert m2("replay", "nonflush", fill=0).bytes_read == 376
    assert m2("replay", "flush") == Cost(604, 280, 868)


@pytest.mark.parametrize("window", [1, 2, 5, 16], ids=lambda w: f"W{w}")
@pytest.mark.parametrize("shape", [M2, GDN], ids=["mamba2", "gdn"])
def test_step_cost_average_is_the_mean_of_the_phases(shape, window):
    kw = dict(batch=3, window=window, state_dtype="bf16", read_dtype="fp8")
    phases = [step_cost(shape, "split", "nonflush", fill=f, **kw) for f in range(window - 1)]
    phases.append(step_cost(shape, "split", "flush", **kw))
    mean = [sum(getattr(c, k) for c in phases) / window for k in ("bytes_read", "bytes_written", "flops")]
    avg = step_cost(shape, "split", **kw)
    assert [avg.bytes_read, avg.bytes_written, avg.flops] == [round(v) for v in mean]
    if window > 1:
        assert step_cost(shape, "split", "nonflush", **kw).bytes_read == round(
            sum(c.bytes_read for c in phases[:-1]) / (window - 1)
        )


def test_step_cost_mamba2_split():
    bf16_copy = 2 * 3 * 5 * 2
    fp8_copy = 2 * 3 * 5 * 1 + 2 * 3 * 4  # plus one fp32 scale per (head, row p)
    for read, copy, dequant in (("bf16", bf16_copy, 0), ("fp8", fp8_copy, 3)):
        assert m2("split", "nonflush", fill=1, read_dtype=read) == Cost(
            B * (copy + 1 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
            B * (M2_ENTRY + M2_OUT + M2_COUNTERS),
            B * 2 * (7 + 2 * 15 + 2 * (2 * 5 + 2 * 3 + 4) + 3 * (4 + 5) + dequant),
        )
    # fp8 quantisation of the new copy: a division per element and one per row (the scale). A flush reads
    # the checkpoint only (Mamba-2's buffered updates need no correction) and writes it and the copy.
    for read, copy, quant in (("bf16", bf16_copy, 0), ("fp8", fp8_copy, 15 + 3)):
        assert m2("split", "flush", read_dtype=read) == Cost(
            B * (M2_STATE + 3 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
            B * (M2_STATE + copy + M2_OUT + M2_COUNTERS),
            B * 2 * (7 + 4 * (3 + 3) + 15 * (1 + 2 * 4 + 2) + 3 * (2 + 5) + quant),
        )
    assert m2("replay", read_dtype="bf16") == m2("split", read_dtype="bf16")


def test_step_cost_mamba2_spec_conventional():
    assert m2("spec-conventional", draft=2) == Cost(
        B * (M2_STATE + 2 * M2_INPUTS) + M2_PARAMS,
        B * (2 * M2_STATE + 2 * M2_OUT),
        2 * B * 2 * (6 + 3 * (3 + 5) + 5 * 3 * 5),
    )


def test_step_cost_mamba2_spec_replay():
    # Accept reads n and the counters, writes the counters, and copies 2 accepted drafts' B.
    accept = Cost(B * (4 + M2_COUNTERS + 2 * M2_DRAFT_B), B * (M2_COUNTERS + 2 * M2_DRAFT_B), B * 2)
    # Verify of T = 2 at fill 1 (the mean fill for W = 4, 2 accepted): 1 + 2 terms for draft 0, 1 + 3 for draft 1.
    verify_1 = Cost(
        B * (M2_STATE + 1 * M2_ENTRY + 2 * M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (2 * M2_ENTRY + 2 * M2_OUT),
        B * 2 * (2 * 7 + 2 * 2 * 15 + (2 + 3) * (2 * 5 + 2 * 3 + 4) + 2 * 3 * (4 + 5)),
    )
    assert m2("spec-replay", "nonflush", draft=2, accepted=2) == verify_1 + accept
    # From an fp8 copy: the copy and its scales instead of the checkpoint, the tile dequantised once (P N).
    fp8_copy = 2 * 3 * 5 * 1 + 2 * 3 * 4
    assert m2("spec-replay", "nonflush", draft=2, accepted=2, read_dtype="fp8") == accept + Cost(
        B * (fp8_copy + 1 * M2_ENTRY + 2 * M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        verify_1.bytes_written,
        verify_1.flops + B * 2 * 15,
    )
    # A flushing verify folds 4 entries (1 + 4 (3 + P), 1 + 2*4 per element), then verifies at fill 0.
    verify_after_fold = Cost(
        B * (M2_STATE + 4 * M2_ENTRY + 2 * M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (M2_STATE + 2 * M2_ENTRY + 2 * M2_OUT + M2_COUNTERS),
        B * 2 * (1 + 4 * (3 + 3) + 15 * (1 + 2 * 4))
        + B * 2 * (2 * 7 + 2 * 2 * 15 + (1 + 2) * (2 * 5 + 2 * 3 + 4) + 2 * 3 * (4 + 5)),
    )
    flush = verify_after_fold + accept
    assert m2("spec-replay", "flush", draft=2, accepted=2) == flush
    # Accepting 2 of 2 at W = 4 cycles through a flushing verify and a verify at fill 2.
    at_2 = m2("spec-replay", "nonflush", draft=2, accepted=2, fill=2)
    mean = Cost(
        (flush.bytes_read + at_2.bytes_read) // 2,
        (flush.bytes_written + at_2.bytes_written) // 2,
        (flush.flops + at_2.flops) // 2,
    )
    assert m2("spec-replay", draft=2, accepted=2) == mean
    assert (flush.bytes_read + at_2.bytes_read) % 2 == 0


def test_step_cost_spec_replay_one_draft_is_replay_plus_accept():
    for shape in (M2, GDN):
        kw = dict(batch=B, window=W, fill=2)
        verify = step_cost(shape, "spec-replay", "nonflush", draft=1, **kw)
        replay = step_cost(shape, "replay", "nonflush", **kw)
        counters = M2_COUNTERS if shape is M2 else GDN_COUNTERS
        draft_b = M2_DRAFT_B if shape is M2 else 0
        # accept reads n and the counters (and moves Mamba-2's B); a replay step writes its counters itself.
        assert verify.bytes_read == replay.bytes_read + B * (4 + counters + draft_b)
        assert verify.bytes_written == replay.bytes_written + B * draft_b
        assert verify.flops == replay.flops + B * 2


def test_spec_replay_cycle():
    assert spec_replay_cycle(16, 1) == (7.5, 16.0, 1 / 16)
    assert spec_replay_cycle(16, 4) == (6.0, 16.0, 0.25)
    # More accepted than the window holds: every verify flushes.
    assert spec_replay_cycle(2, 3) == (0.0, 3.0, 1.0)


def test_step_cost_gdn():
    # Conventional, per value head: exp(g) 1, q scale K, per element 7, u 2 per v.
    assert gdn("conventional") == Cost(
        B * (GDN_STATE + GDN_INPUTS), B * (GDN_STATE + GDN_OUT), B * 2 * (1 + 3 + 7 * 15 + 2 * 5)
    )
    # Nonflush at fill 1: per element S0 k and S0 q 4, per head 2 + 3K + 8V, one buffer term 4K + 4V + 4.
    nonflush_flops = 2 + 3 * 3 + 8 * 5 + 4 * 15 + 1 * (4 * 3 + 4 * 5 + 4)
    assert gdn("replay", "nonflush", fill=1) == Cost(
        B * (GDN_STATE + 1 * GDN_ENTRY + GDN_INPUTS + GDN_COUNTERS),
        B * (GDN_ENTRY + GDN_OUT + GDN_COUNTERS),
        B * 2 * nonflush_flops,
    )
    # Flush at fill 3: the nonflush work at fill 3, then 1 + 2*4 per element and 4 V to fold.
    flush_flops = 2 + 3 * 3 + 8 * 5 + 4 * 15 + 3 * (4 * 3 + 4 * 5 + 4) + 15 * (1 + 2 * 4) + 4 * 5
    assert gdn("replay", "flush") == Cost(
        B * (GDN_STATE + 3 * GDN_ENTRY + GDN_INPUTS + GDN_COUNTERS),
        B * (GDN_STATE + GDN_OUT + GDN_COUNTERS),
        B * 2 * flush_flops,
    )
    fp8_copy = 2 * 5 * 3 + 2 * 5 * 4
    assert gdn("split", "nonflush", fill=1, read_dtype="fp8") == Cost(
        B * (fp8_copy + 1 * GDN_SPLIT_ENTRY + GDN_INPUTS + GDN_COUNTERS),
        B * (GDN_SPLIT_ENTRY + GDN_OUT + GDN_COUNTERS),
        B * 2 * (nonflush_flops + 2 * 5),
    )
    # The flush reads the copy too: it corrects the buffered updates for checkpoint - copy. Per head: the keys y_j
    # 2 f² K + f K, per element the difference (after the fp8 copy's dequantisation) and its product 1 + 1 + 2f,
    # the corrections added f V.
    correction = 2 * 9 * 3 + 3 * 3 + 15 * (1 + 1 + 2 * 3) + 3 * 5
    assert gdn("split", "flush", read_dtype="fp8") == Cost(
        B * (GDN_STATE + fp8_copy + 3 * GDN_SPLIT_ENTRY + GDN_INPUTS + GDN_COUNTERS),
        B * (GDN_STATE + fp8_copy + GDN_OUT + GDN_COUNTERS),
        B * 2 * (flush_flops + 15 + 5 + correction),
    )
    assert (gdn("split", "flush", read_dtype="fp8").flops - gdn("split", "flush", read_dtype="bf16").flops
            == B * 2 * (15 + 5 + 15))
    assert gdn("spec-conventional", draft=2) == Cost(
        B * (GDN_STATE + 2 * GDN_INPUTS), B * (2 * GDN_STATE + 2 * GDN_OUT), 2 * B * 2 * (1 + 3 + 7 * 15 + 2 * 5)
    )
    # Verify of T = 2 at fill 1: draft 0 sees 1 buffer term, draft 1 sees 2.
    assert gdn("spec-replay", "nonflush", draft=2, fill=1) == Cost(
        B * (GDN_STATE + 1 * GDN_ENTRY + 2 * GDN_INPUTS + GDN_COUNTERS) + B * (4 + GDN_COUNTERS),
        B * (2 * GDN_ENTRY + 2 * GDN_OUT) + B * GDN_COUNTERS,
        B * 2 * (2 * (2 + 3 * 3 + 8 * 5 + 4 * 15) + (1 + 2) * (4 * 3 + 4 * 5 + 4)) + B * 2,
    )
    # Fold of 4 entries: 1 + 4 (2 + V) + 15 (1 + 2*4), then the verify at fill 0 (draft 1 sees draft 0).
    assert gdn("spec-replay", "flush", draft=2).flops == (
        B * 2 * (1 + 4 * (2 + 5) + 15 * (1 + 2 * 4))
        + B * 2 * (2 * (2 + 3 * 3 + 8 * 5 + 4 * 15) + 1 * (4 * 3 + 4 * 5 + 4))
        + B * 2
    )


def test_step_cost_batch_scales_all_but_the_parameters():
    for phase, fill in (("nonflush", 1), ("flush", None)):
        one = step_cost(M2, "replay", phase, batch=1, window=W, fill=fill)
        eight = step_cost(M2, "replay", phase, batch=8, window=W, fill=fill)
        assert eight.bytes_read - M2_PARAMS == 8 * (one.bytes_read - M2_PARAMS)
        assert eight.bytes_written == 8 * one.bytes_written and eight.flops == 8 * one.flops


def test_step_cost_nemotron_super_ratio_near_the_state_bound():
    # Nemotron-3-Super has no z gate. State traffic alone: 2W reads and writes against W + 1, 32/17 = 1.88.
    kw = dict(batch=256, window=16, state_dtype="fp32", has_z=False)
    conventional = step_cost(NEMOTRON_SUPER, "conventional", **kw)
    replay = step_cost(NEMOTRON_SUPER, "replay", **kw)
    state = 128 * 64 * 128 * 4
    io = (128 * 64 + 128 + 2 * 8 * 128) * 2 + 128 * 64 * 2  # inputs and output
    entry, counters = (128 * 64 + 8 * 128) * 2 + 2 * 128 * 4, 128 * 4
    nonflush = sum(state + f * entry + io + entry + 2 * counters for f in range(15))
    # A flush reads the checkpoint and writes the folded one.
    flush = state + 15 * entry + io + state + 2 * counters
    per_row_ratio = (2 * state + io) / ((nonflush + flush) / 16)
    assert conventional.total_bytes / replay.total_bytes == pytest.approx(per_row_ratio, rel=1e-5)


def test_step_cost_nemotron_super_split_bf16_ratio():
    kw = dict(batch=256, window=16, state_dtype="fp32", has_z=False)
    conventional = step_cost(NEMOTRON_SUPER, "conventional", **kw)
    split = step_cost(NEMOTRON_SUPER, "split", read_dtype="bf16", **kw)
    state, copy = 128 * 64 * 128 * 4, 128 * 64 * 128 * 2
    io = (128 * 64 + 128 + 2 * 8 * 128) * 2 + 128 * 64 * 2  # inputs and output
    entry, counters = (128 * 64 + 8 * 128) * 2 + 2 * 128 * 4, 128 * 4
    nonflush = sum(copy + f * entry + io + entry + 2 * counters for f in range(15))
    # A flush reads the checkpoint (not the copy), writes both.
    flush = state + 15 * entry + io + state + copy + 2 * counters
    per_row_ratio = (2 * state + io) / ((nonflush + flush) / 16)
    assert conventional.total_bytes / split.total_bytes == pytest.approx(per_row_ratio, rel=1e-5)


# An 8-bit state of M2: 30 one-byte elements and one fp32 scale per row (H, P); of GDN: 30 elements, rows (HV, V).
M2_INT8_STATE = 2 * 3 * 5 * 1 + 2 * 3 * 4
GDN_INT8_STATE = 2 * 5 * 3 * 1 + 2 * 5 * 4
# Stochastic rounding per store: Philox4x32-10 per head (10 rounds of 2 umulhi, 2 mul, 4 xor, 2 add); in M2 a hash of
# 10 integer operations per pair of stored elements and 1 per element, in GDN a hash of 10 per element: M2 and GDN
# have 2 (value) heads of 30 elements in all.
PHILOX = 10 * (2 + 2 + 4 + 2)
M2_RNG = 2 * PHILOX + 15 * 10 + 30
GDN_RNG = 2 * PHILOX + 30 * 10
STEP_COUNT = 8  # the slot's int64 store count, read and written by a step that stores


@pytest.mark.parametrize("state", ["int8", "fp8"])
def test_step_cost_eight_bit_state(state):
    # Conventional: the state and its scales read and written; FLOPs per row as fp32's plus a dequantise per element
    # (30) and the store's quantise, a division per element and per row (2 * (15 + 3)).
    assert m2("conventional", state_dtype=state) == Cost(
        B * (M2_INT8_STATE + M2_INPUTS) + M2_PARAMS,
        B * (M2_INT8_STATE + M2_OUT),
        B * (2 * (6 + 3 * (3 + 5) + 5 * 3 * 5) + 30 + 2 * (15 + 3)),
    )
    # Nonflush at fill 1 reads the 8-bit checkpoint as an fp8 copy: its scales, a dequantise per row (3 per head).
    assert m2("replay", "nonflush", fill=1, state_dtype=state) == Cost(
        B * (M2_INT8_STATE + 1 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (M2_ENTRY + M2_OUT + M2_COUNTERS),
        B * 2 * (7 + 2 * 15 + 2 * (2 * 5 + 2 * 3 + 4) + 3 * (4 + 5) + 3),
    )
    # The flush dequantises the checkpoint it reads (30) and quantises the one it writes (15 + 3 per head).
    assert m2("replay", "flush", state_dtype=state) == Cost(
        B * (M2_INT8_STATE + 3 * M2_ENTRY + M2_INPUTS + M2_COUNTERS) + M2_PARAMS,
        B * (M2_INT8_STATE + M2_OUT + M2_COUNTERS),
        B * (2 * (7 + 4 * (3 + 3) + 15 * (1 + 2 * 4 + 2) + 3 * (2 + 5) + 15 + 3) + 30),
    )
    # GDN: per value head 1 + K + 7 VK + 2V, plus dequantise 30 and quantise 2 * (15 + 5).
    assert gdn("conventional", state_dtype=state) == Cost(
        B * (GDN_INT8_STATE + GDN_INPUTS), B * (GDN_INT8_STATE + GDN_OUT), B * (2 * (1 + 3 + 7 * 15 + 2 * 5) + 30 + 2 * 20),
    )
    assert memory_per_seq(M2, "conventional", state_dtype=state)["total"] == M2_INT8_STATE
    assert memory_per_seq(GDN, "replay", window=W, state_dtype=state)["state"] == GDN_INT8_STATE


def test_step_cost_stochastic_rounding_counts_philox_apart_from_flops():
    nearest = m2("conventional", state_dtype="bf16")
    sr = m2("conventional", state_dtype="bf16", rounding="stochastic")
    # A draw per head, a hash per pair of stored elements, a half per element, and the store count read and written.
    assert sr == Cost(nearest.bytes_read + B * STEP_COUNT, nearest.bytes_written + B * STEP_COUNT, nearest.flops,
                      B * M2_RNG)
    assert sr.int_ops == 760 and sr.as_dict()["int_ops"] == 760
    # A nonflush step stores nothing: no draws; the flush stores the checkpoint once.
    kw = dict(state_dtype="int8", rounding="stochastic")
    assert m2("replay", "nonflush", fill=1, **kw) == m2("replay", "nonflush", fill=1, state_dtype="int8")
    flush = m2("replay", "flush", **kw)
    assert flush.int_ops == B * M2_RNG
    assert flush.bytes_read == m2("replay", "flush", state_dtype="int8").bytes_read + B * STEP_COUNT
    # The window average: one store in W steps.
    assert m2("replay", **kw).int_ops == round(B * M2_RNG / W)
    # decode_multi stores T snapshots; a verify that folds stores one checkpoint.
    assert m2("spec-conventional", draft=2, **kw).int_ops == 2 * B * M2_RNG
    assert m2("spec-replay", "flush", draft=2, **kw).int_ops == B * M2_RNG
    assert gdn("conventional", state_dtype="fp16", rounding="stochastic").int_ops == B * GDN_RNG
    assert memory_per_seq(M2, "conventional", state_dtype="bf16", rounding="stochastic")["counters"] == STEP_COUNT
    # One head of 16 elements: one draw; M2 8 hashes and 16 halves, GDN 16 hashes
    one = Mamba2Shape(H=1, P=2, N=8, G=1)
    assert step_cost(one, "conventional", batch=B, state_dtype="bf16", rounding="stochastic").int_ops == B * (
        PHILOX + 8 * 10 + 16)
    gdn1 = GDNShape(H=1, HV=1, K=8, V=2)
    assert step_cost(gdn1, "conventional", batch=B, state_dtype="bf16", rounding="stochastic").int_ops == B * (
        PHILOX + 16 * 10)
    replay = memory_per_seq(M2, "replay", window=W, state_dtype="bf16", rounding="stochastic")
    assert replay["counters"] == M2_HELD_COUNTERS + STEP_COUNT


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: m2("replay", window=0), "window"),
        (lambda: m2("replay", window=65), "window"),
        (lambda: step_cost(M2, "replay", batch=B), "window"),
        (lambda: step_cost(M2, "conventional", batch=0), "batch"),
        (lambda: m2("split"), "read_dtype"),
        (lambda: m2("replay", state_dtype="fp4"), "state_dtype"),
        (lambda: m2("split", state_dtype="int8", read_dtype="fp8"), "not narrower"),
        (lambda: m2("split", state_dtype="bf16", read_dtype="fp16"), "not narrower"),
        (lambda: m2("conventional", rounding="stochastic"), "fp32 state is stored exactly"),
        (lambda: m2("replay", state_dtype="bf16", rounding="dithered"), "rounding"),
        (lambda: m2("replay", io_dtype="int8"), "io_dtype"),
        (lambda: m2("fast"), "variant"),
        (lambda: m2("replay", "middle"), "phase"),
        (lambda: m2("replay", "nonflush", fill=3), "fill"),
        (lambda: m2("replay", "flush", fill=1), "fill"),
        (lambda: m2("spec-replay", draft=0), "draft"),
        (lambda: m2("spec-conventional", draft=9), "draft"),
        (lambda: m2("spec-replay", draft=2, accepted=3), "accepted"),
        (lambda: m2("spec-replay", "flush", draft=2, fill=6), "fill"),
        (lambda: step_cost(M2, "replay", "nonflush", batch=B, window=1), "nonflush"),
        (lambda: step_cost(object(), "conventional", batch=B), "shape"),
    ],
    ids=[
        "window0", "window65", "no-window", "batch0", "split-no-read", "state-fp4", "int8-fp8-copy", "bf16-fp16-copy",
        "stochastic-fp32", "rounding", "io-int8", "variant",
        "phase", "nonflush-fill", "flush-fill", "draft0", "draft9", "accepted", "spec-flush-fill", "W1-nonflush",
        "shape",
    ],
)
def test_step_cost_rejects_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_launches_per_step():
    assert launches_per_step("conventional") == 1
    assert launches_per_step("replay", "flush") == 1
    assert launches_per_step("split") == 1
    assert launches_per_step("spec-conventional") == 1
    assert launches_per_step("spec-replay") == 2
    with pytest.raises(ValueError):
        launches_per_step("other")


def test_memory_per_seq():
    zero = {"read_copy": 0, "buffers": 0, "counters": 0, "snapshots": 0}
    assert memory_per_seq(M2, "conventional") == {"state": M2_STATE, **zero, "total": M2_STATE}
    # a Mamba-2 cache holds one draft's B even without drafts
    assert memory_per_seq(M2, "replay", window=W)["total"] == M2_STATE + 4 * M2_ENTRY + M2_DRAFT_B + M2_HELD_COUNTERS
    fp8 = memory_per_seq(M2, "split", window=W, read_dtype="fp8")
    assert fp8["read_copy"] == 2 * 3 * 5 * 1 + 2 * 3 * 4
    assert fp8["total"] == M2_STATE + (2 * 3 * 5 + 2 * 3 * 4) + 4 * M2_ENTRY + M2_DRAFT_B + M2_HELD_COUNTERS
    assert memory_per_seq(M2, "spec-conventional", draft=2)["total"] == 3 * M2_STATE
    assert memory_per_seq(M2, "spec-replay", window=W, draft=2)["buffers"] == (4 + 2) * M2_ENTRY + 2 * M2_DRAFT_B
    assert memory_per_seq(GDN, "replay", window=W, state_dtype="bf16")["total"] == (
        GDN_STATE // 2 + 4 * GDN_ENTRY + GDN_HELD_COUNTERS
    )
    split = memory_per_seq(GDN, "split", window=W, read_dtype="bf16", draft=2)
    assert split["buffers"] == (4 + 2) * (GDN_ENTRY + 2 * (1 + 4 + 2) * 4)
    assert split["counters"] == GDN_HELD_COUNTERS + 1 * 4  # and the verify's arrivals per key head
    with pytest.raises(ValueError, match="draft"):
        memory_per_seq(M2, "spec-replay", window=W)


def _takes_new_precisions(kernels):
    """Whether this op's ReplayCache takes 8-bit checkpoints and a rounding (each op's kernels gain them on their own)."""
    import inspect

    return "rounding" in inspect.signature(kernels.ReplayCache.create).parameters


@pytest.mark.parametrize("variant,state,read,draft,rounding", [
    ("replay", "fp32", None, 0, "nearest"), ("replay", "bf16", None, 0, "nearest"), ("split", "fp32", "bf16", 0, "nearest"),
    ("split", "fp32", "fp8", 0, "nearest"), ("spec-replay", "fp32", None, 2, "nearest"), ("split", "fp32", "fp16", 3, "nearest"),
    ("replay", "int8", None, 0, "nearest"), ("replay", "fp8", None, 2, "stochastic"), ("replay", "bf16", None, 0, "stochastic"),
])
def test_memory_per_seq_is_what_a_cache_allocates(variant, state, read, draft, rounding):
    """The model's bytes per sequence against a real ReplayCache of each layer on the CPU: every tensor's bytes over
    its slots, less the flush list's header, which belongs to no slot."""
    import torch

    from replayssm_kernels import gdn, mamba2

    nslots = 3
    for shape, kernels in ((M2, mamba2), (GDN, gdn)):
        if (state in ("int8", "fp8") or rounding == "stochastic") and not _takes_new_precisions(kernels):
            continue
        dims = (shape.H, shape.P, shape.N, shape.G) if shape.op == "mamba2" else (shape.H, shape.HV, shape.K, shape.V)
        extra = {"rounding": rounding} if rounding != "nearest" else {}
        cache = kernels.ReplayCache.create(nslots, *dims, W, state_dtype=state, read_dtype=read, io_dtype="bf16",
                                           max_draft=draft, device="cpu", **extra)
        tensors = [t for t in vars(cache).values() if isinstance(t, torch.Tensor)]
        if cache_rounding := getattr(cache, "rounding", None):
            tensors.append(cache_rounding.step)
        held = sum(t.numel() * t.element_size() for t in tensors)
        want = memory_per_seq(shape, variant, window=W, state_dtype=state, read_dtype=read, draft=draft, rounding=rounding)["total"]
        assert (held - 8 * 4) / nslots == want, (shape.op, held, want)


def test_predict_us():
    copy_only = SimpleNamespace(copy_gbs=4000.0, read_gbs=None, fp32_tflops=50.0)
    # 4 MB at 4 TB/s is 1 µs, plus one launch.
    assert predict_us(Cost(2_000_000, 2_000_000, 10), copy_only) == pytest.approx(1.0 + 2.0)
    assert predict_us(Cost(2_000_000, 2_000_000, 10), copy_only, 2, launch_us=3.0) == pytest.approx(1.0 + 6.0)
    # Compute bound: 1e8 FLOPs at 50 TFLOP/s is 2 µs.
    assert predict_us(Cost(1000, 0, 100_000_000), copy_only, 0) == pytest.approx(2.0)
    # Reads at the read stream (3 TB/s); writes at 1 / (2/4 - 1/3) = 6 TB/s, so an even copy still runs at 4 TB/s.
    streams = SimpleNamespace(copy_gbs=4000.0, read_gbs=3000.0, fp32_tflops=50.0)
    assert predict_us(Cost(3_000_000, 6_000_000, 0), streams, 0) == pytest.approx(1.0 + 1.0)
    assert predict_us(Cost(2_000_000, 2_000_000, 0), streams, 0) == pytest.approx(1.0)
    datasheet = SimpleNamespace(hbm_gbs=4800.0, fp32_tflops=67.0)
    assert predict_us(Cost(4_800_000, 0, 0), datasheet, 0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="copy_gbs"):
        predict_us(Cost(1, 1, 1), SimpleNamespace(fp32_tflops=1.0))


def test_cost_table_rows():
    rows = cost_table(M2, batch=B, window=W, state_dtype="fp32", read_dtype="fp8", io_dtype="bf16", draft=2, accepted=1)
    got = [(r["variant"], r["phase"], r["fill"]) for r in rows]
    assert got == [
        ("conventional", "avg", None),
        ("replay", "nonflush", 0), ("replay", "nonflush", 2), ("replay", "flush", 3), ("replay", "avg", None),
        ("split", "nonflush", 0), ("split", "nonflush", 2), ("split", "flush", 3), ("split", "avg", None),
        ("spec-conventional", "avg", None),
        ("spec-replay", "nonflush", 1.5), ("spec-replay", "flush", 4), ("spec-replay", "avg", None),
    ]
    by = {(r["variant"], r["phase"], r["fill"]): r for r in rows}
    conventional = m2("conventional")
    replay_avg = by["replay", "avg", None]
    assert replay_avg["bytes_read"] == m2("replay").bytes_read
    assert replay_avg["bytes_ratio"] == pytest.approx(conventional.total_bytes / m2("replay").total_bytes)
    spec = by["spec-replay", "avg", None]
    snapshots = m2("spec-conventional", draft=2)
    assert spec["bytes_ratio"] == pytest.approx(snapshots.total_bytes / spec["total_bytes"])
    assert spec["launches"] == 2 and spec["accepted"] == 1
    assert by["split", "flush", 3]["read_dtype"] == "fp8" and by["replay", "flush", 3]["read_dtype"] is None
    assert by["conventional", "avg", None]["mem_per_seq"] == M2_STATE
    assert [r["phase"] for r in cost_table(GDN, batch=1, window=1, read_dtype=None)] == ["avg", "flush", "avg"]


def test_cost_modules_import_no_torch():
    code = "import sys, replayssm_cli.model.cost, replayssm_cli.commands.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


runner = CliRunner()


def test_cost_cli_json():
    result = runner.invoke(app, ["cost", "--json", "--draft", "4", "--accepted", "3"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["op"] for r in rows} == {"mamba2", "gdn"}
    for r in rows:
        assert r["batch"] == 256 and r["window"] in (None, 16)
        assert r["bytes_read"] > 0 and r["flops"] > 0 and r["bytes_ratio"] > 0 and r["mem_per_seq"] > 0
        assert r["mem_per_seq_model"] == r["mem_per_seq"] * presets.resolve(r["preset"]).ssm_layers
    avg = {(r["op"], r["variant"]): r for r in rows if r["phase"] == "avg"}
    assert avg["mamba2", "replay"]["bytes_ratio"] > 1.7
    assert avg["mamba2", "split"]["read_dtype"] == "bf16"
    assert avg["gdn", "spec-replay"]["bytes_ratio"] > 2


def test_cost_cli_table():
    result = runner.invoke(
        app, ["cost", "--preset", "nemotron-3-super-120b-a12b", "--window", "8", "--read-dtype", "fp8", "--batch", "16"]
    )
    assert result.exit_code == 0, result.output
    assert "Nemotron-3-Super" in result.stdout and "split fp8" in result.stdout
    assert not [line for line in result.stdout.splitlines() if line.lstrip().startswith("spec-")]


@pytest.mark.parametrize(
    "args",
    [
        ["--window", "0"],
        ["--window", "65"],
        ["--batch", "-4"],
        ["--draft", "9"],
        ["--draft", "2", "--accepted", "3"],
        ["--accepted", "1"],
        ["--tp", "0"],
        ["--preset", "no-such-model"],
        ["--state-dtype", "fp7"],
        ["--read-dtype", "fp32"],
        ["--io-dtype", "int8"],
    ],
    ids=[
        "window0", "window65", "batch-4", "draft9", "accepted-over-draft", "accepted-alone", "tp0", "preset",
        "state-fp7", "read-fp32", "io-int8",
    ],
)
def test_cost_cli_bad_options_one_line(args):
    result = runner.invoke(app, ["cost", *args])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("shape", [Mamba2Shape(H=6, P=12, N=10, G=3), GDNShape(H=2, HV=6, K=12, V=10)], ids=["mamba2", "gdn"])
@pytest.mark.parametrize("kernel, read", [("replay", None), ("split-bf16", "bf16"), ("split-fp8", "fp8")])
def test_kernel_step_bytes_over_a_window_average_to_the_step_cost(shape, kernel, read):
    """A sweep's per-fill bytes are step_cost's: W steps at fills 0..W-1 average to the window's figure."""
    W = 5
    per_fill = [kernel_step_bytes(shape, kernel, f, window=W) for f in range(W)]
    variant = "split" if read else "replay"
    avg = step_cost(shape, variant, "avg", batch=1, window=W, read_dtype=read).total_bytes
    assert sum(per_fill) / W == pytest.approx(avg, abs=1)  # Cost rounds to whole bytes
    assert per_fill[-1] > per_fill[0], "the flush at fill W-1 writes the checkpoint"
    assert kernel_step_bytes(shape, f"{kernel}-flush", W - 1, window=W) == per_fill[-1]


@pytest.mark.parametrize("shape", [Mamba2Shape(H=6, P=12, N=10, G=3), GDNShape(H=2, HV=6, K=12, V=10)], ids=["mamba2", "gdn"])
def test_kernel_step_bytes_of_decode_and_verify(shape):
    assert kernel_step_bytes(shape, "decode", 0) == step_cost(shape, "conventional", batch=1).total_bytes
    multi = step_cost(shape, "spec-conventional", batch=1, draft=3).total_bytes
    assert kernel_step_bytes(shape, "decode-multi", 0, draft=3) == multi
    W = 6
    nonflush = kernel_step_bytes(shape, "verify", 2, window=W, draft=3, accepted=2)
    assert nonflush == step_cost(shape, "spec-replay", "nonflush", batch=1, window=W, fill=2, draft=3, accepted=2).total_bytes
    assert kernel_step_bytes(shape, "verify", W, window=W, draft=3, accepted=2) > nonflush, "at fill W the verify folds first"
    with pytest.raises(ValueError, match="kernel must be"):
        kernel_step_bytes(shape, "replay2", 0)


@pytest.mark.parametrize("shape", [Mamba2Shape(H=6, P=12, N=10, G=3), GDNShape(H=2, HV=6, K=12, V=10)], ids=["mamba2", "gdn"])
def test_kernel_step_bytes_of_a_batch_read_the_parameters_once(shape):
    """Rows at several fills add up, with the layer's parameters read once per step, not once per row."""
    W = 4
    # Mamba-2's A, D and dt_bias, fp32 per head; GDN takes none.
    params = 3 * 6 * 4 if shape.op == "mamba2" else 0
    fills = [0, 3, 1, 3]
    alone = [kernel_step_bytes(shape, "split-fp8", f, window=W) for f in fills]
    assert kernel_step_bytes(shape, "split-fp8", fills, window=W) == sum(alone) - 3 * params
    assert kernel_step_bytes(shape, "replay", [3, 3], window=W) == step_cost(
        shape, "replay", "flush", batch=2, window=W).total_bytes
    with pytest.raises(ValueError, match="at least one row"):
        kernel_step_bytes(shape, "replay", [], window=W)


def test_gdn_buffer_dtype():
    """A 2-byte state may buffer u and k in its own dtype: 2 bytes narrower per element; G (and beta, T) stay fp32;
    the default (None) is the cache's, fp32."""
    kw = dict(batch=B, window=W, state_dtype="bf16")
    wide = gdn("replay", "nonflush", fill=1, state_dtype="bf16")
    narrow = gdn("replay", "nonflush", fill=1, state_dtype="bf16", buffer_dtype="bf16")
    # Fill 1 reads one entry and appends one: two entries' u (HV, V) and k (H, K) per row, 2 bytes each fewer.
    assert wide.total_bytes - narrow.total_bytes == B * 2 * (2 * 5 + 1 * 3) * 2
    assert narrow.flops == wide.flops
    assert gdn("replay", buffer_dtype="fp32", state_dtype="bf16") == gdn("replay", state_dtype="bf16")
    assert memory_per_seq(GDN, "replay", window=W, state_dtype="bf16", buffer_dtype="bf16")["buffers"] == (
        W * ((2 * 5 + 1 * 3) * 2 + 2 * 4))
    assert memory_per_seq(GDN, "replay", window=W, state_dtype="bf16")["buffers"] == W * GDN_ENTRY
    assert kernel_step_bytes(GDN, "replay", 1, window=W, state_dtype="bf16", buffer_dtype="bf16") == (
        narrow.total_bytes // B)
    with pytest.raises(ValueError, match="Gated DeltaNet only"):
        m2("replay", buffer_dtype="fp32")
    with pytest.raises(ValueError, match=r"fp32 or the state dtype \(fp32\), got bf16"):
        step_cost(GDN, "replay", batch=B, window=W, buffer_dtype="bf16")
    with pytest.raises(ValueError, match=r"fp32 or the state dtype \(bf16\), got fp16"):
        step_cost(GDN, "replay", buffer_dtype="fp16", **kw)
    with pytest.raises(ValueError, match="buffer_dtype must be one of fp32, bf16, fp16"):
        memory_per_seq(GDN, "replay", window=W, state_dtype="bf16", buffer_dtype="fp8")


def test_kernels_readme_bytes_tables_are_the_cost_models(tmp_path):
    """kernels/README.md's bytes-per-step tables are benchmarks/cost_tables.py's output, which a stale table fails."""
    import benchmark_scripts

    tables = benchmark_scripts.load("cost_tables")
    readme = benchmark_scripts.BENCHMARKS.parent / "kernels" / "README.md"
    assert tables.main(["--check", str(readme)]) == 0
    stale = tmp_path / "README.md"
    stale.write_text(readme.read_text().replace("| `decode` | fp32 |  |  | 4.04 |", "| `decode` | fp32 |  |  | 4.05 |"))
    assert stale.read_text() != readme.read_text()
    assert tables.main(["--check", str(stale)]) == 1
    assert tables.main(["--write", str(stale)]) == 0 and stale.read_text() == readme.read_text()
    (tmp_path / "bare.md").write_text("no markers\n")
    assert tables.main(["--check", str(tmp_path / "bare.md")]) == 2


@pytest.mark.parametrize("args, needle", [
    (["--state-dtype", "int8", "--read-dtype", "fp8"], "the read copy (fp8) is not narrower than the checkpoint (int8)"),
    (["--state-dtype", "fp32", "--stochastic-rounding"], "an fp32 state is stored exactly"),
], ids=["int8-fp8-copy", "stochastic-fp32"])
def test_cost_cli_refuses_an_impossible_precision_in_one_line(args, needle):
    result = runner.invoke(app, ["cost", *args])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


def test_cost_cli_eight_bit_state_with_stochastic_rounding():
    result = runner.invoke(app, ["cost", "-p", "nemotron-3-super-120b-a12b", "--state-dtype", "int8",
                                 "--stochastic-rounding", "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    shape = presets.resolve("nemotron-3-super-120b-a12b").shape
    # an 8-bit state has no narrower read copy: no split rows
    assert {r["variant"] for r in rows} == {"conventional", "replay"}
    conv = next(r for r in rows if r["variant"] == "conventional")
    assert conv["state_dtype"] == "int8" and conv["rounding"] == "stochastic"
    # a draw per head, a hash per element
    assert conv["int_ops"] == 2 * (shape.H * 100 + shape.state_elems // 2 * 10 + shape.state_elems)
    assert conv["memory"]["state"] == shape.state_elems + shape.state_rows * 4
    text = runner.invoke(app, ["cost", "-p", "nemotron-3-super-120b-a12b", "--state-dtype", "bf16", "--stochastic-rounding"])
    assert text.exit_code == 0 and "int ops" in text.stdout and "split fp8" in text.stdout
