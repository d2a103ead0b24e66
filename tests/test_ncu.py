"""Nsight Compute integration: the raw-page parser on captured H200 output, kernel matching, measure and annotate."""

from __future__ import annotations

import ast
import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from replayssm_cli.measure import ncu, ncu_child
from replayssm_cli.model import presets

FIXTURES = Path(__file__).parent / "fixtures"
KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_raw_csv_explicit_metrics_h200():
    records = ncu.parse_raw_csv(fixture_text("ncu_explicit-metrics_raw_h200.csv"))
    assert len(records) == 1
    (rec,) = records
    assert rec["id"] == 0 and rec["pid"] == 503 and rec["kernel"] == "scale_add"
    assert rec["grid"] == "(65536, 1, 1)" and rec["block"] == "(128, 1, 1)"
    m = rec["metrics"]
    assert m["dram__bytes_read.sum"] == 536_878_336
    assert m["dram__bytes_write.sum"] == 249_302_016
    assert m["dram__bytes_read.avg"] == pytest.approx(11_184_965.33)
    assert m["gpu__time_duration.sum"] == 181_856
    assert rec["units"]["dram__bytes_read.sum"] == "byte"
    assert rec["units"]["gpu__time_duration.sum"] == "ns"
    assert rec["units"]["dram__cycles_elapsed.avg.per_second"] == "hz"
    assert m["launch__grid_size"] == 65_536
    totals = ncu.kernel_totals(rec)
    assert totals["dram_bytes"] == 536_878_336 + 249_302_016
    assert totals["l2_bytes"] == 1_237_644_064
    # scale_add does one FFMA per element over 2**26 elements, and reads two fp32 tensors of that size.
    assert totals["flops"] == totals["flops_fp32"] == 2 * 67_108_864
    assert totals["dram_read"] == pytest.approx(2 * 4 * 2**26, rel=1e-4)
    assert totals["ns"] == 181_856


def test_parse_raw_csv_roofline_set_h200():
    records = ncu.parse_raw_csv(fixture_text("ncu_set-roofline_raw_h200.csv"))
    assert [r["id"] for r in records] == [0, 1, 2, 3, 4]
    assert records[2]["kernel"].startswith("void at::vectorized_elementwise_kernel<4, at::AUnaryFunctor<float, float, float, binary_internal::MulFunctor")
    assert records[4]["kernel"] == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    mul, add, gemm = (ncu.kernel_totals(records[i]) for i in (2, 3, 4))
    # The roofline set gives no read/write split: DRAM bytes come from the rate times the duration.
    assert add["dram_read"] is None and add["dram_write"] is None
    assert add["dram_bytes"] == pytest.approx(4_040_428_877_769.84 * 44_768e-9)
    assert add["ns"] == 44_768
    # The FP32 counters come as per-cycle rates; times the elapsed cycles they give counts over 4096 x 4096 floats.
    assert mul["flops_fp32"] == pytest.approx(4096**2, rel=1e-4)
    assert add["flops_fp32"] == pytest.approx(2 * 4096**2, rel=1e-4)
    # A bf16 2048^3 matrix product on the tensor cores.
    assert gemm["flops_tensor"] == 2 * 2048**3
    assert gemm["flops"] == pytest.approx(2 * 2048**3)
    assert records[0]["units"]["dram__bytes.sum.per_second"] == "byte/second"


CRAFTED = textwrap.dedent(
    """\
    ==PROF== Connected to process 7 (/usr/bin/python3)
    some line the program printed
    ==PROF== Disconnected from process 7
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","lts__t_bytes.sum","gpu__time_duration.sum","dram__bytes.sum.per_second","smsp__sass_thread_inst_executed_op_ffma_pred_on.sum","smsp__sass_thread_inst_executed_op_fadd_pred_on.sum","smsp__sass_thread_inst_executed_op_fmul_pred_on.sum","smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"
    "","","","","","","","","","","","Mbyte","Kbyte","Gbyte","usecond","Gbyte/second","inst","inst","inst","inst"
    "0","7","python3","host","alpha_kernel","1","7","(128, 1, 1)","(256, 4, 1)","0","9.0","1,234.5","2","1.5","12.25","3,100","1,000","10","20","5"
    "1","7","python3","host","beta_kernel","1","7","(64, 1, 1)","(8, 1, 1)","0","9.0","0.5","(!) n/a","0.002","0.5","n/a","0","0","0","0"
    "2","7","python3","host","alpha_kernel","1","7","(128, 1, 1)","(256, 4, 1)","0","9.0","2","4","1","1","1","2","0","0","0"
    """
)


