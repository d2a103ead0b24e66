"""The long-decode quality harness: equal to the kernel references, drift by generation length, trace files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from replayssm_cli.measure import quality as Q
from replayssm_cli.measure import trace as T
from replayssm_cli.errors import UserError
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

MAMBA2 = Mamba2Shape(H=8, P=12, N=10, G=2)
GDN = GDNShape(H=2, HV=6, K=16, V=12)
CONFIGS = [
    Q.Config("conventional", "fp32"),
    Q.Config("conventional", "bf16"),
    Q.Config("conventional", "fp16"),
    Q.Config("replay", "fp32", 5),
    Q.Config("replay", "bf16", 4),
    Q.Config("replay", "fp16", 3),
    Q.Config("split", "fp32", 4, "bf16"),
    Q.Config("split", "fp32", 6, "fp16"),
    Q.Config("split", "fp32", 4, "fp8"),
    Q.Config("conventional", "int8"),
    Q.Config("replay", "fp8", 4),
    Q.Config("replay", "int8", 3),
]


def _inputs(shape, steps=40, prompt=8, heads=3, seed=0):
    a_range = (1.0, 16.0) if shape.op == "mamba2" else (0.0, 16.0)
    return Q.synthetic_inputs(shape, a_range=a_range, steps=steps, prompt=prompt, heads=heads, seed=seed)


def test_synthetic_inputs_are_drawn_like_a_model():
    m = _inputs(Mamba2Shape(H=128, P=64, N=128, G=8), steps=5, prompt=3, heads=4)
    assert m.steps == 8 and m.generated == 5 and m.dims() == {"H": 4, "P": 64, "N": 128}
    A = m.tensors["A"]
    assert torch.all(A < 0) and A.max().item() == pytest.approx(-1.0) and A.min().item() == pytest.approx(-16.0, rel=1e-5)
    delta = torch.nn.functional.softplus(m.tensors["dt_bias"])
    assert delta.min().item() == pytest.approx(1e-3, rel=1e-3) and delta.max().item() == pytest.approx(1e-1, rel=1e-3)
    assert torch.equal(m.tensors["x"], m.tensors["x"].bfloat16().float())
    g = _inputs(GDNShape(H=16, HV=64, K=128, V=128), steps=5, prompt=3, heads=4)
    assert torch.allclose(g.tensors["k"].norm(dim=-1), torch.ones(8, 4), atol=1e-4)
    assert torch.all(g.tensors["g"] <= 0) and torch.all((g.tensors["beta"] > 0) & (g.tensors["beta"] < 1))
    assert g.scale == pytest.approx(128**-0.5)


@pytest.mark.parametrize("shape", [MAMBA2, GDN], ids=["mamba2-H3-P12-N10", "gdn-HV3-K16-V12"])
def test_run_equals_the_kernel_references(shape):
    """The vectorised harness steps every config exactly as decode_ref / replay_ref do, flushes included."""
    inputs = _inputs(shape)
    report = Q.run(inputs, CONFIGS, keep_outputs=True)
    ref64 = Q._reference_outputs(inputs)
    for c in CONFIGS:
        want = Q.stepwise_outputs(inputs, c, backend="reference", device="cpu")
        got = report.outputs[c]
        assert not torch.isnan(want).any()
        gap = (got - want).norm().item()
        # Harness and reference agree far closer than either agrees with fp64 (a state rounding that flips
        # on a last-bit difference is the only way they part).
        limit = max(1e-5 * want.norm().item(), 0.1 * (want.double() - ref64).norm().item())
        assert gap <= limit, f"{c.label()}: |harness - reference| = {gap:.3g} > {limit:.3g}"
        e = report.get(c)
        assert list(e.buckets) == ["1-128"] and e.longest == e.buckets["1-128"]


def test_run_kernels_match_the_harness(device):
    """The stepping path drives the real kernels (GPU, or Triton's interpreter) to the same outputs."""
    for shape, configs in (
        (MAMBA2, [Q.Config("conventional", "fp16"), Q.Config("split", "fp32", 3, "fp16"), Q.Config("replay", "int8", 3)]),
        (GDN, [Q.Config("conventional", "bf16"), Q.Config("split", "fp32", 3, "bf16"), Q.Config("conventional", "fp8")]),
    ):
        inputs = _inputs(shape, steps=7, prompt=4, heads=2)
        report = Q.run(inputs, configs, keep_outputs=True)
        ref64 = Q._reference_outputs(inputs)
        for c in configs:
            got = Q.stepwise_outputs(inputs, c, backend="kernels", device=device)
            want = report.outputs[c]
            limit = max(1e-5 * want.norm().item(), 0.1 * (want.double() - ref64).norm().item())
            assert (got - want).norm().item() <= limit, c.label()


@pytest.mark.parametrize(
    "shape, a_range",
    [(Mamba2Shape(H=128, P=64, N=128, G=8), (1.0, 16.0)), (GDNShape(H=16, HV=64, K=128, V=128), (0.0, 16.0))],
    ids=["mamba2-P64-N128", "gdn-K128-V128"],
)
def test_bf16_state_drifts_with_length_but_a_bf16_read_copy_does_not(shape, a_range):
    """Rounding the state on every store accumulates; a read copy's rounding touches one output and is gone."""
    inputs = Q.synthetic_inputs(shape, a_range=a_range, steps=600, heads=2, seed=0)
    conv, split, exact = Q.Config("conventional", "bf16"), Q.Config("split", "fp32", 16, "bf16"), Q.Config("conventional", "fp32")
    report = Q.run(inputs, [conv, split, exact])
    c, s, f = (report.get(x).buckets for x in (conv, split, exact))
    assert list(c) == ["1-128", "129-1k"]
    assert c["129-1k"] > 1.4 * c["1-128"], c
    assert s["129-1k"] < 1.2 * s["1-128"], s
    assert s["129-1k"] < c["129-1k"] / 5
    assert f["129-1k"] < 1e-5


def test_buckets_follow_the_generation_length():
    assert [b[0] for b in Q._bucket_slices(600)] == ["1-128", "129-1k"]
    assert Q._bucket_slices(1100)[-1] == ("1k-4k", 1024, 1100)
    assert [b[0] for b in Q._bucket_slices(5000)] == ["1-128", "129-1k", "1k-4k", "4k+"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(variant="replay", state_dtype="fp32"),
        dict(variant="split", state_dtype="bf16", window=4, read_dtype="bf16"),
        dict(variant="conventional", state_dtype="fp32", window=4),
        dict(variant="replay", state_dtype="fp64", window=4),
    ],
    ids=["replay-no-window", "split-bf16-checkpoint", "conventional-window", "fp64-state"],
)
def test_config_rejects_what_no_kernel_runs(kwargs):
    with pytest.raises(ValueError):
        Q.Config(**kwargs)


