"""`replayssm e2e --weight-dtype` and the attention backend: weight bytes, the nvfp4 plan, refusals, fp8 products on the CPU."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from replayssm_cli.measure import e2e
from replayssm_cli.model import hybrid
from replayssm_kernels import e2e_ops
from replayssm_cli.model import presets as P
from replayssm_cli.errors import UserError
from replayssm_cli.model.shapes import Mamba2Shape
from test_e2e import interpreter, invoke, no_cuda  # noqa: F401 - the e2e command's runner and fixtures

NANO = "nemotron-3-nano-4b"


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA GPU of a chosen compute capability, as far as the command's checks can see."""
    def make(capability):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(e2e, "attention_backend", lambda device: "torch-sdpa")
    return make


def test_weight_bytes_per_dtype():
    inv16 = hybrid.inventory(P.load_preset(NANO))
    inv8 = hybrid.inventory(P.load_preset(NANO), weight_dtype="fp8")
    inv4 = hybrid.inventory(P.load_preset(NANO), weight_dtype="nvfp4")
    lins = [(lin, hybrid.inventory(P.load_preset(NANO)).count(kind)) for kind, b in inv16.blocks.items() for lin in b.linears]
    quantized = sum(lin.params * n for lin, n in lins)
    tensors = sum(n for _, n in lins)
    # Every SSM, attention and MLP matrix of this model is 16-aligned; the embedding and LM head (2 x 131072 x 3136) stay bf16.
    assert inv8.to_dict()["kept_bf16"] == ["embedding", "lm_head"]
    assert inv16.full_bytes() - inv8.full_bytes() == quantized - 4 * tensors
    assert inv16.full_bytes() - inv4.full_bytes() == pytest.approx(quantized * (2 - 0.5625) - 4 * tensors, abs=tensors)
    assert inv16.head.nbytes("fp8") == inv16.head.nbytes() == 2 * 131072 * 3136 * 2 + 3136 * 2


def test_unaligned_and_kept_matrices_stay_bf16():
    lin = hybrid.Linear("in_proj", 32, 84)
    assert not lin.quantized("fp8") and lin.nbytes("fp8") == lin.nbytes("bf16") == 32 * 84 * 2
    assert not hybrid.Linear("router", 4096, 512).quantized("fp8")
    experts = hybrid.Linear("experts_up", 1024, 2688, experts=512)
    assert experts.nbytes("fp8") == 512 * 1024 * 2688 + 512 * 4, "one fp32 scale per expert"


def test_predicted_shares_grow_as_weights_shrink():
    spec = e2e.E2ESpec(presets=(NANO,), batches=(1, 256), contexts=(4096,))
    got = {wd: hybrid.predicted_shares(hybrid.inventory(P.load_preset(NANO), weight_dtype=wd), spec, "fp32") for wd in hybrid.WEIGHT_DTYPES}
    for rows in got.values():
        for r in rows:
            assert r["source"] == "predicted" and sum(r["shares"].values()) == pytest.approx(1.0)
            assert r["speedup_over"] == "conventional" and r["speedup"] >= 1.0
    ssm = {wd: got[wd][1]["shares"]["ssm"] for wd in got}
    assert ssm["bf16"] < ssm["fp8"] < ssm["nvfp4"], "less weight traffic, a larger SSM share"
    assert got["bf16"][1]["speedup"] > got["bf16"][0]["speedup"], "the state's share grows with the batch"
    assert got["fp8"][0]["weight_bytes_read"] < got["bf16"][0]["weight_bytes_read"]


def test_replay_saves_the_state_writes_in_the_prediction():
    inv = hybrid.inventory(P.load_preset(NANO))
    kw = dict(batch=64, context=4096, window=16, state_dtype="fp32", read_dtype=None)
    base, fast = hybrid.step_bytes(inv, variant="conventional", **kw), hybrid.step_bytes(inv, variant="replay", **kw)
    assert {k: base[k] for k in ("attn", "mlp", "other")} == {k: fast[k] for k in ("attn", "mlp", "other")}
    state = 96 * 80 * 128 * 4 * 64 * 21
    assert base["ssm"] - fast["ssm"] == pytest.approx(state * 15 / 16, rel=0.05), "15 of 16 state writes saved per window"


def test_dry_run_nvfp4_plan_json(no_cuda):
    res = invoke("--preset", "qwen3.5-122b-a10b", "--weight-dtype", "nvfp4", "--dry-run", "--gpu", "b300", "--json", "--batch", "1,512")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    entry = doc["presets"][0]
    assert entry["weight_dtype"] == "nvfp4" and doc["spec"]["weight_dtype"] == "nvfp4"
    assert [r["batch"] for r in entry["predicted"]] == [1, 512] and all(r["source"] == "predicted" for r in entry["predicted"])
    bf16 = json.loads(invoke("--preset", "qwen3.5-122b-a10b", "--dry-run", "--gpu", "b300", "--json").stdout)["presets"][0]
    assert entry["inventory"]["weights_bytes"]["full"] < 0.3 * bf16["inventory"]["weights_bytes"]["full"]
    assert any("NVFP4" in n for n in doc["notes"])


