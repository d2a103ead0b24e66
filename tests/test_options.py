"""The shared option vocabulary (replayssm_cli/options.py) through the real CLI: aliases, completion, and the
one-line refusals of repeated, empty, non-finite and out-of-range values."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from replayssm_cli import options
from replayssm_cli.errors import UserError
from replayssm_cli.main import app

runner = CliRunner()
SUPER = "nemotron-3-super-120b-a12b"
QWEN = "qwen3.5-122b-a10b"


def invoke(*args: str, **kw):
    return runner.invoke(app, list(args), **kw)


def one_error_line(res) -> str:
    """The single stderr line of a refused command (exit code 2, no traceback, nothing on stdout)."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output and res.stdout == ""
    return lines[0]


def cost_json(*args: str) -> list[dict]:
    res = invoke("cost", "--json", *args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# Completion.


def complete(line: str) -> list[str]:
    res = invoke(env={"_REPLAYSSM_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(line.split()) - (0 if line.endswith(" ") else 1))})
    assert res.exit_code == 0, res.output
    return res.stdout.split()


@pytest.mark.parametrize("command", ["profile", "tune", "cost", "e2e", "plan", "presets", "show x.json"])
def test_completion_completes_preset_names(command):
    words = complete(f"replayssm {command} --preset nemotron-3-s")
    assert words == [SUPER]


def test_completion_of_short_option_and_argument():
    assert QWEN in complete("replayssm tune -p qwen3.5")
    assert SUPER in complete("replayssm presets nemotron")


def test_completion_of_gpu_keys_and_dtypes():
    assert "h200" in complete("replayssm profile --gpu h2")
    assert complete("replayssm cost --state-dtype b") == ["bf16"]


def test_completion_is_installable():
    res = invoke("--help")
    assert "--install-completion" in res.stdout and "--show-completion" in res.stdout


# Aliases: the engines' names for dtypes and tensor parallelism, -p everywhere.


@pytest.mark.parametrize("engine, ours", [("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("FP32", "fp32")])
def test_state_dtype_takes_the_engines_names(engine, ours):
    rows = cost_json("-p", SUPER, "--batch", "8", "--state-dtype", engine)
    assert {r["state_dtype"] for r in rows} == {ours}


def test_state_dtype_auto_is_the_presets_own():
    assert cost_json("-p", QWEN, "--batch", "8", "--state-dtype", "auto") == cost_json("-p", QWEN, "--batch", "8")


@pytest.mark.parametrize("option, engine, ours", [("--weight-dtype", "fp8_e4m3", "fp8"), ("--weight-dtype", "bfloat16", "bf16"),
                                                  ("--kv-dtype", "float8_e4m3fn", "fp8")])
def test_e2e_weight_and_kv_dtypes_take_the_engines_names(option, engine, ours):
    res = invoke("e2e", "--dry-run", "-p", QWEN, option, engine, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["spec"][option[2:].replace("-", "_")] == ours


def test_read_dtype_fp8_e4m3_is_fp8():
    rows = cost_json("-p", SUPER, "--batch", "8", "--read-dtype", "fp8_e4m3")
    assert {r["read_dtype"] for r in rows if r["variant"] == "split"} == {"fp8"}


def test_tensor_parallel_size_is_tp():
    assert cost_json("-p", SUPER, "--batch", "8", "--tensor-parallel-size", "4") == cost_json("-p", SUPER, "--batch", "8", "--tp", "4")


def test_cost_batch_is_a_list_and_preset_repeatable():
    rows = cost_json("-p", SUPER, "-p", QWEN, "--batch", "1,64", "--batch", "256")
    assert {(r["preset"], r["batch"]) for r in rows} == {(p, b) for p in (SUPER, QWEN) for b in (1, 64, 256)}


def test_cost_acceptance_as_in_profile_and_tune():
    by_rate = cost_json("-p", SUPER, "--batch", "8", "--draft", "2", "--accept-rate", "0.5")
    by_dist = cost_json("-p", SUPER, "--batch", "8", "--draft", "2", "--accept-dist", "0.5,0.25,0.25")
    by_mean = cost_json("-p", SUPER, "--batch", "8", "--draft", "2", "--accepted", "0.75")
    spec = [r for r in by_rate if r["variant"] == "spec-replay"]
    assert spec and all(math.isclose(r["accepted"], 0.5 + 0.25) for r in spec)
    assert by_rate == by_dist == by_mean


def test_preset_file_is_taken_where_preset_is(tmp_path):
    from tests.test_presets import CONFIGS

    rows = cost_json("--preset-file", str(CONFIGS / "mamba2_2.7b.json"), "--batch", "4")
    assert {r["preset"] for r in rows} == {"mamba2_2.7b"}


def test_a_model_directory_is_a_preset_file(tmp_path):
    from tests.test_presets import CONFIGS

    model = tmp_path / "Mamba2-2.7B"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "mamba2_2.7b.json").read_text())
    rows = cost_json("--preset-file", str(model), "--batch", "4")
    assert {r["preset"] for r in rows} == {"mamba2-2.7b"}


# Refusals: one line, exit code 2.


def test_tune_refuses_two_presets_rather_than_tuning_the_last():
    line = one_error_line(invoke("tune", "--preset", SUPER, "--preset", QWEN, "--gpu", "h100-sxm"))
    assert "tune takes one preset, got 2" in line and SUPER in line and QWEN in line


@pytest.mark.parametrize(
    "args, needle",
    [
        (["cost", "--window", "8", "--window", "16"], "--window/-w was given more than once"),
        (["cost", "--tp", "2", "--tensor-parallel-size", "4"], "--tp/--tensor-parallel-size was given more than once"),
        (["profile", "--gpu", "h200", "--gpu", "b200"], "--gpu was given more than once"),
        (["tune", "-p", SUPER, "--accept-rate", "0.5", "--accept-rate", "0.6"], "--accept-rate was given more than once"),
        (["cost", "--json", "--json"], "--json was given more than once"),
        (["profile", "--phases", "--no-phases"], "was given more than once"),
        (["roofline", "--bytes", "modelled", "--bytes", "measured"], "--bytes was given more than once"),
    ],
    ids=["window", "tp-alias", "gpu", "accept-rate", "flag", "flag-pair", "bytes"],
)
def test_repeated_single_valued_option_is_an_error(args, needle):
    assert needle in one_error_line(invoke(*args))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["profile", "--preset", ""], "--preset is empty"),
        (["cost", "--batch", ""], "--batch is empty; give a value or leave the option out"),
        (["tune", "-p", SUPER, "--window", ""], "--window is empty"),
        (["profile", "--gpu", ""], "--gpu is empty"),
        (["tune", "-p", SUPER, "--gpu", " "], "--gpu is empty"),
        (["profile", "--out", ""], "--out is empty"),
        (["e2e", "--dry-run", "--context", ""], "--context is empty"),
        (["compare", "", "b.json"], "is empty"),
        (["cost", "--batch", "1,,16"], "--batch has an empty item in '1,,16'"),
        (["cost", "--batch", "1,16,"], "--batch has an empty item"),
        (["profile", "--draft", "4", "--accept-dist", "0.2,,0.3,0.5"], "--accept-dist has an empty item"),
        (["profile", "--state-dtype", "fp32,"], "--state-dtype has an empty item"),
    ],
    ids=["preset", "batch", "window", "gpu", "gpu-blank", "out", "context", "argument", "batch-gap", "batch-trailing", "accept-dist-gap", "dtype-trailing"],
)
def test_empty_value_is_an_error(args, needle):
    assert needle in one_error_line(invoke(*args))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["cost", "--draft", "2", "--accept-rate", "nan"], "--accept-rate nan is not a finite number; it takes a number in [0, 1]"),
        (["cost", "--draft", "2", "--accept-rate", "inf"], "not a finite number"),
        (["cost", "--draft", "2", "--accept-rate", "1.5"], "--accept-rate 1.5 is out of range; it takes a number in [0, 1]"),
        (["cost", "--draft", "2", "--accept-rate", "0"], "accepts no draft at all"),
        (["profile", "--draft", "2", "--accept-dist", "nan,1,1"], "--accept-dist weight 'nan' is not a non-negative finite number"),
        (["profile", "--draft", "2", "--accept-dist", "0.5,-1,1"], "--accept-dist weight '-1' is not a non-negative finite number"),
        (["profile", "--draft", "2", "--accept-dist", "0,0,0"], "weighs nothing"),
        (["cost", "--batch", "1000000000"], "--batch 1000000000 is not a batch size; it takes an integer from 1 to 1,048,576"),
        (["cost", "--batch", "-4"], "is not a batch size"),
        (["cost", "--batch", "1.5"], "--batch '1.5' is not an integer"),
        (["cost", "--tp", "0"], "--tp 0 is not a tensor-parallel degree; it takes an integer from 1 to 64"),
        (["cost", "--window", "65"], "--window 65 is out of range; it takes an integer from 1 to 64"),
        (["profile", "--draft", "9"], "--draft 9 is out of range; it takes an integer from 1 to 8"),
        (["e2e", "--dry-run", "--max-weights-gib", "nan"], "--max-weights-gib nan is not a finite number"),
        (["profile", "--repeats", "0"], "--repeats 0 is out of range"),
    ],
    ids=["rate-nan", "rate-inf", "rate-over", "rate-accepts-none", "dist-nan", "dist-negative", "dist-zero", "batch-huge", "batch-negative",
         "batch-float", "tp0", "window65", "draft9", "weights-nan", "repeats0"],
)
def test_number_out_of_range_names_the_range(args, needle):
    assert needle in one_error_line(invoke(*args))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["cost", "--state-dtype", "fp8_e5m2"], "e5m2 is not implemented"),
        (["cost", "--state-dtype", "int4"], "choose from fp32, bf16, fp16, fp8, int8, auto (the preset's)"),
        (["profile", "--state-dtype", "auto,fp32"], "auto (the preset's own dtype) stands alone"),
        (["cost", "--read-dtype", "float32"], "--read-dtype 'float32' is not a dtype it takes"),
        (["tune", "-p", SUPER, "--read-dtype", "none,bf16"], "none stands alone"),
        (["e2e", "--dry-run", "--variant", "spec"], "--variant 'spec' is not one it takes"),
    ],
    ids=["e5m2", "int4", "auto-mixed", "read-fp32", "none-mixed", "variant"],
)
def test_unknown_dtype_or_word_says_what_is_taken(args, needle):
    assert needle in one_error_line(invoke(*args))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["profile", "--predict", "--require-gpu"], "--predict and --require-gpu contradict each other"),
        (["profile", "--accept-rate", "0.9"], "--accept-rate needs --draft"),
        (["tune", "-p", SUPER, "--accept-rate", "0.9"], "--accept-rate needs --draft"),
        (["cost", "--draft", "2", "--accept-rate", "0.5", "--accepted", "1"], "--accepted and --accept-rate both give the acceptance"),
        (["e2e", "--dry-run", "--out", "x.json"], "--dry-run writes nothing"),
    ],
    ids=["predict-require-gpu", "rate-without-draft", "tune-rate-without-draft", "accepted-and-rate", "dry-run-out"],
)
def test_contradicting_options_are_one_line(args, needle):
    assert needle in one_error_line(invoke(*args))


def test_tune_state_dtype_auto_is_the_presets_dtype(tmp_path):
    res = invoke("tune", "-p", QWEN, "--state-dtype", "auto", "--read-dtype", "none", "--batch", "64", "--window", "16",
                 "--steps", "8", "--heads", "1", "--gpu", "h100-sxm", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    dtypes = {a["state_dtype"] for d in report["decisions"] for a in d["candidates"]}
    assert dtypes == {report["preset"]["state_dtype"]}


# The parsing functions alone.


def test_parse_functions_raise_user_errors_naming_the_option():
    assert options.int_list(["1,16", "16", " 64 "], "--batch", 1, 256) == [1, 16, 64]
    assert options.accept_weights("1,0,3") == (1.0, 0.0, 3.0)
    assert options.dtype_name("BFloat16", "--state-dtype", ("fp32", "bf16")) == "bf16"
    for call in (lambda: options.int_list(["2,x"], "--batch", 1, 9), lambda: options.parse_float("-inf", "--y", 0, 1),
                 lambda: options.accept_weights("1"), lambda: options.split_list([""], "--z")):
        with pytest.raises(UserError):
            call()
