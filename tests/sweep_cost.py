"""The cost model's bytes of a launch-setting sweep's graph, from step_cost by another path than the sweeps' own."""

from __future__ import annotations

from replayssm_cli.model.cost import step_cost


def graph_bytes(sweep, shape, kernel: str, batch: int, params: int, **dtypes) -> float:
    """Mean bytes per layer-step of `kernel`'s graph at `batch` rows in sweep module `sweep` (its WINDOW, DRAFT,
    ACCEPTED and row plan), `params` the bytes the layer reads once per step whatever the batch; `dtypes` step_cost's
    state_dtype and buffer_dtype. Kernels outside ours (sweep.EXTRA_KERNELS) move a conventional step's bytes."""
    W = sweep.WINDOW
    kw = dict(batch=batch, window=W, io_dtype="bf16", **dtypes)
    if kernel == "verify":
        # Each row at the fills the sweep steps it through (a fill of W or more folds first).
        steps = sweep.graph_steps(kernel)
        rows = [sweep.fill_trajectory(kernel, start, steps) for start in sweep.start_fills(kernel, batch)]
        return sum(sum(step_cost(shape, "spec-replay", "flush" if f >= W else "nonflush", fill=f, draft=sweep.DRAFT,
                                 accepted=sweep.ACCEPTED, **{**kw, "batch": 1}).total_bytes for f in fills)
                   - (batch - 1) * params for fills in zip(*rows)) / steps
    if kernel in ("decode", "decode-multi") + getattr(sweep, "EXTRA_KERNELS", ()):
        return step_cost(shape, "spec-conventional" if kernel == "decode-multi" else "conventional", draft=sweep.DRAFT,
                         **kw).total_bytes
    # Staggered rows each pass every fill of the window once in W steps: the window average; a -nonflush graph
    # steps fills 0..W-2, whose mean is the nonflush default; a -flush graph the flush.
    read = sweep.common.read_dtype(kernel)
    phase = kernel.rsplit("-", 1)[1] if kernel.endswith(("-nonflush", "-flush")) else "avg"
    return step_cost(shape, "split" if read else "replay", phase, read_dtype=read, **kw).total_bytes
