"""`replayssm profile --baseline`: the adapters against our reference, the settings sweep, missing packages, baseline rows."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from replayssm_cli.measure import baselines, bench
from replayssm_cli.model import presets
from replayssm_cli.measure import grid
from replayssm_cli.measure import profile as prof
from replayssm_cli.main import app
from replayssm_cli.report.results import load
from replayssm_kernels.mamba2 import decode_ref

SUPER, QWEN = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"
MAMBA2 = {"op": "mamba2", "H": 4, "P": 12, "N": 10, "G": 2}
GDN = {"op": "gdn", "H": 1, "HV": 2, "K": 12, "V": 10}
CEILINGS = SimpleNamespace(copy_gbs=4250.0, read_gbs=4130.0, fp32_tflops=65.6, bf16_tflops=700.0, tf32_tflops=None,
                           l2_gbs=None, source="measured", measured_at=None, driver="570", gpu_name="NVIDIA H200")


def case_spec(shape: dict, variant: str, **extra) -> dict:
    return {"shape": shape, "variant": variant, "batch": 5, "state_dtype": "fp32", "io_dtype": "bf16", "layers": 2,
            "ssm_layers": 4, "seed": 3, **extra}


@pytest.fixture
def cpu_device_context(monkeypatch):
    """Wrappers that enter torch.cuda.device(x.device.index) get None on the CPU; the CPU-only build's stub rejects it."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "_exchange_device", lambda index: -1)
        monkeypatch.setattr(torch.cuda, "_maybe_exchange_device", lambda index: -1)


class OursAsBaseline(baselines.Baseline):
    """A stand-in outside kernel: our plain-PyTorch reference on a (nslots, H, N, P) pool, with settings that run at
    different (made-up) speeds, and one that rounds its output wrong."""

    name = "stand-in"
    op = "mamba2"
    variant = "conventional"
    kernel = "tests.stand_in"
    install = "nothing to install"
    note = "a stand-in"

    def load_module(self):
        return decode_ref

    def settings(self, case):
        return [{"speed": 3}, {"speed": 2, "broken": True}, {"speed": 1}]

    def make(self, case, layer, settings):
        return SimpleNamespace(settings=settings, state=layer.state0.transpose(-1, -2).contiguous())

    def load(self, case, layer, handle, *, fills):
        handle.state.copy_(layer.state0.transpose(-1, -2))

    def step(self, case, layer, handle, i):
        args, kwargs = case._args(layer, i)
        view = handle.state.transpose(-1, -2)
        y = decode_ref(view, *args, **kwargs)
        return y * 1.1 if handle.settings.get("broken") else y

    def state(self, case, layer, handle, done):
        return handle.state.transpose(-1, -2)


@pytest.fixture
def stand_in():
    remove = baselines.register(OursAsBaseline())
    yield baselines.get("stand-in")
    remove()


def test_registry_names_ops_and_install_lines():
    assert set(baselines.names()) >= {"flashinfer-ssu", "flashinfer-checkpointing", "mamba-ssm", "fla", "vllm-ssu", "vllm-gdn"}
    for b in baselines.REGISTRY.values():
        assert b.op in ("mamba2", "gdn") and b.variant in ("conventional", "replay")
        assert "pip install" in b.install and "\n" not in b.install and b.kernel and b.note
    assert [b.name for b in baselines.resolve(("fla", "fla"))] == ["fla"]
    assert len(baselines.resolve((baselines.ALL,))) == len(baselines.REGISTRY)
    with pytest.raises(ValueError, match="no baseline named 'nope'"):
        baselines.get("nope")


def absent(name: str):
    raise ModuleNotFoundError(f"No module named '{name.split('.')[0]}'")


def test_missing_package_is_one_line_naming_what_to_install(monkeypatch):
    monkeypatch.setattr(baselines, "_import", absent)
    monkeypatch.delenv(baselines.MAMBA_SSM_TRITON_ENV, raising=False)
    for b in baselines.REGISTRY.values():
        ok, why = b.available()
        assert not ok and "\n" not in why and "pip install" in why and "No module named" in why, why


