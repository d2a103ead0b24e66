"""`replayssm e2e`: the layer inventory against the presets, the step builder, its fused ops, the share accounting, the CLI."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace

import pytest
import torch
import typer
from typer.testing import CliRunner

from replayssm_cli.measure import e2e
from replayssm_cli.model import hybrid
from replayssm_kernels import e2e_ops
from replayssm_cli.measure import timing
from replayssm_cli.model import presets as P
from replayssm_cli.commands import e2e as command
from replayssm_cli.errors import UserError
from replayssm_cli.report.results import ResultsWriter, load, validate_row
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

SUPER, QWEN = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"
GIB = 2**30

app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """Stand-in root so that `e2e` is a subcommand, as main.py wires it."""


app.command("e2e")(command.e2e)


def invoke(*args: str):
    return CliRunner().invoke(app, ["e2e", *args])


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def interpreter():
    """The device the kernels run on, made torch's default so that the tests' tensors are created there."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("kernels run on CUDA or under TRITON_INTERPRET=1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    before = torch.get_default_device()
    torch.set_default_device(device)
    yield device
    torch.set_default_device(before)


def tiny(kind: str) -> P.Preset:
    """Small presets of each block family, with sizes that are not powers of two."""
    if kind == "nemotron":
        return P.Preset(
            name="tiny-nemotron", display="Tiny Nemotron", kind="mamba2", ssm_layers=3, attn_layers=1,
            shape=Mamba2Shape(H=4, P=6, N=8, G=2), state_dtype="fp32", has_D=True, has_z=False, a_log_range=(1.0, 16.0),
            e2e=dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=12, num_experts=6,
                     experts_per_token=2, moe_intermediate_size=10, shared_expert_intermediate_size=14,
                     moe_latent_size=24, moe_layers=3, vocab_size=50),
        )
    if kind == "qwen":
        return P.Preset(
            name="tiny-qwen", display="Tiny Qwen", kind="gdn", ssm_layers=3, attn_layers=1,
            shape=GDNShape(H=2, HV=4, K=12, V=10), state_dtype="fp32", has_D=False, has_z=False, a_log_range=(1.0, 16.0),
            e2e=dict(hidden_size=36, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=5,
                     experts_per_token=2, moe_intermediate_size=10, shared_expert_intermediate_size=14,
                     moe_layers=4, vocab_size=50),
        )
    return P.Preset(
        name="tiny-dense", display="Tiny Dense", kind="mamba2", ssm_layers=2, attn_layers=1,
        shape=Mamba2Shape(H=3, P=8, N=6, G=1), state_dtype="fp32", has_D=True, has_z=True, a_log_range=(1.0, 16.0),
        e2e=dict(hidden_size=28, num_attention_heads=2, num_key_value_heads=1, head_dim=12, intermediate_size=20,
                 mlp_layers=3, vocab_size=30),
    )


def test_inventory_matches_nemotron_super():
    inv = hybrid.inventory(P.load_preset(SUPER))
    assert inv.order_source == "preset file" and inv.family.name == "nemotron-h"
    assert {k: inv.count(k) for k in ("ssm", "attn", "mlp", "moe")} == {"ssm": 40, "attn": 8, "mlp": 0, "moe": 40}
    assert len(inv.order) == 88 and inv.order.startswith("MEMEMEM*E")
    ssm, attn, moe = inv.blocks["ssm"], inv.blocks["attn"], inv.blocks["moe"]
    # z, x, B, C, dt: 2 * 128 * 64 + 2 * 8 * 128 + 128.
    assert (ssm.linear("in_proj").k, ssm.linear("in_proj").n) == (4096, 18560)
    assert (ssm.linear("out_proj").k, ssm.linear("out_proj").n) == (8192, 4096)
    assert ssm.sizes["conv_dim"] == 8192 + 2048 and ssm.sizes["norm_group"] == 1024
    assert (attn.linear("qkv_proj").n, attn.sizes["kv_heads"], attn.sizes["rotary"]) == ((32 + 2 * 2) * 128, 2, 0)
    up = moe.linear("experts_up")
    assert (up.experts, up.k, up.n) == (512, 1024, 2688), "LatentMoE experts run in the 1024 latent, squared ReLU (no gate)"
    assert (moe.linear("latent_in").n, moe.linear("shared_up").n, moe.sizes["topk"]) == (1024, 5376, 22)
    assert inv.full_bytes() / 2 / 1e9 == pytest.approx(120.7, rel=0.01), "Nemotron-3-Super has about 120.7B parameters"