def _trace(op: str, steps: int = 30, prompt: int = 10) -> T.Trace:
    rng = np.random.default_rng(0)
    if op == "mamba2":
        H, P, N, G = 4, 8, 6, 2
        arrays = {
            "x": rng.standard_normal((steps, H, P)),
            "dt": 0.5 * rng.standard_normal((steps, H)),
            "B": rng.standard_normal((steps, G, N)),
            "C": rng.standard_normal((steps, G, N)),
            "A": -np.exp(rng.uniform(0, 2, H)),
            "D": np.ones(H),
            "dt_bias": rng.uniform(-5, -2, H),
        }
        return T.Trace("mamba2", arrays, prompt_tokens=prompt, model="tiny-mamba2", layer=3)
    H, HV, K, V = 1, 3, 8, 5
    q, k = rng.standard_normal((steps, H, K)), rng.standard_normal((steps, H, K))
    arrays = {
        "q": q / np.linalg.norm(q, axis=-1, keepdims=True),
        "k": k / np.linalg.norm(k, axis=-1, keepdims=True),
        "v": rng.standard_normal((steps, HV, V)),
        "g": -rng.uniform(0.001, 0.5, (steps, HV)),
        "beta": rng.uniform(0.05, 0.95, (steps, HV)),
    }
    return T.Trace("gdn", arrays, prompt_tokens=prompt, model="tiny-gdn", layer=0, scale=K**-0.5)


