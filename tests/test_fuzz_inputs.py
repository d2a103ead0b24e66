"""Property-based tests (hypothesis): malformed option values, preset files, Hugging Face configs and traces are
refused by the real CLI with exit code 2, one line on stderr, no traceback, and nothing written."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
import typer.main
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from replayssm_cli.model import dtypes
from replayssm_cli import options
from replayssm_cli.model import presets as P
from replayssm_cli.measure import trace as trace_mod
from replayssm_cli.errors import UserError
from replayssm_cli.main import app

runner = CliRunner()
# Derandomized so that CI runs the same examples every time; small enough that the file runs in well under 30 s.
FAST = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
CONFIGS = Path(__file__).parent / "fixtures" / "configs"
SHIPPED = P._read_toml(Path(P.load_preset("nemotron-h-8b").origin))


@pytest.fixture(scope="module", autouse=True)
def one_click_command():
    """Build the click command once for this module's hundreds of invocations (typer builds it on every invoke)."""
    import typer.testing

    built = typer.testing._get_command(app)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", lambda a: built if a is app else typer.main.get_command(a))
        yield


def assert_refused(args: list[str]) -> None:
    """The contract: exit code 2, one line on stderr, no traceback, and no file written in the working directory."""
    with tempfile.TemporaryDirectory() as d:
        cwd = os.getcwd()
        os.chdir(d)
        try:
            before = set(os.listdir(d))
            res = runner.invoke(app, args)
            after = set(os.listdir(d))
        finally:
            os.chdir(cwd)
    assert res.exit_code == 2, (args, res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, res.stderr)
    assert "Traceback" not in res.output and res.stdout == ""
    assert after == before, f"{args} wrote {after - before}"


# Option values.

NUMBER_TEXT = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "+inf", "1e400", "", " ", ",", "1,", ",1", "1,,2", "0x10", "one", "1.5", "--", "１"]),
    st.integers(min_value=-(10**12), max_value=0).map(str),
    st.text(alphabet="0123456789.,-+eE xna", min_size=1, max_size=8),
)


def valid_int_list(text: str, lo: int, hi: int) -> bool:
    try:
        options.int_list([text], "--x", lo, hi)
        return True
    except UserError:
        return False


INT_OPTIONS = [
    (["cost"], "--batch", 1, options.MAX_BATCH),
    (["cost"], "--window", 1, options.MAX_WINDOW),
    (["cost"], "--draft", 0, options.MAX_DRAFT),
    (["cost"], "--tp", 1, options.MAX_TP),
    (["profile", "--out", "out.json"], "--batch", 1, options.MAX_BATCH),
    (["profile", "--out", "out.json"], "--window", 1, options.MAX_WINDOW),
    (["profile", "--out", "out.json"], "--draft", 1, options.MAX_DRAFT),
    (["tune", "-p", "nemotron-h-8b", "--out", "report.json"], "--batch", 1, options.MAX_BATCH),
    (["tune", "-p", "nemotron-h-8b", "--out", "report.json"], "--tensor-parallel-size", 1, options.MAX_TP),
    (["e2e", "--dry-run"], "--context", 1, 1 << 24),
]


@FAST
@given(case=st.sampled_from(INT_OPTIONS), value=st.one_of(NUMBER_TEXT, st.integers(min_value=options.MAX_BATCH + 1).map(str)))
def test_fuzz_integer_options_are_refused(case, value):
    command, option, lo, hi = case
    multi = option in ("--batch", "--context") or command[0] in ("profile", "tune") and option in ("--window", "--draft")
    assume(not (valid_int_list(value, lo, hi) if multi else _valid_int(value, lo, hi)))
    assert_refused([*command, option, value])


def _valid_int(text: str, lo: int, hi: int) -> bool:
    try:
        options.parse_int(text, "--x", lo, hi)
        return True
    except UserError:
        return False


