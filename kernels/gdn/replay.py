"""ReplaySSM Gated DeltaNet decode: read the checkpoint, replay the buffered updates, write state only at flushes."""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from replayssm_kernels import families
from replayssm_kernels.gdn.cache import ReplayCache, dequantize_read
from replayssm_kernels.gdn.common import (
    advance_heads,
    cast,
    check_accepted,
    check_device,
    check_flush_keys,
    check_out,
    check_slots,
    check_step,
    compile_options,
    default_scale,
    dot_fp32,
    fills_read,
    flat_program_ids,
    flush_cap,
    flush_grid,
    flush_precision,
    list_done,
    list_flush,
    list_heads,
    listed_ahead,
    listed_flush,
    qk_factors,
    launch_settings,
    medium_grid,
    next_pow2,
    pop_flush_keys,
    quantize_e4m3,
    rounded,
    scalar_mask,
    sm_count,
    small_grid,
)

# These kernels mutate the cache in place, so their settings are fixed here (an autotuner would rerun them on live
# state); a read copy gets its own rows because correcting the buffered updates at a flush holds a second tile.
# A non-flush step reads its tile as [BV, BK / VK, VK]: with many programs per SM, BV rows at a time through a
# pipelined loop in 2-warp programs with registers capped (more programs fit); a grid under two programs per SM is
# latency-bound and splits each head's rows over programs of VP rows, each reading its rows up front and the buffer
# before the fill ("-small"), the slot's load issued before the step's own inputs (EARLY=2: batch 1 5.04 -> 4.81
# µs per layer-step under `replayssm profile`, a bf16 state's 4.96 -> 4.68; benchmarks/notes/run-65.md), and the programs of a
# head counting their arrivals lane by lane (LCOUNT=1: 4.93 -> 4.67, a bf16 state's 4.70 -> 4.54; run 66). A
# flush walks its rows BVF at a time (benchmarks/sweep_gdn.py, benchmarks/notes/run-29.md: BVF=16 took batch 256 from 325 to
# 303 µs, and a bf16 checkpoint's step from 346 to 201). A row with PHASES=2 launches the non-flush steps, which
# list the heads that flush, and then the flushes with the settings of its "-flush" row (by default the row's own)
# in PPS programs per SM that loop over the list; with PDL=1 the second as a programmatic dependent launch.
_ONE_CHUNK = {"EARLY": 0, "LCOUNT": 0, "TF32": 0, "CTF32": 0, "SLOAD": 0, "MMA": 0, "VP": 256, "BV": 128, "BVF": 16,
              "VK": 32, "STAGES": 2, "num_warps": 4, "num_stages": 1, "maxnreg": None, "PPS": 6, "FCAP": None}
# A read copy's flushes: 4-warp programs of whole heads, 3xTF32 products (the `-split` rows' correction in one TF32
# pass, CTF32; `_correction_precision`), 168 registers (3 programs per SM), or 255 (FCAP: 2 per SM, each faster) where
# a staggered step's flushes take no more rounds of resident programs at 255 (`flush_cap`).
_COPY_FLUSH = dict(_ONE_CHUNK, BVF=32, TF32=1, maxnreg=168, FCAP=255)
_SPLIT = {"EARLY": 0, "LCOUNT": 0, "TF32": 0, "CTF32": 0, "SLOAD": 0, "MMA": 0, "VP": 256, "BV": 32, "BVF": 16,
          "VK": 64, "STAGES": 3, "num_warps": 1, "num_stages": 1, "maxnreg": 128, "PHASES": 2, "PPS": 6,
          "FCAP": None, "HPP": 1, "PDL": 1}
# FPASS=1 takes the folds out of the verify into a launch of their own (`_verify_fold_kernel`, after a launch that
# lists the value heads that fold): PPS programs per SM of FWARPS warps (registers capped at FMAXNREG) loop over
# items of FVP rows, each fold one product in 3xTF32 (TF32=1) or fp32 FMAs (0; the verify's own folds always take
# 3xTF32), in FKSPLIT column pieces (the verify's own folds take KSPLIT's); FSTREAM=1 runs the folds on a second
# stream beside the key-product pass and the weights, which read nothing a fold writes; FPREF=1 loads each
# program's next item's list entry and slot while it folds the one before; FSPLITW=1 takes a fill of W = 16 in a
# product over 16 entries, not over the capacity's 32, and FSPLITW=2 a fill past it in the same product and up to
# four more entries one by one (`_fold_widths`). With ARRIVE=1 the last of a key head's value heads to finish its
# verify writes the drafts' keys (an atomic count of arrivals), as a verify that folds its own rows needs; ARRIVE=0
# has the key head's first value head write them, its programs ending without the count (with FPASS=1 only: a
# verify that folds its own rows counts regardless). WFILL=1 has a verify program read its value head's fill from
# the weights launch's output (GPASS=2 only), beside its slot, rather than from the cache after the slot.
_FOLD = {"FPASS": 0, "FVP": 128, "FWARPS": 4, "FMAXNREG": None, "PPS": 4, "TF32": 1, "FKSPLIT": 2, "FSTREAM": 0,
         "FPREF": 0, "FSPLITW": 0, "ARRIVE": 1, "WFILL": 0}
_VERIFY = {"BV": 32, "BVF": 16, "VK": 32, "STAGES": 2, "GPASS": 2, "GKSPLIT": 2, "MMA": 1, "KSPLIT": 2, "FSTAGES": 3,
           "num_warps": 2, "num_stages": 1, "maxnreg": 168,
           **dict(_FOLD, FPASS=1, FWARPS=2, PPS=4, TF32=0, FKSPLIT=1, FSTREAM=1, FPREF=1, FSPLITW=2, ARRIVE=0,
                   WFILL=1)}
_SMALL = {"EARLY": 2, "LCOUNT": 1, "TF32": 0, "CTF32": 0, "SLOAD": 0, "MMA": 0, "VP": 16, "BV": 16, "BVF": 16,
          "VK": 32, "STAGES": 1, "num_warps": 1, "num_stages": 1, "maxnreg": None, "PHASES": 1, "PPS": 6,
          "FCAP": None, "HPP": 1, "PDL": 0}
LAUNCH = {
    "replay": {"EARLY": 0, "LCOUNT": 0, "TF32": 0, "CTF32": 0, "SLOAD": 0, "MMA": 0, "VP": 256, "BV": 32, "BVF": 16,
               "VK": 32, "STAGES": 3, "num_warps": 2, "num_stages": 1, "maxnreg": 128, "PHASES": 1,
               "PPS": 6, "FCAP": None, "HPP": 1, "PDL": 0},
    "replay-small": _SMALL,
    # Under split precision a flush also reads the copy and corrects the buffered updates with two more products;
    # in one launch its 4-warp programs set the non-flush step's too (255 µs at batch 256). Apart, the non-flush
    # step runs in the bf16-state replay's 2-warp programs and the flush through 3xTF32 products: batch 256's window
    # 416 -> 342 µs, batch 64's 128 -> 108 (benchmarks/notes/run-49.md); with the flushes' launch over a list of the heads that
    # flush rather than a program per head, 285 and 92, and the non-flush step in 1-warp programs (16-row chunks:
    # non-flush 189 -> 187 µs at 256, 58 -> 55 at 64; 32-row chunks in 64-wide pieces: window 284 -> 277 and 90 ->
    # 89; run 51). A small grid keeps one launch, in the fp32 state's 16-row one-warp programs with the flush in
    # 3xTF32 (from 4-warp programs of whole heads: batch 1 7.77 -> 5.49 µs per layer-step under `replayssm
    # profile`, an fp8 copy's 7.71 -> 5.91; the sweep at batch 2 9.20 -> 7.19, at 4 13.33 -> 12.41; benchmarks/notes/run-66.md).
    # Under 16 programs per SM ("-medium") a staggered step's flushes are one row's heads in 64-row items (from
    # whole heads, 64 programs at batch 16 on 132 SMs): the sweep at batch 16 39.4 -> 34.5 µs, at 32 59.3 -> 53.4,
    # an fp8 copy's 46.6 -> 37.9 and 63.0 -> 52.3 (benchmarks/notes/run-66.md). A 2-byte copy's flushes take their correction in
    # one TF32 pass (CTF32=1: the flush step alone at 256 1476 -> 1173 µs; under `replayssm profile` batch 256
    # 272.6 -> 253.8 µs per layer-step, 64 87.6 -> 80.6, 16 34.2 -> 31.5, 1 5.43 -> 5.13; the checkpoint's error
    # over 2000 steps about 1.1e-6 of the state against 0.4e-6, an fp32-only cache's 0.3e-6; benchmarks/notes/run-67.md). The
    # flushes are bound by their products, not their bytes: read from the checkpoint and the buffered v instead of
    # the copy (10.5 B per element against 12.5) they ran no faster (run 67). A flush program at 255 registers takes
    # an item sooner than at 168 but fits 2 per SM rather than 3, so the cap goes by the rounds of resident programs a
    # staggered step's flushes take (FCAP, `flush_cap`): under `replayssm profile` a bf16 copy at 64 80.5 -> 76.8 µs
    # per layer-step (1.65x -> 1.73x), 128 145.8 -> 140.5 (1.80x -> 1.87x), an fp8 copy's 90.5 -> 82.8 and 169.1 ->
    # 155.0; at 96 (384 items: one round at 168, two at 255) 168 keeps 103.7 against 116.8, and at 256 254 against 263
    # (benchmarks/notes/run-68.md). Reading each chunk's checkpoint rows outside the pipelined loop's shared memory (SLOAD=1 or 2)
    # takes the flush's 4-way bank conflicts away (6.1e7 of its 1.6e8 shared wavefronts -> 0.8e7) but needs 227-252
    # registers: at the same 255 a flush at 256 1359 -> 1339 µs, against 1166 at 168 (run 68). The flushes' launch
    # begins while the non-flush launch's last programs run (PDL=1, a programmatic dependent launch): under `replayssm
    # profile` a bf16 copy at 16 30.9 -> 28.6 µs per layer-step (1.15x -> 1.24x), 64 76.8 -> 76.0, 256 level; the
    # sweep's fp8 copy at 16 36.5 -> 33.6, level at 64 and 256 (run 68).
    "replay-split": _SPLIT,
    "replay-split-flush": dict(_COPY_FLUSH, CTF32=1),
    "replay-split-medium": dict(_SPLIT),
    "replay-split-medium-flush": dict(_COPY_FLUSH, VP=64, CTF32=1),
    "replay-split-small": dict(_SMALL, TF32=1, CTF32=1),
    # An fp8 copy's 1-byte rows are summed in 128-wide pieces (a thread's 16-byte loads): its non-flush launch in
    # 1-warp programs of 32-row chunks, the flushes in the 4-warp row, took batch 256 from 421 µs (one launch) to
    # 292, 64 from 122 to 91, 16 from 47 to 46 (benchmarks/notes/run-51.md).
    "replay-fp8": dict(_SPLIT, VK=128),
    "replay-fp8-flush": dict(_COPY_FLUSH),
    "replay-fp8-medium": dict(_SPLIT, VK=128),
    "replay-fp8-medium-flush": dict(_COPY_FLUSH, VP=64),
    "replay-fp8-small": dict(_SMALL, TF32=1),
    # verify reads its tile BV rows at a time as a non-flush step does; a row that flushes first folds BVF at a time.
    # MMA=1 takes each chunk's row sums with every draft's k and q as one [BV, K] x [K, 16] tensor-core product (two
    # TF32 passes for an fp32 tile against 16-bit drafts), the committed entries' terms into its accumulator, in K
    # halves with KSPLIT=2 (a fold too: its keys' 32 KiB of shared memory halved), the fold's loop FSTAGES deep.
    # MMA=0 sums each row in shuffles after taking every draft's k and q into the tile's layout through shared memory,
    # L1-bound (benchmarks/notes/run-41.md). GPASS=1 takes the key products a key head's value heads share (the drafts' and the
    # committed entries' keys with each draft's key and query, the drafts' norms) from one tensor-core product per
    # (row, key head) in a launch before the verify's (`_verify_gram_kernel`) instead of in each value head's
    # prologue. Batch 256, µs per layer-step (benchmarks/notes/run-59.md): 1108 (MMA=0, 16-row chunks in 2-warp programs) -> 882
    # with GPASS -> 568 with MMA in 32-row chunks (16 per warp: no warp repeats another's tile reads) and KSPLIT
    # under a cap of 168 registers; batch 16 92 -> 60; the fold's loop 3 deep a further 2-7% at every batch (24 B of
    # spills). Grids under two programs per SM ("verify-small") take 64-row chunks in 4-warp programs: batch 1
    # 21.9 -> 16.5. GPASS=2 takes each value head's prologue (its fill, the drafts' gates, the [T, T] solve, the
    # committed entries' weights) into a launch of its own after the key products (`_verify_weights_kernel`), so that
    # the verify's programs begin with independent loads: 564 -> 507 µs at 256, 165 -> 150 at 64, 65 -> 61 at 16
    # (benchmarks/notes/run-60.md); the small grids keep GPASS=1 (17.3 against 17.6 µs at batch 1). FPASS=1 takes the folds into a
    # launch of their own (`_verify_fold_kernel`: 2-warp programs, 8 per SM, fp32 FMAs in one piece of K), and the
    # verify compiles without its fold (146 registers instead of 168, no spills): 508 -> 499 µs at 256, 151 -> 146 at
    # 64, 62 -> 59 at 16 (benchmarks/notes/run-61.md); the small grids keep their folds (17.2 against 19.5 µs at batch 1). With
    # FSTREAM=1 the folds run beside the key products and the weights, 4 fold programs per SM leaving room for
    # theirs: 497 -> 478 µs at 256, 147 -> 140 at 64, 59.8 -> 53.7 at 16 (benchmarks/notes/run-62.md). Grids under 16 programs
    # per SM ("verify-medium") fold in items of 64 rows: batch 16 53.9 -> 49.2 µs, level at 32, 1-2% slower from 64
    # up (benchmarks/notes/run-62.md). FPREF loads a fold item's list entry and slot an item ahead, GKSPLIT=2 takes the key products
    # in K halves (182 -> 108 registers), FSPLITW folds a fill of 16 in a product over 16 entries, not 32 (1267 ->
    # 695 instructions per 16-row chunk): in the reference loop (T = 4, acceptance 0.9) 118.1 -> 116.9 µs per token
    # at 256, 34.6 -> 33.7 at 64 (benchmarks/notes/run-63.md); FSPLITW=2 folds a fill past 16 in the same product and the rest one
    # by one (1266 -> 906 instructions per chunk): 118.5 -> 115.5 µs per token at 256, the sweep at 64 138.6 -> 133.5
    # µs (benchmarks/notes/run-63.md). The medium grids keep the key products whole (GKSPLIT=2 1 µs slower at batch 16) and
    # FSPLITW=1 (FSPLITW=2 not timed there). With ARRIVE=0 a verify program ends without the count of arrivals (a
    # barrier and an atomic's round trip): the verify at fill 0 320.5 -> 307.8 µs at 256, the sweep at 16 / 64 / 256
    # 49.2 / 133.1 / 457.8 -> 46.7 / 129.3 / 445.7, the reference loop 114.1 -> 111.0 µs per token at 256
    # (benchmarks/notes/run-64.md). WFILL=1 takes a program's fill from the weights launch beside its slot: the sweep at 64 / 256 130.8 /
    # 450.5 -> 129.8 / 448.5, the reference loop 113.5 -> 112.8 µs per token at 256; batch 16 46.3 -> 47.4, so the
    # medium grids keep WFILL=0 (benchmarks/notes/run-64.md).
    "verify": _VERIFY,
    "verify-medium": dict(_VERIFY, FVP=64, GKSPLIT=1, FSPLITW=1, WFILL=0),
    "verify-small": {"BV": 64, "BVF": 16, "VK": 32, "STAGES": 2, "GPASS": 1, "GKSPLIT": 1, "MMA": 1, "KSPLIT": 2,
                     "FSTAGES": 1, "num_warps": 4, "num_stages": 1, "maxnreg": 168, **_FOLD},
    "verify-split": {"BV": 32, "BVF": 16, "VK": 32, "STAGES": 2, "GPASS": 0, "GKSPLIT": 1, "MMA": 0, "KSPLIT": 1,
                     "FSTAGES": 1, "num_warps": 4, "num_stages": 1, "maxnreg": None, **_FOLD},
    "verify-fp8": {"BV": 32, "BVF": 16, "VK": 32, "STAGES": 2, "GPASS": 0, "GKSPLIT": 1, "MMA": 0, "KSPLIT": 1,
                   "FSTAGES": 1, "num_warps": 4, "num_stages": 1, "maxnreg": None, **_FOLD},
    "accept": {"num_warps": 1},
}


