"""GPU specs, NVML detection (faked), the ceilings cache, the clock sampler and `replayssm gpu`."""

from __future__ import annotations

import json
import os
import sys
import time
import types

import pytest
from typer.testing import CliRunner

from replayssm_cli.model import gpus as G
from replayssm_cli.errors import UserError
from replayssm_cli.main import app

REQUIRED = ("a100-sxm4-80gb", "h100-sxm", "h100-pcie", "h200", "gh200", "b200", "b300", "l40s", "l4", "rtx-4090", "rtx-5090")
runner = CliRunner()


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


def fake_pynvml(name="NVIDIA H200", bus=6016, mem_clock=3201, fail=False, reasons_api="event", reason_mask=0x5):
    """A stand-in for pynvml that answers as one GPU (an H200 by default) or fails at nvmlInit."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2
    m.calls = []

    def init():
        if fail:
            raise FakeLibraryNotFound("NVML Shared Library Not Found")

    def unsupported(*_):
        raise FakeNotSupported("Not Supported")

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    m.nvmlDeviceGetName = lambda h: name
    m.nvmlDeviceGetUUID = lambda h: "GPU-8d6a-fake"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150754820096, free=149000000000, used=1754820096)
    m.nvmlDeviceGetMaxClockInfo = lambda h, which: {1: 1980, 2: mem_clock}[which]
    m.nvmlDeviceGetMemoryBusWidth = (lambda h: bus) if bus else unsupported
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    m.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    clocks = iter([1980, 1755, 1455, 1410] * 1000)
    m.nvmlDeviceGetClockInfo = lambda h, which: next(clocks) if which == 1 else 3201
    m.nvmlDeviceGetPowerUsage = lambda h: 690000
    if reasons_api == "event":
        m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reason_mask
    else:
        m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: reason_mask
    return m


@pytest.fixture
def nvml(monkeypatch, tmp_path):
    """Install a fake NVML (an H200) and an empty ceilings cache; CUDA is made to see nothing."""
    monkeypatch.setenv(G.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(G, "_cuda_sm_count", lambda index, uuid: (None, None))

    def install(**kwargs):
        module = fake_pynvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    install()
    return install


def test_every_required_gpu_spec_loads():
    keys = G.gpu_keys()
    assert set(REQUIRED) <= set(keys)
    for spec in G.list_gpus():
        for f in G.SPEC_FIELDS:
            value = getattr(spec, f)
            assert value > 0 or (f in G.OPTIONAL_ZERO and value == 0), (spec.key, f)
            assert f in spec.sources or f in spec.estimated, (spec.key, f)
        assert spec.match and spec.name


def test_h200_figures():
    s = G.load_gpu("h200")
    assert (s.hbm_gbs, s.fp32_tflops, s.tf32_tflops, s.bf16_tflops, s.fp8_tflops) == (4800, 67, 494.7, 989.4, 1978.9)
    assert (s.sm_count, s.memory_gib) == (132, 141)


@pytest.mark.parametrize(
    "device,key",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200-144g"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA L40", None),
        ("NVIDIA A100-SXM4-40GB", None),
        ("Tesla T4", None),
    ],
)
def test_match_spec(device, key):
    spec = G.match_spec(device)
    assert (spec.key if spec else None) == key


def test_load_gpu_by_key_name_and_device_name():
    assert G.load_gpu("H200").key == "h200"
    assert G.load_gpu("NVIDIA GeForce RTX 4090").key == "rtx-4090"
    assert G.load_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    with pytest.raises(UserError) as exc:
        G.load_gpu("voodoo3")
    assert all(k in exc.value.line() for k in REQUIRED)


def test_theoretical_bandwidth_from_clock_and_bus():
    d = G.DetectedGpu(0, "NVIDIA H200", None, "9.0", None, None, 1980, 3201, 6016, 700.0, None, None, None, None)
    assert d.theoretical_gbs == pytest.approx(2 * 3201e6 * 6016 / 8 / 1e9)
    assert G.format_gbs(d.theoretical_gbs) == "4.81 TB/s"
    assert G.format_gbs(864) == "864 GB/s"


def test_detect_h200(nvml):
    d = G.detect()
    assert d.name == "NVIDIA H200" and d.spec.key == "h200"
    assert (d.compute_capability, d.bus_width_bits, d.max_mem_clock_mhz, d.power_limit_w) == ("9.0", 6016, 3201, 700.0)
    assert (d.sm_count, d.sm_count_source) == (132, "spec h200")
    assert d.driver == "570.86.15" and d.theoretical_gbs == pytest.approx(4814.304)


def test_detect_sm_count_from_cuda(nvml, monkeypatch):
    monkeypatch.setattr(G, "_cuda_sm_count", lambda index, uuid: (132, "CUDA"))
    assert G.detect().sm_count_source == "CUDA"


def test_detect_without_bus_width(nvml):
    nvml(bus=None)
    d = G.detect()
    assert d.bus_width_bits is None and d.theoretical_gbs is None


def test_detect_fails_with_one_line_naming_gpu_option(nvml):
    nvml(fail=True)
    with pytest.raises(UserError) as exc:
        G.detect()
    assert "--gpu" in exc.value.line() and "\n" not in exc.value.line()


def test_detect_index_out_of_range(nvml):
    with pytest.raises(UserError, match="index 3 does not exist"):
        G.detect(3)


def _ceilings(driver="570.86.15", copy=4250.0):
    return G.Ceilings(
        copy_gbs=copy, read_gbs=4130.0, fp32_tflops=65.6, bf16_tflops=720.0, tf32_tflops=400.0, l2_gbs=9000.0,
        source=f"measured 2026-11-01, driver {driver}", measured_at="2026-11-01T10:00:00+00:00", driver=driver,
        gpu_name="NVIDIA H200", details={"copy_torch_gbs": copy},
    )


def test_ceilings_cache_round_trip(monkeypatch, tmp_path):
    monkeypatch.setenv(G.CACHE_ENV, str(tmp_path))
    assert G.cached_ceilings("NVIDIA H200", "570.86.15") is None
    path = G.save_ceilings(_ceilings())
    assert path == tmp_path / "ceilings.json"
    G.save_ceilings(_ceilings(driver="580.1", copy=4300.0))
    assert G.cached_ceilings("NVIDIA H200", "570.86.15") == _ceilings()
    assert G.cached_ceilings("NVIDIA H200", "580.1").copy_gbs == 4300.0
    assert G.cached_ceilings("NVIDIA H200", "999") is None
    assert G.cached_ceilings("NVIDIA H100 PCIe", "570.86.15") is None


def test_corrupt_cache_reads_as_empty(monkeypatch, tmp_path):
    monkeypatch.setenv(G.CACHE_ENV, str(tmp_path))
    (tmp_path / "ceilings.json").write_text("{not json")
    assert G.cached_ceilings("NVIDIA H200", "570.86.15") is None
    G.save_ceilings(_ceilings())
    assert G.cached_ceilings("NVIDIA H200", "570.86.15") is not None


def test_ceilings_for_prefers_cache_then_datasheet(nvml):
    spec, detected = G.load_gpu("h200"), G.detect()
    c = G.ceilings_for(spec, detected)
    assert c.source == "datasheet" and c.copy_gbs == 4800 and c.l2_gbs is None
    G.save_ceilings(_ceilings())
    assert G.ceilings_for(spec, detected).copy_gbs == 4250.0


def test_ceilings_for_a_detected_gpu_use_the_shipped_measurement_only_under_its_driver(nvml):
    from dataclasses import replace

    spec, detected = G.load_gpu("h200"), G.detect()
    shipped = G.shipped_ceilings(spec)
    same = replace(detected, name=shipped.gpu_name, driver=shipped.driver)
    assert G.ceilings_for(spec, same) == shipped
    other = replace(same, driver="999.1")
    assert G.ceilings_for(spec, other).source == "datasheet"


def test_ceilings_for_a_named_gpu_use_its_shipped_measurement_else_the_datasheet():
    shipped = G.ceilings_for(G.load_gpu("h200"))
    assert shipped.source.endswith("(shipped reference)") and shipped.source.startswith("measured")
    assert 3000 < shipped.copy_gbs < 4800 and shipped.read_gbs is not None and shipped.driver
    assert G.ceilings_for(G.load_gpu("b200")).source == "datasheet"


def test_measure_without_cuda_is_one_line(nvml, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        G.measure_ceilings()


def test_cli_gpu_prints_theoretical_bandwidth_of_h200(nvml):
    result = runner.invoke(app, ["gpu"])
    assert result.exit_code == 0, result.output
    assert "4.81 TB/s" in result.stdout and "4.80 TB/s" in result.stdout
    assert "h200" in result.stdout and "6016 bit" in result.stdout and "datasheet" in result.stdout


def test_cli_gpu_json(nvml):
    result = runner.invoke(app, ["gpu", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["gpu"]["name"] == "NVIDIA H200" and d["spec"]["key"] == "h200"
    assert d["theoretical_gbs"] == pytest.approx(4814.304)
    assert d["ceilings"]["source"] == "datasheet"


def test_cli_gpu_uses_cached_measurement(nvml):
    G.save_ceilings(_ceilings())
    result = runner.invoke(app, ["gpu"])
    assert result.exit_code == 0, result.output
    assert "measured 2026-11-01" in result.stdout and "4.25 TB/s" in result.stdout
    assert f"{100 * 4250 / 4800:.0f}%" in result.stdout


@pytest.mark.parametrize("how", ["nvml-fails", "no-nvidia-ml-py"])
def test_cli_gpu_without_gpu_is_one_line(nvml, monkeypatch, how):
    if how == "nvml-fails":
        nvml(fail=True)
    else:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    result = runner.invoke(app, ["gpu"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--gpu" in lines[0]
    assert result.stdout == ""


def test_cli_gpu_unknown_device_warns(nvml):
    nvml(name="NVIDIA Voodoo 9000")
    result = runner.invoke(app, ["gpu"])
    assert result.exit_code == 0, result.output
    assert "no spec file matches" in result.stderr and "no match" in result.stdout


def test_cli_gpu_named_spec(nvml):
    result = runner.invoke(app, ["gpu", "--gpu", "h200", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["gpu"] is None and d["spec"]["sm_count"] == 132 and d["ceilings"]["bf16_tflops"] == 989.4
    table = runner.invoke(app, ["gpu", "--gpu", "h100-pcie"])
    assert table.exit_code == 0 and "2.00 TB/s" in table.stdout and "Sources" in table.stdout


def test_cli_gpu_list():
    result = runner.invoke(app, ["gpu", "--gpu", "list"])
    assert result.exit_code == 0, result.output
    assert all(k in result.stdout for k in REQUIRED)


@pytest.mark.parametrize(
    "args,needle",
    [(["gpu", "--gpu", "voodoo3"], "valid keys"), (["gpu", "--gpu", "h200", "--measure"], "drop --gpu")],
    ids=["unknown-key", "measure-with-gpu"],
)
def test_cli_gpu_bad_input_is_one_line(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_decode_reasons():
    assert G.decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert G.decode_reasons(0x10000) == ["other_0x10000"]


@pytest.mark.parametrize("api", ["event", "throttle"])
def test_clock_sampler(nvml, api):
    nvml(reasons_api=api, reason_mask=0x5)
    with G.ClockSampler(interval_s=0.005) as sampler:
        time.sleep(0.05)
    s = sampler.summary()
    assert s["samples"] >= 3
    assert s["sm_mhz"]["min"] < s["sm_mhz"]["max"] and s["sm_mhz"]["max"] <= 1980
    assert s["mem_mhz"]["median"] == 3201 and s["power_w"]["max"] == 690
    assert s["reasons"] == ["sw_power_cap"]


def test_clock_sampler_without_nvml(nvml):
    nvml(fail=True)
    with pytest.raises(UserError):
        with G.ClockSampler():
            pass
    with G.ClockSampler(required=False) as sampler:
        pass
    assert sampler.summary() is None and "NVML" in sampler.error


interpret = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the ceiling kernels in Triton's interpreter")


@interpret
def test_ceiling_kernels_compute_what_they_claim():
    torch = pytest.importorskip("torch")
    from replayssm_kernels import ceilings as K

    g = torch.Generator().manual_seed(0)
    n = 2 * K.COPY_BLOCK + 37
    src = torch.rand(n, generator=g)
    dst = torch.full_like(src, float("nan"))
    K.copy(src, dst)
    assert torch.equal(dst, src)

    x = torch.rand(3 * K.READ_BLOCK * K.READ_TILES + 5, generator=g, dtype=torch.float64).float()
    partial = K.read_sum(x, reps=2)
    assert partial.numel() == 4 and not torch.isnan(partial).any()
    assert partial.double().sum().item() == pytest.approx(2 * x.double().sum().item(), rel=1e-5)
    small = K.read_sum(x[: 4 * 1024], reps=3, block=1024, tiles=2, bypass_l1=True)
    assert small.double().sum().item() == pytest.approx(3 * x[: 4 * 1024].double().sum().item(), rel=1e-5)

    out = torch.full((2 * K.FMA_BLOCK,), float("nan"))
    iters, a, c = 3, 0.999, 0.001
    K.fma(out, iters, a, c)
    x0 = torch.arange(out.numel(), dtype=torch.float64) * 1e-6
    chains = [x0, x0 + 0.25, x0 + 0.5, x0 + 0.75]
    for _ in range(iters * K.FMA_UNROLL):
        chains = [v * a + c for v in chains]
    torch.testing.assert_close(out.double(), sum(chains), rtol=1e-5, atol=1e-5)
    assert K.fma_flops(out.numel(), iters) == out.numel() * 4 * 2 * iters * K.FMA_UNROLL


def test_gpu_says_which_launch_table_a_chip_takes():
    from replayssm_cli.model.gpus import launch_table

    assert launch_table("9.0") == {"family": "sm_90", "table": "sm_90 table (tuned on an NVIDIA H200)", "tuned": True,
                                   "fp8": True, "pdl": True, "shared_kib_per_sm": 228}
    a100 = launch_table("8.0")
    assert a100["family"] == "sm_80" and not a100["tuned"] and "carried over untuned" in a100["table"]
    assert "without programmatic dependent launch" in a100["table"] and not a100["fp8"]
    assert launch_table("7.5")["family"] is None and launch_table(None) is None
    res = runner.invoke(app, ["gpu", "--gpu", "a100-sxm4-80gb", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["launch_table"]["family"] == "sm_80"
    res = runner.invoke(app, ["gpu", "--gpu", "rtx-5090"])
    assert res.exit_code == 0 and "launch table" in res.stdout and "sm_90 table carried over untuned" in res.stdout
