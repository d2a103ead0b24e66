"""`replayssm e2e`: time one decode step of a whole hybrid model per batch and context, conventional against ReplaySSM."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from replayssm_cli import options
from replayssm_cli.errors import UserError, cli_command

EXIT_INTERRUPTED = 130
EXIT_FAILED = 1
WIDE = 200


# The library's WEIGHT_DTYPES and KV_DTYPES, spelled here so that --help imports no torch.
WeightDtype = Enum("WeightDtype", {d: d for d in ("bf16", "fp8", "nvfp4")}, type=str)
KVDtype = Enum("KVDtype", {d: d for d in ("bf16", "fp8")}, type=str)


@cli_command
def e2e(
    preset: Annotated[Optional[list[str]], options.preset(show_default="one Mamba-2 and one GDN preset")] = None,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    batch: Annotated[Optional[list[str]], options.batch(show_default="1,16,64,256")] = None,
    context: Annotated[Optional[list[str]], options.context(show_default="4096")] = None,
    window: Annotated[int, options.window()] = 16,
    state_dtype: Annotated[Optional[str], options.state_dtype("SSM state (checkpoint) dtype:", show_default="the preset's own (auto)")] = None,
    read_dtype: Annotated[str, options.read_dtype("Read-copy dtype of the split variant:", show_default=True)] = "bf16",
    variant: Annotated[
        Optional[list[str]], options.words("--variant", "SSM variants, comma-separated or repeated.", choices=("conventional", "replay", "split"), show_default="conventional,replay")
    ] = None,
    tp: Annotated[int, options.tp("Tensor-parallel degree: heads and MLP sizes as one GPU of the group sees them.")] = 1,
    tp_launch: Annotated[str, typer.Option(
        "--tp-launch", metavar="LAUNCH", help="How --tp runs: one-gpu times one GPU's shard alone, no all-reduces; spawn starts --tp "
        "processes, one per GPU, over NCCL and times the all-reduces; torchrun is one rank of the processes torchrun "
        "started. Rows and table say which ran.")] = "one-gpu",
    max_weights_gib: Annotated[
        Optional[float],
        options.number("--max-weights-gib", "Cap on weight memory in GiB: MLP/MoE blocks then share weight sets round-robin.", 0.0, 1e6, lo_open=True, show_default="30% of free memory"),
    ] = None,
    gpu: Annotated[Optional[str], options.gpu("GPU whose memory and L2 a --dry-run plans for when no CUDA GPU is present.", show_default="h200")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the layer inventory and memory plan; allocate and time nothing (no GPU needed).")] = False,
    out: Annotated[Optional[Path], options.out("Results file.", show_default="./runs/<time>-<gpu>-e2e.json")] = None,
    weight_dtype: Annotated[str, options.dtype(
        "--weight-dtype", WeightDtype, help="Weights: bf16; fp8 e4m3 with per-tensor scales (torch._scaled_mm, MoE through torch._scaled_grouped_mm; "
        "sm_89+); nvfp4 with --dry-run only (Blackwell's FP4: weight bytes and predicted shares). Takes")] = "bf16",
    kv_dtype: Annotated[str, options.dtype("--kv-dtype", KVDtype, help="KV cache: bf16, or fp8 (through FlashInfer's paged decode attention). Takes")] = "bf16",
    energy: Annotated[bool, typer.Option("--energy", help="Also measure joules per step and tokens per joule from NVML's energy counter (about 3 s more per configuration).")] = False,
    json_: Annotated[bool, typer.Option("--json", help="JSON on stdout instead of tables.")] = False,
) -> None:
    """Time one decode step of a whole model: SSM layers through our kernels, attention over a KV cache, MLP/MoE, norms, LM head.

    Random weights at the preset's shapes (bf16, or fp8 through torch._scaled_mm), real kernels, one CUDA graph per step. Reports the
    time per output token (ITL), tokens per second, the share of the step in SSM layers, attention,
    MLP/MoE and the rest, and ReplaySSM's end-to-end speedup. Prefill is not timed.

    Examples:

      replayssm e2e --preset nemotron-3-super-120b-a12b --batch 1,64,256 --context 4096,32768 --state-dtype fp32

      replayssm e2e --preset nemotron-3-super-120b-a12b --batch 64,256 --tp 4 --tp-launch spawn --weight-dtype fp8

      replayssm e2e --preset qwen3.5-122b-a10b --weight-dtype nvfp4 --dry-run --gpu b300 --json
    """
    from replayssm_cli.measure import e2e as lib
    from replayssm_cli.model import hybrid
    from replayssm_cli.model import presets as presets_mod

    spec = lib.E2ESpec(
        presets=tuple(options.preset_names_given(preset, preset_file)) or presets_mod.DEFAULT_PRESETS,
        batches=options.ints_given(batch, "--batch") or lib.DEFAULT_BATCHES,
        contexts=options.ints_given(context, "--context") or lib.DEFAULT_CONTEXTS,
        variants=options.words_given(variant) or lib.DEFAULT_VARIANTS,
        window=window,
        state_dtype=state_dtype.value if state_dtype else None,
        read_dtype=read_dtype.value,
        tp=tp,
        tp_launch=tp_launch,
        max_weights_gib=max_weights_gib,
        energy=energy,
        weight_dtype=weight_dtype.value,
        kv_dtype=kv_dtype.value,
    )
    spec.validate()
    resolved = [presets_mod.resolve(name, tp) for name in spec.presets]
    for p in resolved:
        hybrid.inventory(p, weight_dtype=spec.weight_dtype)
    if dry_run:
        _dry_run(lib, spec, resolved, gpu, json_)
        return

    import torch

    if spec.weight_dtype not in hybrid.RUNNABLE_WEIGHT_DTYPES:
        lib.check_runnable(spec.weight_dtype, spec.kv_dtype, "", None, has_moe=False)
    from replayssm_cli.measure import tensor_parallel

    cuda = torch.cuda.is_available()
    tensor_parallel.check_launch(spec.tp, spec.tp_launch, cuda=cuda, visible=torch.cuda.device_count() if cuda else 0)
    ranks = (spec, resolved, gpu, out, json_)
    if spec.tp_launch == "spawn":
        tensor_parallel.spawn(tensor_parallel.run_rank, spec.tp, args=("spawn", _measure_rank, ranks, tensor_parallel.quiet_run))
        return
    if spec.tp_launch == "torchrun":
        rank, local, world = tensor_parallel.torchrun_world()
        tensor_parallel.run_rank(rank, world, None, "torchrun", _measure_rank, ranks, tensor_parallel.quiet_run, local_rank=local)
        return
    if not cuda:
        raise UserError(
            "the e2e estimate needs a CUDA GPU: it times the whole model's real kernels, and no prediction of the non-SSM layers is made",
            "run it on a machine with an NVIDIA GPU, or pass --dry-run for the layer inventory and memory plan",
        )
    _measure(lib, spec, resolved, gpu, out, json_)


def _dry_run(lib: Any, spec: Any, resolved: list[Any], gpu: str | None, json_: bool) -> None:
    from replayssm_cli.model import hybrid
    from replayssm_cli.report import e2e_table
    import torch

    from replayssm_cli.console import out as stdout, print_json, sized

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free = int(torch.cuda.mem_get_info()[0])
        l2 = getattr(props, "L2_cache_size", None)
        where = {"name": props.name, "memory": "free", "bytes": free, "l2_bytes": l2}
    else:
        from replayssm_cli.model import gpus

        g = gpus.load_gpu(gpu or "h200")
        free, l2 = int(g.memory_gib * hybrid.GIB), int(g.l2_mib * hybrid.MIB)
        where = {"name": g.name, "key": g.key, "memory": "total (datasheet)", "bytes": free, "l2_bytes": l2}
    entries = lib.dry_run(spec, resolved, free=free, l2_bytes=l2)
    if spec.tp > 1:
        from replayssm_cli.measure.tensor_parallel import plan_summary

        for p, entry in zip(resolved, entries):
            entry["collectives"] = {"source": "modelled: vLLM's tensor-parallel step, not run", **plan_summary(lib.inventory(p))}
    if json_:
        print_json({"gpu": where, "spec": spec.to_dict(), "presets": entries, "notes": lib.notes(spec)})
        return
    console = sized(stdout, WIDE)
    for p, entry in zip(resolved, entries):
        console.print(e2e_table.inventory_table(hybrid.inventory(p, weight_dtype=spec.weight_dtype)))
        console.print(e2e_table.memory_table(entry, spec.batches))
        console.print(e2e_table.prediction_table(entry))
        if "collectives" in entry:
            c = entry["collectives"]
            console.print(f"{p.name}: tp {spec.tp} runs {c['all_reduce']} all-reduces and {c['all_gather']} all-gather per step, "
                          f"{c['bytes_per_seq'] / 1024:.0f} KiB per sequence from each rank (modelled; --tp-launch spawn times them)",
                          highlight=False)
    console.print(
        f"memory planned against {where['bytes'] / hybrid.GIB:.0f} GiB ({where['memory']}) of {where['name']}; "
        f"state dtype {spec.state_dtype or 'each preset’s own'}; {lib.weights_note(spec.weight_dtype)}; "
        f"{hybrid.PREDICTION_METHOD}; nothing was allocated or timed",
        highlight=False,
    )


def _measure_rank(spec: Any, resolved: list[Any], gpu: str | None, out: Path | None, json_: bool, **run_kw: Any) -> None:
    """Rank 0 of `--tp-launch spawn|torchrun`: the one-process path, with the hooks that put the collectives in every step."""
    from replayssm_cli.measure import e2e as lib

    _measure(lib, spec, resolved, gpu, out, json_, **run_kw)


def _measure(lib: Any, spec: Any, resolved: list[Any], gpu: str | None, out: Path | None, json_: bool, **run_kw: Any) -> None:
    from replayssm_cli.report import e2e_table
    from replayssm_cli.report.results import default_out
    from replayssm_cli.console import err, note, out as stdout, print_json, sized, warn
    from replayssm_cli.report.results import ResultsWriter

    if gpu:
        warn("--gpu names the GPU a --dry-run plans for; the detected GPU is measured")
    lib.check_spec_runnable(spec, resolved, "cuda")
    env = lib.environment()
    path = out or default_out(env["gpu"].get("key"), kind="e2e")
    doc = {**spec.to_dict(), "kind": "e2e", "presets_resolved": [p.name for p in resolved], "notes": lib.notes(spec)}
    try:
        writer = ResultsWriter(path, env, doc, exclusive=out is None)
    except OSError as exc:
        raise UserError(f"cannot write the results file {path} ({exc.strerror or exc})", "pass a writable --out") from None
    result = lib.run(spec, resolved, writer, device="cuda", l2_bytes=env["gpu"].get("l2_bytes"), **run_kw)
    rows = result.results.rows
    if json_:
        print_json({
            "rows": rows, "skipped": result.skipped, "max_batch": result.max_batch, "weights": result.plans,
            "notes": lib.notes(spec), "results": str(result.path), "complete": result.results.complete,
        })
    else:
        backends = ", ".join(sorted({r["x_attn_backend"] for r in rows if r.get("x_attn_backend")})) or "none ran"
        title = (f"replayssm e2e · {env['gpu']['name']} · one decode step of the whole model (prefill not timed) · "
                 f"weights {spec.weight_dtype} · KV {spec.kv_dtype} · attention {backends} · {lib.tp_title(spec)}")
        caption = "\n".join(lib.notes(spec))
        sized(stdout, WIDE).print(e2e_table.render_table(rows, title=title, caption=caption))
        for name, plan in result.plans.items():
            note(f"{name}: {plan}")
    note(f"results: {result.path} ({len(rows)} rows{'' if result.results.complete else ', incomplete'})")
    for s in result.skipped:
        warn(f"skipped {s['what']}: {s['why']}")
    for line in e2e_table.largest_fit_lines(result.max_batch):
        note(line)
    for label in result.failed:
        err.print(f"[red]SSM kernels failed their check against the reference, not timed:[/] {label}", highlight=False)
    if result.interrupted:
        note("interrupted: the file holds every row finished before Ctrl-C")
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.failed:
        raise typer.Exit(EXIT_FAILED)