def test_inventory_matches_qwen35():
    inv = hybrid.inventory(P.load_preset(QWEN))
    assert inv.family.name == "qwen3-next"
    assert {k: inv.count(k) for k in ("ssm", "attn", "mlp", "moe")} == {"ssm": 36, "attn": 12, "mlp": 0, "moe": 48}
    assert inv.order == "MEMEME*E" * 12, "three Gated DeltaNet layers to one attention layer, each with its MoE"
    ssm, attn, moe = inv.blocks["ssm"], inv.blocks["attn"], inv.blocks["moe"]
    # q, k (16 x 128 each), v, z (64 x 128 each), b, a (64 each).
    assert ssm.linear("in_proj").n == 2 * 2048 + 2 * 8192 + 128 and ssm.sizes["conv_dim"] == 2 * 2048 + 8192
    assert attn.linear("qkv_proj").n == (2 * 32 + 2 * 2) * 256, "gated attention: the query projection is twice as wide"
    assert attn.sizes["rotary"] == 64
    up = moe.linear("experts_up")
    assert (up.experts, up.k, up.n) == (256, 3072, 2048) and moe.has("shared_gate")
    assert inv.head.linear("lm_head").n == 248320
    assert inv.full_bytes() / 2 / 1e9 == pytest.approx(122, rel=0.02)


def test_inventory_divides_for_tp():
    inv = hybrid.inventory(P.load_preset(SUPER, tp=4))
    attn = inv.blocks["attn"].sizes
    assert (attn["heads"], attn["kv_heads"]) == (8, 1), "2 KV heads over 4 GPUs: one per GPU, replicated"
    assert inv.blocks["moe"].linear("experts_up").n == 2688 // 4
    assert inv.blocks["ssm"].linear("in_proj").n == 18560 // 4
    assert inv.dims["vocab"] == 131072 // 4


@pytest.mark.parametrize("name, missing", [
    ("falcon-h1-34b", ["e2e.vocab_size", "e2e.intermediate_size"]),
    ("granite-4.0-h-small", ["e2e.num_key_value_heads", "e2e.head_dim"]),
])
def test_inventory_names_missing_fields(name, missing):
    with pytest.raises(UserError) as info:
        hybrid.inventory(P.load_preset(name))
    line = info.value.line()
    assert "\n" not in line and all(m in line for m in missing)


def test_layer_order_spreads_blocks_without_a_pattern():
    p = replace(tiny("dense"), e2e={**tiny("dense").e2e, "mlp_layers": 3})
    order, source = hybrid.layer_order(p)
    assert source == "spread evenly" and P.pattern_counts(order) == {"ssm": 2, "attn": 1, "mlp": 3, "moe": 0}
    assert order == "M-M-*-"


def test_experts_touched():
    assert hybrid.experts_touched(512, 22, 1) == 22
    assert hybrid.experts_touched(512, 22, 64) == round(512 * (1 - (1 - 22 / 512) ** 64))
    assert hybrid.experts_touched(512, 22, 256) == 512
    assert hybrid.experts_touched(6, 2, 1000) == 6