def test_parse_raw_csv_converts_units_and_separators():
    records = ncu.parse_raw_csv(CRAFTED)
    assert [r["kernel"] for r in records] == ["alpha_kernel", "beta_kernel", "alpha_kernel"]
    m0, m1 = records[0]["metrics"], records[1]["metrics"]
    assert m0["dram__bytes_read.sum"] == pytest.approx(1_234_500_000)
    assert m0["dram__bytes_write.sum"] == pytest.approx(2_000)
    assert m0["lts__t_bytes.sum"] == pytest.approx(1.5e9)
    assert m0["gpu__time_duration.sum"] == pytest.approx(12_250)
    assert m0["dram__bytes.sum.per_second"] == pytest.approx(3.1e12)
    assert records[0]["units"]["dram__bytes.sum.per_second"] == "byte/second"
    assert m1["dram__bytes_write.sum"] is None and m1["dram__bytes.sum.per_second"] is None
    t0, t1 = ncu.kernel_totals(records[0]), ncu.kernel_totals(records[1])
    assert t0["flops_fp32"] == 2 * 1_000 + 10 + 20
    assert t0["flops"] == 2 * 1_000 + 10 + 20 + 4 * 5
    # A missing write count leaves the launch's DRAM total unknown rather than half-counted.
    assert t1["dram_read"] == pytest.approx(500_000) and t1["dram_bytes"] is None


def test_parse_raw_csv_without_a_table():
    assert ncu.parse_raw_csv("==PROF== No kernels were profiled.\n") == []
    assert ncu.parse_raw_csv("") == []


@pytest.mark.parametrize(
    "cell, value",
    [("1,234,567", 1_234_567.0), ("-1,234.5", -1234.5), ("0.20", 0.2), ("1.5e3", 1500.0), ("(!) n/a", None),
     ("n/a", None), ("", None), ("(128, 1, 1)", "(128, 1, 1)"), ("PolicySpread", "PolicySpread"), ("1,23", "1,23")],
    ids=lambda v: repr(v),
)
def test_parse_value(cell, value):
    assert ncu.parse_value(cell) == value


@pytest.mark.parametrize(
    "unit, factor, base",
    [("byte", 1, "byte"), ("Kbyte", 1e3, "byte"), ("Mbyte", 1e6, "byte"), ("Gbyte", 1e9, "byte"), ("KiB", 1024, "byte"),
     ("nsecond", 1, "ns"), ("ns", 1, "ns"), ("usecond", 1e3, "ns"), ("msecond", 1e6, "ns"), ("second", 1e9, "ns"),
     ("byte/s", 1, "byte/second"), ("Gbyte/second", 1e9, "byte/second"), ("Tbyte/second", 1e12, "byte/second"),
     ("cycle/nsecond", 1e9, "cycle/second"), ("Mhz", 1e6, "hz"), ("inst", 1, "inst"), ("Kinst", 1e3, "inst"),
     ("inst/cycle", 1, "inst/cycle"), ("byte/block", 1, "byte/block"), ("%", 1, "%"), ("", 1, "")],
    ids=lambda v: str(v),
)
def test_unit_scale(unit, factor, base):
    got_factor, got_base = ncu.unit_scale(unit)
    assert got_factor == pytest.approx(factor) and got_base == base


FAKE_KERNELS = (
    ncu.KernelKind("alpha_kernel", "mamba2", ("conventional",), None),
    ncu.KernelKind("alpha_kernel_flush", "mamba2", ("replay", "split"), "flush"),
    ncu.KernelKind("beta_kernel", "mamba2", ("replay", "split"), None),
    ncu.KernelKind("beta_kernel", "gdn", ("replay",), None),
)


def test_match_kernel_by_name_op_and_variant(monkeypatch):
    monkeypatch.setattr(ncu, "KERNELS", FAKE_KERNELS)
    assert ncu.match_kernel("alpha_kernel") == FAKE_KERNELS[0]
    assert ncu.match_kernel("alpha_kernel_flush") == FAKE_KERNELS[1]
    assert ncu.match_kernel("beta_kernel", op="gdn") == FAKE_KERNELS[3]
    assert ncu.match_kernel("beta_kernel", op="mamba2", variant="split") == FAKE_KERNELS[2]
    assert ncu.match_kernel("beta_kernel", op="gdn", variant="split") is None
    assert ncu.match_kernel("void at::vectorized_elementwise_kernel<4>") is None
    assert ncu.kernels_for("mamba2", "replay") == FAKE_KERNELS[1:3]
    assert ncu.kernel_regex(ncu.kernels_for("mamba2", "replay")) == "regex:alpha_kernel_flush|beta_kernel"
    with pytest.raises(ValueError, match="no kernels"):
        ncu.kernel_regex(())