GRAM_WARPS = 2
WEIGHTS_WARPS = 1


def launch_name(kernel: str, cache: ReplayCache, batch: int | None = None) -> str:
    """The LAUNCH row of `kernel` ("replay" or "verify") for this cache's read copy, and, given the batch, its
    small-grid row (a grid under two programs per SM) or medium-grid row (under 16) where it has one."""
    if cache.read_copy is not None:
        kernel += "-fp8" if cache.read_scale is not None else "-split"
    if batch is not None:
        for size, smaller in (("small", small_grid), ("medium", medium_grid)):
            if f"{kernel}-{size}" in LAUNCH and smaller(batch * cache.HV, cache.device):
                return f"{kernel}-{size}"
    return kernel


def _mma_tile(cache: ReplayCache) -> bool:
    """Whether a non-flush step's tile can take its row sums as a tensor-core product exactly: a 2-byte tile in the
    dtype of q and k (their products are exact in the fp32 accumulator)."""
    tile = cache.checkpoint.dtype if cache.read_copy is None else cache.read_copy.dtype
    return tile in (torch.bfloat16, torch.float16) and cache.io_dtype == tile


@triton.jit
def _read_copy(rcopy, rscale, o_s, o_r, m_s, m_v, IS_FP8: tl.constexpr):
    """Rows [BV, BK] of the read copy as fp32 values."""
    b_c = tl.load(rcopy + o_s, mask=m_s, other=0.0).to(tl.float32)
    if IS_FP8:
        b_c *= tl.load(rscale + o_r, mask=m_v, other=0.0)[:, None]
    return b_c


@triton.jit
def _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_FP8: tl.constexpr):
    """Store the read copy of checkpoint rows b_s [BV, BK]; return the values a read of the copy gives."""
    if IS_FP8:
        b_amax = tl.max(tl.abs(b_s), 1)
        b_sc = tl.where(b_amax > 0, tl.math.div_rn(b_amax, tl.full(b_amax.shape, 448.0, tl.float32)), 1.0)
        b_c = quantize_e4m3(tl.math.div_rn(b_s, tl.broadcast_to(b_sc[:, None], b_s.shape)))
        tl.store(rcopy + o_s, b_c, mask=m_s)
        tl.store(rscale + o_r, b_sc, mask=m_v)
        b_r = b_c.to(tl.float32) * b_sc[:, None]
    else:
        b_c = cast(b_s, rcopy.dtype.element_ty)
        tl.store(rcopy + o_s, b_c, mask=m_s)
        b_r = b_c.to(tl.float32)
    return b_r


@triton.jit
def _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, C: tl.constexpr, HV: tl.constexpr,
                        PRECISION: tl.constexpr):
    """[BW, BK] rows w_j = -e^{G_j} y_j with u_j - û_j = (checkpoint - copy) · w_j for every row of a head: y_j =
    sum_l t_jl k_l from the rows t_j of T the appends stored and the buffered keys b_kw [BW, BK] (zero past the
    fill)."""
    m_w = o_w < b_f
    b_t = tl.load(buf_t + ((i_s * C + o_w[:, None]) * HV + i_hv) * C + o_w[None, :],
                  mask=m_w[:, None] & (o_w < C)[None, :], other=0.0)
    return tl.where(m_w, -tl.exp(b_Gw), 0.0)[:, None] * tl.dot(b_t, b_kw, input_precision=PRECISION)


@triton.jit
def _fold(
    b_s, b_d, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_G, b_Gw, b_kw, b_wc,
    C: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, CORRECT: tl.constexpr, PRECISION: tl.constexpr,
    CPRECISION: tl.constexpr,
):
    """b_s [BV, BK] plus sum_{j<f} e^{G - G_j} u_j k_jᵀ; with CORRECT, u_j corrected by b_d · w_j, b_d =
    checkpoint - copy [BV, BK] and b_wc [BW, BK] the rows w_j (`_correction_weights`), one product in CPRECISION.

    b_Gw [BW] and b_kw [BW, BK] are the buffered log-decays and keys, zero past the fill.
    """
    m_w = o_w < b_f
    # [BW, BV]
    b_uw = tl.load(
        buf_u + ((i_s * C + o_w[:, None]) * HV + i_hv) * V + o_v[None, :], mask=m_w[:, None] & m_v[None, :], other=0.0,
    ).to(tl.float32)
    if CORRECT:
        b_uw += tl.dot(b_wc, tl.trans(b_d), input_precision=CPRECISION)
    b_cw = tl.where(m_w, tl.exp(b_G - b_Gw), 0.0)
    # One product for the whole rank-f update: fp32 FMAs ("ieee") in a replay flush's small chunks unless its TF32
    # setting asks for 3xTF32 on the tensor cores, which verify's larger ones always use (benchmarks/notes/).
    return b_s + tl.dot(tl.trans(b_uw * b_cw[:, None]), b_kw, input_precision=PRECISION)


@triton.jit
def _folded_rows(
    ckpt, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc, b_held,
    C: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, PRECISION: tl.constexpr, CPRECISION: tl.constexpr,
    SLOAD: tl.constexpr,
):
    """Checkpoint rows o_v with the f buffered entries folded in (corrected under a read copy), and their offsets.

    The rows are read here (SLOAD=0: in a pipelined loop, through shared memory; 1: under a branch on the fill,
    which the pipeliner leaves to a plain load), or were read a chunk ahead into b_held (2, `_replay_flush`)."""
    m_s = m_v[:, None] & m_k[None, :]
    o_s = ((i_s * HV + i_hv) * V + o_v[:, None]) * K + o_k[None, :]
    o_r = (i_s * HV + i_hv) * V + o_v
    if SLOAD == 2:
        b_s = b_held.to(tl.float32)
    elif SLOAD == 1:
        b_s = tl.zeros(o_s.shape, tl.float32)
        if b_f >= 0:
            b_s = tl.load(ckpt + o_s, mask=m_s, other=0.0).to(tl.float32)
    else:
        b_s = tl.load(ckpt + o_s, mask=m_s, other=0.0).to(tl.float32)
    if HAS_COPY:
        b_d = b_s - _read_copy(rcopy, rscale, o_s, o_r, m_s, m_v, IS_FP8)
        b_s = _fold(b_s * tl.exp(b_Gl), b_d, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
                    C, HV, V, True, PRECISION, CPRECISION)
    else:
        b_s = _fold(b_s * tl.exp(b_Gl), b_s, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
                    C, HV, V, False, PRECISION, CPRECISION)
    return b_s, o_s, o_r, m_s


@triton.jit
def _replay_flush(
    ckpt, rcopy, rscale, buf_u, buf_t, v, o,
    i_b, i_s, i_h, i_hv, v0, b_f, b_k, b_q, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
    s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
    C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, VP: tl.constexpr, BVF: tl.constexpr,
    STAGES: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, PRECISION: tl.constexpr,
    CPRECISION: tl.constexpr, SLOAD: tl.constexpr,
):
    """The step that fills the window for rows v0 .. v0 + VP: fold the buffer into the full checkpoint, take this
    step from it, store it (the checkpoint's rows read as SLOAD says, `_folded_rows`)."""
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b_wc = b_kw
    if HAS_COPY:
        b_wc = _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, C, HV, PRECISION)
    o_h = (i_s * HV + i_hv) * V
    # With SLOAD=2 each chunk's checkpoint rows are read during the chunk before (the first before the loop).
    b_next = tl.zeros((BVF, BK), ckpt.dtype.element_ty)
    if SLOAD == 2:
        o_n = v0 + tl.arange(0, BVF)
        m_n = (o_n < V) & (tl.arange(0, BVF) < VP)
        b_next = tl.load(ckpt + (o_h + o_n[:, None]) * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
    # BVF rows at a time (a pipelined loop), so that this rare branch does not raise the register count of the common
    # one.
    for i_v in tl.range(0, VP, BVF, num_stages=STAGES):
        o_v = v0 + i_v + tl.arange(0, BVF)
        # A chunk is at least 16 rows (the fold is one product); with VP < 16 it is masked to this program's rows.
        m_v = (o_v < V) & (i_v + tl.arange(0, BVF) < VP)
        b_held = b_next
        if SLOAD == 2:
            o_n = o_v + BVF
            m_n = (o_n < V) & (i_v + BVF + tl.arange(0, BVF) < VP)
            b_next = tl.load(ckpt + (o_h + o_n[:, None]) * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                             other=0.0)
        # [BVF, BK] the checkpoint, brought to the state after the buffered entries
        b_s, o_s, o_r, m_s = _folded_rows(
            ckpt, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc, b_held,
            C, HV, K, V, HAS_COPY, IS_FP8, PRECISION, CPRECISION, SLOAD,
        )
        b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
        b_s *= tl.exp(b_g)
        b_u = b_beta * (b_v - tl.sum(b_s * b_k[None, :], 1))
        b_s += b_u[:, None] * b_k[None, :]
        b_o = tl.sum(b_s * b_q[None, :], 1)
        tl.store(o + i_b * s_ob + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
        b_s = rounded(b_s, ckpt.dtype.element_ty)
        tl.store(ckpt + o_s, b_s.to(ckpt.dtype.element_ty), mask=m_s)
        if HAS_COPY:
            _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_FP8)


@triton.jit
def _row_sums(b_s, b_k3, b_q3, b_rk, b_rq):
    """[BV] sums of the rows of b_s [BV, NC, VK] times k and q [NC, VK], scaled by b_rk and b_rq."""
    b_s = b_s.to(tl.float32)
    # The chunk axis first: it lies within each thread, and only the VK axis's lanes then shuffle.
    b_sk = tl.sum(tl.sum(b_s * b_k3[None, :, :], 1), 1)
    b_sq = tl.sum(tl.sum(b_s * b_q3[None, :, :], 1), 1)
    return b_sk * b_rk, b_sq * b_rq


@triton.jit
def _tile(rcopy, o_h, o_v, m_v, o_k, m_k, o_k3, m_k3, K: tl.constexpr, MMA: tl.constexpr):
    """Rows o_v of the tile a non-flush step reads: [BV, BK] for a tensor-core product, else [BV, NC, VK]."""
    if MMA:
        return tl.load(rcopy + (o_h + o_v[:, None]) * K + o_k[None, :], mask=m_v[:, None] & m_k[None, :], other=0.0)
    else:
        return tl.load(rcopy + (o_h + o_v[:, None, None]) * K + o_k3[None, :, :],
                       mask=m_v[:, None, None] & m_k3[None, :, :], other=0.0)


@triton.jit
def _tile_sums(b_s, b_k3, b_q3, b_kqm, b_rk, b_rq, MMA: tl.constexpr):
    """[BV] sums of the tile's rows times k and q, scaled by b_rk and b_rq: with MMA one product of the 2-byte tile
    [BV, BK] with b_kqm [BK, 16] (k in column 0, q in column 1, both in the tile's dtype; fp32 accumulation), else
    `_row_sums` over [BV, NC, VK]."""
    if MMA:
        b_acc = tl.dot(b_s, b_kqm)
        o_n = tl.arange(0, 16)[None, :]
        return tl.sum(tl.where(o_n == 0, b_acc, 0.0), 1) * b_rk, tl.sum(tl.where(o_n == 1, b_acc, 0.0), 1) * b_rq
    else:
        return _row_sums(b_s, b_k3, b_q3, b_rk, b_rq)


@triton.jit
def _nonflush_rows(
    o, buf_u, rscale, b_sk, b_sq, b_uw, b_v, b_wk, b_wq, b_beta, b_eG, b_kq, i_b, i_s, i_hv, b_f, o_h, o_v, m_v,
    s_ob, s_oh, s_ov, C: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, IS_FP8: tl.constexpr,
):
    """A non-flush step's rows o_v: from the tile's row sums times k and q (b_sk, b_sq), the buffered updates b_uw
    [BW, BV] with their weights in S_{t-1} k_t and S_t q_t (b_wk, b_wq) and v, this token's update u, appended to
    the buffer, and its output o."""
    b_bk = tl.sum(b_wk[:, None] * b_uw, 0)
    b_bq = tl.sum(b_wq[:, None] * b_uw, 0)
    if IS_FP8:
        b_sc = tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)
        b_sk *= b_sc
        b_sq *= b_sc
    b_u = b_beta * (b_v - b_eG * b_sk - b_bk)
    b_o = b_eG * b_sq + b_bq + b_kq * b_u
    tl.store(o + i_b * s_ob + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
    tl.store(buf_u + ((i_s * C + b_f) * HV + i_hv) * V + o_v, cast(b_u, buf_u.dtype.element_ty), mask=m_v)


@triton.jit
def _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh):
    """The step's g, beta, q and k [BK] as given, as fp32."""
    b_g = tl.load(g + i_b * s_gb + i_hv * s_gh).to(tl.float32)
    b_beta = tl.load(beta + i_b * s_bb + i_hv * s_bh).to(tl.float32)
    b_q = tl.load(q + i_b * s_qb + i_h * s_qh + o_k * s_qk, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_b * s_kb + i_h * s_kh + o_k * s_kk, mask=m_k, other=0.0).to(tl.float32)
    return b_g, b_beta, b_q, b_k


