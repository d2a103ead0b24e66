"""`replayssm plan --traffic FILE`: where ReplaySSM pays on recorded serving traffic, cohort by cohort."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from replayssm_cli import options
from replayssm_cli.errors import UserError, cli_command

WIDE = 140
# the largest cohort edge and quality run the options take (far past any serving batch or generation)
MAX_EDGE = 1 << 20
MAX_STEPS = 1 << 20
MAX_HEADS = 4096
MAX_GIB = 65536


def _edges(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    edges = tuple(options.int_list(value, "--cohorts", 1, MAX_EDGE))
    if list(edges) != sorted(edges):
        raise UserError(f"--cohorts {value!r} must be increasing", "e.g. --cohorts 1,16,64,128,256")
    return edges


def _preset_for(name: str | None, traffic, tp: int):
    """The named preset, else the one whose Hugging Face id is the traffic's model_id."""
    from replayssm_cli.model import presets

    if name:
        return presets.resolve(name, tp)
    model = str(traffic.metadata.get("model_id") or "")
    tail = model.rstrip("/").split("/")[-1].lower()
    for p in presets.list_presets():
        if p.hf_id and tail and p.hf_id.split("/")[-1].lower() == tail:
            return presets.with_tp(p, tp) if tp != 1 else p
    found = f"its model_id {model!r} is no preset's" if model else "the traffic names no model"
    raise UserError(f"plan needs a preset ({found})", "pass --preset NAME (see `replayssm presets`)")