@FAST
@given(command=st.sampled_from([["cost", "--draft", "2"], ["profile", "--draft", "2", "--out", "o.json"], ["tune", "-p", "nemotron-h-8b", "--draft", "2"]]),
       value=st.one_of(NUMBER_TEXT, st.floats(allow_nan=True, allow_infinity=True).map(repr)))
def test_fuzz_accept_rate_is_refused_outside_0_1(command, value):
    try:
        ok = 0 <= float(value) <= 1
    except ValueError:
        ok = False
    assume(not ok or not math.isfinite(float(value)))
    assert_refused([*command, "--accept-rate", value])


@FAST
@given(weights=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(["", " ", "x", "-1", "nan"])),
                        min_size=1, max_size=4))
def test_fuzz_accept_dist_is_refused_when_malformed(weights):
    text = ",".join(weights)
    try:
        options.accept_weights(text)
        valid = True
    except UserError:
        valid = False
    assume(not valid)
    assert_refused(["cost", "--draft", str(max(len(weights) - 1, 1)), "--accept-dist", text])


@FAST
@given(option=st.sampled_from(["--state-dtype", "--read-dtype", "--io-dtype"]), name=st.text(min_size=1, max_size=10))
def test_fuzz_dtype_names_outside_ours_and_the_engines_are_refused(option, name):
    allowed = {"--state-dtype": ("fp32", "bf16", "fp16"), "--read-dtype": ("bf16", "fp16", "fp8"), "--io-dtype": ("bf16", "fp16", "fp32")}[option]
    words = [w.strip().lower() for w in name.split(",")]
    assume(not all(dtypes.ALIASES.get(w) in allowed or (w == "auto" and option == "--state-dtype") for w in words))
    assume(not name.startswith("-"))
    assert_refused(["cost", "-p", "nemotron-h-8b", option, name])


@FAST
@given(option=st.sampled_from(["--preset", "--gpu", "--batch", "--out", "--state-dtype", "--preset-file"]), blank=st.sampled_from(["", " ", "\t"]))
def test_fuzz_empty_values_are_refused(option, blank):
    assert_refused(["profile", option, blank])


@FAST
@given(option=st.sampled_from(["--window", "--tp", "--gpu", "--io-dtype", "--accept-rate", "--json", "--state-dtype"]),
       values=st.lists(st.sampled_from(["1", "2", "h200", "bf16", "0.5"]), min_size=2, max_size=3))
def test_fuzz_repeated_single_valued_options_are_refused(option, values):
    args = ["cost"]
    for v in values:
        args += [option] if option == "--json" else [option, v]
    assert_refused(args)


# Preset files: a shipped preset with one field replaced by a value of the wrong type or out of range.


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not (isinstance(v, float) and not math.isfinite(v)) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def to_toml(data: dict) -> str:
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines += [f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


INT_FIELDS = [("ssm_layers",), ("attn_layers",), ("ssm", "heads"), ("ssm", "head_dim"), ("ssm", "state_dim"), ("ssm", "groups"),
              ("e2e", "hidden_size"), ("e2e", "vocab_size")]
STR_FIELDS = [("kind",), ("state_dtype",), ("display",), ("layer_pattern",), ("sources", "ssm"), ("estimated", "a_log_range")]
BOOL_FIELDS = [("ssm", "dt_softplus"), ("ssm", "has_z")]
WRONG_FOR_INT = st.one_of(st.text(max_size=5), st.booleans(), st.floats(allow_nan=True), st.integers(max_value=-1),
                          st.integers(min_value=1 << 40, max_value=1 << 62), st.lists(st.integers(), max_size=2))
WRONG_FOR_STR = st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False), st.lists(st.text(max_size=3), max_size=2))
WRONG_FOR_BOOL = st.one_of(st.integers(), st.text(max_size=5), st.floats(allow_nan=False))


