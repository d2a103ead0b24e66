"""A GPU's ceilings measured with kernels: DRAM copy and read streams, an L2 read, an FP32 FMA loop, BF16 and TF32 GEMMs."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from replayssm_kernels.ceilings import COPY_BLOCK, FMA_BLOCK, L2_BLOCK, L2_TILES, copy, fma, fma_flops, read_sum

GEMM_SIZE = 8192


def time_ms(fn: Callable[[], Any], warmup: int = 3, reps: int = 10) -> float:
    """Median wall time of `fn` on the current CUDA stream, in ms, timed with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def dram_rates(device: torch.device, nbytes: int) -> dict[str, float]:
    """GB/s of a Triton copy and torch's copy_ (bytes read plus written) and of a read-only stream, on nbytes buffers."""
    n = nbytes // 4
    src = torch.rand(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    triton_ms = time_ms(lambda: copy(src, dst))
    torch_ms = time_ms(lambda: dst.copy_(src))
    read_ms = time_ms(lambda: read_sum(src))
    return {"copy_triton_gbs": 2 * nbytes / triton_ms / 1e6, "copy_torch_gbs": 2 * nbytes / torch_ms / 1e6, "read_gbs": nbytes / read_ms / 1e6}


def l2_rate(device: torch.device, nbytes: int, reps: int = 2000) -> float:
    """GB/s of re-reading an L2-resident buffer of nbytes, reps times in one launch, with L1 bypassed."""
    src = torch.rand(nbytes // 4, dtype=torch.float32, device=device)
    ms = time_ms(lambda: read_sum(src, reps, block=L2_BLOCK, tiles=L2_TILES, bypass_l1=True))
    return nbytes * reps / ms / 1e6


def fp32_rate(device: torch.device, sm_count: int, iters: int = 4096) -> float:
    """TFLOP/s of the FMA loop over 16 programs per SM."""
    out = torch.empty(sm_count * 16 * FMA_BLOCK, dtype=torch.float32, device=device)
    ms = time_ms(lambda: fma(out, iters))
    return fma_flops(out.numel(), iters) / ms / 1e9


def gemm_rate(device: torch.device, dtype: torch.dtype, size: int = GEMM_SIZE) -> float:
    """TFLOP/s of torch.matmul on random size x size matrices (fp32 inputs run as TF32)."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ms = time_ms(lambda: torch.matmul(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return 2 * size**3 / ms / 1e9


def run_all(device: torch.device, progress: bool = True, l2_mib: float | None = None) -> dict[str, Any]:
    """Every ceiling on `device`: copy_gbs, read_gbs, l2_gbs, fp32_tflops, bf16_tflops, tf32_tflops, and details."""
    from rich.progress import Progress

    from replayssm_cli.console import err

    torch.cuda.set_device(device)
    free, _ = torch.cuda.mem_get_info(device)
    # Two buffers of up to 2 GiB each, far larger than any L2, within a quarter of free memory.
    nbytes = min(2 << 30, free // 4) // (4 * COPY_BLOCK) * (4 * COPY_BLOCK)
    # A buffer well inside L2: a quarter of it, at most 8 MiB.
    l2_bytes = int(min(8.0, (l2_mib or 32.0) / 4) * 2**20) // (4 * L2_BLOCK * L2_TILES) * (4 * L2_BLOCK * L2_TILES)
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    details: dict[str, Any] = {"buffer_bytes": nbytes, "l2_buffer_bytes": l2_bytes, "sm_count": sm_count, "gemm_size": GEMM_SIZE}
    steps: list[tuple[str, Callable[[], None]]] = [
        ("DRAM copy and read", lambda: details.update(dram_rates(device, nbytes))),
        ("L2 read", lambda: details.update(l2_gbs=l2_rate(device, l2_bytes))),
        ("FP32 FMA", lambda: details.update(fp32_tflops=fp32_rate(device, sm_count))),
        ("BF16 GEMM", lambda: details.update(bf16_tflops=gemm_rate(device, torch.bfloat16))),
        ("TF32 GEMM", lambda: details.update(tf32_tflops=gemm_rate(device, torch.float32))),
    ]
    with Progress(console=err, transient=True, disable=not progress) as bar:
        task = bar.add_task("measuring ceilings", total=len(steps))
        for name, run in steps:
            bar.update(task, description=f"measuring {name}")
            run()
            torch.cuda.empty_cache()
            bar.advance(task)
    return {
        "copy_gbs": max(details["copy_triton_gbs"], details["copy_torch_gbs"]),
        "read_gbs": details["read_gbs"],
        "l2_gbs": details["l2_gbs"],
        "fp32_tflops": details["fp32_tflops"],
        "bf16_tflops": details["bf16_tflops"],
        "tf32_tflops": details["tf32_tflops"],
        "details": details,
    }