@pytest.mark.parametrize("op", ["mamba2", "gdn"])
def test_trace_round_trip_and_quality_on_it(tmp_path, op):
    path = T.write(tmp_path / f"{op}.npz", _trace(op))
    back = T.read(path)
    assert back.op == op and back.prompt_tokens == 10 and back.steps == 30 and back.generated == 20
    for name, arr in _trace(op).arrays.items():
        np.testing.assert_allclose(back.arrays[name], arr.astype(np.float32))
    inputs = Q.trace_inputs(back, heads=3)
    assert inputs.prompt == 10 and inputs.generated == 20 and inputs.heads == 3
    report = Q.run(inputs, [Q.Config("conventional", "bf16"), Q.Config("split", "fp32", 4, "bf16")])
    assert report.source == f"trace tiny-{op} layer {back.layer}"
    assert all(0 < e.longest < 0.1 for e in report.errors)
    short = Q.trace_inputs(back, heads=1, steps=5)
    assert short.generated == 5 and short.heads == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.arrays.pop("C"), "lacks"),
        (lambda t: t.arrays.__setitem__("A", -t.arrays["A"]), "A >= 0"),
        (lambda t: t.arrays.__setitem__("B", t.arrays["B"][:, :, :5]), "N=5"),
        (lambda t: t.arrays.__setitem__("x", t.arrays["x"][..., 0]), "dimensions"),
        (lambda t: setattr(t, "prompt_tokens", 30), "no generated token"),
        (lambda t: t.arrays["dt"].__setitem__((0, 0), np.nan), "NaN"),
    ],
    ids=["missing-array", "positive-A", "mismatched-N", "wrong-rank", "no-generation", "nan"],
)
def test_trace_validation(change, message):
    t = _trace("mamba2")
    change(t)
    with pytest.raises(ValueError, match=message):
        T.validate(t)