def _launched_jit_functions(paths: list[Path]) -> list[str]:
    """@triton.jit functions that some file launches as `name[grid](...)`: kernels, not inlined helpers."""
    jit, launched = set(), set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    target = dec.func if isinstance(dec, ast.Call) else dec
                    if (isinstance(target, ast.Attribute) and target.attr == "jit") or (isinstance(target, ast.Name) and target.id == "jit"):
                        jit.add(node.name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                value = node.func.value
                if isinstance(value, ast.Name):
                    launched.add(value.id)
                elif isinstance(value, ast.Attribute):
                    launched.add(value.attr)
    return sorted(jit & launched)


def our_triton_kernels() -> dict[tuple[str, str], str]:
    found = {}
    for op in ("mamba2", "gdn"):
        for name in _launched_jit_functions(sorted((KERNEL_DIR / op).glob("*.py"))):
            found[(op, name)] = op
    return found


def test_kernel_table_covers_every_triton_kernel():
    kernels = our_triton_kernels()
    if not kernels:
        pytest.skip("no launched @triton.jit kernels under kernels/ yet")
    unlisted = [f"{op}: {name}" for (op, name) in kernels if not ncu.match_kernel(name, op)]
    assert not unlisted, f"add these to replayssm_cli.measure.ncu.KERNELS: {unlisted}"
    stale = [f"{k.op}: {k.name}" for k in ncu.KERNELS if not any(k.name in name for (op, name) in kernels if op == k.op)]
    assert not stale, f"KERNELS lists kernels that no longer exist: {stale}"
    for kind in ncu.KERNELS:
        assert set(kind.variants) <= set(ncu.STEP_VARIANTS) and kind.phase in (None, "nonflush", "flush")
    # Every op and plain variant has something to profile.
    for op in ("mamba2", "gdn"):
        for variant in ncu.STEP_VARIANTS:
            assert ncu.kernels_for(op, variant), f"no kernel listed for {op} {variant}"


@pytest.mark.parametrize("op", ["mamba2", "gdn"])
def test_a_replay_step_profiles_every_kernel_replay_launches(op):
    """Every kernel that an op's replay.py launches (its flush launch too: an fp32 or 8-bit checkpoint's flush runs
    in a launch of its own) is profiled for the replay variant, so a flush step's bytes are all counted."""
    # materialize, beside the step in replay.py, is no part of a decode step (KERNELS lists it serving no variant)
    off_step = {k.name for k in ncu.KERNELS if k.op == op and not k.variants}
    launched = set(_launched_jit_functions([KERNEL_DIR / op / "replay.py"])) - off_step
    profiled = {k.name for k in ncu.kernels_for(op, "replay")}
    assert launched and launched <= profiled, f"{op} replay launches {sorted(launched - profiled)} unprofiled"


@pytest.mark.parametrize(
    "spec, expected",
    [({"variant": "conventional"}, (2, 1)), ({"variant": "replay", "window": 16}, (16, 16)),
     ({"variant": "split", "window": 8, "phase": "flush"}, (8, 1)), ({"variant": "replay", "window": 4, "phase": "nonflush"}, (4, 1)),
     ({"variant": "spec-conventional", "draft": 4}, (2, 1))],
    ids=["conventional", "replay-avg", "split-flush", "replay-nonflush", "spec-conventional"],
)
def test_profiled_steps(spec, expected):
    assert ncu.profiled_steps(spec) == expected


def test_ncu_command_leaves_clocks_alone():
    cmd = ncu.ncu_command("/x/ncu", "/tmp/s.json", "regex:a|b", ["m1", "m2"], python="/py")
    assert cmd[0] == "/x/ncu"
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--metrics") + 1] == "m1,m2"
    assert cmd[cmd.index("-k") + 1] == "regex:a|b"
    assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
    assert cmd[-4:] == ["/py", "-m", "replayssm_cli.measure.ncu_child", "/tmp/s.json"]


FAKE_NCU = """\
#!{python}
# Stands in for ncu: answers like it for the arguments measure() passes, from a scenario file.
import json, sys
args = sys.argv[1:]
scenario = json.load(open({scenario!r}))
log = open({log!r}, "a")
log.write(json.dumps(args) + "\\n")
if scenario.get("fail"):
    print(scenario["fail"])
    sys.exit(1)
if "--import" in args:
    sys.stdout.write(open(args[args.index("--import") + 1]).read())
    sys.exit(0)
if "--export" in args:
    # An ncu that exports a report writes its results there, not to the console.
    sys.stdout = open(args[args.index("--export") + 1], "w")
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler")
    print("Version 2025.3.1.0 (build 36398880) (public-release)")
    sys.exit(0)
metrics = args[args.index("--metrics") + 1].split(",")
if scenario.get("unknown") and scenario["unknown"] in metrics:
    print("==ERROR== Failed to find metric " + scenario["unknown"])
    sys.exit(1)
names = ["ID", "Kernel Name"] + metrics
units = ["", ""] + ["byte" if "bytes" in m else ("ns" if "time" in m else ("sector" if "sectors" in m else "inst")) for m in metrics]
print("==PROF== Connected to process 1")
print(",".join('"%s"' % n for n in names))
print(",".join('"%s"' % u for u in units))
if args[-2] == "-c":
    print(",".join('"%s"' % c for c in ["0", "vectorized_elementwise_kernel"] + ["1,024"] * len(metrics)))
    sys.exit(0)
job = json.load(open(args[-1]))
layers, steps = scenario["layers"], job["steps"]
json.dump({{"layers": layers, "steps": steps}}, open(job["info"], "w"))
wanted = args[args.index("-k") + 1].removeprefix("regex:").split("|")
launches = scenario.get("launches") or [[name, scenario["values"]] for name in wanted]
row = 0
for step in range(steps):
    for layer in range(layers):
        for name, values in launches:
            cells = [str(row), name] + ["{{:,}}".format(values.get(m, 0)) for m in metrics]
            print(",".join('"%s"' % c for c in cells))
            row += 1
"""


def make_fake_ncu(tmp_path: Path, scenario: dict) -> tuple[str, Path]:
    scen = tmp_path / "scenario.json"
    scen.write_text(json.dumps(scenario))
    log = tmp_path / "calls.log"
    exe = tmp_path / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, scenario=str(scen), log=str(log)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe), log