def test_dry_run_table_says_predicted(no_cuda):
    res = invoke("--preset", NANO, "--weight-dtype", "fp8", "--dry-run", "--gpu", "h200")
    assert res.exit_code == 0, res.output
    assert "predicted at fp8 weights" in res.stdout and "not measured" in res.stdout and "GiB all (fp8)" in res.stdout


def test_nvfp4_without_dry_run_is_one_line(no_cuda):
    res = invoke("--preset", NANO, "--weight-dtype", "nvfp4")
    assert res.exit_code == 2 and "--dry-run" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("capability, words", [((8, 0), "sm_89"), ((8, 6), "sm_86")])
def test_fp8_before_sm89_is_refused_in_one_line(fake_gpu, tmp_path, capability, words):
    fake_gpu(capability)
    out = tmp_path / "never.json"
    res = invoke("--preset", NANO, "--weight-dtype", "fp8", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert words in res.output and "--weight-dtype bf16" in res.output and len(res.output.strip().splitlines()) <= 2
    assert not out.exists(), "refused before any results file is opened"


def test_fp8_moe_needs_hopper(fake_gpu):
    fake_gpu((8, 9))
    res = invoke("--preset", "nemotron-3-nano-30b-a3b", "--weight-dtype", "fp8")
    assert res.exit_code == 2 and "_scaled_grouped_mm" in res.output


def test_fp8_kv_needs_flashinfer():
    with pytest.raises(UserError, match="FlashInfer"):
        e2e.check_runnable("bf16", "fp8", "torch-sdpa", (9, 0), has_moe=False)
    e2e.check_runnable("fp8", "fp8", "flashinfer", (9, 0), has_moe=True)


def test_attention_backend_prefers_flashinfer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    assert e2e.attention_backend(torch.device("cuda")) == "flashinfer"
    assert e2e.attention_backend(torch.device("cpu")) == "torch-sdpa"
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    assert e2e.attention_backend(torch.device("cuda")) == "torch-sdpa", "a package that does not import is not used"
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    assert e2e.attention_backend(torch.device("cuda")) == "flash-attn"


def test_grouped_fp8_product_shapes_pass_torchs_checks():
    """The MoE fp8 call as the step makes it, on the meta device: torch's own layout and scale checks."""
    touched, per, k, n = 6, 3, 64, 48
    rows = torch.empty(touched, per, k, dtype=torch.float8_e4m3fn, device="meta")
    weight = torch.empty(8, n, k, dtype=torch.float8_e4m3fn, device="meta")[:touched]
    scale = torch.empty(8, n, device="meta")[:touched]
    y = e2e.scaled_grouped_mm(rows, weight, torch.empty(touched, per, device="meta"), scale)
    assert y.shape == (touched, per, n) and y.dtype == torch.bfloat16


# e4m3 keeps 3 mantissa bits: an activation rounds by up to half a unit, 2^-4 of its size; the interpreter's cast, by up to half.
FP8_UNITS = 2.0**-1


def test_fp8_quantize_saturates_like_torch(interpreter):
    x = (torch.randn(5, 40) * 30).to(torch.bfloat16)
    x[0, 0], x[1, 1] = 1e4, -1e4
    out = torch.empty(5, 40, dtype=torch.float8_e4m3fn)
    e2e_ops.fp8_quantize(x, 0.5, out)
    want = (x.float() / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    ok = out.float() == want
    if interpreter.type == "cpu":
        # The interpreter's cast rounds ties away from zero and drops the carry when rounding reaches the next power of
        # two (the GPU's rounds to nearest even): one unit off, or half of a power of two.
        low = 2.0 ** torch.floor(torch.log2(want.abs()))
        ok |= ((out.float() - want).abs() <= low * 2.0**-3) | ((want.abs() == low) & (out.float() == want / 2))
    assert ok.all(), (x.float() / 0.5)[~ok]
    assert (out[0, 0].float(), out[1, 1].float()) == (448, -448), "saturated, not NaN"
    assert torch.equal(torch.sign(out.float()), torch.sign(want))


def dense16() -> P.Preset:
    """A small dense model whose products are 16-aligned except the SSM in_proj (z, x, B, C and dt: 84 wide)."""
    return P.Preset(
        name="dense16", display="Dense16", kind="mamba2", ssm_layers=2, attn_layers=1,
        shape=Mamba2Shape(H=4, P=8, N=8, G=1), state_dtype="fp32", has_D=True, has_z=False, a_log_range=(1.0, 16.0),
        e2e=dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48,
                 mlp_layers=3, vocab_size=64),
    )


def test_fp8_step_runs_and_stays_close_to_bf16(interpreter):
    inv8 = hybrid.inventory(dense16(), weight_dtype="fp8")
    w8 = e2e.Weights(inv8, sets=3, device=interpreter)
    mlp = w8.blocks[inv8.order.index("-")]
    assert mlp["up_proj"].dtype == torch.float8_e4m3fn and mlp["up_proj.scale"].shape == ()
    assert w8.blocks[0]["in_proj"].dtype == torch.bfloat16 and "in_proj.scale" not in w8.blocks[0], "84 wide: kept bf16"
    assert w8.head["lm_head"].dtype == torch.bfloat16
    step = e2e.Step(inv8, w8, variant="replay", batch=3, context=20, window=4, state_dtype="fp32", read_dtype=None,
                    device=interpreter, attention="torch-sdpa")
    try:
        step.run()
        assert torch.isfinite(step.bo.float()).all() and step.next_tokens.shape == (3,)
        x = torch.randn(3, 32).to(torch.bfloat16)
        got = step._mm(x, mlp, "up_proj").float()
        weight = mlp["up_proj"].float() * mlp["up_proj.scale"]
        # The product of the quantized activations and weights, each at its own scale, in bf16.
        x_q = step._quantized(x).float() * (hybrid.ACT_AMAX / e2e.FP8_MAX)
        assert torch.allclose(got, x_q @ weight.t(), rtol=2.0**-7, atol=2.0**-7 * (x_q @ weight.t()).abs().max())
        exact = x.float() @ weight.t()
        assert (got - exact).abs().max() <= FP8_UNITS * exact.abs().max(), "within the activations' fp8 rounding"
    finally:
        step.close()


def moe16() -> P.Preset:
    """A small MoE model (LatentMoE, shared expert) whose expert products are 16-aligned."""
    return P.Preset(
        name="moe16", display="Nemotron MoE16", kind="mamba2", ssm_layers=2, attn_layers=1,
        shape=Mamba2Shape(H=4, P=16, N=16, G=2), state_dtype="fp32", has_D=True, has_z=False, a_log_range=(1.0, 16.0),
        e2e=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=6, experts_per_token=2,
                 moe_intermediate_size=32, shared_expert_intermediate_size=48, moe_latent_size=32, moe_layers=3, vocab_size=64),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("make", [dense16, moe16], ids=["dense", "moe"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_run_fp8_weights_on_the_gpu(tmp_path, make, kv_dtype):
    from replayssm_cli.report.results import ResultsWriter, load

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("fp8 MoE experts need sm_90")
    attention = e2e.attention_backend(torch.device("cuda"))
    if kv_dtype == "fp8" and attention != "flashinfer":
        pytest.skip("an fp8 KV cache needs flashinfer")
    preset = make()
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(5,), contexts=(40,), window=4, windows=2, weight_dtype="fp8", kv_dtype=kv_dtype)
    writer = ResultsWriter(tmp_path / "g.json", {"gpu": {"name": torch.cuda.get_device_name()}}, spec.to_dict())
    result = e2e.run(spec, [preset], writer, device="cuda", progress=False)
    rows = load(tmp_path / "g.json").rows
    assert not result.skipped, result.skipped
    for row in rows:
        assert row["status"] == "ok" and row["x_weight_dtype"] == "fp8" and row["x_kv_dtype"] == kv_dtype
        assert row["x_weight_path"].startswith("torch._scaled_mm")
        assert row["x_attn_backend"] == attention and row["us"] > 0


def test_rows_say_which_weights_and_pair_only_like_with_like():
    from test_e2e import _measurement

    rows = []
    for wd, us in (("bf16", 1000.0), ("fp8", 700.0)):
        inv = hybrid.inventory(P.load_preset("nemotron-3-nano-30b-a3b"), weight_dtype=wd)
        spec = e2e.E2ESpec(presets=(inv.preset.name,), weight_dtype=wd)
        plan = hybrid.plan_weights(inv, None, None)
        for variant, scale in (("conventional", 1.0), ("replay", 0.9)):
            parts = {"ssm": [300.0 * scale], "attn": [100.0], "mlp": [500.0], "other": [100.0]}
            row = e2e.build_row(inv, spec, variant=variant, batch=8, context=4096, state_dtype="fp32", plan=plan,
                                meas=_measurement([us * scale] * 3, parts, [200.0 * scale]), check_err=0.0, status="ok", step_info={})
            e2e.attach_speedup(row, rows)
            rows.append(row)
    assert [r["x_weight_dtype"] for r in rows] == ["bf16", "bf16", "fp8", "fp8"]
    assert rows[2]["x_weight_path"] == "torch._scaled_mm, torch._scaled_grouped_mm" and rows[0]["x_weight_path"] == "torch.mm, torch.bmm"
    assert rows[1]["speedup"] == pytest.approx(1 / 0.9) and rows[3]["speedup"] == pytest.approx(1 / 0.9), "each over its own weights"
    assert rows[2]["x_weights_gib"] < 0.6 * rows[0]["x_weights_gib"]


def test_fp8_kv_without_flashinfer_is_one_line(fake_gpu):
    fake_gpu((9, 0))
    res = invoke("--preset", NANO, "--kv-dtype", "fp8")
    assert res.exit_code == 2 and "FlashInfer" in res.output and "--kv-dtype bf16" in res.output