@triton.jit
def _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh,
                 s_bb, s_bh):
    """The step's g, beta, q and k [BK], and q and k [NC, VK] as given, in the shape of the tiles (their factors go
    on the row sums instead), all as fp32."""
    b_g, b_beta, b_q, b_k = _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk,
                                          s_gb, s_gh, s_bb, s_bh)
    b_q3 = tl.load(q + i_b * s_qb + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
    b_k3 = tl.load(k + i_b * s_kb + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
    return b_g, b_beta, b_q, b_k, b_q3, b_k3


@triton.jit
def _replay_kernel(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_b, buf_t, fill, arrive, work,
    q, k, v, g, beta, o, slots,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    W: tl.constexpr, C: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, VP: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, BW: tl.constexpr,
    VK: tl.constexpr, STAGES: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_FP8: tl.constexpr, EARLY: tl.constexpr, PRECISION: tl.constexpr, PHASE: tl.constexpr, MMA: tl.constexpr,
    LCOUNT: tl.constexpr, LANES: tl.constexpr, CPRECISION: tl.constexpr, SLOAD: tl.constexpr, PDL: tl.constexpr,
):
    # PHASE 0 takes every row's step; 1 only the non-flush steps, and lists the (row, head, fill) of each head that
    # flushes in `work` for `_flush_kernel` (`replay` launches the two where a cache's row asks for two launches).
    # Both advance every fill. With PDL the flushes' launch may begin once every program here has begun.
    if PDL:
        gdc_launch_dependents()
    # Each program takes VP rows of its (row, value head): NPB programs share the head's buffer and fill counter.
    NPB: tl.constexpr = (V + VP - 1) // VP
    i_b, i_hv, i_p = flat_program_ids(HV, NPB)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_k = o_k < K
    # A non-flush step reduces its tiles over K. They are held as [BV, BK / VK, VK] so that each thread sums its
    # VK-wide pieces of a row in registers and only the lanes that share a row meet in shuffles.
    NC: tl.constexpr = BK // VK
    o_k3 = tl.arange(0, NC)[:, None] * VK + tl.arange(0, VK)[None, :]
    m_k3 = o_k3 < K
    if EARLY == 2:
        # the slot's load issued first, so that it is in flight while the layout changes of q and k wait on theirs
        i_s = tl.load(slots + i_b).to(tl.int64)
    if EARLY:
        # The step's own inputs depend on neither the slot nor the fill: read first, they leave the chain too.
        b_g, b_beta, b_q, b_k, b_q3, b_k3 = _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3,
                                                         s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh)
    if EARLY != 2:
        i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_h = (i_s * HV + i_hv) * V
    v0 = i_p * VP
    # The tile read bounds a non-flush step: when it is one chunk, it is issued before the fill it does not depend on.
    if BV >= VP:
        o_v = v0 + tl.arange(0, BV)
        # rcopy is the checkpoint itself when the cache has no read copy (`_cache_args`).
        b_r = _tile(rcopy, o_h, o_v, o_v < V, o_k, m_k, o_k3, m_k3, K, MMA)
    m_c = o_w < C
    if EARLY:
        # The buffer is read whole, before the fill it is masked by: the fill then leaves the chain of dependent
        # loads (slot, fill, buffer) that bounds a small grid. Entries past the fill are weighted by zero below.
        b_Gw = tl.load(buf_g + (i_s * C + o_w) * HV + i_hv, mask=m_c, other=0.0)
        # [BW, NC, VK] the buffered keys
        b_kw3 = tl.load(buf_k + ((i_s * C + o_w[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                        mask=m_c[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        if BV >= VP:
            # [BW, BV] the buffered updates of this program's rows, and the rows' v: with one chunk they are read
            # here rather than after the tile's row sums, which they do not depend on.
            b_uw1 = tl.load(buf_u + ((i_s * C + o_w[:, None]) * HV + i_hv) * V + o_v[None, :],
                            mask=m_c[:, None] & (o_v < V)[None, :], other=0.0).to(tl.float32)
            b_v1 = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=o_v < V, other=0.0)
    p_f = fill + i_s * HV + i_hv
    # a (slot, head)'s LANES arrival counts; without LCOUNT only the first
    o_a = tl.arange(0, LANES)
    p_a = arrive + (i_s * HV + i_hv) * LANES
    b_f = tl.load(p_f)
    m_w = o_w < b_f
    f_next = tl.where(b_f + 1 >= W, 0, b_f + 1)
    if EARLY:
        if NPB > 1:
            # Arrive as soon as every thread has read the fill.
            fills_read()
            if LCOUNT:
                # each lane counts on its own counter: no lane waits for another's count (a scalar atomic's result
                # is broadcast to the warp where it is issued), so the round trip is waited on only at the end
                b_arrived = tl.atomic_add(p_a + o_a, tl.where(b_f >= 0, 1, 0) + o_a * 0, sem="relaxed")
            else:
                b_arrived = tl.atomic_add(p_a, tl.where(b_f >= 0, 1, 0), sem="relaxed")
        b_Gl = tl.sum(tl.where(o_w == b_f - 1, b_Gw, 0.0))
        b_Gw = tl.where(m_w, b_Gw, 0.0)
    else:
        # The f buffered entries' log-decays [BW], and the log-decay since the checkpoint after the last of them.
        b_Gw = tl.load(buf_g + (i_s * C + o_w) * HV + i_hv, mask=m_w, other=0.0)
        b_Gl = tl.load(buf_g + (i_s * C + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)

    if not EARLY:
        b_g, b_beta, b_q, b_k, b_q3, b_k3 = _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3,
                                                         s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh)
    b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
    b_kqm = b_k
    if MMA:
        # [BK, 16] k and q as given (in the tile's dtype, which is theirs) for the tile's one product
        o_n = tl.arange(0, 16)[None, :]
        b_kqm = tl.where(o_n == 0, b_k[:, None], tl.where(o_n == 1, b_q[:, None], 0.0)).to(rcopy.dtype.element_ty)
    b_k = b_k * b_rk
    b_q = b_q * b_rq
    if BV >= VP:
        # Reduced before the branch, so that the tile is not held through the buffer's reads.
        b_sk, b_sq = _tile_sums(b_r, b_k3, b_q3, b_kqm, b_rk, b_rq, MMA)

    if b_f + 1 >= W:
        if PHASE == 0:
            # [BW, BK] the buffered keys
            b_kw = tl.load(buf_k + ((i_s * C + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                           mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            _replay_flush(
                ckpt, rcopy, rscale, buf_u, buf_t, v, o,
                i_b, i_s, i_h, i_hv, v0, b_f, b_k, b_q, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
                s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
                C, H, HV, K, V, BK, VP, BVF, STAGES, HAS_COPY, IS_FP8, PRECISION, CPRECISION, SLOAD,
            )
    else:
        if not EARLY:
            # [BW, NC, VK] the buffered keys
            b_kw3 = tl.load(buf_k + ((i_s * C + o_w[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                            mask=m_w[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_Gt = b_Gl + b_g
        # [BW] weights of the committed updates in S_{t-1} k_t and S_t q_t
        b_decay = tl.where(m_w, tl.exp(b_Gt - b_Gw), 0.0)
        b_wk, b_wq = _row_sums(b_kw3, b_k3, b_q3, b_rk, b_rq)
        if HAS_COPY:
            # This entry's row t of T (its correction key y = sum_l t_l k_l, for the flush's one product):
            # t = beta (e_f - sum_{j<f} (k_j·k) t_j).
            b_tw = tl.load(buf_t + ((i_s * C + o_w[:, None]) * HV + i_hv) * C + o_w[None, :],
                           mask=m_w[:, None] & m_c[None, :], other=0.0)
            b_t = b_beta * (tl.where(o_w == b_f, 1.0, 0.0) - tl.sum(tl.where(m_w, b_wk, 0.0)[:, None] * b_tw, 0))
        b_wk = tl.where(m_w, b_wk * b_decay, 0.0)
        b_wq = tl.where(m_w, b_wq * b_decay, 0.0)
        b_kq = tl.sum(b_k * b_q)
        b_eG = tl.exp(b_Gt)
        o_u = ((i_s * C + o_w) * HV + i_hv) * V
        # With BV < V the tile streams BV rows at a time through a pipelined loop (cp.async into shared memory).
        for i_v in tl.range(0, VP, BV, num_stages=STAGES):
            o_v = v0 + i_v + tl.arange(0, BV)
            m_v = o_v < V
            if BV < VP:
                # the read copy, or the checkpoint without one
                b_s = _tile(rcopy, o_h, o_v, m_v, o_k, m_k, o_k3, m_k3, K, MMA)
                b_sk, b_sq = _tile_sums(b_s, b_k3, b_q3, b_kqm, b_rk, b_rq, MMA)
            # [BW, BV]
            if EARLY:
                if BV >= VP:
                    b_uw, b_v = b_uw1, b_v1.to(tl.float32)
                else:
                    b_uw = tl.load(buf_u + o_u[:, None] + o_v[None, :], mask=m_c[:, None] & m_v[None, :],
                                   other=0.0).to(tl.float32)
                    b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
                b_uw = tl.where(m_w[:, None], b_uw, 0.0)
            else:
                b_uw = tl.load(buf_u + o_u[:, None] + o_v[None, :], mask=m_w[:, None] & m_v[None, :],
                               other=0.0).to(tl.float32)
                b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
            _nonflush_rows(o, buf_u, rscale, b_sk, b_sq, b_uw, b_v, b_wk, b_wq, b_beta, b_eG, b_kq, i_b, i_s, i_hv,
                           b_f, o_h, o_v, m_v, s_ob, s_oh, s_ov, C, HV, V, IS_FP8)
        if i_p == 0:
            if i_hv % (HV // H) == 0:
                tl.store(buf_k + ((i_s * C + b_f) * H + i_h) * K + o_k, cast(b_k, buf_k.dtype.element_ty), mask=m_k)
            tl.store(buf_g + (i_s * C + b_f) * HV + i_hv, b_Gt)
            if HAS_COPY:
                tl.store(buf_b + (i_s * C + b_f) * HV + i_hv, b_beta)
                tl.store(buf_t + ((i_s * C + b_f) * HV + i_hv) * C + o_w, b_t, mask=m_c)

    if not (EARLY and NPB > 1):
        fills_read()
    if NPB == 1:
        tl.store(p_f, f_next)
        b_last = b_f >= 0
    else:
        # The row blocks of a (slot, head) all read its fill; the last to arrive advances it. Relaxed order
        # suffices: every program has consumed the fill it read before it arrives.
        if not EARLY:
            b_arrived = tl.atomic_add(p_a, 1, sem="relaxed")
        if EARLY and LCOUNT:
            # Every lane's counter saw each program once: the program last on a lane's resets it, the one last on
            # the first lane's advances the fill.
            tl.store(p_a + o_a, 0, mask=b_arrived == NPB - 1)
            b_last = tl.sum(tl.where((o_a == 0) & (b_arrived == NPB - 1), 1, 0)) > 0
        else:
            b_last = b_arrived == NPB - 1
            if b_last:
                tl.store(p_a, 0)
        if b_last:
            tl.store(p_f, f_next)
    if PHASE == 1:
        if b_last & (b_f + 1 >= W):
            # The flush launch reads the buffer, which no step of this launch overwrites, and this fill.
            list_flush(work, i_b, i_hv, b_f, False)


@triton.jit
def _heads_kernel(
    rcopy, rscale, buf_u, buf_k, buf_g, buf_b, buf_t, fill, work,
    q, k, v, g, beta, o, slots,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    W: tl.constexpr, C: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BVH: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, VK: tl.constexpr, STAGES: tl.constexpr,
    HPP: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, PDL: tl.constexpr,
):
    """A two-launch step's non-flush launch with HPP value heads of one k-head per program (whole heads, BVH ≥ V
    rows each): the buffered keys' sums against this step's k and q are taken once for all of them, and one
    pipelined loop streams their tiles BV rows at a time, head after head. Heads that flush are listed in `work`
    for `_flush_kernel` (which, with PDL, may begin once every program here has begun)."""
    if PDL:
        gdc_launch_dependents()
    i_b, i_hp, _ = flat_program_ids(HV // HPP, 1)
    hv0 = i_hp * HPP
    i_h = hv0 // (HV // H)
    o_k, o_w = tl.arange(0, BK), tl.arange(0, BW)
    m_k = o_k < K
    NC: tl.constexpr = BK // VK
    o_k3 = tl.arange(0, NC)[:, None] * VK + tl.arange(0, VK)[None, :]
    m_k3 = o_k3 < K
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    # The heads of a slot share its fill (ReplayCache).
    b_f = tl.load(fill + i_s * HV + hv0)
    if b_f + 1 < W:
        m_w = o_w < b_f
        m_c = o_w < C
        b_q = tl.load(q + i_b * s_qb + i_h * s_qh + o_k * s_qk, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(k + i_b * s_kb + i_h * s_kh + o_k * s_kk, mask=m_k, other=0.0).to(tl.float32)
        b_q3 = tl.load(q + i_b * s_qb + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
        b_k3 = tl.load(k + i_b * s_kb + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
        b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
        b_k = b_k * b_rk
        b_kq = tl.sum(b_k * (b_q * b_rq))
        # [BW, NC, VK] the k-head's buffered keys, against k and q once for every value head of the program
        b_kw3 = tl.load(buf_k + ((i_s * C + o_w[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                        mask=m_w[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_wk0, b_wq0 = _row_sums(b_kw3, b_k3, b_q3, b_rk, b_rq)
        b_wk0 = tl.where(m_w, b_wk0, 0.0)
        for i_t in tl.range(0, HPP * BVH, BV, num_stages=STAGES):
            i_hv = hv0 + i_t // BVH
            o_v = i_t % BVH + tl.arange(0, BV)
            m_v = o_v < V
            o_h = (i_s * HV + i_hv) * V
            b_g = tl.load(g + i_b * s_gb + i_hv * s_gh).to(tl.float32)
            b_beta = tl.load(beta + i_b * s_bb + i_hv * s_bh).to(tl.float32)
            b_Gw = tl.load(buf_g + (i_s * C + o_w) * HV + i_hv, mask=m_w, other=0.0)
            b_Gt = tl.load(buf_g + (i_s * C + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0) + b_g
            b_decay = tl.where(m_w, tl.exp(b_Gt - b_Gw), 0.0)
            b_eG = tl.exp(b_Gt)
            b_s = _tile(rcopy, o_h, o_v, m_v, o_k, m_k, o_k3, m_k3, K, False)
            b_sk, b_sq = _row_sums(b_s, b_k3, b_q3, b_rk, b_rq)
            b_uw = tl.load(buf_u + ((i_s * C + o_w[:, None]) * HV + i_hv) * V + o_v[None, :],
                           mask=m_w[:, None] & m_v[None, :], other=0.0).to(tl.float32)
            b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
            # This token's update rows with each chunk, G with each head's first.
            _nonflush_rows(o, buf_u, rscale, b_sk, b_sq, b_uw, b_v, b_wk0 * b_decay, b_wq0 * b_decay, b_beta, b_eG,
                           b_kq, i_b, i_s, i_hv, b_f, o_h, o_v, m_v, s_ob, s_oh, s_ov, C, HV, V, IS_FP8)
            tl.store(buf_g + (i_s * C + b_f) * HV + i_hv, b_Gt, mask=i_t % BVH == 0)
        if HAS_COPY:
            # Each head's beta and row of T, t = beta (e_f - sum_{j<f} (k_j·k) t_j), after the tiles' loop (its [BW,
            # BW] read would add to the loop's registers).
            for hh in range(HPP):
                i_hv = hv0 + hh
                b_beta = tl.load(beta + i_b * s_bb + i_hv * s_bh).to(tl.float32)
                b_tw = tl.load(buf_t + ((i_s * C + o_w[:, None]) * HV + i_hv) * C + o_w[None, :],
                               mask=m_w[:, None] & m_c[None, :], other=0.0)
                b_t = b_beta * (tl.where(o_w == b_f, 1.0, 0.0) - tl.sum(b_wk0[:, None] * b_tw, 0))
                tl.store(buf_b + (i_s * C + b_f) * HV + i_hv, b_beta)
                tl.store(buf_t + ((i_s * C + b_f) * HV + i_hv) * C + o_w, b_t, mask=m_c)
        if hv0 % (HV // H) == 0:
            tl.store(buf_k + ((i_s * C + b_f) * H + i_h) * K + o_k, cast(b_k, buf_k.dtype.element_ty), mask=m_k)
    advance_heads(fill + i_s * HV, work, i_b, hv0, b_f, W, HPP, False)


@triton.jit
def _flush_kernel(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, work,
    q, k, v, g, beta, o, slots,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, VP: tl.constexpr, BVF: tl.constexpr, BW: tl.constexpr, STAGES: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, PRECISION: tl.constexpr,
    CPRECISION: tl.constexpr, SLOAD: tl.constexpr, PDL: tl.constexpr,
):
    """The flushes the non-flush launch listed in `work` (a count, a done counter, then (row, head, fill) per
    flushing head), VP rows of a head per item: each program loops over the items, so the launch's programs are a
    few per SM however few rows flush. The last program to finish zeroes the counters for the next step. With PDL
    (a programmatic dependent launch) its programs may begin while the non-flush launch's last ones run, and wait
    for that launch's end, its writes visible, before they read anything."""
    if PDL:
        gdc_wait()
    NPB: tl.constexpr = (V + VP - 1) // VP
    n_items = tl.load(work) * NPB
    n_programs = tl.num_programs(0)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_k = o_k < K
    # A while loop: its bounds are device values (the interpreter's range takes only Python integers).
    i_j = tl.program_id(0)
    while i_j < n_items:
        i_b, i_hv, b_f = listed_flush(work, i_j // NPB)
        i_h = i_hv // (HV // H)
        i_s = tl.load(slots + i_b).to(tl.int64)
        m_w = o_w < b_f
        b_g, b_beta, b_q, b_k = _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh,
                                              s_kk, s_gb, s_gh, s_bb, s_bh)
        b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
        b_Gw = tl.load(buf_g + (i_s * C + o_w) * HV + i_hv, mask=m_w, other=0.0)
        b_Gl = tl.load(buf_g + (i_s * C + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
        # [BW, BK] the buffered keys
        b_kw = tl.load(buf_k + ((i_s * C + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                       mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        _replay_flush(
            ckpt, rcopy, rscale, buf_u, buf_t, v, o,
            i_b, i_s, i_h, i_hv, (i_j % NPB) * VP, b_f, b_k * b_rk, b_q * b_rq, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
            s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
            C, H, HV, K, V, BK, VP, BVF, STAGES, HAS_COPY, IS_FP8, PRECISION, CPRECISION, SLOAD,
        )
        i_j += n_programs
    list_done(work, tl.num_programs(0))


@triton.jit
def _columns4(b_x, N: tl.constexpr):
    """The four columns of b_x [N, 4] as [N] vectors. Split in pairs (tl.split keeps a pair in one thread), not summed
    over a middle axis of a broadcast product, which Triton's combining pass turns into a TF32 product, nor over a
    last axis, which it sums across threads."""
    b_02, b_13 = tl.split(tl.reshape(b_x, [N, 2, 2]))
    b_0, b_2 = tl.split(b_02)
    b_1, b_3 = tl.split(b_13)
    return b_0, b_1, b_2, b_3


@triton.jit
def _fold_entries(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, v0,
    C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BVF: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, FKSPLIT: tl.constexpr,
    FSTAGES: tl.constexpr, VP: tl.constexpr, PRECISION: tl.constexpr, BWE: tl.constexpr, FXW: tl.constexpr,
):
    """`_verify_flush` with the buffer's first BWE entries in its product and, with FXW = 4, the four after them in
    FMAs of their own (zero past the fill)."""
    BKF: tl.constexpr = BK // FKSPLIT
    o_w = tl.arange(0, BWE)
    m_w = o_w < b_f
    # The committed entries' log-decays [BWE]
    b_Gw = tl.load(buf_g + (i_s * C + o_w) * HV + i_hv, mask=m_w, other=0.0)
    for i_k in tl.static_range(FKSPLIT):
        o_k = i_k * BKF + tl.arange(0, BKF)
        m_k = o_k < K
        # The committed entries' keys [BWE, BKF], zero past the fill
        b_kw = tl.load(buf_k + ((i_s * C + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                       mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_wc = b_kw
        if HAS_COPY:
            b_wc = _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, C, HV, PRECISION)
        if FXW == 4:
            # The entries past the product: their weights e^{G - G_j} [4] and keys, a [BKF] vector each
            o_x = BWE + tl.arange(0, FXW)
            m_x = o_x < b_f
            b_cx = tl.where(m_x, tl.exp(b_Gl - tl.load(buf_g + (i_s * C + o_x) * HV + i_hv, mask=m_x, other=0.0)),
                            0.0)
            b_k0, b_k1, b_k2, b_k3 = _columns4(
                tl.load(buf_k + ((i_s * C + o_x[None, :]) * H + i_h) * K + o_k[:, None],
                        mask=m_x[None, :] & m_k[:, None], other=0.0).to(tl.float32), BKF)
        for i_v in tl.range(0, VP, BVF, num_stages=FSTAGES):
            o_v = v0 + i_v + tl.arange(0, BVF)
            m_v = (o_v < V) & (i_v + tl.arange(0, BVF) < VP)
            b_s, o_s, o_r, m_s = _folded_rows(
                ckpt, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc, b_wc,
                C, HV, K, V, HAS_COPY, IS_FP8, PRECISION, PRECISION, 0,
            )
            if FXW == 4:
                # their weighted updates [BVF, 4] as four [BVF] vectors, one rank-1 update each
                b_u0, b_u1, b_u2, b_u3 = _columns4(
                    tl.load(buf_u + ((i_s * C + o_x[None, :]) * HV + i_hv) * V + o_v[:, None],
                            mask=m_v[:, None] & m_x[None, :], other=0.0).to(tl.float32) * b_cx[None, :], BVF)
                b_s += (b_u0[:, None] * b_k0[None, :] + b_u1[:, None] * b_k1[None, :]
                        + b_u2[:, None] * b_k2[None, :] + b_u3[:, None] * b_k3[None, :])
            b_s = rounded(b_s, ckpt.dtype.element_ty)
            tl.store(ckpt + o_s, b_s.to(ckpt.dtype.element_ty), mask=m_s)
            if HAS_COPY:
                _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_FP8)


@triton.jit
def _verify_flush(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, v0,
    C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BVF: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, FKSPLIT: tl.constexpr,
    FSTAGES: tl.constexpr, VP: tl.constexpr, PRECISION: tl.constexpr, FWM: tl.constexpr, BW: tl.constexpr,
    FXW: tl.constexpr,
):
    """Fold the buffer into a new checkpoint (updates corrected under a read copy) and store it for rows v0 .. v0 +
    VP, BVF rows at a time through a loop pipelined FSTAGES deep, in FKSPLIT column pieces (the buffered keys of one
    piece at a time; a read copy's correction sums whole rows, so 1 under one), the f buffered entries in one
    product: over FWM entries where f <= FWM < BW; past FWM, with FXW = 4, the same product and the rest one by one
    (at most 4), else one over BW (the padding's products cost as much as the entries')."""
    # past FWM: the product over FWM and the rest one by one, or over BW
    PAST: tl.constexpr = FWM if FXW > 0 else BW
    if FWM < BW and b_f <= FWM:
        _fold_entries(ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, v0, C, H, HV, K, V,
                      BK, BVF, HAS_COPY, IS_FP8, FKSPLIT, FSTAGES, VP, PRECISION, FWM, 0)
    else:
        _fold_entries(ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, v0, C, H, HV, K, V,
                      BK, BVF, HAS_COPY, IS_FP8, FKSPLIT, FSTAGES, VP, PRECISION, PAST, FXW)


@triton.jit
def _store_draft_rows(buf_t, b_KK, b_Wck, b_rk, b_bd, i_s, i_hv, b_fe, o_t, o_w, o_wc, m_t, m_wc,
                      T: tl.constexpr, C: tl.constexpr, HV: tl.constexpr):
    """Store the drafts' rows of T, t_i = beta_i (e_i - sum_j (k_j·k_i) t_j), j over the committed entries and the
    drafts before i; b_KK [BT, BT] and b_Wck [BWC, BT] are the drafts' and committed keys' products with the
    drafts' keys as given (b_rk their normalising factors)."""
    m_c = o_w < C
    # [BWC, BW] the committed entries' rows
    b_tc = tl.load(buf_t + ((i_s * C + o_wc[:, None]) * HV + i_hv) * C + o_w[None, :],
                   mask=m_wc[:, None] & m_c[None, :], other=0.0)
    # [BT, BW]
    b_r = tl.where(o_w[None, :] == b_fe + o_t[:, None], 1.0, 0.0)
    b_r -= tl.sum((b_Wck * b_rk[None, :])[:, :, None] * b_tc[:, None, :], 0)
    b_kk = b_KK * b_rk[:, None] * b_rk[None, :]
    b_t = tl.zeros(b_r.shape, dtype=tl.float32)
    for i in tl.static_range(T):
        b_kki = tl.sum(tl.where((o_t[:, None] == i) & (o_t[None, :] < i), b_kk, 0.0), 0)
        b_ri = tl.sum(tl.where(o_t[:, None] == i, b_r, 0.0), 0)
        b_bi = tl.sum(tl.where(o_t == i, b_bd, 0.0))
        b_t = tl.where(o_t[:, None] == i, (b_bi * (b_ri - tl.sum(b_kki[:, None] * b_t, 0)))[None, :], b_t)
    tl.store(buf_t + ((i_s * C + b_fe + o_t[:, None]) * HV + i_hv) * C + o_w[None, :], b_t,
             mask=m_t[:, None] & m_c[None, :])


@triton.jit
def _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk):
    """Draft i's key and query as given, [NC, VK] in fp32."""
    b_k3 = tl.load(k + i_b * s_kb + i * s_kt + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
    b_q3 = tl.load(q + i_b * s_qb + i * s_qt + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
    return b_k3, b_q3


@triton.jit
def _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh):
    """The drafts' log-decays and betas [BT], the log-decay after each since the committed state, and its exp."""
    b_gd = tl.load(g + i_b * s_gb + o_t * s_gt + i_hv * s_gh, mask=m_t, other=0.0).to(tl.float32)
    b_bd = tl.load(beta + i_b * s_bb + o_t * s_bt + i_hv * s_bh, mask=m_t, other=0.0).to(tl.float32)
    b_cum = tl.sum(tl.where(m_upto, b_gd[None, :], 0.0), 1)
    return b_gd, b_bd, b_cum, tl.exp(b_cum)


@triton.jit
def _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv):
    """A verify chunk's committed updates [BV, BWC] and the drafts' v [BV, BT] as fp32."""
    b_uw = tl.load(buf_u + o_u[None, :] + o_v[:, None], mask=m_wc[None, :] & m_v[:, None], other=0.0).to(tl.float32)
    b_Vd = tl.load(v + i_b * s_vb + o_t[None, :] * s_vt + i_hv * s_vh + o_v[:, None] * s_vv, mask=m_vt, other=0.0)
    return b_uw, b_Vd.to(tl.float32)


@triton.jit
def _tile_product(b_s, b_KQ, acc, NATIVE: tl.constexpr, IS_TILE_EXACT: tl.constexpr, IS_HALF_IO: tl.constexpr):
    """acc + the tile's rows [BV, BK] times the drafts' columns [BK, BZ] on the tensor cores: a 2-byte tile in its own
    dtype with drafts of the same (exact products), else in TF32 passes (`dot_fp32`)."""
    if NATIVE:
        return tl.dot(b_s, b_KQ, acc)
    return dot_fp32(b_s.to(tl.float32), b_KQ.to(tl.float32), IS_TILE_EXACT, IS_HALF_IO, acc)


@triton.jit
def _draft_columns(q, k, i_b, i_h, o_k, m_k, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T: tl.constexpr,
                   BT: tl.constexpr, BZ: tl.constexpr):
    """[BK, BZ] the drafts' keys (columns z < T) and queries (BT <= z < BT + T) as given, zero elsewhere."""
    o_z = tl.arange(0, BZ)
    m_zk = o_z < T
    m_zq = (o_z >= BT) & (o_z < BT + T)
    b_z = tl.load(k + i_b * s_kb + i_h * s_kh + o_z[None, :] * s_kt + o_k[:, None] * s_kk,
                  mask=m_k[:, None] & m_zk[None, :], other=0.0)
    b_z += tl.load(q + i_b * s_qb + i_h * s_qh + (o_z - BT)[None, :] * s_qt + o_k[:, None] * s_qk,
                   mask=m_k[:, None] & m_zq[None, :], other=0.0)
    return b_z


@triton.jit
def _gram_products(p_gm, o_wc, m_wc, o_t, scale, BT: tl.constexpr, BZ: tl.constexpr, BWC: tl.constexpr,
                   USE_QK_L2NORM: tl.constexpr):
    """The drafts' products from a key head's [BE, BZ] matrix at p_gm (`_verify_gram_kernel`): [BWC, BT] k_j·k_i and
    k_j·q_i of committed entry j (zero where m_wc is not), [BT, BT] row i, column i': k_i'·k_i and k_i'·q_i, all with
    the drafts' q and k as given, and [BT] their factors (l2-norm, scale) for the keys and the queries."""
    b_Wck = tl.load(p_gm + o_wc[:, None] * BZ + o_t[None, :], mask=m_wc[:, None], other=0.0)
    b_Wcq = tl.load(p_gm + o_wc[:, None] * BZ + BT + o_t[None, :], mask=m_wc[:, None], other=0.0)
    b_KK = tl.load(p_gm + (BWC + o_t[None, :]) * BZ + o_t[:, None])
    b_QK = tl.load(p_gm + (BWC + o_t[None, :]) * BZ + BT + o_t[:, None])
    if USE_QK_L2NORM:
        b_rq = scale / tl.sqrt(tl.load(p_gm + (BWC + BT + o_t) * BZ + BT + o_t) + 1e-6)
        b_rk = 1.0 / tl.sqrt(tl.load(p_gm + (BWC + o_t) * BZ + o_t) + 1e-6)
    else:
        b_rq = tl.full([BT], scale, tl.float32)
        b_rk = tl.full([BT], 1.0, tl.float32)
    return b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq


@triton.jit
def _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec, b_G0, b_Gwc, m_wc, o_t, m_upto,
                 T: tl.constexpr, BT: tl.constexpr):
    """The weights a verify's chunks take from the drafts' and the committed entries' products (`_gram_products`'
    layout), their betas b_bd, the log-decay b_cum after each draft since the committed state (b_ec its exp) and the
    committed state's since the tile (b_G0; b_Gwc the entries'): [BT, BT] A and M, U = R Aᵀ and O = S Q + R Mᵀ;
    [BWC, BT] each committed entry's weight in every draft's S k and S q; [BT] those of the tile's row sums."""
    # [BT, BT] row i, column i': weight of draft i''s update in draft i's S k (i' < i) and S q (i' <= i)
    b_Ed = tl.exp(tl.where(m_upto, b_cum[:, None] - b_cum[None, :], 0.0)) * b_rk[None, :]
    b_Wk = tl.where(o_t[None, :] < o_t[:, None], b_Ed * b_KK * b_rk[:, None], 0.0)
    b_Wq = tl.where(m_upto, b_Ed * b_QK * b_rq[:, None], 0.0)
    # [BWC, BT] weight of committed entry j's update in draft i's S k and S q
    b_dc = tl.where(m_wc, tl.exp(b_G0 - b_Gwc), 0.0)
    b_Wck *= b_dc[:, None] * (b_ec * b_rk)[None, :]
    b_Wcq *= b_dc[:, None] * (b_ec * b_rq)[None, :]
    # [BT] weights of the tile's row sums with the raw k_i and q_i
    b_fk = tl.exp(b_G0 + b_cum) * b_rk
    b_fq = tl.exp(b_G0 + b_cum) * b_rq
    # The drafts' recurrence u_i = beta_i (r_i - sum_{i'<i} Wk[i, i'] u_i') solved once: U = R Aᵀ, [BT, BT] A lower
    # triangular; r_i = v_i - S k_i from the committed state. Then O = S Q + Wq U = S Q + R Mᵀ with M = Wq A.
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i in tl.static_range(T):
        b_wki = tl.sum(tl.where(o_t[:, None] == i, b_Wk, 0.0), 0)
        b_bi = tl.sum(tl.where(o_t == i, b_bd, 0.0))
        b_ai = b_bi * (tl.where(o_t == i, 1.0, 0.0) - tl.sum(b_wki[:, None] * b_A, 0))
        b_A = tl.where(o_t[:, None] == i, b_ai[None, :], b_A)
    b_M = tl.sum(b_Wq[:, :, None] * b_A[None, :, :], 1)
    return b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq


@triton.jit
def _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT: tl.constexpr, BZ: tl.constexpr):
    """[BZ] the factor of each column of a chunk's tensor-core product (the drafts' keys, then their queries) and
    [BWC, BZ] the committed entries' weights in the same columns."""
    o_z = tl.arange(0, BZ)
    m_zk = o_z[None, :] == o_t[:, None]
    m_zq = o_z[None, :] == BT + o_t[:, None]
    b_fz = tl.sum(tl.where(m_zk, b_fk[:, None], 0.0) + tl.where(m_zq, b_fq[:, None], 0.0), 0)
    b_Wcz = tl.sum(tl.where(m_zk[None, :, :], b_Wck[:, :, None], 0.0)
                   + tl.where(m_zq[None, :, :], b_Wcq[:, :, None], 0.0), 1)
    return b_fz, b_Wcz


@triton.jit
def _verify_gram_kernel(
    buf_k, fill, q, k, slots, gram,
    s_qb, s_qt, s_qh, s_qk,
    s_kb, s_kt, s_kh, s_kk,
    T: tl.constexpr, W: tl.constexpr, C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr, BWC: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr,
    IS_HALF_IO: tl.constexpr, GKSPLIT: tl.constexpr,
):
    """The key products a verify's value heads share, once per (row, key head): [BE, BZ] fp32 into gram, row e
    a key or query (the committed entries' keys e < BWC, then the drafts' keys as given, then their queries), column
    z a draft's key (z < BT) or query (BT <= z < 2 BT), as given. One [BE, K] x [K, BZ] product in GKSPLIT column
    pieces; the drafts' 16-bit keys and queries are exact in TF32. A key head's value heads share its fill: its first
    one's."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    b_f = tl.load(fill + i_s * HV + i_h * (HV // H))
    BKG: tl.constexpr = BK // GKSPLIT
    o_e, o_z = tl.arange(0, BE), tl.arange(0, BZ)
    # the entries still committed on top of the tile a verify reads (none once W are buffered: those fold first)
    m_wc = (o_e < BWC) & (o_e < b_f) & scalar_mask(b_f < W)
    m_kd = (o_e >= BWC) & (o_e < BWC + T)
    m_qd = (o_e >= BWC + BT) & (o_e < BWC + BT + T)
    b_g = tl.zeros([BE, BZ], dtype=tl.float32)
    for i_k in tl.static_range(GKSPLIT):
        o_k = i_k * BKG + tl.arange(0, BKG)
        m_k = o_k < K
        p_kb = k + i_b * s_kb + i_h * s_kh + o_k[None, :] * s_kk
        p_qb = q + i_b * s_qb + i_h * s_qh + o_k[None, :] * s_qk
        b_e = tl.load(buf_k + ((i_s * C + o_e[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_wc[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_e += tl.load(p_kb + (o_e - BWC)[:, None] * s_kt, mask=m_kd[:, None] & m_k[None, :],
                       other=0.0).to(tl.float32)
        b_e += tl.load(p_qb + (o_e - BWC - BT)[:, None] * s_qt, mask=m_qd[:, None] & m_k[None, :],
                       other=0.0).to(tl.float32)
        b_z = _draft_columns(q, k, i_b, i_h, o_k, m_k, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T, BT, BZ)
        b_g = dot_fp32(b_e, b_z.to(tl.float32), False, IS_HALF_IO, b_g)
    tl.store(gram + (i_b * H + i_h) * BE * BZ + o_e[:, None] * BZ + o_z[None, :], b_g)


@triton.jit
def _row_fills(fill, i_s, HV: tl.constexpr, BHV: tl.constexpr):
    """Slot i_s's value heads [BHV], their mask and the pointers to their fills."""
    o_h = tl.arange(0, BHV)
    return o_h, o_h < HV, fill + i_s * HV + o_h


@triton.jit
def _verify_list_kernel(fill, slots, work, W: tl.constexpr, HV: tl.constexpr, BHV: tl.constexpr):
    """A row's value heads whose buffers hold W entries or more, listed in `work` for `_verify_fold_kernel` (FPASS),
    with their fills."""
    i_b = tl.program_id(0)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_h, m_h, p_f = _row_fills(fill, i_s, HV, BHV)
    b_f = tl.load(p_f, mask=m_h, other=0)
    list_heads(work, i_b, o_h, b_f, m_h & (b_f >= W))


@triton.jit
def _verify_fold_kernel(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, slots, work,
    C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BVF: tl.constexpr, VP: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_FP8: tl.constexpr, FKSPLIT: tl.constexpr, FSTAGES: tl.constexpr, PRECISION: tl.constexpr,
    FPREF: tl.constexpr, FWM: tl.constexpr, BW: tl.constexpr, FXW: tl.constexpr,
):
    """The folds a verify's rows take first (FPASS), in a launch of their own between `_verify_list_kernel`, which
    listed the value heads whose buffers hold W entries or more in `work`, and the verify, which then skips its own
    fold (their fills, read again there, still say W or more: the drafts go to position 0 and the fill to 0): VP
    rows of a head per item, each program looping over the items (a few programs per SM however few rows fold). With
    FPREF a program loads its next item's list entry and slot while it folds the one before (the entry two items
    ahead, the slot one), so that an item begins with the loads of its rows. The last program to finish zeroes the
    list's counters for the next step."""
    NPB: tl.constexpr = (V + VP - 1) // VP
    n_items = tl.load(work) * NPB
    n_programs = tl.num_programs(0)
    # A while loop: its bounds are device values (the interpreter's range takes only Python integers).
    i_j = tl.program_id(0)
    if FPREF:
        e_b, e_hv, e_f = listed_ahead(work, i_j // NPB, i_j < n_items)
        e_s = tl.load(slots + e_b, mask=i_j < n_items, other=0).to(tl.int64)
        n_b, n_hv, n_f = listed_ahead(work, (i_j + n_programs) // NPB, i_j + n_programs < n_items)
    while i_j < n_items:
        if FPREF:
            i_b, i_hv, b_f, i_s = e_b, e_hv, e_f, e_s
            e_b, e_hv, e_f = n_b, n_hv, n_f
            e_s = tl.load(slots + e_b, mask=i_j + n_programs < n_items, other=0).to(tl.int64)
            n_b, n_hv, n_f = listed_ahead(work, (i_j + 2 * n_programs) // NPB,
                                         i_j + 2 * n_programs < n_items)
        else:
            i_b, i_hv, b_f = listed_flush(work, i_j // NPB)
            i_s = tl.load(slots + i_b).to(tl.int64)
        i_h = i_hv // (HV // H)
        b_Gl = tl.load(buf_g + (i_s * C + b_f - 1) * HV + i_hv)
        _verify_flush(
            ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, (i_j % NPB) * VP,
            C, H, HV, K, V, BK, BVF, HAS_COPY, IS_FP8, FKSPLIT, FSTAGES, VP, PRECISION, FWM, BW, FXW,
        )
        i_j += n_programs
    list_done(work, n_programs)


@triton.jit
def _verify_weights_kernel(
    buf_g, fill, g, beta, slots, gram, wts,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    scale,
    T: tl.constexpr, W: tl.constexpr, C: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
    BT: tl.constexpr, BWC: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr, NW: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    """A verify's prologue for one (row, value head) from its key head's products (`_verify_gram_kernel`), so that
    the verify's programs begin with independent loads: [NW] into wts, A and M [BT, BT], the column factors [BZ],
    the committed entries' weights [BWC, BZ], the fill (its int32 bits, in a block of BT) and the log-decays [BT]
    the drafts' entries take."""
    i_b, i_hv = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_t, o_wc, o_z = tl.arange(0, BT), tl.arange(0, BWC), tl.arange(0, BZ)
    m_t = o_t < T
    m_upto = o_t[None, :] <= o_t[:, None]
    b_f = tl.load(fill + i_s * HV + i_hv)
    b_flush = b_f >= W
    m_wc = (o_wc < b_f) & scalar_mask(b_f < W)
    b_Gl = tl.load(buf_g + (i_s * C + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
    b_G0 = tl.where(b_flush, 0.0, b_Gl)
    b_Gwc = tl.load(buf_g + (i_s * C + o_wc) * HV + i_hv, mask=m_wc, other=0.0)
    b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh)
    b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq = _gram_products(gram + (i_b * H + i_hv // (HV // H)) * BE * BZ, o_wc, m_wc,
                                                          o_t, scale, BT, BZ, BWC, USE_QK_L2NORM)
    b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq = _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec, b_G0,
                                                      b_Gwc, m_wc, o_t, m_upto, T, BT)
    b_fz, b_Wcz = _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT, BZ)
    p_w = wts + (i_b * HV + i_hv) * NW
    tl.store(p_w + o_t[:, None] * BT + o_t[None, :], b_A)
    tl.store(p_w + BT * BT + o_t[:, None] * BT + o_t[None, :], b_M)
    tl.store(p_w + 2 * BT * BT + o_z, b_fz)
    tl.store(p_w + 2 * BT * BT + BZ + o_wc[:, None] * BZ + o_z[None, :], b_Wcz)
    tl.store(p_w + NW - 2 * BT, b_f.to(tl.float32, bitcast=True))
    tl.store(p_w + NW - BT + o_t, b_G0 + b_cum)


@triton.jit
def _weights(p_w, o_t, BT: tl.constexpr, NW: tl.constexpr):
    """A value head's A, M [BT, BT] and drafts' log-decays [BT] from its row of `_verify_weights_kernel`'s output."""
    b_A = tl.load(p_w + o_t[:, None] * BT + o_t[None, :])
    b_M = tl.load(p_w + BT * BT + o_t[:, None] * BT + o_t[None, :])
    return b_A, b_M, tl.load(p_w + NW - BT + o_t)


@triton.jit
def _weights_fill(p_w, BT: tl.constexpr, NW: tl.constexpr):
    """A value head's fill from its row of `_verify_weights_kernel`'s output, which keeps its int32 bits."""
    return tl.load(p_w + NW - 2 * BT).to(tl.int32, bitcast=True)


@triton.jit
def _verify_kernel(
    ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_b, buf_t, fill, arrivals, gram, wts,
    q, k, v, g, beta, o, slots,
    s_qb, s_qt, s_qh, s_qk,
    s_kb, s_kt, s_kh, s_kk,
    s_vb, s_vt, s_vh, s_vv,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    s_ob, s_ot, s_oh, s_ov,
    scale,
    T: tl.constexpr, W: tl.constexpr, C: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr, BWC: tl.constexpr,
    VK: tl.constexpr, STAGES: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_FP8: tl.constexpr, GPASS: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr, MMA: tl.constexpr,
    NATIVE: tl.constexpr, IS_TILE_EXACT: tl.constexpr, IS_HALF_IO: tl.constexpr, KSPLIT: tl.constexpr,
    FKSPLIT: tl.constexpr, FSTAGES: tl.constexpr, NW: tl.constexpr, FPASS: tl.constexpr, FWM: tl.constexpr,
    FXW: tl.constexpr, ARRIVE: tl.constexpr, WFILL: tl.constexpr,
):
    i_b, i_hv = tl.program_id(0), tl.program_id(1)
    o_t = tl.arange(0, BT)
    # With GPASS=2 A, M and the drafts' log-decays come from `_verify_weights_kernel`, which took this value head's
    # prologue; with WFILL its fill too, all read beside the slot rather than after it (the weights of a row without
    # a slot are never used).
    if GPASS == 2:
        p_w = wts + (i_b * HV + i_hv) * NW
    if WFILL:
        b_A, b_M, b_Gs = _weights(p_w, o_t, BT, NW)
        b_fw = _weights_fill(p_w, BT, NW)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_t = o_t < T
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    m_upto = o_t[None, :] <= o_t[:, None]
    # The tile is held as [BV, BK / VK, VK] so that each thread sums its VK-wide pieces of a row in registers and
    # only the lanes that share a row meet in shuffles; the drafts' and the committed entries' keys likewise.
    NC: tl.constexpr = BK // VK
    o_k3 = tl.arange(0, NC)[:, None] * VK + tl.arange(0, VK)[None, :]
    m_k3 = o_k3 < K
    o_h = (i_s * HV + i_hv) * V
    p_f = fill + i_s * HV + i_hv
    if WFILL:
        b_f = b_fw
    else:
        b_f = tl.load(p_f)
    b_flush = b_f >= W
    # Position of the first draft: after the committed entries, or at 0 when they are folded first.
    b_fe = tl.where(b_flush, 0, b_f)
    b_Gl = tl.load(buf_g + (i_s * C + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
    # Every committed entry is read before any draft's key is written (the arrivals below; with FPASS the fold
    # launch, before this one, has read the entries the drafts' keys overwrite).
    # With FPASS `_verify_fold_kernel` has folded the rows with W entries or more.
    if not FPASS:
        if b_flush:
            # Into a new checkpoint first, as a flush step would; the drafts then read it with no entries left.
            _verify_flush(
                ckpt, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, i_s, i_h, i_hv, b_f, b_Gl, 0,
                C, H, HV, K, V, BK, BVF, HAS_COPY, IS_FP8, FKSPLIT, FSTAGES, V, "tf32x3", FWM, BW, FXW,
            )
            # The tile reads below see this program's stores, and the drafts' updates overwrite entries it folded.
            tl.debug_barrier()
    # The entries still committed on top of the tile read below (fewer than W), and (for the prologue, unless
    # `_verify_weights_kernel` took it) their log-decay since it.
    o_wc = tl.arange(0, BWC)
    m_wc = (o_wc < b_f) & scalar_mask(b_f < W)
    if GPASS < 2:
        b_G0 = tl.where(b_flush, 0.0, b_Gl)
        b_Gwc = tl.load(buf_g + (i_s * C + o_wc) * HV + i_hv, mask=m_wc, other=0.0)
    # [BT, BT] row i, column i': k_i'·k_i and k_i'·q_i; [BWC, BT] k_j·k_i and k_j·q_i of committed entry j; the
    # drafts' q and k as given, their factors (l2-norm, scale) going on the products. b_gd and b_bd: the drafts'
    # log-decays and betas, b_cum [BT] the log-decay after each since the committed state.
    if GPASS == 2:
        if not WFILL:
            b_A, b_M, b_Gs = _weights(p_w, o_t, BT, NW)
    elif GPASS == 1:
        b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt,
                                               s_bh)
        b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq = _gram_products(gram + (i_b * H + i_h) * BE * BZ, o_wc, m_wc, o_t,
                                                              scale, BT, BZ, BWC, USE_QK_L2NORM)
    elif GPASS == 0:
        # [BWC, NC, VK] the committed entries' keys, [BT, NC, VK] the drafts' keys as given
        b_kw3 = tl.load(buf_k + ((i_s * C + o_wc[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                        mask=m_wc[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_K3 = tl.load(k + i_b * s_kb + o_t[:, None, None] * s_kt + i_h * s_kh + o_k3[None, :, :] * s_kk,
                       mask=m_t[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt,
                                               s_bh)
        if USE_QK_L2NORM:
            b_Q3 = tl.load(q + i_b * s_qb + o_t[:, None, None] * s_qt + i_h * s_qh + o_k3[None, :, :] * s_qk,
                           mask=m_t[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
            b_rq = scale / tl.sqrt(tl.sum(tl.sum(b_Q3 * b_Q3, 2), 1) + 1e-6)
            b_rk = 1.0 / tl.sqrt(tl.sum(tl.sum(b_K3 * b_K3, 2), 1) + 1e-6)
        else:
            b_rq = tl.full([BT], scale, tl.float32)
            b_rk = tl.full([BT], 1.0, tl.float32)
        b_KK = tl.zeros([BT, BT], dtype=tl.float32)
        b_QK = tl.zeros([BT, BT], dtype=tl.float32)
        b_Wck = tl.zeros([BWC, BT], dtype=tl.float32)
        b_Wcq = tl.zeros([BWC, BT], dtype=tl.float32)
        for i in tl.static_range(T):
            b_k3, b_q3 = _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk)
            b_kki, b_qki = _row_sums(b_K3, b_k3, b_q3, 1.0, 1.0)
            b_KK = tl.where(o_t[:, None] == i, b_kki[None, :], b_KK)
            b_QK = tl.where(o_t[:, None] == i, b_qki[None, :], b_QK)
            b_wki, b_wqi = _row_sums(b_kw3, b_k3, b_q3, 1.0, 1.0)
            b_Wck = tl.where(o_t[None, :] == i, b_wki[:, None], b_Wck)
            b_Wcq = tl.where(o_t[None, :] == i, b_wqi[:, None], b_Wcq)
    if GPASS < 2:
        if HAS_COPY:
            _store_draft_rows(buf_t, b_KK, b_Wck, b_rk, b_bd, i_s, i_hv, b_fe, o_t, o_w, o_wc, m_t, m_wc, T, C, HV)
        b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq = _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec,
                                                          b_G0, b_Gwc, m_wc, o_t, m_upto, T, BT)
        b_Gs = b_G0 + b_cum

    o_u = ((i_s * C + o_wc) * HV + i_hv) * V
    if MMA:
        # [BK, BZ] the drafts' keys, then their queries, as columns, read once for every chunk's product; [BZ] each
        # column's factor, and [BWC, BZ] the committed entries' weights in the same columns
        # (with KSPLIT=2 as two halves of BK / 2 rows, each chunk's product then taken in two, fewer registers live)
        BKS: tl.constexpr = BK // KSPLIT
        o_ka = tl.arange(0, BKS)
        b_KQa = _draft_columns(q, k, i_b, i_h, o_ka, o_ka < K, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T, BT,
                               BZ)
        if KSPLIT == 2:
            b_KQb = _draft_columns(q, k, i_b, i_h, BKS + o_ka, BKS + o_ka < K, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt,
                                   s_kh, s_kk, T, BT, BZ)
        o_z = tl.arange(0, BZ)
        if GPASS == 2:
            b_fz = tl.load(p_w + 2 * BT * BT + o_z)
            b_Wcz = tl.load(p_w + 2 * BT * BT + BZ + o_wc[:, None] * BZ + o_z[None, :])
        else:
            b_fz, b_Wcz = _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT, BZ)
    for i_v in tl.range(0, V, BV, num_stages=STAGES):
        o_v = i_v + tl.arange(0, BV)
        m_v = o_v < V
        m_vt = m_v[:, None] & m_t[None, :]
        # [BV, BT] R = V - S K (draft i's v less the committed state's S k_i), and the committed state's S Q: from
        # one read of the tile (the read copy, refreshed by a flush above, or the checkpoint without one) for every
        # draft's k and q as given, and the committed entries' terms
        if MMA:
            # one [BV, BK] x [BK, BZ] tensor-core product, and the entries' [BV, BWC] x [BWC, BZ] into its columns,
            # folded onto the drafts' (the rest are zero)
            p_s = rcopy + (o_h + o_v[:, None]) * K + o_ka[None, :]
            b_s = tl.load(p_s, mask=m_v[:, None] & (o_ka < K)[None, :], other=0.0)
            b_uw, b_Vd = _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv)
            b_P = _tile_product(b_s, b_KQa, None, NATIVE, IS_TILE_EXACT, IS_HALF_IO)
            if KSPLIT == 2:
                b_s = tl.load(p_s + BKS, mask=m_v[:, None] & (BKS + o_ka < K)[None, :], other=0.0)
                b_P = _tile_product(b_s, b_KQb, b_P, NATIVE, IS_TILE_EXACT, IS_HALF_IO)
            if IS_FP8:
                b_P *= tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)[:, None]
            b_P = dot_fp32(b_uw, b_Wcz, False, False, b_P * b_fz[None, :])
            b_R = b_Vd - tl.sum(tl.reshape(tl.where(o_z[None, :] < BT, b_P, 0.0), (BV, BZ // BT, BT)), 1)
            b_O = tl.sum(tl.reshape(tl.where(o_z[None, :] >= BT, b_P, 0.0), (BV, BZ // BT, BT)), 1)
        else:
            # [BV, NC, VK] the tile, its row sums draft by draft
            b_s = tl.load(rcopy + (o_h + o_v[:, None, None]) * K + o_k3[None, :, :],
                          mask=m_v[:, None, None] & m_k3[None, :, :], other=0.0)
            b_SK = tl.zeros([BV, BT], dtype=tl.float32)
            b_SQ = tl.zeros([BV, BT], dtype=tl.float32)
            for i in tl.static_range(T):
                b_k3, b_q3 = _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh,
                                       s_kk)
                b_ski, b_sqi = _row_sums(b_s, b_k3, b_q3, 1.0, 1.0)
                b_SK = tl.where(o_t[None, :] == i, b_ski[:, None], b_SK)
                b_SQ = tl.where(o_t[None, :] == i, b_sqi[:, None], b_SQ)
            if IS_FP8:
                b_sc = tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)
                b_SK *= b_sc[:, None]
                b_SQ *= b_sc[:, None]
            b_uw, b_Vd = _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv)
            # each product is ordered so that its sum lands in the tile's layout
            b_R = b_Vd - b_SK * b_fk[None, :] - tl.sum(b_uw[:, None, :] * tl.trans(b_Wck)[None, :, :], 2)
            b_O = b_SQ * b_fq[None, :] + tl.sum(b_uw[:, None, :] * tl.trans(b_Wcq)[None, :, :], 2)
        # U = R Aᵀ, O = S Q + R Mᵀ
        b_U = tl.sum(b_R[:, :, None] * tl.trans(b_A)[None, :, :], 1)
        b_O += tl.sum(b_R[:, :, None] * tl.trans(b_M)[None, :, :], 1)
        p_o = o + i_b * s_ob + o_t[None, :] * s_ot + i_hv * s_oh + o_v[:, None] * s_ov
        tl.store(p_o, cast(b_O, o.dtype.element_ty), mask=m_vt)
        tl.store(buf_u + ((i_s * C + b_fe + o_t[None, :]) * HV + i_hv) * V + o_v[:, None],
                 cast(b_U, buf_u.dtype.element_ty), mask=m_vt)
    tl.store(buf_g + (i_s * C + b_fe + o_t) * HV + i_hv, b_Gs, mask=m_t)
    if HAS_COPY:
        tl.store(buf_b + (i_s * C + b_fe + o_t) * HV + i_hv, b_bd, mask=m_t)
    if b_flush:
        fills_read()
        tl.store(p_f, 0)
    # The drafts' keys overwrite entries that every value head of this key head may still be folding: with ARRIVE
    # the last of them to arrive writes the keys. Without it (FPASS: no fold here, the fold launch has finished,
    # and the committed entries read above lie before the drafts' places) the key head's first value head does.
    if ARRIVE:
        tl.debug_barrier()
        p_a = arrivals + i_s * H + i_h
        b_write = tl.atomic_add(p_a, 1, sem="acq_rel") == HV // H - 1
        if b_write:
            tl.store(p_a, 0)
    else:
        b_write = i_hv % (HV // H) == 0
    if b_write:
        # [BT, BK]
        b_K = tl.load(k + i_b * s_kb + o_t[:, None] * s_kt + i_h * s_kh + o_k[None, :] * s_kk, mask=m_tk, other=0.0)
        b_K = b_K.to(tl.float32)
        if USE_QK_L2NORM:
            b_K = b_K / tl.sqrt(tl.sum(b_K * b_K, 1) + 1e-6)[:, None]
        tl.store(buf_k + ((i_s * C + b_fe + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                 cast(b_K, buf_k.dtype.element_ty), mask=m_tk)


@triton.jit
def _accept_kernel(fill, n, slots, HV: tl.constexpr, BHV: tl.constexpr):
    i_b = tl.program_id(0)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    _, m_h, p_f = _row_fills(fill, i_s, HV, BHV)
    b_f = tl.load(p_f, mask=m_h, other=0)
    fills_read()
    tl.store(p_f, b_f + tl.load(n + i_b).to(tl.int32), mask=m_h)


def _cache_args(cache: ReplayCache) -> dict:
    return {
        "ckpt": cache.checkpoint,
        "rcopy": cache.checkpoint if cache.read_copy is None else cache.read_copy,
        "rscale": cache.buf_g if cache.read_scale is None else cache.read_scale,
        "buf_u": cache.buf_u,
        "buf_k": cache.buf_k,
        "buf_g": cache.buf_g,
        "buf_b": cache.buf_g if cache.buf_beta is None else cache.buf_beta,
        "buf_t": cache.buf_g if cache.buf_t is None else cache.buf_t,
        "fill": cache.fill,
    }


def _correction_precision(cache: ReplayCache, settings: dict) -> str:
    """The input precision of a flush's correction product under a read copy: its TF32 setting's, or with CTF32=1
    one TF32 pass, for a 2-byte copy only (checkpoint - copy is about 2^-9 of the state under a bf16 copy, so
    TF32's 2^-11 of it is about 2^-20 of the state; an fp8 copy's is about 2^-4)."""
    precision = flush_precision(cache.checkpoint, settings["TF32"])
    if not settings.get("CTF32"):
        return precision
    if cache.read_dtype is None or cache.read_dtype.itemsize != 2:
        copy = "no read copy" if cache.read_dtype is None else f"a {cache.read_dtype} read copy"
        raise ValueError(f"launch CTF32 = 1 (a flush's correction in one TF32 pass) applies only to a bf16 or fp16 "
                         f"read copy; this cache has {copy}")
    return "tf32"


def _cache_constants(cache: ReplayCache) -> dict:
    return {
        "W": cache.window, "C": cache.capacity,
        "H": cache.H, "HV": cache.HV, "K": cache.K, "V": cache.V,
        "BK": max(16, next_pow2(cache.K)), "BW": max(16, next_pow2(cache.capacity)),
        "HAS_COPY": cache.read_copy is not None, "IS_FP8": cache.read_scale is not None,
    }


def _replay_settings(name: str, launch: dict | None) -> tuple[dict, dict | None]:
    """The settings of LAUNCH row `name` and, where it takes its flushes in a second launch (PHASES=2), those of
    that launch (row `name`-flush, else row `name`'s own, overridden by the `launch` keys prefixed flush_)."""
    launch = dict(launch or {})
    flush_keys = pop_flush_keys(launch)
    settings = launch_settings(LAUNCH, name, launch)
    phases = settings.get("PHASES", 1)
    check_flush_keys(flush_keys, phases)
    if phases == 1:
        return settings, None
    own = {key: value for key, value in settings.items() if key not in ("PHASES", "HPP", "PDL")}
    flush = launch_settings({f"{name}-flush": LAUNCH.get(f"{name}-flush", own)}, f"{name}-flush", flush_keys)
    return settings, flush


def _step_strides(q, k, v, g, beta, out) -> dict:
    return dict(
        s_qb=q.stride(0), s_qh=q.stride(1), s_qk=q.stride(2),
        s_kb=k.stride(0), s_kh=k.stride(1), s_kk=k.stride(2),
        s_vb=v.stride(0), s_vh=v.stride(1), s_vv=v.stride(2),
        s_gb=g.stride(0), s_gh=g.stride(1),
        s_bb=beta.stride(0), s_bh=beta.stride(1),
        s_ob=out.stride(0), s_oh=out.stride(1), s_ov=out.stride(2),
    )


def _launch_flushes(cache, q, k, v, g, beta, out, slots, scale, l2norm, settings, pdl):
    """The flushes a PHASE 1 launch listed: PPS programs per SM (PPS in all on the CPU), at most one per item, their
    register cap FCAP where a step with the rows' fills staggered (batch / W rows flushing) takes no more rounds of
    resident programs at it than at maxnreg (`flush_cap`)."""
    VP = min(settings["VP"], next_pow2(cache.V))
    per_row = cache.HV * triton.cdiv(cache.V, VP)
    items = q.shape[0] * per_row
    staggered = triton.cdiv(q.shape[0], cache.window) * per_row
    maxnreg = flush_cap(settings["maxnreg"], settings["FCAP"], staggered, settings["num_warps"], settings["PPS"],
                        sm_count(cache.device))
    constants = _cache_constants(cache)
    _flush_kernel[flush_grid(items, settings["PPS"], cache.device)](
        **{key: value for key, value in _cache_args(cache).items() if key not in ("buf_b", "fill")}, work=cache.work,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots,
        **_step_strides(q, k, v, g, beta, out),
        scale=scale,
        **{key: constants[key] for key in ("C", "H", "HV", "K", "V", "BK", "BW", "HAS_COPY", "IS_FP8")},
        VP=VP,
        BVF=max(16, min(settings["BVF"], VP)),
        STAGES=settings["STAGES"],
        USE_QK_L2NORM=l2norm,
        PRECISION=flush_precision(cache.checkpoint, settings["TF32"]),
        CPRECISION=_correction_precision(cache, settings),
        SLOAD=settings["SLOAD"],
        PDL=pdl,
        **compile_options(dict(settings, maxnreg=maxnreg)),
        **({"launch_pdl": True} if pdl else {}),
    )


def _heads_per_program(cache: ReplayCache, settings: dict, flush: dict | None) -> int:
    """The row's HPP (value heads per program of a two-launch step's non-flush launch) as run: the largest power of
    two, no larger than asked, that divides the value heads of a k-head."""
    hpp = settings.get("HPP", 1)
    if hpp > 1:
        if flush is None:
            raise ValueError(f"launch HPP = {hpp} (value heads per program) applies only with PHASES=2")
        if min(settings["VP"], next_pow2(cache.V)) < next_pow2(cache.V):
            raise ValueError(f"launch HPP = {hpp} takes whole heads: VP = {settings['VP']} must cover V = {cache.V}")
        if settings["EARLY"] or settings["MMA"]:
            raise ValueError(f"launch HPP = {hpp} reads the buffer after the fill, in fp32 row sums: EARLY and MMA "
                             "must be 0")
    while (cache.HV // cache.H) % hpp:
        hpp //= 2
    return hpp


def _launch_heads(cache, q, k, v, g, beta, out, slots, scale, l2norm, settings, hpp, pdl):
    BVH = next_pow2(cache.V)
    _heads_kernel[(q.shape[0] * (cache.HV // hpp),)](
        **{key: value for key, value in _cache_args(cache).items() if key != "ckpt"}, work=cache.work,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots,
        **_step_strides(q, k, v, g, beta, out),
        scale=scale,
        **_cache_constants(cache),
        BVH=BVH,
        BV=min(settings["BV"], BVH),
        VK=min(settings["VK"], max(16, next_pow2(cache.K))),
        STAGES=settings["STAGES"],
        HPP=hpp,
        USE_QK_L2NORM=l2norm,
        PDL=pdl,
        **compile_options(settings),
    )


def _launch_replay(cache, q, k, v, g, beta, out, slots, scale, l2norm, settings, phase, pdl=False):
    VP = min(settings["VP"], next_pow2(cache.V))
    _replay_kernel[(q.shape[0] * cache.HV * triton.cdiv(cache.V, VP),)](
        **_cache_args(cache), arrive=cache.arrive, work=cache.work,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots,
        **_step_strides(q, k, v, g, beta, out),
        scale=scale,
        **_cache_constants(cache),
        VP=VP,
        BV=min(settings["BV"], VP),
        BVF=max(16, min(settings["BVF"], VP)),
        VK=min(settings["VK"], max(16, next_pow2(cache.K))),
        STAGES=settings["STAGES"],
        USE_QK_L2NORM=l2norm,
        EARLY=settings["EARLY"],
        LCOUNT=bool(settings["LCOUNT"]),
        LANES=cache.arrive.shape[-1],
        PRECISION=flush_precision(cache.checkpoint, settings["TF32"]),
        CPRECISION=_correction_precision(cache, settings),
        SLOAD=settings["SLOAD"],
        PHASE=phase,
        PDL=pdl,
        MMA=bool(settings["MMA"]) and min(settings["BV"], VP) >= 16 and _mma_tile(cache),
        **compile_options(settings),
    )


def _launch_verify(cache, q, k, v, g, beta, out, slots, scale, l2norm, settings):
    batch, T = q.shape[0], q.shape[1]
    if settings["GPASS"] == 2 and (cache.read_copy is not None or not settings["MMA"]):
        raise ValueError("launch GPASS = 2 (each value head's weights from a launch of their own) takes MMA = 1 and no "
                         "read copy; a read copy's verify stores its drafts' rows of T from its own prologue")
    BT, BWC = next_pow2(T), max(16, next_pow2(cache.window))
    # the Gram pass's rows (committed keys, the drafts' keys, their queries) and columns (keys, queries)
    BE, BZ = next_pow2(BWC + 2 * BT), max(16, 2 * BT)
    # the tile's dtype, and whether the drafts' keys and queries are exact in TF32
    tile = cache.checkpoint.dtype if cache.read_copy is None else cache.read_copy.dtype
    half_io = q.element_size() == 2 and k.element_size() == 2
    constants = _cache_constants(cache)
    BK = constants["BK"]
    # K pieces of the tile's product (and of a fold's, but for a read copy's: its correction sums whole rows)
    ksplit = settings["KSPLIT"] if BK >= 32 else 1
    # with GPASS=2, per (row, value head): A and M [BT, BT], the column factors [BZ], the committed entries'
    # weights [BWC, BZ], the fill (in a block of BT, the rows 16-byte aligned), the drafts' log-decays [BT]
    NW = 2 * BT * BT + BZ + BWC * BZ + 2 * BT
    gram = wts = None
    # With FSTREAM the folds run on a stream of their own beside the key products and the weights (neither reads what
    # a fold writes), and the verify waits for both.
    side = _side_stream(cache.device) if settings["FPASS"] and settings["FSTREAM"] else None
    fold_widths = _fold_widths(cache, settings, constants["BW"])
    if settings["FPASS"]:
        _verify_list_kernel[(batch,)](cache.fill, slots, cache.work, W=cache.window, HV=cache.HV,
                                      BHV=next_pow2(cache.HV), num_warps=1)
        FVP = min(settings["FVP"], next_pow2(cache.V))
        items = batch * cache.HV * triton.cdiv(cache.V, FVP)
        main = None
        if side is not None:
            main = torch.cuda.current_stream(cache.device)
            side.wait_stream(main)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            _verify_fold_kernel[flush_grid(items, settings["PPS"], cache.device)](
                **{key: value for key, value in _cache_args(cache).items() if key not in ("buf_b", "fill")},
                slots=slots, work=cache.work,
                **{key: constants[key] for key in ("C", "H", "HV", "K", "V", "BK", "BW", "HAS_COPY", "IS_FP8")},
                BVF=max(16, min(settings["BVF"], FVP)), VP=FVP,
                FKSPLIT=1 if cache.read_copy is not None or BK < 32 else settings["FKSPLIT"],
                FSTAGES=settings["FSTAGES"], PRECISION=flush_precision(cache.checkpoint, settings["TF32"]),
                FPREF=bool(settings["FPREF"]), **fold_widths,
                **compile_options({"num_warps": settings["FWARPS"], "num_stages": 1,
                                   "maxnreg": settings["FMAXNREG"]}),
            )
    qk_strides = dict(s_qb=q.stride(0), s_qt=q.stride(1), s_qh=q.stride(2), s_qk=q.stride(3),
                      s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2), s_kk=k.stride(3))
    vo_strides = dict(s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), s_vv=v.stride(3),
                      s_ob=out.stride(0), s_ot=out.stride(1), s_oh=out.stride(2), s_ov=out.stride(3))
    gate_strides = dict(s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2),
                        s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2))
    # the verify's rows per chunk, and how its tile's product is taken
    BV = max(16, min(settings["BV"], next_pow2(cache.V)))
    tile_product = dict(NATIVE=tile.itemsize == 2 and q.dtype == k.dtype == tile, IS_TILE_EXACT=tile != torch.float32,
                        IS_HALF_IO=half_io)
    if settings["GPASS"]:
        gram = torch.empty(batch, cache.H, BE, BZ, dtype=torch.float32, device=cache.device)
        _verify_gram_kernel[(batch, cache.H)](
            buf_k=cache.buf_k, fill=cache.fill, q=q, k=k, slots=slots, gram=gram, **qk_strides,
            T=T, W=cache.window, C=cache.capacity, H=cache.H, HV=cache.HV, K=cache.K, BK=BK,
            BT=BT, BWC=BWC, BE=BE, BZ=BZ, IS_HALF_IO=half_io, GKSPLIT=min(settings["GKSPLIT"], BK // 16),
            num_warps=GRAM_WARPS,
        )
    if settings["GPASS"] == 2:
        wts = torch.empty(batch, cache.HV, NW, dtype=torch.float32, device=cache.device)
        _verify_weights_kernel[(batch, cache.HV)](
            buf_g=cache.buf_g, fill=cache.fill, g=g, beta=beta, slots=slots, gram=gram, wts=wts, **gate_strides,
            scale=scale,
            T=T, W=cache.window, C=cache.capacity, H=cache.H, HV=cache.HV,
            BT=BT, BWC=BWC, BE=BE, BZ=BZ, NW=NW, USE_QK_L2NORM=l2norm,
            num_warps=WEIGHTS_WARPS,
        )
    if side is not None:
        main.wait_stream(side)
    _verify_kernel[(batch, cache.HV)](
        **_cache_args(cache), arrivals=cache.arrivals, gram=gram, wts=wts,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots, **qk_strides, **vo_strides, **gate_strides,
        scale=scale,
        T=T, BT=BT, BWC=BWC,
        **constants,
        BV=BV,
        BVF=max(16, min(settings["BVF"], next_pow2(cache.V))),
        VK=min(settings["VK"], BK),
        STAGES=settings["STAGES"],
        USE_QK_L2NORM=l2norm, GPASS=settings["GPASS"], BE=BE, BZ=BZ, MMA=bool(settings["MMA"]),
        **tile_product, KSPLIT=ksplit, FKSPLIT=1 if cache.read_copy is not None else ksplit,
        FSTAGES=settings["FSTAGES"], NW=NW, FPASS=bool(settings["FPASS"]), **fold_widths,
        # a verify that folds its own rows counts its arrivals whatever ARRIVE says; WFILL needs the weights launch
        ARRIVE=bool(settings["ARRIVE"]) or not settings["FPASS"],
        WFILL=bool(settings["WFILL"]) and settings["GPASS"] == 2, **compile_options(settings),
    )


def _fold_widths(cache: ReplayCache, settings: dict, BW: int) -> dict:
    """The entries of a verify's fold product where a fill does not pass them (FWM), and how many after them a fold
    takes one by one past it (FXW). With FSPLITW FWM is the window's (a power of two, at least 16), so that a fold at
    a fill of W = 16 takes a product over 16 entries, not over 32 (the buffer's capacity W + max_draft to a power of
    two, which a fill past W needs; FSPLITW=1 takes that product past it); FSPLITW=2 takes the same 16 past it and
    the rest (a folding fill is at most W - 1 + max_draft: up to 4 more) one by one. Without FSPLITW, or under a
    read copy (whose correction weights are computed for every entry), the capacity's (BW)."""
    if not settings["FSPLITW"] or cache.read_copy is not None:
        return {"FWM": BW, "FXW": 0}
    fwm = min(BW, max(16, next_pow2(cache.window)))
    past = cache.capacity - 1 - fwm
    return {"FWM": fwm, "FXW": 4 if settings["FSPLITW"] == 2 and 0 < past <= 4 else 0}


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A second stream of a CUDA device, made on the first call that takes it (an eager one: a kernel's first call
    compiles and loads it, which no graph capture holds), or None elsewhere (the interpreter runs launches in
    order)."""
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _launch_accept(cache, n_accepted, slots, settings):
    _accept_kernel[(n_accepted.shape[0],)](
        fill=cache.fill, n=n_accepted, slots=slots,
        HV=cache.HV, BHV=next_pow2(cache.HV),
        num_warps=settings["num_warps"],
    )


def _check_cache(cache, kernel) -> None:
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache must be a ReplayCache; got {type(cache).__name__}")
    check_device(cache.device, kernel)
    families.check_read_dtype(None if cache.read_copy is None else cache.read_copy.dtype, cache.device)
    for name in ("checkpoint", "read_copy", "read_scale", "buf_u", "buf_k", "buf_g", "buf_beta", "buf_t", "fill",
                 "arrive", "arrivals"):
        value = getattr(cache, name)
        if value is not None and not value.is_contiguous():
            raise ValueError(f"cache.{name} must be contiguous, as ReplayCache.create makes it")


def _check_against_cache(cache: ReplayCache, kernel, q, k, v, g, beta, tokens: bool):
    _check_cache(cache, kernel)
    batch, T, H, HV, K, V = check_step(q, k, v, g, beta, tokens=tokens, io_dtype=cache.io_dtype)
    if (H, HV, K, V) != (cache.H, cache.HV, cache.K, cache.V):
        raise ValueError(
            f"q, k, v have H={H}, HV={HV}, K={K}, V={V} but the cache has "
            f"H={cache.H}, HV={cache.HV}, K={cache.K}, V={cache.V}"
        )
    if q.device != cache.device:
        raise ValueError(f"q, k, v are on {q.device} but the cache is on {cache.device}")
    return batch, T


@families.refuse_out_of_resources
def replay(
    cache: ReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    slots: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    launch: dict | None = None,
    check: bool = True,
) -> torch.Tensor:
    """One ReplaySSM Gated DeltaNet decode step, in one launch; the fill counters live on the device.

    Inputs and output as in `decode` (q, k, v in the cache's io_dtype; slots index the cache's slots,
    -1 for padding rows). Each (row, value head) reads its checkpoint (the read copy when the cache
    has one), replays its f buffered updates, appends (u_t, k_t, G_t, and beta_t and its row of T
    under split precision) and advances its fill counter; the step that fills the window (f + 1 >= W)
    instead folds the buffer into the full-precision checkpoint (correcting the updates the copy gave),
    takes this step from it, stores it, refreshes the read copy and empties the buffer. With PHASES=2
    (split precision on grids of two or more programs per SM) the flushes take a second launch, over the
    heads the first listed in cache.work.
    Mutates the cache; returns o (batch, HV, V) in v's dtype (written into `out` when given).
    `launch` overrides VP (rows per program: the programs of a head share its fill counter), BV (rows per chunk of a
    non-flush step), BVF (of a flush), VK (width of the K pieces a non-flush step reduces its rows in), EARLY (1: a
    non-flush step reads the whole buffer before the fill counter; 2: also the slot before its own inputs), LCOUNT
    (1, with EARLY and VP < V: the programs of a head count their arrivals lane by lane, so that no lane waits on
    the count before the program's end), TF32 (1: a flush folds the buffer through 3xTF32 tensor-core products, 2
    through one TF32 product, a 2-byte checkpoint only, 0 through fp32 FMAs), MMA (1: a non-flush step sums its
    tile's rows times k and q as one tensor-core product where the tile is 2-byte and in q's
    and k's dtype, a bf16 state or copy with bf16 inputs, and its chunks are of 16 rows or more; other tiles keep
    their fp32 row sums), num_warps, num_stages, maxnreg, PHASES (2: the non-flush steps in one launch, then the
    flushes in a second with their own settings, given by keys prefixed flush_, such as flush_num_warps and
    flush_PPS, the second launch's programs per SM; 1: one launch), HPP (with PHASES=2: the non-flush launch in
    programs of HPP whole value heads of a k-head, which sum the buffered keys against k and q once; lowered to a
    power of two dividing HV / H), PDL (with PHASES=2: 1 begins the flushes' launch while the non-flush launch's
    last programs run; on a GPU only), SLOAD (where a flush reads its checkpoint rows, `_folded_rows`), FCAP (a
    flush launch's register cap where its staggered flushes take no more rounds of programs at it, `flush_cap`).
    `check` range-checks slots on the host, a device sync: pass check=False for a step with no host
    synchronisation (it is skipped anyway while a CUDA graph is captured).
    """
    batch, _ = _check_against_cache(cache, _replay_kernel, q, k, v, g, beta, tokens=False)
    scale = default_scale(cache.K, scale)
    slots = check_slots(slots, batch, cache.nslots, q.device, check)
    out = check_out(out, v.shape, v.dtype, q.device)
    settings, flush = _replay_settings(launch_name("replay", cache, batch), launch)
    settings = families.family_row(settings, launch, cache.device)
    for row in (settings, flush or settings):
        # before either launch, so that a refused setting leaves the cache as it was
        _correction_precision(cache, row)
    if settings["FCAP"] is not None:
        raise ValueError(f"launch FCAP = {settings['FCAP']} (a register cap by rounds) applies to a flush launch: "
                         "give it as flush_FCAP, with PHASES=2")
    if (launch or {}).get("PDL") and flush is None:
        # (a row's own PDL=1 is left as it is under PHASES=1: one launch has nothing to overlap)
        raise ValueError("launch PDL = 1 (the flushes' launch begun while the non-flush launch ends) applies only with "
                         "PHASES=2")
    if batch:
        args = (cache, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel))
        hpp = _heads_per_program(cache, settings, flush)
        if flush is None:
            _launch_replay(*args, settings, 0)
        else:
            # On the CPU the interpreter runs the launches one after the other: nothing to overlap, no GPU instruction.
            pdl = bool(settings["PDL"]) and families.capability(cache.device) is not None
            if hpp > 1:
                _launch_heads(*args, settings, hpp, pdl)
            else:
                _launch_replay(*args, settings, 1, pdl)
            _launch_flushes(*args, flush, pdl)
    return out


@families.refuse_out_of_resources
def verify(
    cache: ReplayCache,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    slots: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    launch: dict | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Outputs of T speculative drafts from one read of each checkpoint; commit them with `accept`.

    q, k (batch, T, H, K), v (batch, T, HV, V), g, beta (batch, T, HV), 1 <= T <= cache.max_draft.
    Rows whose buffer holds W or more committed entries are flushed first (as a flush step would).
    Each (row, value head) reads its tile once (the read copy, or the new checkpoint after a flush)
    and takes S k_i and S q_i for every draft from that one read; the committed entries and the drafts
    enter through small [entries, T] and [T, T] weight matrices, so draft i's update is exact, from
    the state after drafts 0..i-1. The drafts are appended at fill .. fill + T - 1 (0 .. T - 1
    after a flush) and fill is not advanced, so a later verify or step overwrites the rejected ones.
    Returns o (batch, T, HV, V) in v's dtype (written into `out` when given). `launch` overrides BV
    (rows of the tile per pipelined chunk), BVF (rows per chunk of a flush-first fold), VK, STAGES (the
    chunks' pipeline depth), GPASS (1: the key products a key head's value heads share from a launch of
    their own, in GKSPLIT column pieces; 2: also each value head's weights, from a second launch; MMA =
    1 and no read copy), MMA (1: each chunk's products on the tensor cores), KSPLIT (2: those products
    and a fold's in K halves), FSTAGES (a fold's pipeline depth), FPASS (1: the folds in a launch of
    their own, after a launch that lists the heads that fold; its FVP rows per item, FWARPS, FMAXNREG,
    PPS programs per SM, TF32 (1: 3xTF32, 0: fp32 FMAs), FKSPLIT, FSTREAM: 1 runs it on a second stream
    beside the key products and the weights, and FPREF: 1 loads each item's list entry and slot an item
    ahead), FSPLITW (1: a fill of W folds in a product over the window's entries, not the capacity's; 2:
    a fill past W too, and the entries past them one by one), ARRIVE (0: the drafts' keys written by each
    key head's first value head, not the last to finish; taken with FPASS = 1 only), WFILL (1: each value
    head's fill read from its weights; with GPASS = 2 only), num_warps, num_stages, maxnreg; slots,
    check: as in `replay`.
    """
    batch, T = _check_against_cache(cache, _verify_kernel, q, k, v, g, beta, tokens=True)
    if not 1 <= T <= cache.max_draft:
        raise ValueError(f"q carries T={T} drafts; verify takes 1 to the cache's max_draft={cache.max_draft}")
    scale = default_scale(cache.K, scale)
    slots = check_slots(slots, batch, cache.nslots, q.device, check)
    out = check_out(out, v.shape, v.dtype, q.device)
    settings = launch_settings(LAUNCH, launch_name("verify", cache, batch), launch)
    if batch:
        _launch_verify(cache, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel), settings)
    cache.last_draft = T
    return out


@families.refuse_out_of_resources
def accept(
    cache: ReplayCache,
    n_accepted: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    launch: dict | None = None,
    check: bool = True,
) -> None:
    """Commit the first n drafts of each row's last `verify`: its fill counters advance by n.

    n_accepted (batch,) int32 or int64 on the cache's device, each in [0, T]; slots as in `replay`.
    `check` range-checks slots and n_accepted on the host (a device sync), skipped while a CUDA graph
    is captured.
    """
    _check_cache(cache, _accept_kernel)
    if not isinstance(n_accepted, torch.Tensor) or n_accepted.dim() != 1:
        raise ValueError("n_accepted must be a 1-D int32 or int64 tensor of shape (batch,)")
    batch = n_accepted.shape[0]
    check_accepted(n_accepted, batch, cache.last_draft, cache.device, check)
    slots = check_slots(slots, batch, cache.nslots, cache.device, check)
    settings = launch_settings(LAUNCH, "accept", launch)
    if batch:
        _launch_accept(cache, n_accepted, slots, settings)


@families.refuse_out_of_resources
def materialize(cache: ReplayCache, slots: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 full states (n, HV, V, K) of `slots` (default: all): checkpoint plus committed buffer.

    S = e^{G_f} S_0 + sum_{j<f} e^{G_f - G_j} u_j k_jᵀ per value head, from the full-precision
    checkpoint, with the buffered updates corrected as a flush corrects them: the state the next flush
    would store. Plain torch, for tests, prefix caching and debugging; the cache is not changed.
    """
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache must be a ReplayCache; got {type(cache).__name__}")
    idx = cache._index(slots, "slots")
    f = cache.fill[idx].long()
    used = torch.arange(cache.capacity, device=cache.device)[None, :, None] < f[:, None, :]
    G = torch.where(used, cache.buf_g[idx], 0.0)
    keys = torch.where(used[..., None], cache.buf_k[idx].float().repeat_interleave(cache.HV // cache.H, dim=2), 0.0)
    u = torch.where(used[..., None], cache.buf_u[idx].float(), 0.0)
    if cache.read_copy is not None:
        scale = None if cache.read_scale is None else cache.read_scale[idx]
        D = cache.checkpoint[idx].float() - dequantize_read(cache.read_copy[idx], scale)
        beta = torch.where(used, cache.buf_beta[idx], 0.0)
        G_prev = torch.zeros_like(G[:, 0])
        corrected = []
        for j in range(cache.capacity):
            a = torch.where(used[:, j], torch.exp(G[:, j] - G_prev), 1.0)
            d = -(beta[:, j] * a)[..., None] * torch.einsum("nhvk,nhk->nhv", D, keys[:, j])
            D = a[..., None, None] * D + d[..., None] * keys[:, j, :, None, :]
            corrected.append(u[:, j] + d)
            G_prev = torch.where(used[:, j], G[:, j], G_prev)
        u = torch.stack(corrected, dim=1)
    G_last = torch.where(f > 0, G.gather(1, (f - 1).clamp(min=0)[:, None, :]).squeeze(1), 0.0)
    w = torch.where(used, torch.exp(G_last[:, None, :] - G), 0.0)
    S = torch.exp(G_last)[..., None, None] * cache.checkpoint[idx].float()
    return S + torch.einsum("njhv,njhk->nhvk", w[..., None] * u, keys)