LAUNCH = {
    "dram__bytes_read.sum": 1_000_000,
    "dram__bytes_write.sum": 400_000,
    "lts__t_bytes.sum": 2_000_000,
    "gpu__time_duration.sum": 5_000,
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 300,
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 7,
    "lts__t_sectors_srcunit_tex_op_write.sum": 12_500,
}


def test_measure_one_through_a_fake_ncu(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "KERNELS", FAKE_KERNELS)
    exe, log = make_fake_ncu(
        tmp_path,
        {"layers": 3, "launches": [["beta_kernel", LAUNCH], ["some_torch_copy_kernel", LAUNCH]],
         "unknown": "sm__ops_path_tensor_src_fp8_sparsity_on.sum"},
    )
    spec = {"op": "mamba2", "preset": "tiny", "variant": "replay", "batch": 4, "window": 4, "state_dtype": "fp32"}
    got = ncu.measure_one(spec, ncu=exe, python="/py")
    assert got["ok"], got["reason"]
    # A whole window (4 steps) of 3 layers, one launch of ours per layer step: figures are per layer step.
    assert got["steps"] == 4 and got["layers"] == 3 and got["launches"] == {"beta_kernel": 12}
    assert got["bytes_read"] == 1_000_000 and got["bytes_written"] == 400_000
    assert got["dram_bytes"] == 1_400_000 and got["l2_bytes"] == 2_000_000
    assert got["l2_write_bytes"] == 12_500 * 32
    assert got["flops"] == 2 * 300 + 7
    assert got["us"] == pytest.approx(5.0)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # The first run asked for a metric this "GPU" lacks; the retry asked without it.
    assert len(calls) == 2
    assert "sm__ops_path_tensor_src_fp8_sparsity_on.sum" in calls[0][calls[0].index("--metrics") + 1]
    assert "sm__ops_path_tensor_src_fp8_sparsity_on.sum" not in calls[1][calls[1].index("--metrics") + 1]
    assert calls[1][calls[1].index("-k") + 1] == "regex:alpha_kernel_flush|beta_kernel"
    job = json.loads(Path(calls[1][-1]).read_text()) if Path(calls[1][-1]).exists() else None
    assert job is None, "the spec file lives in a temporary directory that is removed afterwards"


def test_measure_keeps_each_report_and_the_table_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "KERNELS", FAKE_KERNELS)
    exe, log = make_fake_ncu(tmp_path, {"layers": 1, "launches": [["beta_kernel", LAUNCH]]})
    spec = {"op": "mamba2", "preset": "tiny", "variant": "replay", "batch": 4, "window": 4, "state_dtype": "fp32"}
    reports = tmp_path / "reports"
    reports.mkdir()
    (got,) = ncu.measure([spec], ncu=exe, progress=False, report_dir=reports)
    assert got["ok"], got["reason"]
    kept = Path(got["report"])
    assert kept.parent == reports and kept.name == ncu.report_name(spec) and kept.suffix == ".ncu-rep" and kept.is_file()
    # The figures came from the kept report, read back through ncu --import.
    assert got["bytes_read"] == 1_000_000 and got["l2_bytes"] == 2_000_000
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0][calls[0].index("--export") + 1] == str(kept) and calls[-1][:2] == ["--import", str(kept)]

    rows = [{"preset": "tiny", "variant": "replay", "phase": "avg", "batch": 4, "window": 4, "bytes_read": 900_000,
             "bytes_written": 400_000, "flops": 600}]
    ncu.annotate_rows(rows, [spec], measure_fn=lambda specs, **kw: ncu.measure(specs, progress=False, **kw), ncu=exe,
                      report_dir=reports, warn=print)
    assert rows[0]["x_ncu_report"] == str(kept)
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(ncu.comparison_table(rows))
    assert kept.name in console.export_text()