def test_mamba_ssm_file_path_problems_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(baselines.MAMBA_SSM_TRITON_ENV, str(tmp_path / "missing.py"))
    ok, why = baselines.get("mamba-ssm").available()
    assert not ok and "is not a file" in why and "\n" not in why
    lone = tmp_path / "selective_state_update.py"
    lone.write_text("from mamba_ssm.ops.triton.softplus import softplus\n")
    monkeypatch.setenv(baselines.MAMBA_SSM_TRITON_ENV, str(lone))
    if importlib.util.find_spec("mamba_ssm") is None and baselines.MAMBA_SSM_SOFTPLUS not in sys.modules:
        ok, why = baselines.get("mamba-ssm").available()
        assert not ok and "softplus.py beside it" in why


def test_stand_in_check_catches_a_wrong_output_and_a_wrong_layout(device, stand_in):
    case = bench.make_case(case_spec(MAMBA2, "baseline:stand-in"), device)
    try:
        assert case.kernel_variant == "conventional" and case.layers == 2
        assert case.check() <= case.tolerance()
        case.use_settings({"speed": 2, "broken": True})
        assert case.check() > case.tolerance(), "a wrong output must fail the check"
        case.use_settings({"speed": 1})
        layer = case._layers[0]
        layer.handle.state.copy_(layer.state0.transpose(-1, -2).flip(0))
        assert case.check() > case.tolerance(), "a state on the wrong slots must fail the check"
    finally:
        case.close()


def test_run_baseline_keeps_the_fastest_setting_that_passes(device, stand_in, monkeypatch):
    def fake_time_graph(case, *, steps, repeats):
        return [10.0 * case.settings["speed"] * (1 + 0.01 * random.random()) for _ in range(repeats)]

    monkeypatch.setattr(bench, "time_graph", fake_time_graph)
    case = bench.make_case(case_spec(MAMBA2, "baseline:stand-in"), device)
    try:
        (m,) = bench._run_baseline(case, {"repeats": 5})
    finally:
        case.close()
    assert m["ok"] and m["settings"] == {"speed": 1} and len(m["samples_us"]) == 5
    assert m["kernel"] == "tests.stand_in" and m["check_max_err"] <= m["tolerance"]
    tried = {t["settings"]: t for t in m["settings_tried"]}
    assert set(tried) == {"speed=3", "speed=2,broken=True", "speed=1"}
    assert "max relative error" in tried["speed=2,broken=True"]["error"] and "us" not in tried["speed=2,broken=True"]
    assert tried["speed=3"]["us"] > tried["speed=1"]["us"]


def test_mamba_ssm_adapter_matches_our_reference(device, cpu_device_context):
    path = os.environ.get(baselines.MAMBA_SSM_TRITON_ENV)
    if not path:
        pytest.skip(f"{baselines.MAMBA_SSM_TRITON_ENV} is not set (point it at mamba_ssm/ops/triton/selective_state_update.py of its sdist)")
    ok, why = baselines.get("mamba-ssm").available()
    if not ok:
        pytest.skip(why)
    case = bench.make_case(case_spec(MAMBA2, "baseline:mamba-ssm"), device)
    ours = bench.make_case(case_spec(MAMBA2, "conventional"), device)
    try:
        assert case.check() <= case.tolerance() and ours.check() <= ours.tolerance()
        for _ in range(3):
            case.step()
            ours.step()
        for theirs, mine in zip(case._layers, ours._layers):
            assert torch.equal(theirs.inputs[1]["x"], mine.inputs[1]["x"]), "the same seed gives the same inputs"
            assert bench.rel_err(theirs.handle.state, mine.state) < 1e-5
    finally:
        case.close()
        ours.close()


def test_fla_adapter_matches_our_reference(device):
    ok, why = baselines.get("fla").available()
    if not ok:
        pytest.skip(why)
    case = bench.make_case(case_spec(GDN, "baseline:fla"), device)
    try:
        for settings in case.baseline.settings(case):
            case.use_settings(settings)
            try:
                err = case.check()
            except Exception as exc:
                if device == "cpu" and "0-dimensional arrays" in str(exc):
                    pytest.skip("fla's fused_recurrent kernel loops tl.range(0, T) over a runtime scalar, which Triton's "
                                f"interpreter cannot turn into an int under NumPy {np.__version__} (it runs on CUDA)")
                raise
            assert err <= case.tolerance(), settings
    finally:
        case.close()


def _softplus(d):
    return torch.where(d <= 20.0, torch.log1p(torch.exp(d)), d)


