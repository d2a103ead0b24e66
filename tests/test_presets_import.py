"""Model configs as users have them: a model directory, Hugging Face's wrappers and "auto" values, every block derived."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from replayssm_cli.model import hybrid
from replayssm_cli.model import presets as P
from replayssm_cli.errors import UserError
from replayssm_cli.model.shapes import Mamba2Shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"

# Nemotron-H-8B's config.json: the figures the shipped preset cites (Megatron-LM's Nemotron-H-8B-Base-8K.sh, vLLM's
# nemotron_h defaults), in Hugging Face's field names, with the model dtype and no mamba_ssm_cache_dtype, as the file has.
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
    "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 52, "vocab_size": 131072,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
}
# A Falcon-H1 config with mamba_d_head "auto" (sizes illustrative, shaped like the 34B's table row: 72 layers,
# 5120 wide, 20/4 attention heads, 32 Mamba heads of 128).
FALCON_H1 = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "torch_dtype": "bfloat16",
    "hidden_size": 5120, "intermediate_size": 21504, "num_hidden_layers": 72, "vocab_size": 261120,
    "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 128,
    "mamba_n_heads": 32, "mamba_d_head": "auto", "mamba_d_ssm": 4096, "mamba_d_state": 256, "mamba_n_groups": 1,
}
# Granite 4.0-H: layer_types, MoE with a shared expert, and no head_dim (it is hidden_size / num_attention_heads).
GRANITE = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "torch_dtype": "bfloat16",
    "hidden_size": 4096, "num_hidden_layers": 40, "vocab_size": 100352,
    "layer_types": (["mamba"] * 9 + ["attention"]) * 4,
    "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 72, "num_experts_per_tok": 10, "intermediate_size": 768, "shared_intermediate_size": 1536,
    "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
}


def write(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_preset_file_takes_a_model_directory(tmp_path):
    folder = write(tmp_path / "Nemotron-H-8B-Base-8K", NEMOTRON_H_8B)
    p = P.load_preset_file(folder)
    assert p.name == "nemotron-h-8b-base-8k" and p.shape == Mamba2Shape(H=128, P=64, N=128, G=8)
    assert P.resolve(str(folder)).shape == p.shape


def test_directory_without_config_is_one_line(tmp_path):
    with pytest.raises(UserError, match="without a config.json") as info:
        P.load_preset_file(tmp_path)
    assert "\n" not in info.value.line()


def test_import_agrees_with_the_shipped_preset_of_the_same_model(tmp_path):
    imported = P.load_preset_file(write(tmp_path / "nemotron-h-8b", NEMOTRON_H_8B))
    shipped = P.load_preset("nemotron-h-8b")
    assert imported.shape == shipped.shape
    assert (imported.ssm_layers, imported.attn_layers) == (shipped.ssm_layers, shipped.attn_layers)
    assert imported.state_dtype == shipped.state_dtype == "fp32"
    assert "Nemotron-H family" in imported.estimated_reasons["state_dtype"]
    assert imported.e2e == shipped.e2e
    assert hybrid.inventory(imported).full_bytes() == hybrid.inventory(shipped).full_bytes()


@pytest.mark.parametrize("wrapper", ["text_config", "llm_config"])
def test_wrapped_language_model_config(tmp_path, wrapper):
    outer = {"architectures": ["SomeVLModel"], "model_type": "some_vl", wrapper: NEMOTRON_H_8B, "vision_config": {"hidden_size": 1152}}
    p = P.load_preset_file(write(tmp_path / "vl", outer))
    assert p.shape == Mamba2Shape(H=128, P=64, N=128, G=8) and p.e2e["hidden_size"] == 4096


def test_falcon_h1_auto_head_and_mlp_blocks(tmp_path):
    p = P.load_preset_file(write(tmp_path / "falcon", FALCON_H1))
    assert p.shape == Mamba2Shape(H=32, P=128, N=256, G=1), "mamba_d_head 'auto' is mamba_d_ssm / mamba_n_heads"
    assert (p.ssm_layers, p.attn_layers) == (72, 72) and p.e2e["mlp_layers"] == 72
    inv = hybrid.inventory(p)
    assert inv.count("mlp") == 72
    mlp = inv.blocks["mlp"].params * 72 * hybrid.WEIGHT_ITEMSIZE
    assert inv.full_bytes() > 2 * (inv.full_bytes() - mlp), "the MLP blocks hold most of the weights"


def test_falcon_h1_auto_head_from_expand(tmp_path):
    cfg = {**FALCON_H1, "mamba_expand": 2, "hidden_size": 2048, "mamba_n_heads": 32, "num_attention_heads": 8, "num_key_value_heads": 2}
    del cfg["mamba_d_ssm"]
    assert P.load_preset_file(write(tmp_path / "f", cfg)).shape.P == 2 * 2048 // 32


def test_auto_that_cannot_be_derived_is_one_line(tmp_path):
    cfg = {**FALCON_H1, "mamba_d_ssm": 4100}
    with pytest.raises(UserError, match="not a multiple of mamba_n_heads") as info:
        P.load_preset_file(write(tmp_path / "f", cfg))
    assert "\n" not in info.value.line()
    cfg = {**GRANITE, "mamba_d_head": "auto"}
    with pytest.raises(UserError, match="cannot derive"):
        P.load_preset_file(write(tmp_path / "g", cfg))


def test_granite_needs_no_hand_written_head_dim(tmp_path):
    p = P.load_preset_file(write(tmp_path / "granite", GRANITE))
    assert p.e2e["head_dim"] == 4096 // 32
    assert p.e2e["moe_layers"] == 40 and p.e2e["moe_intermediate_size"] == 768 and "intermediate_size" not in p.e2e
    assert p.e2e["shared_expert_intermediate_size"] == 1536
    inv = hybrid.inventory(p)
    assert (inv.count("ssm"), inv.count("attn"), inv.count("moe")) == (36, 4, 40)


def test_dense_qwen35_has_an_mlp_per_layer(tmp_path):
    text = {"model_type": "qwen3_5_text", "hidden_size": 2560, "intermediate_size": 9216, "num_hidden_layers": 32,
            "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "vocab_size": 248320, "mamba_ssm_dtype": "float32"}
    p = P.load_preset_file(write(tmp_path / "Qwen3.5-4B", {"model_type": "qwen3_5", "text_config": text}))
    shipped = P.load_preset("qwen3.5-4b")
    assert (p.shape, p.ssm_layers, p.attn_layers, p.state_dtype) == (shipped.shape, shipped.ssm_layers, shipped.attn_layers, "fp32")
    assert p.e2e == shipped.e2e


def test_config_read_through_transformers_where_installed(tmp_path, monkeypatch):
    seen = []

    class AutoConfig:
        @staticmethod
        def from_pretrained(path):
            seen.append(path)
            return types.SimpleNamespace(to_dict=lambda: {**NEMOTRON_H_8B, "mamba_ssm_cache_dtype": "float16"})

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(AutoConfig=AutoConfig))
    folder = write(tmp_path / "m", NEMOTRON_H_8B)
    p = P.load_preset_file(folder)
    assert seen == [str(folder)] and p.state_dtype == "fp16", "AutoConfig's values win over the raw file"
    assert any("AutoConfig" in n for n in p.notes)


def test_config_without_transformers_reads_the_json(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    p = P.load_preset_file(write(tmp_path / "m", NEMOTRON_H_8B))
    assert p.state_dtype == "fp32" and not any("AutoConfig" in n for n in p.notes)