def test_measure_one_reports_failures_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "KERNELS", FAKE_KERNELS)
    exe, _ = make_fake_ncu(tmp_path, {"fail": "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"})
    got = ncu.measure_one({"op": "mamba2", "variant": "conventional", "batch": 1}, ncu=exe)
    assert not got["ok"] and "ERR_NVGPUCTRPERM" in got["reason"] and "\n" not in got["reason"]
    exe, _ = make_fake_ncu(tmp_path, {"layers": 1, "launches": [["some_torch_copy_kernel", LAUNCH]]})
    got = ncu.measure_one({"op": "mamba2", "variant": "conventional", "batch": 1}, ncu=exe)
    assert not got["ok"] and "some_torch_copy_kernel" in got["reason"]
    assert "no kernel of ours" in ncu.measure_one({"op": "gdn", "variant": "conventional"}, ncu=exe)["reason"]
    assert "names no op" in ncu.measure_one({"variant": "conventional"}, ncu=exe)["reason"]


def test_measure_runs_each_distinct_spec_once(tmp_path, monkeypatch):
    monkeypatch.setattr(ncu, "KERNELS", FAKE_KERNELS)
    exe, log = make_fake_ncu(tmp_path, {"layers": 2, "launches": [["alpha_kernel", LAUNCH]]})
    a = {"op": "mamba2", "variant": "conventional", "batch": 1}
    b = {"op": "mamba2", "variant": "conventional", "batch": 2}
    got = ncu.measure([a, b, dict(a)], ncu=exe, progress=False)
    assert [g["ok"] for g in got] == [True, True, True]
    assert len(log.read_text().splitlines()) == 2


def test_ncu_available_says_why_not(tmp_path):
    ncu._probe.cache_clear()
    ok, reason = ncu.ncu_available(str(tmp_path / "missing-ncu"))
    assert not ok and "does not run" in reason
    exe, _ = make_fake_ncu(tmp_path, {"fail": "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"})
    ok, reason = ncu.ncu_available(exe)
    assert not ok and "ERR_NVGPUCTRPERM" in reason and "\n" not in reason


