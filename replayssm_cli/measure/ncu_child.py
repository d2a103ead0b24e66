"""The process Nsight Compute profiles: builds one configuration, warms it up, then runs the profiled steps."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def case_layers(case: Any) -> int:
    """How many SSM layers one step of a case runs (each layer launches its own kernels)."""
    for name in ("n_layers", "num_layers", "layers"):
        value = getattr(case, name, None)
        if isinstance(value, int):
            return value
        if value is not None and hasattr(value, "__len__"):
            return len(value)
    spec = getattr(case, "spec", None)
    if isinstance(spec, dict) and isinstance(spec.get("layers"), int):
        return spec["layers"]
    raise ValueError(f"cannot tell how many layers {type(case).__name__} runs per step")


def run(spec_file: str | Path) -> dict[str, Any]:
    """Run one configuration: warm-up steps outside the profiled range, then the profiled steps inside it.

    The spec file holds {"case": <bench case spec>, "warmup": int, "steps": int, "info": path, "device":
    optional, default "cuda"}; what was run (layers, steps) is written to "info" once the profiled steps
    have finished.
    """
    import torch

    from replayssm_cli.measure.bench import make_case

    job = json.loads(Path(spec_file).read_text())
    device = torch.device(job.get("device", "cuda"))
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: Nsight Compute measurements need one")
    case = make_case(job["case"], device)
    try:
        for _ in range(int(job["warmup"])):
            case.step()
        if cuda:
            torch.cuda.synchronize()
            # ncu runs with --profile-from-start off: only launches between start and stop are profiled.
            torch.cuda.profiler.start()
        for _ in range(int(job["steps"])):
            case.step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        info = {"layers": case_layers(case), "steps": int(job["steps"]), "warmup": int(job["warmup"])}
    finally:
        case.close()
    Path(job["info"]).write_text(json.dumps(info))
    return info


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m replayssm_cli.measure.ncu_child SPEC.json", file=sys.stderr)
        return 2
    # ncu prints its CSV on the stdout this process shares: send everything this process writes to stderr.
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        run(args[0])
    except Exception as exc:
        print(f"error: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
