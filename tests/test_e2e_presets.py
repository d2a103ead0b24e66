"""The presets of the models the engines' ReplaySSM end-to-end results were measured on: each loads, and its shapes are its config's."""

from __future__ import annotations

import pytest

from replayssm_cli.model import hybrid
from replayssm_cli.model import presets as P
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

# Figures as each model's config.json gives them (the preset files name the copies they were read from).
CONFIGS = {
    "nemotron-3-nano-4b": dict(
        shape=Mamba2Shape(H=96, P=80, N=128, G=8), layers=(21, 4), counts={"ssm": 21, "attn": 4, "mlp": 17, "moe": 0},
        hidden=3136, heads=40, kv=8, head_dim=128, inter=12544, vocab=131072, family="nemotron-h",
    ),
    "qwen3.5-4b": dict(
        shape=GDNShape(H=16, HV=32, K=128, V=128), layers=(24, 8), counts={"ssm": 24, "attn": 8, "mlp": 32, "moe": 0},
        hidden=2560, heads=16, kv=4, head_dim=256, inter=9216, vocab=248320, family="qwen3-next",
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_small_preset_loads_with_its_config_shapes(name):
    want = CONFIGS[name]
    p = P.load_preset(name)
    assert p.shape == want["shape"] and (p.ssm_layers, p.attn_layers) == want["layers"]
    assert p.state_dtype == "fp32", "the engines' end-to-end results on these models use fp32 state"
    assert p.e2e["hidden_size"] == want["hidden"] and p.e2e["vocab_size"] == want["vocab"]
    assert (p.e2e["num_attention_heads"], p.e2e["num_key_value_heads"], p.e2e["head_dim"]) == (want["heads"], want["kv"], want["head_dim"])
    assert p.e2e["intermediate_size"] == want["inter"]
    assert "state_dtype" in p.estimated and all(p.estimated_reasons[k] for k in p.estimated)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_small_preset_inventory_has_every_block(name):
    want = CONFIGS[name]
    inv = hybrid.inventory(P.load_preset(name))
    assert inv.family.name == want["family"]
    assert {k: inv.count(k) for k in ("ssm", "attn", "mlp", "moe")} == want["counts"]
    mlp = inv.blocks["mlp"].linear("up_proj")
    assert (mlp.k, mlp.n) == (want["hidden"], inv.family.up_factor * want["inter"])


def test_nemotron_nano_4b_follows_its_hybrid_pattern():
    inv = hybrid.inventory(P.load_preset("nemotron-3-nano-4b"))
    assert inv.order_source == "preset file" and inv.order == "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
    ssm = inv.blocks["ssm"]
    # z and x (96 x 80 each), B and C (8 x 128 each), dt (96).
    assert ssm.linear("in_proj").n == 2 * 7680 + 2 * 1024 + 96 and ssm.sizes["norm_group"] == 7680 // 8
    # Embedding and LM head (untied), 21 Mamba-2, 4 attention and 17 squared-ReLU MLP blocks: about 3.97B parameters.
    assert inv.full_bytes() / hybrid.WEIGHT_ITEMSIZE / 1e9 == pytest.approx(3.97, rel=0.01)


def test_qwen35_4b_puts_an_mlp_after_every_mixer():
    inv = hybrid.inventory(P.load_preset("qwen3.5-4b"))
    assert inv.order == "M-M-M-*-" * 8
    assert inv.blocks["attn"].linear("qkv_proj").n == (2 * 16 + 2 * 4) * 256, "gated attention: the query projection is twice as wide"
    assert inv.blocks["ssm"].sizes["conv_dim"] == 2 * 16 * 128 + 32 * 128


@pytest.mark.parametrize("name, tp", [("nemotron-3-nano-4b", 2), ("qwen3.5-4b", 4)])
def test_small_presets_divide_for_tp(name, tp):
    inv = hybrid.inventory(P.load_preset(name, tp=tp))
    want = CONFIGS[name]
    assert inv.dims["intermediate"] == want["inter"] // tp and inv.dims["heads"] == want["heads"] // tp