def fake_flashinfer(monkeypatch, *, forget_flush: bool = False):
    """flashinfer.mamba (0.7.2.post1) in plain PyTorch: its wrappers' signatures, the shape, stride and dtype checks of
    their bindings (csrc/selective_state_update.cu, csrc/checkpointing_ssu.cu), and the ring contract of the kernel.

    With forget_flush the checkpoint is never written, so the tokens the host moves past are lost.
    """
    calls = []

    def check_tied(t, name, rank):
        assert t.dim() == rank and t.stride() == (1,) + (0,) * (rank - 1), f"{name} must be per-head with tied strides"

    def selective_state_update(state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None,
                               pad_slot_id=-1, state_scale=None, out=None, disable_state_update=False,
                               intermediate_states_buffer=None, intermediate_state_indices=None, intermediate_state_scales=None,
                               rand_seed=None, philox_rounds=10, cache_steps=0, algorithm="auto", dst_state_batch_indices=None,
                               cu_seqlens=None, num_accepted_tokens=None, backend="auto"):
        if algorithm not in ("auto", "simple", "vertical", "horizontal", "async_horizontal"):
            raise ValueError(f"Unknown algorithm: {algorithm}")
        b, H, P, N = x.shape[0], state.shape[1], state.shape[2], state.shape[3]
        assert cache_steps == 0 and x.dim() == 3, "one token a step: the single-token path takes x (batch, nheads, dim)"
        assert state.stride()[1:] == (P * N, N, 1) and state.shape[0] >= b
        assert x.shape == (b, H, P) and x.stride()[1:] == (P, 1)
        assert dt.shape == (b, H, P) and dt.stride()[1:] == (1, 0), "dt is (batch, nheads, dim) with dim tied"
        check_tied(A, "A", 3)
        check_tied(D, "D", 2)
        assert dt_bias is None or (check_tied(dt_bias, "dt_bias", 2) or True)
        assert B.dim() == 3 and B.shape[0] == b and B.stride()[1:] == (N, 1) and C.shape == B.shape and C.stride()[1:] == (N, 1)
        assert z is None or (z.shape == x.shape and z.stride()[1:] == (P, 1))
        assert out is not None and out.shape == x.shape and out.is_contiguous()
        assert D.dtype == dt.dtype and (dt_bias is None or dt_bias.dtype == dt.dtype), "D and dt_bias must have dt's dtype"
        assert B.dtype == C.dtype == out.dtype == x.dtype and (z is None or z.dtype == x.dtype)
        assert state_batch_indices is None or (state_batch_indices.dim() == 1 and state_batch_indices.shape[0] >= b)
        calls.append(algorithm)
        y = decode_ref(state, x, dt[:, :, 0], A[:, 0, 0], B, C, D=D[:, 0], z=z, dt_bias=None if dt_bias is None else dt_bias[:, 0],
                       dt_softplus=dt_softplus, slots=state_batch_indices)
        out.copy_(y)
        return out

    def checkpointing_ssu(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D=None,
                          z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, state_scale=None,
                          rand_seed=None, philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, enable_pdl=False,
                          cb_scaled=None, cumAdt_vec=None, cb_old=None, precompute_heads_per_cta=0, algorithm="auto"):
        assert algorithm in ("auto", "monolith", "two-kernel")
        scratch = (cb_scaled, cumAdt_vec, cb_old)
        if len({t is None for t in scratch}) != 1:
            raise ValueError("cb_scaled, cumAdt_vec, and cb_old must be provided together")
        if algorithm == "two-kernel" and cb_scaled is None:
            raise ValueError("algorithm='two-kernel' requires the cb_scaled/cumAdt_vec/cb_old/scratch trio")
        assert x.dim() == 4, "x is (batch, T, nheads, dim)"
        nslots, H, P, N = state.shape
        b, T, G = x.shape[0], x.shape[1], B.shape[2]
        ring = x_cache.shape[2]
        W = ring - T
        assert T <= W <= 16, "the ring is max_window + T rows, max_window at most 16"
        assert x.element_size() == 2, "its kernels static_assert a 2-byte input type"
        assert state.stride()[1:] == (P * N, N, 1)
        assert x.shape == (b, T, H, P) and x.stride()[2:] == (P, 1)
        assert dt.shape == (b, T, H, P) and dt.stride()[2:] == (1, 0), "dt is (batch, T, nheads, dim) with dim tied"
        check_tied(A, "A", 3)
        assert B.shape == (b, T, G, N) and B.stride()[2:] == (N, 1) and C.shape == B.shape and C.stride()[2:] == (N, 1)
        assert out.shape == x.shape and out.stride()[2:] == (P, 1)
        assert x_cache.shape == (nslots, H, ring, P) and x_cache.stride()[2:] == (P, 1)
        assert B_cache.shape == (nslots, G, ring, N) and B_cache.stride()[2:] == (N, 1)
        assert dt_cache.shape == (nslots, H, ring) and dt_cache.stride(2) == 1 and dt_cache.dtype == torch.float32
        for t in (ring_start, prev_num_accepted_tokens):
            assert t.shape == (nslots,) and t.is_contiguous() and t.dtype == torch.int32
        assert D is None or (check_tied(D, "D", 2) or True)
        assert dt_bias is None or (check_tied(dt_bias, "dt_bias", 2) or True)
        assert D is None or dt_bias is None or D.dtype == dt_bias.dtype
        assert z is None or (z.shape == x.shape and z.stride()[2:] == (P, 1))
        assert all(t.dtype == x.dtype for t in (B, C, out, x_cache, B_cache) + (() if z is None else (z,)))
        sbi = state_batch_indices
        assert sbi is None or (sbi.shape == (b,) and sbi.is_contiguous() and sbi.dtype in (torch.int32, torch.int64))
        if cb_scaled is not None:
            k_old_half = (W + 7) // 8 * 8 // 2
            assert cb_scaled.shape[1:] == (H, 32, 8) and cb_scaled.shape[0] >= b and cb_scaled.dtype == x.dtype
            assert cumAdt_vec.shape[1:] == (H, (T + 15) // 16 * 16) and cumAdt_vec.dtype == torch.float32
            assert cb_old.shape[1:] == (H, 32, k_old_half) and cb_old.shape[0] >= b and cb_old.dtype == x.dtype
            assert all(t.is_contiguous() for t in scratch)
        calls.append(algorithm)
        for b in range(x.shape[0]):
            s = int(state_batch_indices[b])
            if s == pad_slot_id:
                continue
            start, count = int(ring_start[s]), int(prev_num_accepted_tokens[s])
            d = dt[b, 0, :, 0].float() + (0.0 if dt_bias is None else dt_bias[:, 0].float())
            d = _softplus(d) if dt_softplus else d
            S = state[s].float()
            for j in range(count):
                pos = (start + j) % ring
                dj = dt_cache[s, :, pos]
                Bj = B_cache[s, :, pos].float().repeat_interleave(H // G, dim=0)
                S = torch.exp(A[:, 0, 0] * dj)[:, None, None] * S + (dj[:, None] * x_cache[s, :, pos].float())[:, :, None] * Bj[:, None, :]
            if count + T > W and not forget_flush:
                state[s] = S.to(state.dtype)
            Bh = B[b, 0].float().repeat_interleave(H // G, dim=0)
            S = torch.exp(A[:, 0, 0] * d)[:, None, None] * S + (d[:, None] * x[b, 0].float())[:, :, None] * Bh[:, None, :]
            y = torch.einsum("hpn,hn->hp", S, C[b, 0].float().repeat_interleave(H // G, dim=0))
            if D is not None:
                y = y + D.float() * x[b, 0].float()
            if z is not None:
                y = y * F.silu(z[b, 0].float())
            out[b, 0] = y.to(out.dtype)
            pos = (start + count) % ring
            x_cache[s, :, pos] = x[b, 0]
            B_cache[s, :, pos] = B[b, 0]
            dt_cache[s, :, pos] = d
        return out

    def allocate_checkpointing_ssu_scratch(batch_size, num_heads, num_predicted_tokens, max_window, dtype, device):
        if not 0 < num_predicted_tokens <= 16 or not 0 < max_window <= 16:
            raise ValueError("num_predicted_tokens and max_window must be in [1, 16]")
        t_pad, k_old = (num_predicted_tokens + 15) // 16 * 16, (max_window + 7) // 8 * 8
        return (torch.empty(batch_size, num_heads, 32, t_pad // 2, dtype=dtype, device=device),
                torch.empty(batch_size, num_heads, t_pad, dtype=torch.float32, device=device),
                torch.empty(batch_size, num_heads, 32, k_old // 2, dtype=dtype, device=device))

    tuned = []

    @contextlib.contextmanager
    def autotune(tune_mode=True, cache=None, tuning_buckets=None, round_up=None, skip_ops=None, cuda_graph_profile_replays=None):
        if tuning_buckets is not None and len(tuning_buckets) == 0:
            raise ValueError("tuning_buckets must contain at least one value when provided")
        tuned.append((tune_mode, tuning_buckets))
        yield

    mamba = ModuleType("flashinfer.mamba")
    mamba.selective_state_update = selective_state_update
    mamba.checkpointing_ssu = checkpointing_ssu
    mamba.allocate_checkpointing_ssu_scratch = allocate_checkpointing_ssu_scratch
    tuner = ModuleType("flashinfer.autotuner")
    tuner.autotune = autotune
    root = ModuleType("flashinfer")
    root.mamba, root.autotuner = mamba, tuner
    for name, mod in (("flashinfer", root), ("flashinfer.mamba", mamba), ("flashinfer.autotuner", tuner)):
        monkeypatch.setitem(sys.modules, name, mod)
    baselines._import.cache_clear()
    return SimpleNamespace(calls=calls, tuned=tuned)


@pytest.fixture
def flashinfer(monkeypatch):
    yield fake_flashinfer(monkeypatch)
    baselines._import.cache_clear()


def test_flashinfer_ssu_adapter_ties_strides_and_matches(device, flashinfer):
    case = bench.make_case(case_spec(dict(MAMBA2, G=1), "baseline:flashinfer-ssu"), device)
    try:
        for settings in case.baseline.settings(case):
            case.use_settings(settings)
            assert case.check() <= case.tolerance()
        # Off a GPU the adapter assumes sm90, where FlashInfer's own dispatch never picks horizontal.
        assert set(flashinfer.calls) == {"simple", "vertical"}
    finally:
        case.close()


@pytest.mark.parametrize("window", [1, 3, 4], ids=["W1", "W3", "W4"])
def test_flashinfer_checkpointing_rows_are_staggered_and_match(device, flashinfer, window):
    case = bench.make_case(case_spec(MAMBA2, "baseline:flashinfer-checkpointing", window=window), device)
    try:
        layer = case._layers[1]
        h = layer.handle
        slots = layer.slots.long()
        assert h.pnat[0][slots].tolist() == [r % window for r in range(5)], "row r starts with r mod W tokens in its ring"
        assert h.ring_start[0].tolist() == [0] * 5 and h.ring == window + 1
        # W steps on, a row that started with p ≥ 1 tokens has flushed once (its ring moved W rows on) and holds p again;
        # the row that started empty holds W and flushes next.
        assert h.pnat[window][slots].tolist() == [r % window or window for r in range(5)]
        assert h.ring_start[window][slots].tolist() == [window if r % window else 0 for r in range(5)]
        assert h.pnat[window + 1][slots].tolist() == [1 if r % window == 0 else r % window + 1 for r in range(5)]
        for settings in case.baseline.settings(case):
            case.use_settings(settings)
            assert case.check() <= case.tolerance(), settings
        assert flashinfer.tuned[0] == (True, (5,)) and (False, (5,)) in flashinfer.tuned
        assert {"monolith", "two-kernel", "auto"} <= set(flashinfer.calls)
    finally:
        case.close()


@pytest.mark.parametrize("window", [1, 2, 3, 5, 16])
def test_flashinfer_ring_schedule_matches_the_host_bookkeeping_past_its_period(window):
    """Every step's ring_start and pnat, looked up in the table, equal the host's running bookkeeping over three periods:
    the row placed empty is never empty again, so the table must not wrap back to step 0."""
    ring = window + 1
    fills = torch.arange(window).repeat(2)
    start0 = torch.zeros_like(fills)
    table_start, table_pnat = baselines._ring_schedule(start0, fills, window, ring, "cpu")
    start, count = start0.clone(), fills.clone()
    for step in range(3 * window * ring + 2):
        k = baselines._schedule_row(step, table_start.shape[0])
        assert table_start[k].tolist() == start.tolist() and table_pnat[k].tolist() == count.tolist(), step
        assert int(count.max()) <= window and (step == 0 or int(count.min()) >= 1)
        flush = count + 1 > window  # the kernel's must_checkpoint with T = 1: pnat + T > max_window
        start = torch.where(flush, (start + count) % ring, start)
        count = torch.where(flush, torch.ones_like(count), count + 1)


def test_flashinfer_adapters_leave_out_what_cannot_compile():
    ssu, cp = baselines.get("flashinfer-ssu"), baselines.get("flashinfer-checkpointing")
    wide = SimpleNamespace(H=128, P=64, N=128, G=8)
    narrow = SimpleNamespace(H=128, P=32, N=128, G=8)
    assert ssu.unsupported(window=None, state_dtype="fp32", io_dtype="fp32", shape=wide) is None
    assert "P under 64" in ssu.unsupported(window=None, state_dtype="fp32", io_dtype="bf16", shape=narrow)
    for io in ("bf16", "fp16"):
        assert cp.unsupported(window=16, state_dtype="fp32", io_dtype=io, shape=wide) is None
    assert "bf16 or fp16" in cp.unsupported(window=16, state_dtype="fp32", io_dtype="fp32", shape=wide)
    assert "P under 64" in cp.unsupported(window=16, state_dtype="bf16", io_dtype="bf16", shape=narrow)
    assert "1 to 16" in cp.unsupported(window=32, state_dtype="fp32", io_dtype="bf16", shape=wide)


def test_flashinfer_checkpointing_check_fails_when_flushes_are_lost(device, monkeypatch):
    fake_flashinfer(monkeypatch, forget_flush=True)
    case = bench.make_case(case_spec(MAMBA2, "baseline:flashinfer-checkpointing", window=3), device)
    try:
        assert case.check() > 10 * case.tolerance()
    finally:
        case.close()
        baselines._import.cache_clear()


def test_plan_adds_baseline_points_after_ours_and_leaves_out_what_they_cannot_run():
    spec = grid.ProfileSpec(presets=(SUPER, QWEN), batches=(1, 64), windows=(16, 32), state_dtypes=("fp32", "bf16"), phases=False)
    pre = [presets.resolve(SUPER), presets.resolve(QWEN)]
    left_out: list[dict] = []
    chosen = [baselines.get(n) for n in ("flashinfer-ssu", "flashinfer-checkpointing", "fla")]
    points = grid.plan(spec, pre, left_out, chosen)
    block = [(p.variant, p.window) for p in points if p.preset == SUPER and p.batch == 64 and p.state_dtype == "fp32"]
    assert block == [("conventional", None), ("replay", 16), ("replay", 32), ("baseline:flashinfer-ssu", None),
                     ("baseline:flashinfer-checkpointing", 16)]
    fla = [p for p in points if p.variant == "baseline:fla"]
    assert {(p.preset, p.state_dtype, p.competes) for p in fla} == {(QWEN, "fp32", "conventional")}
    assert all(p.cost_variant == p.competes for p in points if p.competes)
    whys = {s["what"]: s["why"] for s in left_out}
    assert "windows of 1 to 16" in whys[f"{SUPER} baseline:flashinfer-checkpointing W32 fp32"]
    assert "fp32" in whys[f"{QWEN} baseline:fla bf16"]


def fake_runner(point, context):
    """Made-up timings: ours conventional 10 µs, ReplaySSM 6, the stand-ins 12 (conventional) and 7 (replay)."""
    us = {"conventional": 10.0, "replay": 6.0, "baseline:stand-in": 12.0, "baseline:stand-in-replay": 7.0}[point.variant] * point.batch
    rng = random.Random(point.batch)
    m = {"phase": "avg", "ok": True, "layers": 2, "check_max_err": 1e-4, "tolerance": 3e-2, "steps": 32, "repeats": 20,
         "samples_us": [us * (1 + 0.01 * (rng.random() - 0.5)) for _ in range(20)]}
    if point.variant.startswith("baseline:"):
        m.update(settings={"algorithm": "b"}, settings_tried=[{"settings": "algorithm=a", "us": us * 2}, {"settings": "algorithm=b", "us": us}],
                 kernel="tests.stand_in", note="a stand-in")
    return [m]


class ReplayStandIn(OursAsBaseline):
    name = "stand-in-replay"
    variant = "replay"


@pytest.fixture
def measured(monkeypatch, stand_in):
    def setup(gpu, spec):
        return {"environment": {"gpu": {"name": "NVIDIA H200", "driver": "570"}, "mode": "measured"}, "ceilings": CEILINGS,
                "free_bytes": 100 * 2**30, "gpu_key": "h200", "gpu_name": "NVIDIA H200", "context": {}}

    monkeypatch.setattr(prof, "detect_mode", lambda require_gpu: "measured")
    monkeypatch.setattr(prof, "measured_setup", setup)
    monkeypatch.setattr(bench, "run_point", fake_runner)
    remove = baselines.register(ReplayStandIn())
    yield
    remove()


def invoke(*args: str):
    return CliRunner().invoke(app, ["profile", *args])


def test_profile_baseline_rows_reach_the_results_file_roofline_and_compare(tmp_path, measured, monkeypatch):
    monkeypatch.setattr(baselines, "_import", absent)
    out = tmp_path / "b.json"
    res = invoke("--preset", SUPER, "--batch", "1,16", "--no-phases", "--baseline", "stand-in,stand-in-replay,vllm-ssu", "--out", str(out))
    assert res.exit_code == 0, res.output
    got = load(out)
    by = {(r["variant"], r["batch"]): r for r in got.rows}
    assert [r["variant"] for r in got.rows if r["batch"] == 16] == ["conventional", "replay", "baseline:stand-in", "baseline:stand-in-replay"]
    conv, rep, base, base_rep = (by[v, 16] for v in ("conventional", "replay", "baseline:stand-in", "baseline:stand-in-replay"))
    assert base["x_vs_ours"] == pytest.approx(base["us_per_token"] / conv["us_per_token"]) and base["x_vs_ours"] > 1
    assert base_rep["x_vs_ours"] == pytest.approx(base_rep["us_per_token"] / rep["us_per_token"])
    assert base_rep["speedup"] == pytest.approx(conv["us_per_token"] / base_rep["us_per_token"]), "speedup stays conventional over the row"
    assert base_rep["window"] == 16 and base_rep["x_competes"] == "replay" and base["window"] is None
    assert base["x_settings"] == {"algorithm": "b"} and len(base["x_settings_tried"]) == 2 and base["x_kernel"] == "tests.stand_in"
    assert base_rep["bytes_read"] == rep["bytes_read"], "a baseline is costed as the variant it competes with"
    skipped = [s for s in got.skipped if s["what"] == "baseline:vllm-ssu"]
    assert len(skipped) == 1 and "pip install vllm" in skipped[0]["why"]
    stderr = " ".join(res.stderr.split())
    assert stderr.count("vllm-ssu") == 1 and "pip install vllm" in stderr
    assert "ours" in res.stdout and "baseline:stand-in" in res.stdout

    roof = CliRunner().invoke(app, ["roofline", str(out), "--out", str(tmp_path / "r.html"), "--json"])
    assert roof.exit_code == 0, roof.output
    assert {"baseline:stand-in", "baseline:stand-in-replay"} <= {p["variant"] for p in json.loads(roof.stdout)["points"]}
    comp = CliRunner().invoke(app, ["compare", str(out), str(out), "--json"])
    assert comp.exit_code == 0, comp.output
    assert "baseline:stand-in-replay" in comp.stdout


def test_profile_baseline_of_another_op_and_predicted_mode_are_left_out(tmp_path, measured, monkeypatch):
    res = invoke("--preset", SUPER, "--batch", "1", "--no-phases", "--baseline", "fla", "--out", str(tmp_path / "a.json"), "--json")
    assert res.exit_code == 0, res.output
    assert all(not r["variant"].startswith("baseline:") for r in json.loads(res.stdout))
    assert "no gdn preset" in " ".join(res.stderr.split())

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(app, ["profile", "--preset", QWEN, "--batch", "1", "--predict", "--baseline", "all", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert load(tmp_path / "p.json").skipped[0]["what"] == "baselines"
    assert "measured, not predicted" in " ".join(res.stderr.split())


def test_profile_unknown_baseline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = invoke("--baseline", "cudnn", "--out", str(tmp_path / "x.json"))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--baseline 'cudnn'" in res.stderr and "flashinfer-ssu" in res.stderr
    assert not (tmp_path / "x.json").exists()


def test_baselines_store_only_what_they_are_run_with():
    ssu, cp, fla = (baselines.get(n) for n in ("flashinfer-ssu", "flashinfer-checkpointing", "fla"))
    assert "fp32 and 16-bit states only" in ssu.unstored("int8", "nearest")
    assert "rounding to nearest only" in fla.unstored("bf16", "stochastic")
    assert ssu.unstored("bf16", "nearest") is None
    # checkpointing_ssu stores fp8 and int8 states with row scales and rounds fp16 and 8-bit states stochastically
    for state, rounding in (("int8", "nearest"), ("fp8", "stochastic"), ("fp16", "stochastic"), ("bf16", "nearest")):
        assert cp.unstored(state, rounding) is None, (state, rounding)
    assert "not bf16" in cp.unstored("bf16", "stochastic")
