"""`replayssm e2e --tp N` over N ranks: vLLM's split of every block checked against the unsharded step over gloo, the
collectives the timed step runs, and the launch's refusals."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist

from replayssm_cli.errors import UserError
from replayssm_cli.measure import e2e
from replayssm_cli.model import hybrid
from replayssm_cli.measure import tensor_parallel as tp
from replayssm_cli.model import presets as P
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape
from test_e2e import interpreter, invoke  # noqa: F401 - the e2e command's runner and the kernels' device

# fp32 on the CPU: a sharded sum of tens of products against the whole one, in another order.
TOL = 1e-5


def _model(kind: str, op: str, shape, **sizes) -> P.Preset:
    return P.Preset(name=f"tp-{kind}", display=f"TP {kind}", kind=op, ssm_layers=2, attn_layers=1, shape=shape, state_dtype="fp32",
                    has_D=True, has_z=False, a_log_range=(1.0, 4.0), e2e=sizes)


def tiny(kind: str) -> P.Preset:
    """Small models of each block family whose heads, groups and sizes divide 2 and 4, with sizes that are not powers of two."""
    moe = dict(num_experts=3, experts_per_token=2)
    if kind == "nemotron":
        # Mamba-2 with 4 groups, attention with 2 KV heads (replicated at tp 4), squared-ReLU latent MoE with a shared expert.
        return _model(kind, "mamba2", Mamba2Shape(H=8, P=3, N=5, G=4), hidden_size=24, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=6, moe_intermediate_size=12, shared_expert_intermediate_size=8, moe_latent_size=10, moe_layers=2,
                      vocab_size=23, **moe)
    if kind == "qwen":
        # Gated DeltaNet, gated attention with QK norm and partial RoPE, SwiGLU MoE with a gated shared expert.
        return _model(kind, "gdn", GDNShape(H=4, HV=8, K=6, V=5), hidden_size=20, num_attention_heads=4, num_key_value_heads=4,
                      head_dim=8, moe_intermediate_size=8, shared_expert_intermediate_size=12, moe_layers=3, vocab_size=21, **moe)
    # Mamba-2 with one group (replicated on every rank, its gated norm all-reduced), one KV head, a dense SwiGLU MLP.
    return _model(kind, "mamba2", Mamba2Shape(H=4, P=5, N=3, G=1), hidden_size=16, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=6, intermediate_size=12, mlp_layers=2, vocab_size=19)


KINDS = ("nemotron", "qwen", "dense")


def _check_ranks(rank: int, world: int, port: int, out: str) -> None:
    tp.init(rank, world, port, "gloo")
    torch.set_num_threads(1)
    try:
        got = {kind: tp.check_shard(tiny(kind), world, tp.Comm(tp=world, rank=rank)) for kind in KINDS}
        # A wrong split must fail the check: every rank given rank 0's weights.
        right = tp.shard_weights
        tp.shard_weights = lambda full, weights, r, n: right(full, weights, 0, n)
        got["wrong"] = tp.check_shard(tiny("nemotron"), world, tp.Comm(tp=world, rank=rank))
        tp.shard_weights = right
    finally:
        dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(got, fh)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """check_shard of every tiny model on 2 and on 4 gloo ranks (forked processes), per world size, per rank."""
    found = {}
    for world in (2, 4):
        out = tmp_path_factory.mktemp(f"tp{world}")
        tp.spawn(_check_ranks, world, args=(str(out),), start_method="fork")
        found[world] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return found


@pytest.mark.parametrize("world", [2, 4], ids=["tp2", "tp4"])
@pytest.mark.parametrize("kind", KINDS)
def test_check_shard_matches_the_unsharded_step(sharded, world, kind):
    for rank, result in enumerate(sharded[world]):
        r = result[kind]
        assert r["rank"] == rank
        for part in ("logits", "ssm", "conv", "kv"):
            assert r[part] <= TOL, (rank, part, r[part])
        preset = P.with_tp(tiny(kind), world)
        heads = preset.shape.H if preset.kind == "mamba2" else preset.shape.HV
        assert [s[1] for s in r["shapes"]["ssm"]] == [heads] * preset.ssm_layers, "each rank holds its heads' states"
        assert r["shapes"]["logits"] == [3, tiny(kind).e2e["vocab_size"]]


@pytest.mark.parametrize("world", [2, 4], ids=["tp2", "tp4"])
@pytest.mark.parametrize("kind", KINDS)
def test_check_shard_runs_the_modelled_collectives(sharded, world, kind):
    inv = hybrid.inventory(P.with_tp(tiny(kind), world))
    blocks = len(inv.order)
    norms = inv.count("ssm") if kind == "dense" else 0
    for result in sharded[world]:
        calls = [tuple(c) for c in result[kind]["calls"]]
        assert calls == [tuple(c) for c in result[kind]["modelled"]]
        assert calls.count(("all_reduce", "embed")) == 1 and calls[-1] == ("all_gather", "lm_head")
        assert sum(k == "all_reduce" for k, _ in calls) == 1 + blocks + norms


@pytest.mark.parametrize("world", [2, 4], ids=["tp2", "tp4"])
def test_a_wrong_split_fails_the_check(sharded, world):
    assert all(r["wrong"]["logits"] > 100 * TOL for r in sharded[world])


def test_collectives_follow_the_blocks():
    inv = hybrid.inventory(P.load_preset("nemotron-3-super-120b-a12b", 4))
    plan = tp.collectives(inv)
    assert [c.after for c in plan[:3]] == ["embed", "M0.out_proj", "E1.moe"]
    assert sum(c.kind == "all_reduce" for c in plan) == 1 + len(inv.order) == 1 + 88
    assert plan[-1].kind == "all_gather" and plan[-1].elems == 131072 // 4
    summary = tp.plan_summary(inv, batch=64)
    assert summary["bytes_per_step"] == 64 * (89 * 4096 * 2 + 131072 // 4 * 2)
    assert tp.collectives(hybrid.inventory(P.load_preset("nemotron-3-super-120b-a12b"))) == []


class FakeComm(tp.Comm):
    """Records the collectives without a process group (a stand-in for NCCL in the timed step)."""

    def all_reduce(self, x, after):
        self.calls.append(("all_reduce", after))
        return x

    def all_gather(self, x, after, out=None):
        self.calls.append(("all_gather", after))
        out.copy_(x.expand_as(out))
        return out


def test_attach_puts_the_collectives_into_the_step(interpreter, monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "fake")
    inv = hybrid.inventory(P.with_tp(tiny("dense"), 2))
    weights = e2e.Weights(inv, inv.ffn_blocks, interpreter)
    step = e2e.Step(inv, weights, variant="replay", batch=2, context=4, window=2, state_dtype="fp32", read_dtype=None,
                    device=interpreter)
    try:
        comm = FakeComm(tp=2, rank=0)
        fields = tp.attach(step, comm, "spawn")
        names = [op.name for op in step.ops]
        comm_ops = [op.name for op in step.ops if op.category == e2e.COMM]
        assert comm_ops == [c.name for c in tp.collectives(inv)]
        for c in tp.collectives(inv):
            assert names.index(c.name) == names.index(c.after) + 1, "each collective right after the op it follows"
        step.run()
        assert comm.calls == [(c.kind, c.after) for c in tp.collectives(inv)]
        assert ((0 <= step.next_tokens) & (step.next_tokens < 2 * inv.dims["vocab"])).all()
        assert fields["x_tp_ranks"] == 2 and fields["x_allreduces_per_step"] == 1 + len(inv.order) + inv.count("ssm")
        meas = e2e.measure(step, replays=1, timer=lambda s, select, r, w: [float(sum(1 for op in s.ops if select(op)))] * r)
        cat = meas.category_us()
        assert cat[e2e.COMM] == len(comm_ops) and sum(cat.values()) == len(step.ops)
        assert sum(e2e.shares(cat).values()) == pytest.approx(1.0)
    finally:
        step.close()


def _one_line(result, *words):
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for w in words:
        assert w in lines[0], lines[0]


def test_more_ranks_than_gpus_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "4", "--tp-launch", "spawn"), "4 GPUs", "2 are visible")


def test_a_tp_that_does_not_divide_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "3", "--tp-launch", "spawn"), "tp=3", "valid --tp")
    _one_line(invoke("--preset", "qwen3.5-122b-a10b", "--tp", "64", "--tp-launch", "spawn"), "does not divide")


def test_launch_refusals(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "2", "--tp-launch", "spawn"), "no CUDA GPU")
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "1", "--tp-launch", "spawn"), "--tp 1")
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "2", "--tp-launch", "spawn", "--energy"), "--energy")
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "2", "--tp-launch", "ring"), "--tp-launch 'ring'")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "2"), "--tp-launch torchrun")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _one_line(invoke("--preset", "nemotron-3-super-120b-a12b", "--tp", "2", "--tp-launch", "torchrun"), "WORLD_SIZE")


def test_check_launch_lets_a_fitting_launch_through(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    tp.check_launch(4, "spawn", cuda=True, visible=8)
    tp.check_launch(4, "one-gpu", cuda=False, visible=0)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    tp.check_launch(4, "torchrun", cuda=True, visible=4)
    with pytest.raises(UserError, match="torchrun started 4"):
        tp.check_launch(2, "torchrun", cuda=True, visible=4)


def test_spawned_ranks_keep_nvlink_multicast_off(monkeypatch, tmp_path):
    for key in tp.NCCL_ENV:
        monkeypatch.delenv(key, raising=False)
    tp.spawn(_env_rank, 2, args=(str(tmp_path),), start_method="fork")
    for r in range(2):
        assert json.loads((tmp_path / f"env{r}.json").read_text()) == tp.NCCL_ENV


def _env_rank(rank: int, world: int, port: int, out: str) -> None:
    import os

    with open(f"{out}/env{rank}.json", "w") as fh:
        json.dump({k: os.environ.get(k) for k in tp.NCCL_ENV}, fh)


def test_the_table_and_notes_say_which_path_ran():
    from rich.console import Console

    from replayssm_cli.report.e2e_table import render_table

    shard = e2e.E2ESpec(presets=("x",), tp=4)
    ranks = e2e.E2ESpec(presets=("x",), tp=4, tp_launch="spawn")
    assert "not run" in e2e.tp_note(shard) and "no all-reduces" in e2e.tp_title(shard)
    assert "4 GPUs" in e2e.tp_note(ranks) and "'comm' share" in e2e.tp_note(ranks) and "NCCL" in e2e.tp_title(ranks)
    row = {"preset": "p", "status": "ok", "x_context": 4096, "batch": 64, "variant": "conventional", "us": 2000.0,
           "x_tokens_per_s": 32000.0, "x_share_ssm": 0.3, "x_share_ssm_kernel": 0.1, "x_share_attn": 0.1,
           "x_share_mlp": 0.4, "x_share_other": 0.05}
    for rows, shown in (([row], False), ([{**row, "x_share_comm": 0.15}], True)):
        console = Console(width=200, record=True)
        console.print(render_table(rows, title="t"))
        text = console.export_text()
        assert ("comm %" in text) == shown and ("15.0" in text) == shown


def _run_rank0(spec, presets, out, device, **hooks):
    _run(spec, presets, out, device, **hooks)


def _run_quiet(spec, presets, out, device, **hooks):
    _run(spec, presets, f"{out}.rank{dist.get_rank()}", device, **hooks)


def _run(spec, presets, out, device, **hooks):
    from replayssm_cli.report.results import ResultsWriter

    writer = ResultsWriter(out, {"gpu": {"name": device}}, spec.to_dict())
    # On the CPU each selection runs once, eagerly; on CUDA through the CUDA-graph timer, collectives captured in the graphs.
    timer = _eager_timer if device == "cpu" else None
    e2e.run(spec, presets, writer, device=device, progress=False, timer=timer, attention="torch-sdpa", **hooks)


def _eager_timer(step, select, replays, warmup):
    """The selected ops run once, eagerly, on every rank in the same order (so the collectives meet); one 'µs' per op."""
    step.run(select)
    return [float(sum(1 for op in step.ops if select(op)))] * replays


def _gloo_rank(rank, world, port, spec, presets, out):
    torch.set_num_threads(1)
    torch.set_default_device("cpu")
    # The kernels' check against their reference is another test's; here the ranks' lockstep and rows are.
    e2e.Step.check = lambda self: 0.0
    tp.run_rank(rank, world, port, "spawn", _run_rank0, (spec, presets, out, "cpu"), _run_quiet, backend="gloo")


def test_ranks_run_the_step_and_write_comm_rows(interpreter, tmp_path):
    preset = P.with_tp(tiny("dense"), 2)
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(2,), contexts=(4,), variants=("conventional",), window=2, windows=1,
                       tp=2, tp_launch="spawn")
    out = tmp_path / "tp.json"
    tp.spawn(_gloo_rank, 2, args=(spec, [preset], str(out)), start_method="fork")
    from replayssm_cli.report.results import load

    got = load(out)
    assert got.complete and len(got.rows) == 1 and not got.skipped
    row = got.rows[0]
    inv = hybrid.inventory(preset)
    assert row["x_tp_launch"] == "spawn" and row["x_tp_ranks"] == 2 and row["x_tp_backend"] == "gloo"
    assert row["x_us_comm"] == len(tp.collectives(inv)) == row["x_allreduces_per_step"] + 1
    assert row["x_share_comm"] > 0 and sum(row[f"x_share_{c}"] for c in (*hybrid.CATEGORIES, e2e.COMM)) == pytest.approx(1.0)
    assert load(f"{out}.rank1").rows[0]["x_us_comm"] == row["x_us_comm"], "rank 1 ran the same step"


def _sleeper(seconds: float) -> None:
    time.sleep(seconds)


def _deaf(seconds: float) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(seconds)


def test_stop_interrupts_then_kills(monkeypatch):
    import multiprocessing as mp

    monkeypatch.setattr(tp, "STOP_WAIT_S", 0.2)
    monkeypatch.setattr(tp, "INTERRUPT_GRACE_S", 0.5)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_sleeper, args=(60,)), ctx.Process(target=_deaf, args=(60,))]
    for proc in procs:
        proc.start()
    started = time.monotonic()
    tp.stop(procs)
    assert time.monotonic() - started < 5 and not any(p.is_alive() for p in procs)
    assert procs[0].exitcode == 1, "Ctrl-C's KeyboardInterrupt ended the first"
    assert procs[1].exitcode == -9, "the one that ignores SIGINT was killed"


two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def _nccl_check(rank, world, port, out):
    comm = tp.init(rank, world, port, "nccl")
    try:
        got = {kind: tp.check_shard(tiny(kind), world, tp.Comm(tp=world, rank=rank), device="cuda") for kind in KINDS}
    finally:
        dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as fh:
        json.dump(got, fh)


@pytest.mark.gpu
@two_gpus
def test_check_shard_over_nccl(tmp_path):
    tp.spawn(_nccl_check, 2, args=(str(tmp_path),))
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for kind in KINDS:
            r = result[kind]
            assert max(r[p] for p in ("logits", "ssm", "conv", "kv")) <= 1e-4, (rank, kind, r)
            assert [tuple(c) for c in r["calls"]] == [tuple(c) for c in r["modelled"]]


def _nccl_rank(rank, world, port, spec, presets, out):
    tp.run_rank(rank, world, port, "spawn", _run_rank0, (spec, presets, out, "cuda"), _run_quiet)


@pytest.mark.gpu
@two_gpus
def test_nccl_ranks_time_the_step_with_collectives_in_its_graphs(tmp_path):
    from replayssm_cli.report.results import load

    preset = P.with_tp(tiny("nemotron"), 2)
    spec = e2e.E2ESpec(presets=(preset.name,), batches=(4,), contexts=(64,), window=4, windows=1, tp=2, tp_launch="spawn")
    out = tmp_path / "tp.json"
    tp.spawn(_nccl_rank, 2, args=(spec, [preset], str(out)))
    got = load(out)
    assert got.complete and not got.skipped, got.skipped
    for row in got.rows:
        assert row["status"] == "ok" and row["x_tp_backend"] == "nccl" and row["x_share_comm"] > 0
    assert got.rows[-1]["speedup"] > 0