def _replace(data: dict, path: tuple[str, ...], value) -> dict:
    out = json.loads(json.dumps(data))
    table = out
    for key in path[:-1]:
        table = table[key]
    table[path[-1]] = value
    return out


@given(st.one_of(
    st.tuples(st.sampled_from(INT_FIELDS), WRONG_FOR_INT.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v == 0)) ),
    st.tuples(st.sampled_from(STR_FIELDS), WRONG_FOR_STR),
    st.tuples(st.sampled_from(BOOL_FIELDS), WRONG_FOR_BOOL),
    st.tuples(st.sampled_from([("ssm",), ("e2e",), ("sources",), ("notes",)]), st.one_of(st.integers(), st.text(max_size=4), st.booleans())),
    st.tuples(st.just(("ssm", "a_log_range")), st.one_of(st.lists(st.floats(), max_size=3), st.text(max_size=3), st.integers())),
))
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_preset_toml_with_a_wrong_field_is_refused(case):
    path_, value = case
    data = _replace(SHIPPED, path_, value)
    if path_ == ("ssm", "a_log_range") and isinstance(value, list) and len(value) == 2 and all(math.isfinite(v) for v in value):
        assume(not 0 <= value[0] < value[1])
    if path_ == ("attn_layers",):
        assume(not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= P.MAX_LAYERS))
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "bad.toml"
        f.write_text(to_toml(data))
        assert_refused(["presets", "--preset-file", str(f)])
        assert_refused(["cost", "--preset", str(f)])


def test_the_toml_writer_round_trips_a_shipped_preset(tmp_path):
    f = tmp_path / "same.toml"
    f.write_text(to_toml(SHIPPED))
    assert P.load_preset_file(f).shape == P.load_preset("nemotron-h-8b").shape


# Hugging Face configs: a fixture with one field it reads replaced, or any JSON at all.

CONFIG_FIELDS = {
    "mamba2_2.7b.json": ["hidden_size", "num_hidden_layers", "expand", "num_heads", "head_dim", "state_size", "n_groups", "torch_dtype"],
    "qwen3_next_80b.json": ["linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                            "num_hidden_layers", "full_attention_interval", "layer_types", "hidden_size"],
    "nemotron_h_super.json": ["mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "hybrid_override_pattern",
                              "mamba_ssm_cache_dtype", "num_attention_heads"],
}
JSON_WRONG = st.one_of(st.text(max_size=6).filter(lambda s: s.lower() not in dtypes.ALIASES and s.lower() != "auto"), st.booleans(),
                       st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)),
                       st.integers(max_value=-1), st.integers(min_value=1 << 40, max_value=1 << 60),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@FAST
@given(name=st.sampled_from(sorted(CONFIG_FIELDS)), data=st.data())
def test_fuzz_config_json_with_a_wrong_field_is_refused(name, data):
    field = data.draw(st.sampled_from(CONFIG_FIELDS[name]))
    value = data.draw(JSON_WRONG)
    if field in ("layer_types",):
        assume(not (isinstance(value, list) and all(isinstance(v, str) for v in value)))
    cfg = json.loads((CONFIGS / name).read_text())
    cfg[field] = value
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "config.json"
        f.write_text(json.dumps(cfg))
        assert_refused(["presets", "--preset-file", str(f)])


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3), max_leaves=8)


@FAST
@given(doc=JSON)
def test_fuzz_any_json_that_is_not_a_config_is_refused(doc):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "config.json"
        f.write_text(json.dumps(doc))
        assert_refused(["presets", "--preset-file", str(f)])


@FAST
@given(blob=st.binary(min_size=1, max_size=256))
def test_fuzz_any_bytes_as_a_preset_or_trace_are_refused(blob):
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "model.toml"
        f.write_bytes(blob)
        try:
            P.load_preset_file(f)
        except UserError:
            pass
        else:
            pytest.fail(f"{blob!r} loaded as a preset")
        with pytest.raises(UserError):
            trace_mod.read(f)
