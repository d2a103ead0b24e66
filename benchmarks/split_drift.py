"""How far GDN's split-precision checkpoint drifts from the exact recurrence over many steps, on a GPU.

Steps a split cache (fp32 checkpoint, a narrower read copy) and an fp32-only cache through the same inputs
beside an fp64 conventional recurrence (`decode_ref`), and prints, per batch, the largest error of each
checkpoint at its flushes and of the outputs in the first and last quarter of the run, relative to the exact
state's and outputs' largest magnitude: what a change to a flush's arithmetic costs the checkpoint's exactness.

    python benchmarks/split_drift.py --batch 1 --batch 64 --launch correction=tf32 --launch precision=tf32x3
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from replayssm_kernels import gdn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402

SHAPE = {"H": 16, "HV": 64, "K": 128, "V": 128}


def _rel(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got.double() - exact).abs().max() / exact.abs().max()).item()


def _launch(text: str) -> dict:
    """field=value,... as ReplayConfig fields to put in the shipped row (the sweeps' parser); "" is the row."""
    try:
        return common.parse_launch(f"replay:{text}", ("replay",))[1]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (for example correction=tf32)") from None


def _config(cache, batch: int, fields: dict):
    """The replay row `cache` takes at `batch` rows with `fields` (ReplayConfig's) put in."""
    import importlib

    from replayssm_kernels import common as kc

    replay = importlib.import_module("replayssm_kernels.gdn.replay")
    return kc.override(replay.REPLAY_LAUNCH[replay.select(cache, batch)], fields)


def drift(batch: int, steps: int, window: int, read_dtype: str, launch: dict, seed: int, shape: dict = SHAPE,
          device: str = "cuda") -> dict:
    H, HV, K, V = shape["H"], shape["HV"], shape["K"], shape["V"]
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(batch, HV, V, K, generator=gen).to(device) * 0.1
    split = gdn.ReplayCache.create(batch, H, HV, K, V, window, state_dtype="fp32", read_dtype=read_dtype,
                                   io_dtype="bf16", device=device)
    full = gdn.ReplayCache.create(batch, H, HV, K, V, window, state_dtype="fp32", io_dtype="bf16", device=device)
    split.load(start)
    full.load(start)
    exact = start.double()
    out_err, ckpt_split, ckpt_full = [], [], []
    for step in range(steps):
        inp = gdn.random_inputs(batch, H, HV, K, V, device=device, generator=gen)
        y_split = gdn.replay(split, **inp, use_qk_l2norm_in_kernel=True, config=_config(split, batch, launch))
        gdn.replay(full, **inp, use_qk_l2norm_in_kernel=True)
        y_exact = gdn.decode_ref(exact, **{k: v.double() for k, v in inp.items()}, use_qk_l2norm_in_kernel=True)
        out_err.append(_rel(y_split, y_exact))
        if step % window == window - 1:
            ckpt_split.append(_rel(split.checkpoint, exact))
            ckpt_full.append(_rel(full.checkpoint, exact))
    quarter = max(1, steps // 4)
    return {
        "batch": batch, "launch": launch, "read_dtype": read_dtype, "steps": steps,
        "checkpoint_split_max": max(ckpt_split), "checkpoint_fp32_max": max(ckpt_full),
        "output_first_quarter": max(out_err[:quarter]), "output_last_quarter": max(out_err[-quarter:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, action="append", help="repeatable (default 1 and 64)")
    parser.add_argument("--launch", action="append", type=_launch, default=None,
                        help="field=value,... of gdn.replay's ReplayConfig, repeatable; each is run at each batch on "
                             "the row the batch takes; the shipped row always")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--read-dtype", default="bf16", choices=("bf16", "fp16", "fp8"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    for batch in args.batch or [1, 64]:
        for launch in [{}] + (args.launch or []):
            try:
                row = drift(batch, args.steps, args.window, args.read_dtype, launch, args.seed)
            except ValueError as exc:  # a setting this batch's row refuses (gdn.replay checks before any launch)
                row = {"batch": batch, "launch": launch, "skipped": str(exc)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