@cli_command
def plan(
    traffic: Annotated[Path, options.input_file("--traffic", "Recorded traffic: vLLM's `bench serve --save-result --save-detailed` file, SGLang's `bench_serving --output-details` file, or a CSV of time,running.", "traffic file", "-t")],
    preset: Annotated[Optional[list[str]], options.preset("Model preset or preset file; one per run. [default: the preset whose Hugging Face id is the traffic's model_id]")] = None,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    results: Annotated[Optional[Path], options.input_file("--results", "Kernel times from this results file. [default: the shipped H200 reference profiles]", "results file", "-r")] = None,
    cohorts: Annotated[Optional[str], typer.Option("--cohorts", help="Concurrency cohort edges: [1,16), [16,64), ... [256, inf). [default: 1,16,64,128,256]", show_default=False)] = None,
    error_budget: Annotated[float, typer.Option("--error-budget", help="Largest relative output error against fp64 at the cohort's generation lengths.")] = 1e-3,
    memory_budget: Annotated[Optional[float], options.number("--memory-budget", "GiB per GPU for SSM states and buffers. [default: the GPU's memory]", 0, MAX_GIB, lo_open=True, show_default=False)] = None,
    steps: Annotated[Optional[int], options.count("--steps", "Generated tokens the quality run decodes; 0 skips it. [default: the traffic's p99 generation length, 128-4096]", 0, MAX_STEPS, show_default=False)] = None,
    heads: Annotated[int, options.count("--heads", "Heads of one layer the quality run decodes.", 1, MAX_HEADS)] = 2,
    tp: Annotated[int, options.tp()] = 1,
    gate: Annotated[Optional[list[str]], typer.Option("--gate", help="Rollout thresholds KEY=VALUE, comma-separated or repeated: min-gain (tokens/s, with its pessimistic bound over min-gain-lo, default 1), min-gain-lo, quality-margin, memory-headroom. Exit 1 when one fails.", show_default=False)] = None,
    gpu: Annotated[Optional[str], options.gpu("GPU the traffic is served on; the gate refuses times from another. [default: the traffic file's `gpu` metadata]")] = None,
    driver: Annotated[Optional[str], typer.Option("--driver", help="NVIDIA driver of the target; the gate refuses times from another. [default: the traffic file's, else unchecked]", show_default=False)] = None,
    torch_version: Annotated[Optional[str], typer.Option("--torch", help="torch version of the target (2.11 matches 2.11.0). [default: the traffic file's, else unchecked]", show_default=False)] = None,
    triton_version: Annotated[Optional[str], typer.Option("--triton", help="triton version of the target. [default: the traffic file's, else unchecked]", show_default=False)] = None,
    out: Annotated[Optional[Path], options.out("Also write the full plan as JSON to this file.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout instead of tables.")] = False,
) -> None:
    """Project ReplaySSM's measured gain onto recorded serving traffic: per concurrency cohort the configuration to run, its kernel and end-to-end gain, flush frequency, memory and quality margin; the traffic-weighted gain in ITL and tokens/s; and where to switch.

    Kernel times come from --results or the shipped H200 reference, through the tuner's decision at each cohort's token-weighted concurrency, interpolated linearly in batch between measured batches (each figure says which). End-to-end: the traffic's own ITL at each concurrency less the SSM time saved per step (the engine's conventional SSM kernel taken as ours), or the shipped whole-model step where the traffic has no ITLs. --gate exits 1 when a threshold set in advance fails, and refuses times from another GPU, driver or software than the traffic's target.

    Examples:

      replayssm plan --traffic vllm-day.json --preset nemotron-3-super-120b-a12b

      replayssm plan --traffic running.csv --preset qwen3.5-122b-a10b --cohorts 1,32,128 --json

      replayssm plan -t sglang.jsonl -r runs/h200.json --memory-budget 40 --out plan.json

      replayssm plan -t day.json --gpu h200 --driver 580.159.04 --gate min-gain=1.05,quality-margin=2,memory-headroom=10%
    """
    from replayssm_cli.advise import gate as gate_mod
    from replayssm_cli.advise import plan as lib
    from replayssm_cli.advise import traffic as traffic_mod
    from replayssm_cli.console import note, warn

    edges = _edges(cohorts) or lib.DEFAULT_COHORTS
    if not error_budget > 0:
        raise UserError(f"--error-budget {error_budget} must be positive", "e.g. --error-budget 1e-3")
    if tp < 1:
        raise UserError(f"--tp {tp} is not a tensor-parallel degree", "pass a positive integer")
    t = traffic_mod.read(traffic)
    p = _preset_for(options.one_preset(preset, preset_file, "plan"), t, tp)
    source = lib.load_source(results, p.name)
    thresholds = gate_mod.parse(gate)
    target = gate_mod.Target.resolve({"gpu": gpu, "driver": driver, "torch": torch_version, "triton": triton_version}, t.metadata)
    files = [(f.label, f.environment) for f in source.files]
    unchecked: list[str] = []
    if thresholds.active:
        unchecked = gate_mod.check_environment(target, files)
    elif target.gpu:
        try:
            gate_mod.check_environment(target, files)
        except UserError as exc:
            warn(exc.message)
    cands = lib.measured_candidates(source)
    n_steps = lib.quality_steps(t) if steps is None else steps
    if n_steps:
        from replayssm_cli.measure import quality as quality_mod

        quality_mod.check_size(p, None, cands, n_steps, heads)
    quality = lib.run_quality(p, cands, steps=n_steps, heads=heads, progress=not json_) if n_steps else None
    result = lib.build(t, p, source, cohort_edges=edges, error_budget=error_budget,
                       memory_budget=memory_budget * 2**30 if memory_budget else None, quality=quality)
    doc = result.to_dict()
    verdicts = gate_mod.evaluate(thresholds, doc) if thresholds.active else []
    if thresholds.active:
        doc["gate"] = {"passed": all(v["passed"] for v in verdicts), "thresholds": verdicts,
                       "target": {k: getattr(target, k) for k in gate_mod.ENV_FIELDS}, "unchecked": unchecked}
    if out is not None:
        from replayssm_cli.report.results import write_atomic

        try:
            write_atomic(Path(out), doc)
        except OSError as exc:
            raise UserError(f"cannot write {out} ({exc.strerror or exc})", "pass a writable --out") from None
        note(f"plan: {out}")
    if json_:
        from replayssm_cli.console import print_json

        print_json(doc)
    else:
        from replayssm_cli.console import out as stdout
        from replayssm_cli.console import sized

        console = sized(stdout, WIDE)
        lib.render(result, console)
        if thresholds.active:
            for v in verdicts:
                console.print(("[green]pass[/] " if v["passed"] else "[red]FAIL[/] ") + v["text"], highlight=False)
    if thresholds.active:
        if unchecked:
            note(f"gate: the target's {', '.join(unchecked)} not named, so not checked (pass --{' --'.join(unchecked)})")
        failed = [v["text"] for v in verdicts if not v["passed"]]
        if failed:
            note("gate failed: " + "; ".join(failed))
            raise typer.Exit(gate_mod.EXIT_GATE_FAILED)
        note("gate passed: " + "; ".join(v["text"] for v in verdicts))
