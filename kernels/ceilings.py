"""Kernels that measure a GPU's ceilings: DRAM copy and read streams, an L2 re-read and an FP32 FMA loop."""

from __future__ import annotations
import torch
import triton
import triton.language as tl


COPY_BLOCK = 8192


READ_BLOCK = 4096


READ_TILES = 8


L2_BLOCK = 1024


L2_TILES = 4


FMA_BLOCK = 1024


FMA_UNROLL = 8


@triton.jit
def copy_kernel(p_src, p_dst, n, BLOCK: tl.constexpr):
    i_b = tl.program_id(0)
    o_x = i_b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m_x = o_x < n
    b_x = tl.load(p_src + o_x, mask=m_x)
    tl.store(p_dst + o_x, b_x, mask=m_x)


@triton.jit
def read_kernel(p_src, p_partial, n, REPS: tl.constexpr, BLOCK: tl.constexpr, TILES: tl.constexpr, BYPASS_L1: tl.constexpr):
    i_b = tl.program_id(0)
    b_acc = tl.zeros([BLOCK], dtype=tl.float32)
    o_base = i_b.to(tl.int64) * BLOCK * TILES
    for i_r in range(REPS):
        for i_t in range(TILES):
            # Rotating the tile order per repetition keeps the compiler from hoisting loads out of the reps loop.
            o_x = o_base + ((i_t + i_r) % TILES) * BLOCK + tl.arange(0, BLOCK)
            m_x = o_x < n
            if BYPASS_L1:
                b_acc += tl.load(p_src + o_x, mask=m_x, other=0.0, cache_modifier=".cg")
            else:
                b_acc += tl.load(p_src + o_x, mask=m_x, other=0.0)
    tl.store(p_partial + i_b, tl.sum(b_acc, axis=0))


@triton.jit
def fma_kernel(p_out, a, c, ITERS: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    i_b = tl.program_id(0)
    o_x = i_b * BLOCK + tl.arange(0, BLOCK)
    b_x0 = o_x.to(tl.float32) * 1e-6
    b_x1 = b_x0 + 0.25
    b_x2 = b_x0 + 0.5
    b_x3 = b_x0 + 0.75
    for _ in range(ITERS):
        for _u in tl.static_range(UNROLL):
            b_x0 = b_x0 * a + c
            b_x1 = b_x1 * a + c
            b_x2 = b_x2 * a + c
            b_x3 = b_x3 * a + c
    tl.store(p_out + o_x, b_x0 + b_x1 + b_x2 + b_x3)


def copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst[:] = src through a Triton kernel (both flat, contiguous, same dtype and size)."""
    if src.shape != dst.shape or src.dtype != dst.dtype or not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("copy needs contiguous src and dst of the same shape and dtype")
    n = src.numel()
    copy_kernel[(triton.cdiv(n, COPY_BLOCK),)](p_src=src, p_dst=dst, n=n, BLOCK=COPY_BLOCK, num_warps=8)


def read_sum(src: torch.Tensor, reps: int = 1, *, block: int = READ_BLOCK, tiles: int = READ_TILES, bypass_l1: bool = False) -> torch.Tensor:
    """Per-program partial sums of `src` read `reps` times over (so the total is reps * src.sum()); reads only."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    n = src.numel()
    grid = triton.cdiv(n, block * tiles)
    partial = torch.full((grid,), float("nan"), dtype=torch.float32, device=src.device)
    read_kernel[(grid,)](p_src=src, p_partial=partial, n=n, REPS=reps, BLOCK=block, TILES=tiles, BYPASS_L1=bypass_l1, num_warps=8)
    return partial


def fma(out: torch.Tensor, iters: int, a: float = 0.999, c: float = 0.001) -> None:
    """Four dependent chains x <- a*x + c per element, iters*UNROLL steps each; out holds their sum (fp32)."""
    if out.dtype != torch.float32 or out.numel() % FMA_BLOCK:
        raise ValueError(f"fma needs an fp32 output whose size is a multiple of {FMA_BLOCK}")
    fma_kernel[(out.numel() // FMA_BLOCK,)](p_out=out, a=a, c=c, ITERS=iters, BLOCK=FMA_BLOCK, UNROLL=FMA_UNROLL, num_warps=4)


def fma_flops(numel: int, iters: int) -> int:
    """FLOPs `fma` performs: 4 chains x 2 FLOPs per FMA x iters x UNROLL per element."""
    return numel * 4 * 2 * iters * FMA_UNROLL