def test_plan_weights_shares_a_pool_and_guards_l2():
    inv = hybrid.inventory(P.load_preset(SUPER))
    unique, one = inv.unique_bytes(), inv.ffn_set_bytes()
    full = hybrid.plan_weights(inv, None, 60 * 2**20)
    assert not full.shared and full.total == inv.full_bytes()
    plan = hybrid.plan_weights(inv, unique + 5 * one + one // 2, 60 * 2**20)
    assert plan.shared and plan.sets == 5 and plan.total == unique + 5 * one
    assert "5 weight sets" in plan.describe() and "L2" in plan.describe()
    with pytest.raises(UserError, match="weight budget"):
        hybrid.plan_weights(inv, unique, 60 * 2**20)
    with pytest.raises(UserError, match="served from the"):
        hybrid.plan_weights(inv, unique + one, 10 * GIB)


def test_seq_bytes_counts_kv_and_state():
    inv = hybrid.inventory(P.load_preset(QWEN))
    conv = hybrid.seq_bytes(inv, variant="conventional", context=4096, window=16, state_dtype="fp32", read_dtype=None)
    replay = hybrid.seq_bytes(inv, variant="replay", context=8192, window=16, state_dtype="fp32", read_dtype=None)
    assert conv["kv"] == 12 * 2 * 2 * 4096 * 256 * 2 and replay["kv"] == 2 * conv["kv"]
    assert conv["ssm"] > 36 * 64 * 128 * 128 * 4 and replay["ssm"] > conv["ssm"]
    assert conv["total"] == sum(v for k, v in conv.items() if k != "total")
    assert hybrid.max_batch(conv["total"], None) is None
    assert hybrid.max_batch(conv["total"], 100 * GIB) == int((90 * GIB - hybrid.RESERVE_BYTES) // conv["total"])


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("add", [True, False], ids=["add", "noadd"])
def test_add_rms_norm_matches_torch(interpreter, assert_close, add):
    h, r, w = torch.randn(3, 37), torch.randn(3, 37), torch.randn(37)
    want_h = h + r if add else h.clone()
    want = want_h * torch.rsqrt(want_h.pow(2).mean(-1, keepdim=True) + e2e_ops.EPS) * w
    y = _nan(3, 37)
    e2e_ops.add_rms_norm(h, r if add else None, w, y)
    assert_close(y, want, what="y")
    assert_close(h, want_h, what="h")


def test_conv_update_matches_torch(interpreter, assert_close):
    B, C = 3, 45
    proj = torch.randn(B, 70)
    x = proj[:, 11:11 + C]
    state, w, b = torch.randn(B, 3, C), torch.randn(C, 4), torch.randn(C)
    full = torch.cat([state, x[:, None, :]], 1)
    want = torch.nn.functional.silu((full * w.t()[None]).sum(1) + b)
    y = _nan(B, C)
    e2e_ops.conv_update(x, state, w, b, y)
    assert_close(y, want, what="y")
    assert_close(state, full[:, 1:], what="state")


def test_gated_rms_norm_matches_torch(interpreter, assert_close):
    B, D, group = 2, 30, 10
    proj = torch.randn(B, 2 * D + 3)
    x, z, w = torch.randn(B, D), proj[:, D:2 * D], torch.randn(D)
    g = (x * torch.nn.functional.silu(z)).view(B, D // group, group)
    want = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + e2e_ops.EPS)).view(B, D) * w
    y = _nan(B, D)
    e2e_ops.gated_rms_norm(x, z, w, y, group)
    assert_close(y, want, what="y")


def _rope(x, rot, cos, sin):
    half = rot // 2
    a, b, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], -1)


@pytest.mark.parametrize("gate, norm, rot, layout", [(True, True, 6, "bhtd"), (False, False, 0, "bthd"), (False, True, 12, "bhtd")],
                         ids=["gate-norm-rope6-bhtd", "plain-bthd", "norm-rope12-bhtd"])
