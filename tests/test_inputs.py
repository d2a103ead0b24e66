"""Bad inputs in presets, configs, traces, paths and recorded ceilings, each a named regression test:
one line on stderr, exit code 2, no traceback, or (for unreadable recorded ceilings) one warning naming the
figures used instead."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from replayssm_cli.model import gpus
from replayssm_cli.model import presets as P
from replayssm_cli.measure import trace as trace_mod
from replayssm_cli.errors import UserError
from replayssm_cli.main import app

runner = CliRunner()
CONFIGS = Path(__file__).parent / "fixtures" / "configs"
SHIPPED_TOML = Path(P.load_preset("nemotron-h-8b").origin).read_text()


def refused(*args: str) -> str:
    """The one stderr line of a command refused with exit code 2 (no traceback, nothing on stdout)."""
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output and res.stdout == ""
    return lines[0]


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return str(path)


def config(name: str, **edits) -> str:
    cfg = json.loads((CONFIGS / name).read_text())
    for key, value in edits.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return json.dumps(cfg)


# Tracebacks before.


@pytest.mark.parametrize("length", [300, 10_000])
def test_a_very_long_preset_name_is_one_line(length):
    for command in ("cost", "presets"):
        line = refused(command, *(["--preset"] if command == "cost" else []), "x" * length)
        assert "characters" in line and "Traceback" not in line


def test_a_very_long_preset_path_is_one_line():
    assert "file names are at most 255" in refused("cost", "--preset", "dir/" + "x" * 300 + ".toml")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda t: "e2e = 5\n" + re.sub(r"\[e2e\]\n(?:[^\[].*\n|\n)*", "", t), "e2e must be a table [e2e], got an integer 5"),
        (lambda t: t.replace("[sources]", 'sources = "a paper"\n[old_sources]'), "unknown key"),
        (lambda t: 'sources = "a paper"\n' + t.split("[sources]")[0], "sources must be a table [sources], got a string"),
        (lambda t: re.sub(r'layer_pattern = ".*"', "layer_pattern = 5", t), "layer_pattern must be a string"),
        (lambda t: t.replace("heads = 128", "heads = 1099511627776"), "ssm.heads=1099511627776 is out of range; it takes 1 to 65,536"),
        (lambda t: t.replace("heads = 128", 'heads = "128"'), "ssm.heads must be an integer, got '128'"),
        (lambda t: t.replace("dt_softplus = true", 'dt_softplus = "yes"'), "ssm.dt_softplus must be true or false"),
        (lambda t: t.replace("[ssm]", "[ssm]\nheads_typo = 3"), "unknown [ssm] key heads_typo"),
        (lambda t: 'display = 7\n' + t.replace('display = "Nemotron-H-8B"\n', ""), "display must be a non-empty string"),
        (lambda t: "notes = 3\n" + t, "notes must be a table"),
        (lambda t: t.replace("a_log_range = [1.0, 16.0]", "a_log_range = [1.0, nan]"), "a_log_range must be a pair of finite numbers"),
        (lambda t: t.replace("ssm_layers = 24", "ssm_layers = 100000"), "ssm_layers=100000 is out of range"),
    ],
    ids=["e2e-int", "sources-string-and-unknown", "sources-string", "layer-pattern-int", "heads-2^40", "heads-string", "flag-string",
         "ssm-typo", "display-int", "notes-int", "a-log-nan", "layers-huge"],
)
def test_preset_toml_fields_are_checked_by_type_and_range(tmp_path, edit, needle):
    path = write(tmp_path, "bad.toml", edit(SHIPPED_TOML))
    assert needle in refused("presets", "--preset-file", path)
    assert needle in refused("cost", "--preset", path)


def test_a_binary_preset_file_is_named_binary(tmp_path):
    path = write(tmp_path, "model.toml", bytes(range(256)) * 4)
    assert "is a binary file, not TOML or JSON text" in refused("cost", "--preset", path)


@pytest.mark.parametrize(
    "name, edits, needle",
    [
        ("mamba2_2.7b.json", {"expand": "two"}, "expand must be an integer, got 'two'"),
        ("mamba2_2.7b.json", {"n_groups": "eight"}, "n_groups must be an integer, got 'eight'"),
        ("mamba2_2.7b.json", {"head_dim": 0, "num_heads": None}, "head_dim=0 is out of range"),
        ("mamba2_2.7b.json", {"num_heads": 80.7}, "num_heads must be an integer, got 80.7"),
        ("mamba2_2.7b.json", {"num_heads": "auto"}, "'auto', which is resolved by the engine"),
        ("mamba2_2.7b.json", {"head_dim": 48, "num_heads": None}, "is not a multiple of the head dimension 48"),
        ("mamba2_2.7b.json", {"num_hidden_layers": -3}, "num_hidden_layers=-3 is out of range"),
        ("mamba2_2.7b.json", {"torch_dtype": "float64"}, "torch_dtype 'float64' is not a state dtype the kernels store"),
        ("qwen3_next_80b.json", {"full_attention_interval": 0}, "full_attention_interval=0 is out of range"),
        ("qwen3_next_80b.json", {"layer_types": "linear"}, "layer_types must be a list of strings"),
        ("qwen3_next_80b.json", {"hidden_size": "big"}, "hidden_size must be an integer"),
        ("nemotron_h_super.json", {"hybrid_override_pattern": 5}, "hybrid_override_pattern must be a string"),
        ("nemotron_h_super.json", {"mamba_ssm_cache_dtype": "int4"}, "mamba_ssm_cache_dtype 'int4' is not a state dtype"),
    ],
    ids=["expand-two", "groups-eight", "head-dim-0", "heads-80.7", "heads-auto", "heads-not-divisible", "layers-negative",
         "float64", "interval-0", "layer-types-string", "hidden-string", "pattern-int", "cache-int4"],
)
def test_config_json_fields_are_checked_by_type_and_range(tmp_path, name, edits, needle):
    path = write(tmp_path, "config.json", config(name, **edits))
    assert needle in refused("presets", "--preset-file", path)


def test_config_json_auto_dtypes_fall_back_to_the_model_dtype_and_say_so(tmp_path):
    p = P.load_preset_file(write(tmp_path, "config.json", config("nemotron_h_super.json", mamba_ssm_cache_dtype="auto", torch_dtype="bfloat16")))
    assert p.state_dtype == "fp32" and "family's shipped choice" in p.estimated_reasons["state_dtype"]
    p = P.load_preset_file(write(tmp_path, "config.json", config("qwen3_next_80b.json", mamba_ssm_cache_dtype="auto", torch_dtype="float16")))
    assert p.state_dtype == "fp16" and "model dtype is used" in p.estimated_reasons["state_dtype"]
    p = P.load_preset_file(write(tmp_path, "config.json", config("mamba2_2.7b.json", torch_dtype="auto")))
    assert p.state_dtype == "bf16" and "bf16 assumed" in p.estimated_reasons["state_dtype"]


# Misleading messages before.


def test_a_directory_fifo_or_symlink_loop_is_named_as_such(tmp_path):
    (tmp_path / "empty-dir").mkdir()
    assert "is a directory without a config.json" in refused("presets", "--preset-file", str(tmp_path / "empty-dir"))
    os.mkfifo(tmp_path / "pipe.toml")
    assert "is a FIFO (named pipe), not a file" in refused("cost", "--preset", str(tmp_path / "pipe.toml"))
    os.symlink(tmp_path / "b.toml", tmp_path / "a.toml")
    os.symlink(tmp_path / "a.toml", tmp_path / "b.toml")
    assert "is a symlink loop" in refused("presets", "--preset-file", str(tmp_path / "a.toml"))
    os.symlink(tmp_path / "gone.toml", tmp_path / "dangling.toml")
    assert "is a broken symlink" in refused("cost", "--preset", str(tmp_path / "dangling.toml"))
    assert "is a directory" in refused("compare", str(tmp_path / "empty-dir"), str(tmp_path / "empty-dir"))
    assert "is a FIFO" in refused("tune", "-p", "nemotron-h-8b", "--results", str(tmp_path / "pipe.toml"))


def test_a_model_directory_holding_config_json_is_a_preset(tmp_path):
    model = tmp_path / "Mamba2-Local"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "mamba2_2.7b.json").read_text())
    for args in (["presets", "--preset-file", str(model), "--json"], ["presets", "--preset", str(model), "--json"], ["presets", str(model), "--json"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["name"] == "mamba2-local"


def test_a_json_list_is_called_a_list(tmp_path):
    assert "holds a JSON list, not an object" in refused("presets", "--preset-file", write(tmp_path, "config.json", "[1, 2]"))


def test_a_deeply_nested_json_is_one_line(tmp_path):
    assert "nests too deeply" in refused("presets", "--preset-file", write(tmp_path, "config.json", "[" * 200_000 + "]" * 200_000))


def test_broken_json_reports_the_json_error(tmp_path):
    assert "is not valid JSON" in refused("presets", "--preset-file", write(tmp_path, "config.json", '{"model_type": "mamba2",'))


def _trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    T, H, P_, N, G = 6, 2, 4, 4, 1
    arrays = {"x": rng.standard_normal((T, H, P_)), "dt": rng.standard_normal((T, H)), "B": rng.standard_normal((T, G, N)),
              "C": rng.standard_normal((T, G, N)), "A": -np.ones(H), "D": np.ones(H), "dt_bias": np.zeros(H)}
    return trace_mod.write(tmp_path / "t.npz", trace_mod.Trace("mamba2", arrays, prompt_tokens=2))


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: write(d, "t.npz", b"\x80\x04\x95" + bytes(64)), "is a pickle; a trace is a .npz archive"),
        (lambda d: write(d, "t.npz", bytes(range(256))), "is not a .npz archive"),
        (lambda d: (np.save(d / "t.npy", np.zeros(3)), str(d / "t.npy"))[1], "is a single .npy array"),
        (lambda d: (np.savez(d / "o.npz", meta=np.array(["{}"], dtype=object)), str(d / "o.npz"))[1], "holds pickled (object) arrays, which replayssm never loads"),
        (lambda d: (np.savez(d / "m.npz", meta=np.array(json.dumps([1]))), str(d / "m.npz"))[1], "meta entry that is not a JSON object"),
        (lambda d: (np.savez(d / "m.npz", meta=np.array(3.0)), str(d / "m.npz"))[1], "meta entry that is not a JSON string"),
    ],
    ids=["pickle", "binary", "npy", "object-array", "meta-list", "meta-number"],
)
def test_a_bad_trace_is_one_line_and_never_unpickled(tmp_path, make, needle):
    line = refused("tune", "-p", "nemotron-h-8b", "--gpu", "h100-sxm", "--trace", make(tmp_path))
    assert needle in line and "allow_pickle" not in line


def test_a_trace_with_bad_meta_types_is_one_line(tmp_path):
    path = _trace(tmp_path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")))
    meta["prompt_tokens"] = "two"
    np.savez(tmp_path / "bad.npz", meta=np.array(json.dumps(meta)), **arrays)
    with pytest.raises(UserError, match="meta prompt_tokens is 'two'; expected a non-negative integer"):
        trace_mod.read(tmp_path / "bad.npz")
    assert trace_mod.read(path).steps == 6


@pytest.mark.parametrize(
    "args, needle",
    [
        (["profile", "--out", "-"], "--out - would write a file named '-'"),
        (["e2e", "--dry-run", "--out", "x.json"], "--dry-run writes nothing"),
        (["profile", "--out", "/"], "it is a directory"),
        (["tune", "-p", "nemotron-h-8b", "--out", "d/" + "n" * 300], "file names are at most 255"),
    ],
    ids=["dash", "dry-run", "directory", "long-name"],
)
def test_out_paths_are_checked_before_any_work(args, needle):
    assert needle in refused(*args)


# Recorded ceilings that do not parse: one warning naming the figures used instead.


def _detected(name: str, driver: str) -> gpus.DetectedGpu:
    return gpus.DetectedGpu(index=0, name=name, uuid=None, compute_capability="9.0", memory_total=None, memory_free=None,
                            max_sm_clock_mhz=None, max_mem_clock_mhz=None, bus_width_bits=None, power_limit_w=None,
                            driver=driver, sm_count=None, sm_count_source=None, spec=gpus.load_gpu("h100-sxm"))


@pytest.mark.parametrize(
    "cache, needle",
    [
        ("{not json", "cannot be read"),
        (json.dumps({"version": 1, "entries": {"NVIDIA H100 80GB HBM3|driver 1.0": {"copy_gbs": "fast"}}}), "copy_gbs must be a positive number, got 'fast'"),
        (json.dumps({"version": 1, "entries": {"NVIDIA H100 80GB HBM3|driver 1.0": {"copy_gbs": -1, "fp32_tflops": 60}}}), "copy_gbs must be a positive number, got -1"),
        (json.dumps({"version": 99, "entries": {}}), "has version 99"),
    ],
    ids=["not-json", "string-rate", "negative-rate", "version"],
)
def test_unreadable_recorded_ceilings_warn_naming_the_datasheet_figures(tmp_path, monkeypatch, capsys, cache, needle):
    monkeypatch.setenv(gpus.CACHE_ENV, str(tmp_path))
    (tmp_path / "ceilings.json").write_text(cache)
    gpus._WARNED.clear()
    spec = gpus.load_gpu("h100-sxm")
    chosen = gpus.ceilings_for(spec, _detected("NVIDIA H100 80GB HBM3", "1.0"))
    assert chosen.source == "datasheet"
    warning = " ".join(capsys.readouterr().err.split())
    assert needle in warning and f"using the datasheet figures instead ({gpus.format_gbs(spec.hbm_gbs)} copy" in warning
    gpus.ceilings_for(spec, _detected("NVIDIA H100 80GB HBM3", "1.0"))
    assert capsys.readouterr().err == "", "the warning is given once"


def test_ceilings_from_a_results_file_are_checked():
    with pytest.raises(UserError, match="fp32_tflops must be a positive number, got 'nan'"):
        gpus.Ceilings.from_dict({"copy_gbs": 4000, "fp32_tflops": "nan", "bf16_tflops": 700, "source": "x", "gpu_name": "g"}, "results")
    with pytest.raises(UserError, match="are not a JSON object"):
        gpus.Ceilings.from_dict([1, 2])
