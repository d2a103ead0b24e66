"""Shared test fixtures: the device the kernels run on, seeding, and the comparison tolerance."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

# Unit roundoff of each dtype a result can pass through.
ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float8_e4m3fn: 2.0**-4,
}
# Tolerance, relative to the largest |expected| (at least 1): ULPS units of roundoff of the coarsest dtype
# on the path, and never below FLOOR. Against an fp64 run, fp32 sums of tens of terms in another order (and
# the GPU's approximate exp and log) stay under FLOOR; Triton's CPU interpreter truncates fp32 -> bf16
# casts where the GPU rounds to nearest, within a unit. A missing or wrong term is off by far more.
ULPS = 8
FLOOR = 2.0**-16


def _interpreter_bf16_dot() -> None:
    """Make the CPU interpreter's tl.dot take bf16 operands by value: it holds bf16 as raw uint16 and multiplies
    the bit patterns (triton-lang/triton#11584, unsupported upstream). The GPU's bf16 product is exact per term
    with fp32 accumulation, as the fp32 matmul of the converted operands is here."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def value(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        data = interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, value(a), value(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = dot


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_bf16_dot()


def kernel_device() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    return None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """"cuda" when a GPU is present, else "cpu" under TRITON_INTERPRET=1; otherwise the test is skipped."""
    found = kernel_device()
    if found is None:
        pytest.skip("no CUDA GPU, and TRITON_INTERPRET=1 is not set to run the Triton kernels on the CPU")
    return found


@pytest.fixture(autouse=True)
def seed() -> int:
    random.seed(0)
    torch.manual_seed(0)
    return 0


def tolerance(expected: torch.Tensor, *dtypes: torch.dtype) -> float:
    """The absolute tolerance for a result that passed through `dtypes`, given its fp64 or fp32 expectation."""
    coarsest = max((ROUNDOFF[d] for d in dtypes), default=ROUNDOFF[torch.float32])
    finite = expected[torch.isfinite(expected)]
    scale = max(finite.abs().max().item(), 1.0) if finite.numel() else 1.0
    return max(ULPS * coarsest, FLOOR) * scale


@pytest.fixture
def assert_close():
    """assert_close(actual, expected, *dtypes, what=""): same shape, NaN exactly where expected has it, within
    the tolerance for a result that passed through `dtypes`."""

    def check(actual: torch.Tensor, expected: torch.Tensor, *dtypes: torch.dtype, what: str = "") -> None:
        assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
        assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what}: NaN where the reference has none (or vice versa)"
        ok = ~torch.isnan(e)
        err = (a[ok] - e[ok]).abs().max().item() if ok.any() else 0.0
        tol = tolerance(e[ok], *dtypes)
        assert err <= tol, f"{what}: max abs error {err:.3g} > tolerance {tol:.3g}"

    return check
