"""The software environment a measurement was taken in: versions, commit, host; torch and triton only if importable."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the replayssm checkout (with '-dirty' if it has uncommitted changes), or None.

    Where the checkout carries no git metadata (a copied working tree), REPLAYSSM_COMMIT names it.
    """
    if os.environ.get("REPLAYSSM_COMMIT"):
        return os.environ["REPLAYSSM_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=5
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def software() -> dict[str, Any]:
    """Versions of everything that changes a measurement, without importing torch or triton."""
    from replayssm_cli import __version__

    return {
        "replayssm": __version__,
        "commit": git_commit(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "host": platform.node(),
        "platform": platform.platform(),
    }


def cuda_runtime() -> dict[str, Any]:
    """CUDA as torch sees it (imports torch): runtime version and whether a device is present."""
    import torch

    info: dict[str, Any] = {"cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_name=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            total_memory=props.total_memory,
        )
    return info