def test_ncu_available_without_any_ncu(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_candidates", lambda: [])
    ok, reason = ncu.ncu_available()
    assert not ok and reason.startswith("ncu not found")


def _row(**kw):
    row = {"kind": "kernel", "op": "mamba2", "preset": "tiny", "variant": "replay", "phase": "avg", "batch": 4,
           "source": "measured", "status": "ok", "bytes_read": 1_000_000, "bytes_written": 250_000, "flops": 500}
    row.update(kw)
    return row


def test_annotate_rows_adds_measured_fields():
    rows = [_row(), _row(variant="conventional"), _row(phase="flush")]
    specs = [{"op": "mamba2", "variant": "replay"}, None, {"op": "mamba2", "variant": "replay", "phase": "flush"}]
    measured = {
        "ok": True, "bytes_read": 1_100_000.0, "bytes_written": 200_000.0, "dram_bytes": 1_300_000.0,
        "l2_bytes": 2e6, "l2_write_bytes": 250_000.0, "flops": 450.0, "us": 3.5,
    }
    seen = []

    def fake_measure(specs, **kw):
        seen.extend(specs)
        return [measured, {"ok": False, "reason": "out of memory"}]

    lines = []
    out = ncu.annotate_rows(rows, specs, measure_fn=fake_measure, warn=lines.append)
    assert out is rows and seen == [specs[0], specs[2]]
    r = rows[0]
    assert r["x_ncu_bytes_read"] == 1_100_000 and r["x_ncu_bytes_written"] == 200_000
    assert r["x_ncu_l2_bytes"] == 2e6 and r["x_ncu_flops"] == 450 and r["x_ncu_us"] == 3.5
    assert r["x_ncu_diff_pct"] == pytest.approx(100 * (1_300_000 - 1_250_000) / 1_250_000)
    assert r["x_ncu_flops_diff_pct"] == pytest.approx(-10.0)
    assert not any(k.startswith("x_ncu") for k in rows[1]) and not any(k.startswith("x_ncu") for k in rows[2])
    assert len(lines) == 1 and "out of memory" in lines[0]
    from replayssm_cli.report.results import validate_row

    validate_row(r)


def test_specs_for_rows_pairs_rows_with_profile_points():
    from replayssm_cli.measure.grid import Point

    common = dict(source_name="tiny.toml", op="mamba2", batch=4, state_dtype="fp32", io_dtype="bf16")
    conv = Point(preset="tiny", variant="conventional", window=None, read_dtype=None, **common)
    rep = Point(preset="tiny", variant="replay", window=8, read_dtype=None, **common)
    split = Point(preset="tiny", variant="split", window=8, read_dtype="bf16", **common)
    base = {"state_dtype": "fp32", "io_dtype": "bf16", "draft": 0, "tp": 1}
    rows = [
        _row(variant="replay", window=8, read_dtype=None, phase="flush", **base),
        _row(variant="split", window=8, read_dtype="bf16", phase="avg", **base),
        _row(variant="conventional", window=None, read_dtype=None, **base),
        _row(variant="replay", window=8, read_dtype=None, source="predicted", **base),
        _row(variant="replay", window=8, read_dtype=None, status="failed", **base),
        _row(variant="replay", window=16, read_dtype=None, **base),
    ]
    specs = ncu.specs_for_rows(rows, [conv, rep, split], seed=3)
    assert specs[3:] == [None, None, None]
    flush, avg, plain = specs[:3]
    assert flush == {**rep.case_spec(3), "op": "mamba2", "phase": "flush", "flush": "aligned", "layers": 1}
    assert avg["variant"] == "split" and avg["read_dtype"] == "bf16" and avg["flush"] == "staggered" and avg["phase"] == "avg"
    assert plain["variant"] == "conventional" and plain["preset"] == "tiny.toml"
    assert ncu.profiled_steps(flush) == (8, 1) and ncu.profiled_steps(avg) == (8, 8)


def test_comparison_table_lists_measured_rows():
    from rich.console import Console

    assert ncu.comparison_table([_row()]) is None
    row = _row(window=16, x_ncu_bytes_read=1.1e6, x_ncu_bytes_written=2e5, x_ncu_diff_pct=4.0, x_ncu_us=3.5)
    console = Console(width=200, record=True)
    console.print(ncu.comparison_table([row, _row()]))
    text = console.export_text()
    assert "+4.0%" in text and "1.10" in text and "3.5" in text and text.count("tiny") == 1


def test_annotate_rows_without_ncu_leaves_rows_alone(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_candidates", lambda: [])
    rows = [_row()]
    before = dict(rows[0])
    lines = []
    ncu.annotate_rows(rows, [{"op": "mamba2", "variant": "replay"}], warn=lines.append)
    assert rows[0] == before
    assert len(lines) == 1 and "ncu not found" in lines[0]
    with pytest.raises(ValueError, match="pair up"):
        ncu.annotate_rows(rows, [], warn=lines.append)


class FakeCase:
    def __init__(self, events):
        self.events = events
        self.layers = [object(), object()]

    def step(self):
        self.events.append("step")

    def close(self):
        self.events.append("close")


def test_ncu_child_profiles_only_the_measured_steps(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    events: list[str] = []
    import types

    fake_bench = types.ModuleType("replayssm_cli.measure.bench")
    fake_bench.make_case = lambda spec, device: events.append(f"make {spec['variant']} {device}") or FakeCase(events)
    monkeypatch.setitem(sys.modules, "replayssm_cli.measure.bench", fake_bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append("stop"))
    info = tmp_path / "info.json"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"case": {"variant": "replay"}, "warmup": 3, "steps": 2, "info": str(info)}))
    assert ncu_child.run(spec) == {"layers": 2, "steps": 2, "warmup": 3}
    assert events == ["make replay cuda", "step", "step", "step", "start", "step", "step", "stop", "close"]
    assert json.loads(info.read_text())["layers"] == 2


def test_ncu_child_usage(capsys):
    assert ncu_child.main([]) == 2
    assert "usage" in capsys.readouterr().err


@pytest.fixture
def kernel_device():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and TRITON_INTERPRET=1 is not set")
    return "cpu"


def test_ncu_child_runs_a_real_case_on_this_device(tmp_path, kernel_device):
    """The child drives the profiler's own make_case; on the CPU through Triton's interpreter, without ncu."""
    info = tmp_path / "info.json"
    spec = tmp_path / "spec.json"
    case = {"op": "mamba2", "variant": "replay", "phase": "flush", "flush": "aligned", "batch": 3, "window": 3,
            "state_dtype": "fp32", "io_dtype": "fp32", "shape": {"op": "mamba2", "H": 2, "P": 4, "N": 8, "G": 1},
            "ssm_layers": 4, "layers": 2, "seed": 1}
    warmup, steps = ncu.profiled_steps(case)
    assert (warmup, steps) == (3, 1)
    spec.write_text(json.dumps({"case": case, "warmup": warmup, "steps": steps, "info": str(info), "device": kernel_device}))
    got = ncu_child.run(spec)
    assert got == {"layers": 2, "steps": 1, "warmup": 3}
    assert json.loads(info.read_text()) == got