def test_trace_read_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        T.read(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(UserError, match="is not a .npz archive"):
        T.read(bad)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    with pytest.raises(UserError, match="no meta"):
        T.read(foreign)
    gdn = _trace("gdn")
    gdn.arrays["g"] = -gdn.arrays["g"]
    with pytest.raises(ValueError, match="g > 0"):
        T.write(tmp_path / "g.npz", gdn)


@pytest.mark.parametrize("kwargs", [
    dict(variant="conventional", state_dtype="fp32", rounding="stochastic"),
    dict(variant="replay", state_dtype="bf16", window=4, rounding="dithered"),
    dict(variant="split", state_dtype="int8", window=4, read_dtype="fp8"),
], ids=["stochastic-fp32", "rounding-word", "split-int8-checkpoint"])
def test_config_rejects_impossible_precisions(kwargs):
    with pytest.raises(ValueError):
        Q.Config(**kwargs)


def test_configs_cover_eight_bit_states_and_stochastic_rounding():
    configs = Q.configs_for((4,), ("fp32", "bf16", "int8"), ("bf16",), ("nearest", "stochastic"))
    labels = [c.label() for c in configs]
    assert labels == ["conventional fp32", "conventional bf16", "conventional bf16 SR", "conventional int8",
                      "conventional int8 SR", "replay W4 fp32", "replay W4 bf16", "replay W4 bf16 SR", "replay W4 int8",
                      "replay W4 int8 SR", "split W4 fp32+bf16"]
    assert Q.Config("replay", "int8", 4, rounding="stochastic").key() == ("replay", "int8", 4, None, "stochastic")


def test_eight_bit_checkpoints_and_stochastic_rounding_by_bucket():
    """Each new precision's error by bucket: an 8-bit checkpoint re-rounds at every flush, so it grows with the
    decode as a stored bf16 state does, while a bf16 read copy over fp32 holds; stochastic rounding's errors are
    unbiased, so a bf16 state rounded so drifts no faster than to nearest (its level is higher: each stochastic
    rounding's error variance is larger)."""
    shape = Mamba2Shape(H=128, P=64, N=128, G=8)
    inputs = Q.synthetic_inputs(shape, a_range=(1.0, 16.0), steps=600, heads=2, seed=0)
    near, sr = Q.Config("conventional", "bf16"), Q.Config("conventional", "bf16", rounding="stochastic")
    int8, fp8 = Q.Config("replay", "int8", 16), Q.Config("replay", "fp8", 16)
    int8_sr, split = Q.Config("replay", "int8", 16, rounding="stochastic"), Q.Config("split", "fp32", 16, "bf16")
    report = Q.run(inputs, [near, sr, int8, fp8, int8_sr, split])
    b = {c: report.get(c).buckets for c in (near, sr, int8, fp8, int8_sr, split)}
    growth = {c: v["129-1k"] / v["1-128"] for c, v in b.items()}
    assert growth[int8] > 1.4 and growth[fp8] > 1.4 and growth[split] < 1.2, growth
    assert growth[sr] <= growth[near] * 1.05, growth
    # an int8 row keeps 7 bits over its largest value, e4m3 3 mantissa bits: fp8 is the coarser checkpoint
    assert b[split]["129-1k"] < b[int8]["129-1k"] < b[fp8]["129-1k"]
    assert b[int8_sr]["129-1k"] > b[int8]["129-1k"]
    assert report.get(sr).to_dict()["rounding"] == "stochastic"


@pytest.mark.parametrize("shape", [MAMBA2, GDN], ids=["mamba2", "gdn"])
def test_stepwise_kernels_round_stochastically_as_their_references(shape, device):
    """The kernel path of the harness hands each kernel its rounding stream and row scales: the same Philox bits
    as the references draw, so the two agree step by step (the harness's own stream is another)."""
    inputs = _inputs(shape, steps=6, prompt=2, heads=1)
    for c in (Q.Config("conventional", "int8", rounding="stochastic"), Q.Config("replay", "bf16", 3, rounding="stochastic")):
        want = Q.stepwise_outputs(inputs, c, backend="reference", device="cpu")
        got = Q.stepwise_outputs(inputs, c, backend="kernels", device=device).cpu()
        assert (got - want).norm().item() <= 1e-5 * want.norm().item(), c.label()


def test_fp8_nearest_equals_torchs_cast():
    """The harness's fp8 e4m3 rounding is torch's cast to float8_e4m3fn and back, ties and subnormals included."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = codes[codes.isfinite() & (codes.abs() <= 448)].unique()
    ties = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([ties, torch.nextafter(ties, grid[1:]), torch.nextafter(ties, grid[:-1]), grid])
    gen = torch.Generator().manual_seed(0)
    spread = torch.exp(torch.empty(200_000).uniform_(math.log(1e-5), math.log(448.0), generator=gen))
    q = torch.cat([near, -near, spread, -spread, torch.tensor([0.0, 448.0, -448.0])])
    assert torch.equal(Q._fp8_nearest(q), q.to(torch.float8_e4m3fn).float())


def test_run_keeps_the_stepwise_harness_errors():
    """The windowed Mamba-2 run gives the errors the token-by-token harness gave on the same inputs (the fixture):
    every figure within float rounding, 1e-4 of itself or 2^-24 (fp32's unit roundoff; an fp32 state's errors are
    that rounding, and the windowed run sums each output's terms in another order)."""
    want = json.loads((Path(__file__).parent / "fixtures" / "quality_mamba2_stepwise.json").read_text())
    spec = want["inputs"]
    inputs = Q.synthetic_inputs(Mamba2Shape(**spec["shape"]), steps=spec["steps"], prompt=spec["prompt"],
                                heads=spec["heads"], seed=spec["seed"])
    configs = [Q.Config(*c["key"]) for c in want["configs"]]
    assert len({c.window for c in configs}) == len(spec["windows"]) + 1 and len(configs) == 57
    report = Q.run(inputs, configs)
    for c, w in zip(configs, want["configs"]):
        got = report.get(c)
        for name, figures in (("buckets", got.buckets), ("worst_token", got.worst)):
            assert list(figures) == list(w[name])
            for label, value in figures.items():
                assert value == pytest.approx(w[name][label], rel=1e-4, abs=2**-24), (c.label(), name, label)