def test_qk_prepare_matches_torch(interpreter, assert_close, gate, norm, rot, layout):
    B, NH, NKV, HD, T, pos = 2, 6, 2, 12, 5, 3
    qw = NH * (2 if gate else 1)
    qkv = torch.randn(B, (qw + 2 * NKV) * HD + 4)[:, 4:]
    w_qk = torch.randn(2, HD)
    angles = torch.rand(max(rot // 2, 1))
    cos, sin = torch.cos(angles), torch.sin(angles)
    cache_shape = (B, NKV, T, HD) if layout == "bhtd" else (B, T, NKV, HD)
    q, kc, vc = _nan(B, NH, HD), _nan(*cache_shape), _nan(*cache_shape)
    e2e_ops.qk_prepare(qkv, q, kc, vc, w_qk, cos, sin, pos=pos, heads=NH, kv_heads=NKV, q_width=qw, rotary=rot, qk_norm=norm, kv_layout=layout)

    def prep(x, weight):
        if norm:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e2e_ops.EPS) * weight
        return _rope(x, rot, cos, sin) if rot else x

    want_q = prep(qkv[:, :NH * HD].view(B, NH, HD), w_qk[0])
    want_k = prep(qkv[:, qw * HD:(qw + NKV) * HD].view(B, NKV, HD), w_qk[1])
    want_v = qkv[:, (qw + NKV) * HD:].view(B, NKV, HD)
    at = (lambda c: c[:, :, pos]) if layout == "bhtd" else (lambda c: c[:, pos])
    assert_close(q, want_q, what="q")
    assert_close(at(kc), want_k, what="k")
    assert_close(at(vc), want_v, what="v")
    written = torch.zeros(cache_shape, dtype=torch.bool)
    at(written).fill_(True)
    assert torch.isnan(kc[~written]).all() and torch.isnan(vc[~written]).all(), "only position pos is written"


def counting_timer(step, select, replays, warmup):
    """A stand-in for the CUDA-graph timer: one 'µs' per selected op, so the parts must partition the step."""
    return [float(sum(1 for op in step.ops if select(op)))] * replays


def wall_timer(step, select, replays, warmup):
    """Eager wall-clock timing on the CPU, the measured path without a GPU: one run of the selected ops (each runs
    its Triton kernels through the interpreter), its time given for every replay."""
    t = time.perf_counter()
    step.run(select)
    return [(time.perf_counter() - t) * 1e6] * replays


@pytest.mark.parametrize("kind", ["nemotron", "qwen", "dense"])
def test_step_builds_the_inventory(interpreter, kind):
    preset = tiny(kind)
    inv = hybrid.inventory(preset)
    plan = hybrid.plan_weights(inv, None, None)
    weights = e2e.Weights(inv, plan.sets, interpreter, seed=3)
    assert weights.nbytes == plan.total == inv.full_bytes()
    for letter, block in zip(inv.order, weights.blocks):
        spec = inv.blocks[hybrid.BLOCK_KIND[letter]]
        for lin in spec.linears:
            want = (lin.n, lin.k) if lin.experts == 1 else (lin.experts, lin.n, lin.k)
            assert tuple(block[lin.name].shape) == want, (letter, lin.name)
    step = e2e.Step(inv, weights, variant="replay", batch=3, context=7, window=2, state_dtype="fp32", read_dtype=None,
                    device=interpreter)
    try:
        assert step.stack.layers == preset.ssm_layers
        names = [op.name for op in step.ops]
        assert sum(n.endswith(".kernel") for n in names) == inv.count("ssm")
        assert sum(n.endswith(".attention") for n in names) == inv.count("attn")
        assert sum(n.endswith(".mlp") for n in names) == inv.count("mlp")
        assert sum(n.endswith(".moe") for n in names) == inv.count("moe")
        assert sum(n.endswith(".norm") for n in names) == len(inv.order)
        assert {op.category for op in step.ops} <= set(hybrid.CATEGORIES)
        conv_dim = inv.blocks["ssm"].sizes["conv_dim"]
        assert [tuple(t.shape) for t in step.conv_states] == [(3, 3, conv_dim)] * inv.count("ssm")
        kv = inv.blocks["attn"].sizes
        assert [tuple(k.shape) for k, _ in step.kv] == [(3, kv["kv_heads"], 7, kv["head_dim"])] * inv.count("attn")
        assert step.check() <= step.tolerance()
        step.h.fill_(float("nan"))
        step.run()
        assert torch.isfinite(step.h.float()).all() and torch.isfinite(step.xn.float()).all()
        assert ((0 <= step.next_tokens) & (step.next_tokens < inv.dims["vocab"])).all()
        meas = e2e.measure(step, replays=2, timer=counting_timer)
        cat = meas.category_us()
        assert sum(cat.values()) == meas.step[0] == len(step.ops), "the categories partition the step's ops"
        assert meas.kernel[0] == inv.count("ssm")
    finally:
        step.close()


def test_weight_pool_is_shared_round_robin(interpreter):
    inv = hybrid.inventory(tiny("nemotron"))
    plan = hybrid.plan_weights(inv, inv.unique_bytes() + 2 * inv.ffn_set_bytes(), None)
    assert plan.shared and plan.sets == 2
    weights = e2e.Weights(inv, plan.sets, interpreter)
    experts = [b["experts_up"].data_ptr() for letter, b in zip(inv.order, weights.blocks) if letter == "E"]
    assert len(experts) == 3 and experts[0] == experts[2] != experts[1]


def test_routing_is_balanced(interpreter):
    inv = hybrid.inventory(tiny("qwen"))
    weights = e2e.Weights(inv, inv.ffn_blocks, interpreter)
    step = e2e.Step(inv, weights, variant="conventional", batch=3, context=4, window=None, state_dtype="fp32",
                    read_dtype=None, device=interpreter)
    try:
        touched, per, index, weight = step.routing()
        assert touched == hybrid.experts_touched(5, 2, 3) and touched * per >= 3 * 2
        real = weight.view(-1) > 0
        assert sorted(index[real].tolist()) == [0, 0, 1, 1, 2, 2], "every token goes to k experts"
        for t in range(3):
            experts = (torch.arange(touched * per) // per)[real & (index == t)]
            assert len(set(experts.tolist())) == 2, "a token's picks are distinct experts"
        assert weight[real].float().sum().item() == pytest.approx(3.0)
    finally:
        step.close()


def _measurement(step_us, parts, kernel):
    return e2e.Measurement(step=list(step_us), parts={c: list(v) for c, v in parts.items()}, kernel=list(kernel))


def test_share_accounting_adds_up():
    inv = hybrid.inventory(P.load_preset(SUPER))
    spec = e2e.E2ESpec(presets=(SUPER,))
    plan = hybrid.plan_weights(inv, None, None)
    parts = {"ssm": [3000.0, 3100.0], "attn": [500.0, 520.0], "mlp": [5000.0, 5100.0], "other": [400.0, 410.0]}
    conv = e2e.build_row(inv, spec, variant="conventional", batch=64, context=4096, state_dtype="fp32", plan=plan,
                         meas=_measurement([9000.0, 9200.0, 9100.0], parts, [2000.0, 2100.0]), check_err=1e-4, status="ok", step_info={})
    parts["ssm"] = [2000.0, 2050.0]
    rep = e2e.build_row(inv, spec, variant="replay", batch=64, context=4096, state_dtype="fp32", plan=plan,
                        meas=_measurement([8000.0, 8100.0, 8050.0], parts, [1000.0, 1100.0]), check_err=1e-4, status="ok", step_info={})
    for row in (conv, rep):
        validate_row(row)
        assert sum(row[f"x_share_{c}"] for c in hybrid.CATEGORIES) == pytest.approx(1.0, abs=1e-12)
        assert row["kind"] == "e2e" and row["phase"] == "avg" and row["x_context"] == 4096
        assert row["us_per_token"] == row["us"] and row["x_tokens_per_s"] == pytest.approx(64 * 1e6 / row["us"])
        assert 0 < row["x_share_ssm_kernel"] < row["x_share_ssm"]
    assert conv["us"] == pytest.approx(9100.0) and conv["x_share_ssm"] == pytest.approx(3050 / (3050 + 510 + 5050 + 405))
    e2e.attach_speedup(conv, [])
    e2e.attach_speedup(rep, [conv])
    assert "speedup" not in conv and rep["speedup"] == pytest.approx(9100.0 / 8050.0)
    assert rep["speedup_lo"] <= rep["speedup"] <= rep["speedup_hi"]
    assert rep["x_kernel_speedup"] == pytest.approx(2050.0 / 1050.0)
    other_ctx = dict(rep, x_context=8192)
    other_ctx.pop("speedup")
    e2e.attach_speedup(other_ctx, [conv])
    assert "speedup" not in other_ctx, "speedups compare the same context only"
    with pytest.raises(ValueError):
        e2e.shares({c: 0.0 for c in hybrid.CATEGORIES})


def test_run_writes_rows_and_skips_what_does_not_fit(interpreter, tmp_path):
    preset = tiny("nemotron")
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(2, 10**6), contexts=(6,), window=2, windows=1)
    writer = ResultsWriter(tmp_path / "e.json", {"gpu": {"name": "cpu"}}, spec.to_dict())
    result = e2e.run(spec, [preset], writer, device=interpreter, progress=False, timer=wall_timer, free_fn=lambda: 8 * GIB,
                     attention="torch-sdpa")
    got = load(tmp_path / "e.json")
    assert got.complete and not result.failed and not result.interrupted
    assert [(r["variant"], r["batch"]) for r in got.rows] == [("conventional", 2), ("replay", 2)]
    conv, rep = got.rows
    for row in got.rows:
        assert row["status"] == "ok" and row["us"] > 0 and row["x_max_batch"] > 2
        assert sum(row[f"x_share_{c}"] for c in hybrid.CATEGORIES) == pytest.approx(1.0)
        assert row["x_experts_touched"] == hybrid.experts_touched(6, 2, 2) and row["x_attn_backend"] == "torch-sdpa"
        assert row["x_prefill"] == "not timed"
    assert rep["speedup"] == pytest.approx(conv["us"] / rep["us"]) and "speedup" not in conv
    assert len(got.skipped) == 2 and all("largest batch that fits" in s["why"] for s in got.skipped)
    assert got.spec["max_batch"][f"{preset.name} replay ctx6"] == rep["x_max_batch"]


def test_run_does_not_time_a_failed_check(monkeypatch, tmp_path):
    class FailingStep:
        def __init__(self, inv, weights, **kwargs):
            self.attention, self.touched, self.per_expert, self.ops = "torch-sdpa", 2, 1, []

        def tolerance(self):
            return 2e-3

        def check(self):
            return 0.4

        def close(self):
            pass

    monkeypatch.setattr(e2e, "Step", FailingStep)
    timed = []
    preset = tiny("nemotron")
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(2,), contexts=(6,), window=2, windows=1)
    writer = ResultsWriter(tmp_path / "f.json", {"gpu": {"name": "cpu"}}, spec.to_dict())
    result = e2e.run(spec, [preset], writer, device="cpu", progress=False, timer=lambda *a: timed.append(a) or [1.0])
    rows = load(tmp_path / "f.json").rows
    assert not timed and [r["status"] for r in rows] == ["failed", "failed"] and len(result.failed) == 2
    assert all("us" not in r and "speedup" not in r and r["check_max_err"] == 0.4 for r in rows)