def _load_ncu_check():
    import benchmark_scripts

    return benchmark_scripts.load("ncu_check")


def _check_with_a_fake_ncu(tmp_path):
    """ncu_check.py and a fake ncu for the Mamba-2 kernels of a small grid: what a step launches, one kernel per variant
    (each call's filter also names the large grids' heads and flush kernels, which this grid does not launch)."""
    ncu._probe.cache_clear()
    exe, log = make_fake_ncu(tmp_path, {"layers": 1, "launches": [["mamba2_decode_kernel", LAUNCH],
                                                                  ["mamba2_replay_kernel", LAUNCH]]})
    return _load_ncu_check(), exe, log


def test_ncu_check_script_end_to_end_with_a_fake_ncu(tmp_path, capsys):
    check, exe, log = _check_with_a_fake_ncu(tmp_path)
    out = tmp_path / "check.json"
    rc = check.main(["--preset", "nemotron-3-super-120b-a12b", "--batch", "64", "--ncu", exe, "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(r["variant"], r["phase"]) for r in rows] == [(v, p) for _, v, _, p in check.CONFIGS]
    for r in rows:
        assert r["ok"] and r["ncu_bytes_read"] == 1_000_000 and r["ncu_bytes_written"] == 400_000
        assert r["diff_read_pct"] == pytest.approx(100 * (1_000_000 - r["model_bytes_read"]) / r["model_bytes_read"])
    flush = next(r for r in rows if r["variant"] == "replay" and r["phase"] == "flush")
    assert flush["fill"] == 15 and flush["model_bytes_written"] > 64 * 128 * 64 * 128 * 4
    assert doc["ncu"] == {"path": exe, "version": "Version 2025.3.1.0 (build 36398880) (public-release)"}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    calls = [c for c in calls if "--metrics" in c]
    # The probe, then one run per configuration, each filtered to the kernel of its op and variant.
    assert len(calls) == 1 + len(check.CONFIGS)
    assert {c[c.index("-k") + 1] for c in calls[1:]} == {
        "regex:mamba2_decode_kernel", "regex:mamba2_flush_kernel|mamba2_heads_kernel|mamba2_replay_kernel"}
    printed = capsys.readouterr().out
    assert "Cost model vs Nsight Compute" in printed and "nonflush" in printed


def test_specs_from_rows_rebuilds_each_measured_kernel_row():
    rows = [
        {"kind": "kernel", "source": "measured", "status": "ok", "op": "mamba2", "phase": "flush", "window": 16,
         "x_case": {"variant": "replay", "batch": 4, "window": 16, "preset": "nemotron-3-super-120b-a12b"}},
        {"kind": "kernel", "source": "measured", "status": "ok", "op": "gdn", "phase": "avg", "window": None,
         "x_case": {"variant": "conventional", "batch": 2}},
        {"kind": "kernel", "source": "predicted", "status": "ok", "op": "gdn", "phase": "avg"},
        {"kind": "kernel", "source": "measured", "status": "failed", "op": "gdn", "phase": "avg", "x_case": {"batch": 1}},
        {"kind": "e2e", "source": "measured", "status": "ok", "op": "mamba2", "phase": "avg", "x_case": {"batch": 1}},
    ]
    specs = ncu.specs_from_rows(rows)
    assert specs[0] == {"variant": "replay", "batch": 4, "window": 16, "preset": "nemotron-3-super-120b-a12b",
                        "op": "mamba2", "phase": "flush", "layers": 1, "flush": "aligned"}
    assert specs[1] == {"variant": "conventional", "batch": 2, "op": "gdn", "phase": "avg", "layers": 1}
    assert specs[2:] == [None, None, None]


def test_profile_ncu_on_a_predicted_profile_says_it_has_no_figures(tmp_path):
    from typer.testing import CliRunner

    from replayssm_cli.main import app

    result = CliRunner().invoke(app, ["profile", "--predict", "--batch", "1", "--ncu", "--json", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    assert "--ncu needs measured rows" in result.output
    assert (tmp_path / "p.json").is_file()


def test_profile_ncu_report_folder_is_checked_before_the_run(tmp_path):
    from typer.testing import CliRunner

    from replayssm_cli.main import app

    taken = tmp_path / "a-file"
    taken.write_text("")
    result = CliRunner().invoke(app, ["profile", "--predict", "--batch", "1", "--ncu-report", str(taken / "reports"),
                                      "--out", str(tmp_path / "p.json")])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "--ncu-report" in lines[0], result.output
    assert not (tmp_path / "p.json").exists()
    # It implies --ncu, which a predicted profile cannot honour: said in one line, the folder made and left empty.
    result = CliRunner().invoke(app, ["profile", "--predict", "--batch", "1", "--ncu-report", str(tmp_path / "reports"),
                                      "--json", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0 and "--ncu needs measured rows" in result.output
    assert list((tmp_path / "reports").iterdir()) == []


def test_ncu_check_remodel_keeps_the_measurements_and_recomputes_the_model(tmp_path, capsys):
    """--remodel: the stored ncu figures stay, the model's columns and differences follow the current cost model."""
    check = _load_ncu_check()
    stored_rows = []
    for entry in check.plan([("nemotron-3-super-120b-a12b", presets.resolve("nemotron-3-super-120b-a12b"))], [64], 16,
                            "fp32", "bf16", 1):
        row = {k: v for k, v in entry.items() if k != "spec"}
        # A stale model: every count 10% high; the measurement is 2% above the current model's reads.
        stale = {k: int(row[k] * 1.1) for k in ("model_bytes_read", "model_bytes_written", "model_flops")}
        measured = {"ncu_bytes_read": row["model_bytes_read"] * 1.02, "ncu_bytes_written": row["model_bytes_written"],
                    "ncu_dram_bytes": row["model_bytes_read"] * 1.02 + row["model_bytes_written"],
                    "ncu_l2_bytes": 1.0, "ncu_l2_write_bytes": row["model_bytes_written"], "ncu_flops": 1.0, "ncu_us": 5.0,
                    "ncu_launches": {"k": 1}}
        stored_rows.append({**row, **stale, **measured, "ok": True, "reason": None})
    stored = {"kind": "replayssm-ncu-check", "created": "2026-01-01T00:00:00+00:00", "environment": {"commit": "abc"},
              "ncu": {"path": "/x/ncu", "version": "V"},
              "settings": {"window": 16, "state_dtype": "fp32", "io_dtype": "bf16", "layers": 1, "batches": [64],
                           "presets": ["nemotron-3-super-120b-a12b"]},
              "rows": stored_rows[:-1]}  # the last configuration missing
    src, out = tmp_path / "stored.json", tmp_path / "remodelled.json"
    src.write_text(json.dumps(stored))
    assert check.main(["--remodel", str(src), "--out", str(out)]) == 1  # one configuration not measured
    doc = json.loads(out.read_text())
    assert doc["created"] == stored["created"] and doc["environment"] == {"commit": "abc"} and doc["ncu"]["path"] == "/x/ncu"
    assert [p["model_bytes_read"] for p in doc["remodelled"]["previous_model"]] == [r["model_bytes_read"] for r in stored_rows[:-1]]
    for row, old in zip(doc["rows"][:-1], stored_rows):
        assert row["ok"] and row["ncu_bytes_read"] == old["ncu_bytes_read"]
        assert row["model_bytes_read"] == pytest.approx(old["model_bytes_read"] / 1.1, rel=1e-6)
        assert row["diff_read_pct"] == pytest.approx(2.0)
    assert not doc["rows"][-1]["ok"] and doc["rows"][-1]["reason"] == "not in the stored check"
    assert "Cost model vs Nsight Compute" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert check.main(["--remodel", str(bad)]) == 2
    assert "is not a stored ncu check" in capsys.readouterr().err


def test_ncu_check_plans_eight_bit_states_and_stochastic_rounding(tmp_path, capsys):
    """--state-dtype takes several dtypes and --rounding stochastic: each row's model counts the scales and draws."""
    from replayssm_cli.model import cost

    check, exe, _ = _check_with_a_fake_ncu(tmp_path)
    out = tmp_path / "check.json"
    rc = check.main(["--preset", "nemotron-3-super-120b-a12b", "--batch", "8", "--state-dtype", "int8,bf16",
                     "--rounding", "stochastic", "--configs", "conventional,flush,split-flush", "--ncu", exe, "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    got = [(r["state_dtype"], r["rounding"], r["variant"], r["phase"]) for r in doc["rows"]]
    # no split row over an int8 checkpoint: no read copy is narrower
    assert got == [("int8", "stochastic", "conventional", "avg"), ("int8", "stochastic", "replay", "flush"),
                   ("bf16", "stochastic", "conventional", "avg"), ("bf16", "stochastic", "replay", "flush")]
    p = presets.resolve("nemotron-3-super-120b-a12b")
    want = cost.step_cost(p.shape, "conventional", batch=8, state_dtype="int8", rounding="stochastic", has_z=p.has_z)
    assert doc["rows"][0]["model_bytes_read"] == want.bytes_read and doc["rows"][0]["model_int_ops"] == want.int_ops > 0
    assert doc["settings"]["rounding"] == "stochastic" and doc["settings"]["configs"] == ["conventional", "flush", "split-flush"]
    assert "int8 SR" in capsys.readouterr().out
    assert check.main(["--configs", "nosuch", "--ncu", exe]) == 2
