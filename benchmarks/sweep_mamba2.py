"""Sweep the Mamba-2 kernels' launch settings on a GPU at the Nemotron-3-Super layer shape: time, GB/s, ratio."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402
from sweep_common import KERNELS, Result, add_ratios  # noqa: E402, F401

from replayssm_cli.model.shapes import Mamba2Shape  # noqa: E402

SHAPE = {"H": 128, "P": 64, "N": 128, "G": 8}
WINDOW = 16
DRAFT = 4
ACCEPTED = 3
# Fields of each kernel's launch configuration (DecodeConfig, StepConfig, VerifyConfig) put into the row the kernel
# chooses at the timed batch.
GRID = {
    "decode": [{"rows": 8, "warps": 4}, {"rows": 16, "warps": 4}, {"rows": 32, "warps": 4},
               {"rows": 16, "warps": 8}, {"rows": 64, "warps": 8}],
    "replay": [{"chunk": 32, "stages": 2, "maxnreg": 96}, {"chunk": 32, "stages": 3, "maxnreg": 128},
               {"chunk": 16, "stages": 3, "maxnreg": 96}, {"rows": 64, "chunk": 64},
               {"rows": 16, "chunk": 16, "warps": 1}, {"rows": 32, "chunk": 32, "warps": 1}],
    "decode-multi": [{"rows": 8, "warps": 4}, {"rows": 16, "warps": 4}, {"rows": 32, "warps": 8}],
    "verify": [{"rows": 16, "warps": 4}, {"rows": 32, "warps": 4}, {"rows": 16, "warps": 8}],
}
GRID["replay-nonflush"] = GRID["replay-flush"] = GRID["split-bf16"] = GRID["replay"]
GRID["split-bf16-nonflush"] = GRID["split-bf16-flush"] = GRID["split-fp8"] = GRID["split-bf16"]
QUICK_GRID = {
    "decode": [{"rows": 16, "warps": 4}, {"rows": 32, "warps": 4}],
    "replay": [{"chunk": 32, "stages": 2, "maxnreg": 96}, {"rows": 16, "chunk": 16, "warps": 1}],
    "decode-multi": [{"rows": 16, "warps": 4}],
    "verify": [{"rows": 16, "warps": 4}, {"rows": 32, "warps": 4}],
}
QUICK_GRID["replay-nonflush"] = QUICK_GRID["replay-flush"] = QUICK_GRID["split-bf16"] = QUICK_GRID["replay"]
QUICK_GRID["split-bf16-nonflush"] = QUICK_GRID["split-bf16-flush"] = QUICK_GRID["split-fp8"] = QUICK_GRID["split-bf16"]


def parse_launch(text: str) -> tuple[str, dict]:
    """'replay:warps=1,chunk=16' -> ('replay', {'warps': 1, 'chunk': 16})."""
    return common.parse_launch(text)


def config_for(kernel: str, target, batch: int, fields: dict):
    """The launch row `kernel` chooses for `target` (a state pool or cache) at `batch` rows, with `fields` put in."""
    import importlib

    from replayssm_kernels import common as kc

    md, mr, mv = (importlib.import_module(f"replayssm_kernels.mamba2.{m}") for m in ("decode", "replay", "verify"))
    if kernel in ("decode", "decode-multi"):
        row = md.DECODE_LAUNCH[md.select(target, batch if kernel == "decode" else None)]
    elif kernel == "verify":
        row = mv.VERIFY_LAUNCH[mv.select(target, batch)]
    else:
        row = mr.STEP_LAUNCH[mr.select(target, batch)]
    return kc.override(row, fields)


def plan(kernels: list[str], quick: bool, overrides: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """The launch settings to time per kernel: those given on the command line, else the built-in grid."""
    return common.plan(kernels, QUICK_GRID if quick else GRID, overrides)


def fill_trajectory(kernel: str, start: int, steps: int) -> list[int]:
    return common.fill_trajectory(kernel, start, steps, WINDOW, ACCEPTED)


def start_fills(kernel: str, batch: int) -> list[int]:
    return common.start_fills(kernel, batch, WINDOW)


def graph_steps(kernel: str) -> int:
    return common.graph_steps(kernel, WINDOW)


def bytes_per_layer_step(kernel: str, batch: int) -> float:
    return common.bytes_per_layer_step(kernel, batch, Mamba2Shape(**SHAPE), WINDOW, DRAFT, ACCEPTED)


def random_inputs(batch: int, T: int | None, device: str) -> dict:
    """One step's inputs (T drafts' with T) in bf16, dt too, as `replayssm profile` draws them and the cost model
    counts them; A, D and dt_bias in fp32."""
    import torch

    from replayssm_kernels import mamba2

    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    inp = mamba2.random_inputs(batch, H, P, N, G, T=T, io_dtype=torch.bfloat16, device=device)
    return {**inp, "dt": inp["dt"].to(torch.bfloat16)}


def layer_count(kernel: str, batch: int, l2_bytes: int) -> int:
    return common.layer_count(kernel, batch, l2_bytes, SHAPE["H"] * SHAPE["P"] * SHAPE["N"])


class Stack:
    """L layers of one kernel at one batch: their state pools or caches, shared inputs, and one step."""

    def __init__(self, kernel: str, batch: int, layers: int, launch: dict, device: str):
        import torch

        from replayssm_kernels import mamba2

        self.m = mamba2
        self.kernel, self.batch, self.launch = kernel, batch, launch
        H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
        T = DRAFT if kernel in ("decode-multi", "verify") else None
        self.inp = random_inputs(batch, T, device)
        self.slots = common.row_slots(batch, device)
        self.n = torch.full((batch,), ACCEPTED, dtype=torch.int32, device=device)
        self.layers = []
        for _ in range(layers):
            if kernel in ("decode", "decode-multi"):
                state = (torch.randn(batch, H, P, N, device=device) * 0.5).to(common.state_torch_dtype())
                snaps = torch.empty(batch, DRAFT, H, P, N, device=device) if kernel == "decode-multi" else None
                self.layers.append((state, snaps))
            else:
                cache = mamba2.ReplayCache.create(
                    batch, H, P, N, G, WINDOW, state_dtype=common.STATE["dtype"],
                    read_dtype=common.read_dtype(kernel),
                    io_dtype="bf16", max_draft=DRAFT if kernel == "verify" else 0, device=device)
                cache.load(torch.randn(batch, H, P, N, device=device) * 0.5)
                self.layers.append(cache)
        fills = torch.tensor(start_fills(kernel, batch), dtype=torch.int32, device=device)
        # row r starts at fill start_fills[r]; the fills are indexed by its slot
        self.start = torch.empty_like(fills)
        self.start[self.slots.long()] = fills
        if kernel == "verify":
            for cache in self.layers:
                self.m.verify(cache, **self.inp, dt_softplus=True, slots=self.slots)

    def rewind(self) -> None:
        """Put every row back at its starting fill (between timed replays, outside the timing)."""
        for layer in self.layers:
            if not isinstance(layer, tuple):
                layer.fill.copy_(self.start[:, None].expand_as(layer.fill))

    def step(self) -> None:
        m, kw = self.m, dict(dt_softplus=True, slots=self.slots, check=False)
        first = self.layers[0][0] if isinstance(self.layers[0], tuple) else self.layers[0]
        kw["config"] = config_for(self.kernel, first, self.batch, self.launch)
        for layer in self.layers:
            if self.kernel == "decode":
                m.decode(layer[0], **self.inp, **kw)
            elif self.kernel == "decode-multi":
                m.decode_multi(layer[0], layer[1], **self.inp, **kw)
            elif self.kernel == "verify":
                m.verify(layer, **self.inp, **kw)
                m.accept(layer, self.n, self.slots, check=False)
            else:
                m.replay(layer, **self.inp, **kw)


def check_config(kernel: str, launch: dict, device: str, slots: list[int] = (2, -1, 0)) -> float:
    """Max relative error of the kernel with these settings against its reference over a window, one row per
    entry of `slots` (its slot, -1 for padding)."""
    import torch

    from replayssm_kernels import mamba2

    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    rows = torch.tensor(list(slots), dtype=torch.int32, device=device)
    n = len(rows)
    live = rows >= 0
    err = 0.0

    def rel(a, b):
        return ((a[live].float() - b[live].float()).abs().max() / b[live].float().abs().max()).item()

    if kernel in ("decode", "decode-multi"):
        state = (torch.randn(n, H, P, N, device=device) * 0.5).to(common.state_torch_dtype())
        want = state.clone()
        for _ in range(3):
            if kernel == "decode":
                inp = random_inputs(n, None, device)
                y = mamba2.decode(state, **inp, dt_softplus=True, slots=rows, config=config_for(kernel, state, n, launch))
                err = max(err, rel(y, mamba2.decode_ref(want, **inp, dt_softplus=True, slots=rows)), rel(state, want))
            else:
                inp = random_inputs(n, DRAFT, device)
                snaps, want_snaps = (torch.zeros(n, DRAFT, H, P, N, device=device) for _ in range(2))
                y = mamba2.decode_multi(state, snaps, **inp, dt_softplus=True, slots=rows,
                                        config=config_for(kernel, state, n, launch))
                y_ref = mamba2.decode_multi_ref(state, want_snaps, **inp, dt_softplus=True, slots=rows)
                err = max(err, rel(y, y_ref), rel(snaps, want_snaps))
        return err
    cache = mamba2.ReplayCache.create(n, H, P, N, G, WINDOW, state_dtype=common.STATE["dtype"],
                                      read_dtype=common.read_dtype(kernel),
                                      io_dtype="bf16", max_draft=DRAFT if kernel == "verify" else 0, device=device)
    cache.load(torch.randn(n, H, P, N, device=device) * 0.5)
    want = cache.clone()
    for step in range(WINDOW + 2):
        if kernel == "verify":
            inp = random_inputs(n, DRAFT, device)
            y = mamba2.verify(cache, **inp, dt_softplus=True, slots=rows, config=config_for(kernel, cache, n, launch))
            err = max(err, rel(y, mamba2.verify_ref(want, **inp, dt_softplus=True, slots=rows)))
            n_acc = torch.randint(0, DRAFT + 1, (n,), dtype=torch.int32, device=device)
            mamba2.accept(cache, n_acc, rows)
            mamba2.accept_ref(want, n_acc, rows)
        else:
            inp = random_inputs(n, None, device)
            y = mamba2.replay(cache, **inp, dt_softplus=True, slots=rows, config=config_for(kernel, cache, n, launch))
            err = max(err, rel(y, mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)))
    got, ref = mamba2.materialize(cache), mamba2.materialize_ref(want)
    return max(err, ((got - ref).abs().max() / ref.abs().max()).item())


def print_table(results: list[Result], out) -> None:
    common.print_table(results, out, f"Mamba-2 H{SHAPE['H']}-P{SHAPE['P']}-N{SHAPE['N']}-G{SHAPE['G']}, W={WINDOW}, "
                                     f"{common.STATE['dtype']} state, bf16 io; ratio = baseline's best / this "
                                     "(verify vs decode-multi, others vs decode)")


def build_parser():
    return common.build_parser(
        "sweep_mamba2.py",
        __doc__,
        "examples:\n"
        "  python benchmarks/sweep_mamba2.py --quick --out runs/sweep_quick.json\n"
        "  python benchmarks/sweep_mamba2.py --kernel replay --kernel decode --batch 256 \\\n"
        "      --launch replay:warps=1,chunk=16 --launch decode:rows=16,warps=4 --out runs/sweep.json\n"
        "  python benchmarks/sweep_mamba2.py --dry-run   # the plan, layer counts and bytes; no GPU needed",
    )


def main(argv: list[str] | None = None) -> int:
    return common.main(sys.modules[__name__], argv, reuse_checks=True)


if __name__ == "__main__":
    sys.exit(main())