def test_e2e_help_has_examples():
    res = invoke("--help")
    assert res.exit_code == 0 and "Examples" in res.stdout and "replayssm e2e" in res.stdout


def test_e2e_without_cuda_is_one_line(no_cuda):
    res = invoke("--preset", SUPER)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "--dry-run" in lines[0]


def test_e2e_missing_fields_is_one_line(no_cuda, tmp_path):
    bare = tmp_path / "bare.toml"
    bare.write_text(
        'name = "bare"\nkind = "mamba2"\nssm_layers = 4\nattn_layers = 1\nstate_dtype = "fp32"\n'
        "[ssm]\nheads = 8\nhead_dim = 16\nstate_dim = 16\ngroups = 1\n"
        '[sources]\nssm = "t"\nlayers = "t"\nstate_dtype = "t"\na_log_range = "t"\n'
    )
    for target, fields in ((str(bare), ("e2e.hidden_size", "e2e.vocab_size", "e2e.head_dim")), ("falcon-h1-34b", ("e2e.vocab_size",))):
        res = invoke("--preset", target, "--dry-run")
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and all(f in lines[0] for f in fields), res.stderr


def test_e2e_dry_run_json(no_cuda):
    res = invoke("--dry-run", "--gpu", "h200", "--batch", "1,256", "--context", "4096,131072", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["gpu"]["key"] == "h200" and [e["inventory"]["preset"] for e in doc["presets"]] == [SUPER, QWEN]
    for entry in doc["presets"]:
        assert entry["weights"]["shared"] and entry["weights"]["sets"] >= 1
        by = {(m["context"], m["variant"]): m for m in entry["memory"]}
        assert by[4096, "conventional"]["fits"] == {"1": True, "256": True}
        assert not by[131072, "replay"]["fits"]["256"], "a 128k KV cache at batch 256 does not fit beside the weights"
        assert by[4096, "replay"]["max_batch"] >= 256
    assert any("prefill is not timed" in n for n in doc["notes"])


def test_e2e_dry_run_table(no_cuda):
    res = invoke("--dry-run", "--preset", QWEN)
    assert res.exit_code == 0, res.output
    assert "Qwen3.5-122B-A10B" in res.stdout and "experts_up" in res.stdout and "max batch" in res.stdout


@pytest.mark.parametrize("args, words", [
    (("--batch", "0"), "--batch 0"),
    (("--variant", "spec"), "--variant 'spec'"),
    (("--window", "0"), "--window 0"),
    (("--context", "4k"), "--context '4k'"),
    (("--max-weights-gib", "-1"), "--max-weights-gib"),
], ids=["batch0", "variant", "window0", "context-word", "weights-negative"])
def test_e2e_bad_options_exit_with_one_line(no_cuda, args, words):
    res = invoke("--dry-run", *args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.output


def test_notes_say_prefill_is_not_timed():
    lines = e2e.notes(e2e.E2ESpec(presets=(SUPER,), tp=2))
    assert lines[0].startswith("prefill is not timed") and any("all-reduces" in n for n in lines)
    assert not math.isnan(timing.percentile([1.0, 2.0, 3.0], 50))


@pytest.fixture
def measured(monkeypatch):
    """The command's measured path on a machine without CUDA: a stand-in environment and a run that writes made-up rows."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(e2e, "environment", lambda: {"gpu": {"name": "NVIDIA H200", "key": "h200", "l2_bytes": 60 * 2**20}})

    def fake_run(spec, presets, writer, **kwargs):
        result = e2e.E2ERun(results=writer.results, path=writer.results.path)
        for preset in presets:
            inv = hybrid.inventory(preset)
            plan = hybrid.plan_weights(inv, 40 * GIB, 60 * 2**20)
            result.plans[preset.name] = plan.describe()
            for batch in spec.batches:
                for variant in spec.variants:
                    scale = 0.8 if variant == "replay" else 1.0
                    parts = {"ssm": [3000.0 * scale], "attn": [400.0], "mlp": [5000.0], "other": [300.0]}
                    meas = _measurement([(8700.0 + batch) * scale] * 3, parts, [2000.0 * scale])
                    row = e2e.build_row(inv, spec, variant=variant, batch=batch, context=spec.contexts[0], state_dtype="fp32",
                                        plan=plan, meas=meas, check_err=1e-4, status="ok", step_info={"x_max_batch": 400})
                    e2e.attach_speedup(row, writer.rows)
                    writer.add(row)
            result.max_batch[f"{preset.name} replay ctx{spec.contexts[0]}"] = 400
        writer.skip(f"{presets[0].name} replay B4096 ctx4096", "needs 900.0 GiB ...; largest batch that fits: 400")
        result.skipped = list(writer.results.skipped)
        result.results = writer.close(complete=True)
        return result

    monkeypatch.setattr(e2e, "run", fake_run)


def test_e2e_measured_table_and_json(measured, tmp_path):
    out = tmp_path / "m.json"
    res = invoke("--batch", "1,64", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "ITL ms" in res.stdout and "prefill is not timed" in res.stdout and "1.25x" in res.stdout
    assert "largest batch that fits" in res.stderr and "skipped" in res.stderr and "round-robin" in res.stderr
    got = load(out)
    assert got.spec["kind"] == "e2e" and len(got.rows) == 2 * 2 * 2
    res = invoke("--preset", SUPER, "--batch", "256", "--out", str(out), "--json")
    doc = json.loads(res.stdout)
    assert [r["variant"] for r in doc["rows"]] == ["conventional", "replay"] and doc["skipped"] and doc["weights"][SUPER]
    assert doc["rows"][1]["speedup"] == pytest.approx(1.25)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["nemotron", "qwen"])
def test_run_times_cuda_graphs(tmp_path, kind):
    preset = tiny(kind)
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(4,), contexts=(64,), window=4, windows=2)
    writer = ResultsWriter(tmp_path / "g.json", {"gpu": {"name": torch.cuda.get_device_name()}}, spec.to_dict())
    result = e2e.run(spec, [preset], writer, device="cuda", progress=False)
    rows = load(tmp_path / "g.json").rows
    assert not result.skipped and [r["variant"] for r in rows] == ["conventional", "replay"], result.skipped
    for row in rows:
        assert row["status"] == "ok" and row["x_replays"] == 8 and row["us"] > 0
        assert sum(row[f"x_share_{c}"] for c in hybrid.CATEGORIES) == pytest.approx(1.0)
        assert 0.5 < row["x_category_sum_ratio"] < 2.0, "the categories' graphs add up to about the whole step"
    assert rows[1]["speedup"] > 0
