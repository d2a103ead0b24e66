"""Model presets: every shipped file validates, TP division, config.json import, and `replayssm presets`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayssm_cli.model import presets as P
from replayssm_cli.errors import UserError
from replayssm_cli.main import app
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
REQUIRED = (
    "mamba2-2.7b",
    "nemotron-h-8b",
    "nemotron-h-56b",
    "nemotron-3-nano-30b-a3b",
    "nemotron-3-super-120b-a12b",
    "nemotron-3-ultra-550b-a55b",
    "granite-4.0-h-small",
    "falcon-h1-34b",
    "qwen3-next-80b-a3b",
    "qwen3.5-122b-a10b",
    "qwen3.5-397b-a17b",
)
runner = CliRunner()


def test_list_presets_has_every_required_model():
    names = [p.name for p in P.list_presets()]
    assert set(REQUIRED) <= set(names)
    assert names == sorted(names)
    assert set(P.DEFAULT_PRESETS) <= set(names)


@pytest.mark.parametrize("name", P.preset_names())
def test_shipped_preset_validates(name):
    p = P.load_preset(name)
    assert p.name == name and p.tp == 1 and p.kind in P.KINDS
    dims = P.shape_dict(p.shape)
    assert all(v > 0 for v in dims.values())
    assert p.ssm_layers > 0 and p.attn_layers >= 0
    assert p.state_dtype in P.STATE_DTYPES
    if p.kind == "mamba2":
        assert isinstance(p.shape, Mamba2Shape) and p.shape.H % p.shape.G == 0
    else:
        assert isinstance(p.shape, GDNShape) and p.shape.HV % p.shape.H == 0
    for group in P.REQUIRED_SOURCES + (("e2e",) if p.e2e else ()):
        assert any(k == group or k.startswith(group + ".") for k in p.sources), group
    assert all(p.estimated_reasons[k] for k in p.estimated)
    assert all(v > 0 for v in (p.e2e or {}).values())
    lo, hi = p.a_log_range
    assert 0 <= lo < hi


def test_design_shapes():
    sup = P.load_preset("nemotron-3-super-120b-a12b")
    assert sup.shape == Mamba2Shape(H=128, P=64, N=128, G=8)
    assert (sup.ssm_layers, sup.attn_layers, sup.state_dtype) == (40, 8, "fp32")
    qwen = P.load_preset("qwen3.5-122b-a10b")
    assert qwen.shape == GDNShape(H=16, HV=64, K=128, V=128)
    assert (qwen.ssm_layers, qwen.attn_layers) == (36, 12)


def test_state_bytes_per_layer_and_sequence():
    sup = P.load_preset("nemotron-3-super-120b-a12b")
    assert sup.state_bytes_per_layer() == 128 * 64 * 128 * 4
    assert sup.state_bytes_per_layer("bf16") == 128 * 64 * 128 * 2
    assert sup.state_bytes_per_sequence() == 40 * 128 * 64 * 128 * 4
    qwen = P.load_preset("qwen3.5-122b-a10b")
    assert qwen.state_bytes_per_sequence("fp16") == 36 * 64 * 128 * 128 * 2


def test_lookup_by_display_name_and_case():
    assert P.load_preset("Nemotron-3-Super-120B-A12B").name == "nemotron-3-super-120b-a12b"
    assert P.load_preset("QWEN3.5-122B-A10B").name == "qwen3.5-122b-a10b"


def test_unknown_preset_lists_valid_names():
    with pytest.raises(UserError) as exc:
        P.load_preset("nemotron-9000")
    for name in REQUIRED:
        assert name in exc.value.line()


@pytest.mark.parametrize(
    "name,tp,expected",
    [
        ("nemotron-3-super-120b-a12b", 4, Mamba2Shape(H=32, P=64, N=128, G=2)),
        ("nemotron-3-super-120b-a12b", 8, Mamba2Shape(H=16, P=64, N=128, G=1)),
        ("mamba2-2.7b", 2, Mamba2Shape(H=40, P=64, N=128, G=1)),
        ("qwen3.5-122b-a10b", 8, GDNShape(H=2, HV=8, K=128, V=128)),
        ("qwen3.5-122b-a10b", 16, GDNShape(H=1, HV=4, K=128, V=128)),
    ],
    ids=["super-tp4", "super-tp8", "mamba2-tp2-G1-replicated", "qwen-tp8", "qwen-tp16"],
)
def test_tp_divides_heads_and_groups(name, tp, expected):
    p = P.load_preset(name, tp=tp)
    assert p.shape == expected and p.tp == tp
    base = P.load_preset(name)
    assert p.state_bytes_per_sequence() * tp == base.state_bytes_per_sequence()


@pytest.mark.parametrize(
    "name,tp",
    [("nemotron-3-super-120b-a12b", 3), ("nemotron-3-super-120b-a12b", 16), ("qwen3.5-122b-a10b", 32), ("mamba2-2.7b", 3)],
    ids=["super-tp3", "super-tp16-groups", "qwen-tp32", "mamba2-tp3"],
)
def test_tp_refuses_degree_that_does_not_divide(name, tp):
    with pytest.raises(UserError, match="does not divide"):
        P.load_preset(name, tp=tp)


def test_with_tp_starts_from_the_full_shape():
    p = P.with_tp(P.load_preset("nemotron-3-super-120b-a12b", tp=2), 4)
    assert p.shape.H == 32 and p.full_shape.H == 128


def test_with_tp_rejects_non_positive():
    with pytest.raises(UserError):
        P.with_tp(P.load_preset("mamba2-2.7b"), 0)


def test_import_nemotron_h_config():
    p = P.load_preset_file(CONFIGS / "nemotron_h_super.json")
    assert p.kind == "mamba2" and p.shape == Mamba2Shape(H=128, P=64, N=128, G=8)
    assert (p.ssm_layers, p.attn_layers) == (40, 8)
    assert p.state_dtype == "fp32" and "state_dtype" not in p.estimated
    assert p.e2e["num_experts"] == 512 and p.e2e["moe_layers"] == 40 and p.e2e["shared_expert_intermediate_size"] == 5376
    assert p.e2e["num_key_value_heads"] == 2 and "mlp_layers" not in p.e2e


def test_import_qwen3_5_moe_config_with_text_config():
    p = P.load_preset_file(CONFIGS / "qwen3_5_moe_122b.json")
    assert p.kind == "gdn" and p.shape == GDNShape(H=16, HV=64, K=128, V=128)
    assert (p.ssm_layers, p.attn_layers) == (36, 12)
    assert p.state_dtype == "fp32"
    assert p.e2e["hidden_size"] == 3072 and p.e2e["experts_per_token"] == 8


def test_import_mamba2_config():
    p = P.load_preset_file(CONFIGS / "mamba2_2.7b.json")
    assert p.shape == Mamba2Shape(H=80, P=64, N=128, G=1)
    assert (p.ssm_layers, p.attn_layers) == (64, 0)
    assert p.state_dtype == "fp16" and "state_dtype" in p.estimated


def test_import_qwen3_next_config_by_interval():
    p = P.load_preset_file(CONFIGS / "qwen3_next_80b.json", tp=2)
    assert p.shape == GDNShape(H=8, HV=16, K=128, V=128)
    assert (p.ssm_layers, p.attn_layers, p.state_dtype) == (36, 12, "bf16")
    assert p.e2e["moe_layers"] == 48


def test_import_nemotron_h_layers_block_type_and_named_after_folder(tmp_path):
    cfg = json.loads((CONFIGS / "nemotron_h_super.json").read_text())
    pattern = cfg.pop("hybrid_override_pattern")
    cfg["layers_block_type"] = [{"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}[c] for c in pattern]
    folder = tmp_path / "My-Super"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    p = P.resolve(str(folder / "config.json"))
    assert p.name == "my-super" and (p.ssm_layers, p.attn_layers) == (40, 8)


def test_import_layer_types_list(tmp_path):
    cfg = json.loads((CONFIGS / "qwen3_next_80b.json").read_text())
    cfg["layer_types"] = ["linear_attention", "full_attention"] * 3
    cfg["num_hidden_layers"] = 6
    path = tmp_path / "two-to-one.json"
    path.write_text(json.dumps(cfg))
    assert (P.load_preset_file(path).ssm_layers, P.load_preset_file(path).attn_layers) == (3, 3)


def test_import_unknown_model_type(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    with pytest.raises(UserError, match="supported config.json model types"):
        P.load_preset_file(path)


def test_import_config_missing_a_field(tmp_path):
    cfg = json.loads((CONFIGS / "qwen3_next_80b.json").read_text())
    del cfg["linear_num_value_heads"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="linear_num_value_heads"):
        P.load_preset_file(path)


def test_own_toml_round_trip_and_resolve(tmp_path):
    src = Path(P.load_preset("nemotron-h-8b").origin)
    dst = tmp_path / "custom.toml"
    shutil.copy(src, dst)
    p = P.resolve(str(dst), tp=2)
    assert p.display == "Nemotron-H-8B" and p.shape.H == 64 and p.shape.G == 4


def _write_toml(tmp_path, text: str) -> Path:
    base = Path(P.load_preset("nemotron-h-8b").origin).read_text()
    path = tmp_path / "bad.toml"
    path.write_text(text(base) if callable(text) else text)
    return path


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda t: t.replace("groups = 8", "groups = 3"), "not a multiple of groups"),
        (lambda t: t.replace("heads = 128", "heads = 0"), "ssm.heads=0 is out of range; it takes 1 to"),
        (lambda t: t.replace("ssm_layers = 24", "ssm_layers = 25"), "layer_pattern has 24 Mamba"),
        (lambda t: t.replace('state_dtype = "fp32"', 'state_dtype = "fp64"'), "state_dtype"),
        (lambda t: t.replace("state_dim = 128\n", ""), "missing ssm.state_dim"),
        (lambda t: t.split("[sources]")[0], "no source for"),
        (lambda t: t.replace('a_log_range = "the initialisation', 'a_log_range = "" #'), "has no reason"),
        (lambda t: t.replace("[e2e]", "[e2e]\nbogus = 3"), r"unknown \[e2e\] keys"),
        (lambda t: "kind = [", "is not valid TOML"),
    ],
    ids=["groups", "zero-heads", "pattern", "dtype", "missing-field", "no-sources", "estimate-reason", "e2e-key", "not-toml"],
)
def test_bad_preset_toml_is_refused(tmp_path, edit, message):
    with pytest.raises(UserError, match=message):
        P.load_preset_file(_write_toml(tmp_path, edit))


def test_gdn_heads_must_divide(tmp_path):
    base = Path(P.load_preset("qwen3.5-122b-a10b").origin).read_text()
    path = tmp_path / "gdn.toml"
    path.write_text(base.replace("value_heads = 64", "value_heads = 40").replace("key_heads = 16", "key_heads = 12"))
    with pytest.raises(UserError, match="not a multiple of key heads"):
        P.load_preset_file(path)


def test_cli_presets_table_lists_every_preset():
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0, result.output
    for name in REQUIRED:
        assert name in result.stdout


def test_cli_presets_json_list_with_tp():
    result = runner.invoke(app, ["presets", "--tp", "4", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["nemotron-3-super-120b-a12b"]["shape"] == {"H": 32, "P": 64, "N": 128, "G": 2}
    assert "error" in rows["falcon-h1-34b"] or rows["falcon-h1-34b"]["shape"]["H"] == 8


def test_cli_presets_one_json():
    result = runner.invoke(app, ["presets", "qwen3.5-122b-a10b", "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["shape"] == {"H": 8, "HV": 32, "K": 128, "V": 128} and d["tp"] == 2
    assert d["state_bytes_per_layer"]["fp32"] == 32 * 128 * 128 * 4
    assert d["state_bytes_per_sequence"]["bf16"] == 36 * 32 * 128 * 128 * 2
    assert d["sources"]["ssm"] and "a_log_range" in d["estimated"]


def test_cli_presets_one_table_shows_every_dtype():
    result = runner.invoke(app, ["presets", "nemotron-3-super-120b-a12b"])
    assert result.exit_code == 0, result.output
    for text in ("fp32 (shipped)", "bf16", "fp16", "4.00 MiB", "160.00 MiB", "Sources"):
        assert text in result.stdout


def test_cli_presets_preset_file():
    result = runner.invoke(app, ["presets", "--preset-file", str(CONFIGS / "qwen3_5_moe_122b.json"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["label"] == "H16-HV64-K128-V128"


def test_cli_presets_shows_a_name_and_a_file_together():
    args = ["presets", "nemotron-3-super-120b-a12b", "--preset-file", str(CONFIGS / "mamba2_2.7b.json"), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [p["name"] for p in json.loads(result.stdout)] == ["nemotron-3-super-120b-a12b", "mamba2_2.7b"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["presets", "nope"], "valid presets: "),
        (["presets", "nemotron-3-super-120b-a12b", "--tp", "3"], "valid --tp: 1, 2, 4, 8"),
        (["presets", "--preset-file", "/nonexistent/config.json"], "does not exist"),
    ],
    ids=["unknown", "bad-tp", "missing-file"],
)
def test_cli_presets_bad_input_is_one_line(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error: ")
