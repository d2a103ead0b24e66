"""`replayssm profile`: time conventional and ReplaySSM decode over a grid and write a results file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from replayssm_cli import options
from replayssm_cli.measure.baselines import names as _baseline_names
from replayssm_cli.errors import UserError, cli_command
# `replayssm tune` measures its candidates through the profiler's setup under this name.
from replayssm_cli.measure.profile import measured_setup as _measured_setup  # noqa: F401

BASELINE_NAMES = _baseline_names()
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_FAILED = 1
WIDE = 240


def _floats(value: str | None, option: str) -> tuple[float, ...]:
    if not value:
        return ()
    try:
        return tuple(float(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise UserError(f"{option} {value!r} is not a list of numbers", f"e.g. {option} 0.1,0.2,0.7") from None


@cli_command
def profile(
    preset: Annotated[Optional[list[str]], options.preset(show_default="nemotron-3-super-120b-a12b, qwen3.5-122b-a10b")] = None,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    batch: Annotated[Optional[list[str]], options.batch(show_default="1,16,64,256")] = None,
    window: Annotated[Optional[list[str]], options.window("ReplaySSM windows W, comma-separated or repeated.", show_default="16")] = None,
    state_dtype: Annotated[Optional[list[str]], options.state_dtype("State (checkpoint) dtypes:", show_default="the preset's own (auto)")] = None,
    read_dtype: Annotated[Optional[list[str]], options.read_dtype("Split precision (adds split rows): read-copy dtypes")] = None,
    io_dtype: Annotated[str, options.io_dtype()] = "bf16",
    stochastic_rounding: Annotated[bool, options.stochastic_rounding(
        "Also time every 16-bit and 8-bit state stored with stochastic rounding (a per-slot Philox stream) beside "
        "rounded to nearest (x_vs_nearest: what it costs); fp32 rows stay exact, the baseline of speedup_vs_fp32.")] = False,
    draft: Annotated[Optional[list[str]], options.draft()] = None,
    accept_rate: Annotated[float, options.accept_rate()] = 0.8,
    accept_dist: Annotated[Optional[str], options.accept_dist()] = None,
    tp: Annotated[int, options.tp()] = 1,
    layers: Annotated[
        Optional[int], options.count("--layers", "Cap on the SSM layers timed per configuration.", 1, 4096, show_default="the preset's, up to 4x the L2")
    ] = None,
    aligned_flush: Annotated[
        bool, typer.Option("--aligned-flush", help="All rows flush on the same step (the worst case) instead of staggered.")
    ] = False,
    phases: Annotated[bool, typer.Option("--phases/--no-phases", help="Also time ReplaySSM's non-flush and flush steps alone.")] = True,
    repeats: Annotated[int, options.count("--repeats", "Timed CUDA-graph replays per configuration.", 1, 100_000)] = 30,
    baseline: Annotated[
        Optional[list[str]],
        options.words(
            "--baseline",
            f"Serving-stack kernels to time beside ours, comma-separated or repeated: {', '.join(BASELINE_NAMES)}, or all. "
            "One missing its package is skipped with what to install.",
        ),
    ] = None,
    gpu: Annotated[Optional[str], options.gpu("GPU to predict for without a CUDA GPU (or with --predict).", show_default="h200")] = None,
    predict: Annotated[bool, typer.Option("--predict", help="Predict from the cost model even where a GPU is present.")] = False,
    require_gpu: Annotated[bool, typer.Option("--require-gpu", help="Fail instead of predicting when no CUDA GPU is present.")] = False,
    out: Annotated[Optional[Path], options.out("Results file.", show_default="./runs/<time>-<random>-<gpu>.json, unique per run")] = None,
    ncu: Annotated[
        bool,
        typer.Option("--ncu", help="Also run each measured kernel once under Nsight Compute (clocks left alone) and record its DRAM and L2 bytes and FLOPs beside the model's."),
    ] = False,
    ncu_report: Annotated[
        Optional[Path],
        typer.Option("--ncu-report", metavar="DIR", help="With --ncu (implied): keep each configuration's .ncu-rep in DIR, "
                     "to open in Nsight Compute; the table names them."),
    ] = None,
    energy: Annotated[bool, typer.Option("--energy", help="Also measure joules per step and tokens per joule from NVML's energy counter (about 3 s more per configuration).")] = False,
    gpus: Annotated[Optional[str], typer.Option(
        "--gpus", metavar="N|all", help="Split the grid over N visible GPUs (or all), one process each, rows merged into one file "
        "as they finish, each naming its GPU; a preset's batch stays on one GPU, so every ratio is within one.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the rows as JSON on stdout instead of the table.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show every column of the table, whatever the terminal's width.")] = False,
) -> None:
    """Time conventional and ReplaySSM decode kernels of model presets over a grid, and write a results file.

    Every SSM layer of the stack has its own state pool, each kernel is checked against its
    reference before it is timed, and rows are written as they finish. Without a CUDA GPU the
    profile is predicted for --gpu from the cost model calibrated on the shipped H200 measurements,
    every row marked predicted and shown beside the shipped measurement where one exists. --baseline
    adds the serving stacks' own kernels (FlashInfer, mamba_ssm, fla, vLLM) on the same inputs,
    each at its fastest launch settings.

    Examples:

      replayssm profile --baseline all

      replayssm profile --preset nemotron-3-super-120b-a12b --batch 64,256 --state-dtype fp32 --read-dtype bf16

      replayssm profile --preset qwen3.5-122b-a10b --draft 2,4 --accept-rate 0.9 --gpus all --out runs/spec.json --json

      replayssm profile --state-dtype fp32,bf16,int8,fp8 --stochastic-rounding --batch 64,256
    """
    from replayssm_cli.model import presets as presets_mod
    from replayssm_cli.measure import grid
    from replayssm_cli.report import profile_table
    from replayssm_cli.measure import profile as prof
    from replayssm_cli.report import provenance
    from replayssm_cli.advise import verdict
    from replayssm_cli.console import err, note, print_json, sized, warn
    from replayssm_cli.console import out as stdout

    if out is not None:
        from replayssm_cli.report.results import check_out_path

        check_out_path(out)
    spec = grid.ProfileSpec(
        presets=tuple(options.preset_names_given(preset, preset_file)) or presets_mod.DEFAULT_PRESETS,
        batches=options.ints_given(batch, "--batch") or grid.DEFAULT_BATCHES,
        windows=options.ints_given(window, "--window") or grid.DEFAULT_WINDOWS,
        state_dtypes=options.words_given(state_dtype),
        read_dtypes=options.words_given(read_dtype),
        io_dtype=io_dtype,
        drafts=options.ints_given(draft, "--draft"),
        accept_rate=accept_rate,
        accept_dist=_floats(accept_dist, "--accept-dist"),
        tp=tp,
        layers=layers,
        aligned_flush=aligned_flush,
        phases=phases,
        repeats=repeats,
        baselines=options.words_given(baseline),
        energy=energy,
        rounding="stochastic" if stochastic_rounding else "nearest",
    )
    if ncu_report is not None:
        try:
            ncu_report.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--ncu-report {ncu_report}: {exc.strerror or exc}", "pass a folder it can write") from None
    if not predict:
        from replayssm_cli.measure.check import refuse_missing_features

        refuse_missing_features(spec.read_dtypes, spec.state_dtypes)
    n = _gpus(gpus, predict, ncu or ncu_report is not None)
    if n > 1:
        from replayssm_cli.measure.profile_gpus import run_profile_gpus

        run = run_profile_gpus(spec, n, out=out)
    else:
        run = prof.run_profile(spec, out=out, predict=predict, require_gpu=require_gpu, gpu=gpu)

    rows = run.results.rows
    ncu = ncu or ncu_report is not None
    if ncu and run.mode == "measured" and not run.interrupted:
        from replayssm_cli.measure import ncu as ncu_mod
        from replayssm_cli.report.results import write_atomic

        ncu_mod.annotate_rows(rows, ncu_mod.specs_from_rows(rows), report_dir=ncu_report)
        write_atomic(run.path, run.results.to_dict())
    elif ncu:
        warn("--ncu needs measured rows on a CUDA GPU: this profile has no Nsight Compute figures")
    if energy and run.mode != "measured":
        warn("--energy needs a CUDA GPU: this profile has no energy figures")
    if json_:
        print_json([{**r, "x_provenance": provenance.row_label(r)} for r in rows])
    else:
        title = f"replayssm profile · {run.gpu_name} · {run.mode}"
        caption = _caption(run.mode, run.ceilings, any(r["variant"].startswith("baseline:") for r in rows))
        console = sized(stdout, WIDE, wide=wide)
        table = profile_table.render_table(rows, title=title, caption=caption, layers_of=run.layers_of,
                                  width=None if wide or not console.is_terminal else console.width)
        console.print(table)
        if ncu and run.mode == "measured" and (ncu_table := ncu_mod.comparison_table(rows)) is not None:
            sized(stdout, WIDE, wide=wide).print(ncu_table)
        # A run cut short gets no verdict: its rows are a part of the grid, and Ctrl-C or SIGTERM must end it at once.
        if not run.interrupted:
            stdout.print("\n" + verdict.profile_verdict(rows, run.presets, gpu=run.gpu_name), highlight=False, markup=False, soft_wrap=True)
    note(f"results: {run.path} ({len(rows)} rows{'' if run.results.complete else ', incomplete'})")
    not_run = [s for s in run.skipped if s["why"] == prof.INTERRUPTED]
    for s in run.skipped:
        if s["why"] != prof.INTERRUPTED:
            warn(f"skipped {s['what']}: {s['why']}")
    if any("out of memory" in s["why"] for s in run.skipped):
        for key, b in sorted(run.largest_fit.items()):
            note(f"largest batch that fit: {key}: {b}")
    for label in run.failed:
        err.print(f"[red]failed its check against the reference, not timed:[/] {label}", highlight=False)
    if run.interrupted:
        how = "terminated (SIGTERM)" if run.stop_signal == "SIGTERM" else "interrupted"
        note(f"{how}: {len(not_run)} configurations not run (listed in the file); it holds every row finished before")
        raise typer.Exit(EXIT_TERMINATED if run.stop_signal == "SIGTERM" else EXIT_INTERRUPTED)
    if run.failed:
        raise typer.Exit(EXIT_FAILED)


def _gpus(value: str | None, predict: bool, ncu: bool) -> int:
    """How many GPUs --gpus asks for (1 without it); one line for what cannot go with it."""
    if value is None:
        return 1
    import torch

    from replayssm_cli.measure.profile_gpus import gpu_count

    if predict:
        raise UserError("--gpus measures on several GPUs and --predict measures nothing", "drop one of them")
    if ncu:
        raise UserError("--ncu profiles one GPU's kernels under Nsight Compute", "drop --gpus, or --ncu")
    if not torch.cuda.is_available():
        raise UserError("--gpus runs one process per CUDA GPU, and no CUDA GPU is visible", "drop --gpus (a predicted profile needs no GPU)")
    return gpu_count(value, torch.cuda.device_count())


def _caption(mode: str, c: Any, baselines: bool = False) -> str:
    bw = f"{c.copy_gbs:.0f} GB/s copy bandwidth ({c.source})" if c is not None else "no known ceiling"
    lines = [
        "µs per token per layer: " + (
            "predicted, no kernel ran: the cost model's bytes and FLOPs over the GPU's datasheet ceilings divided by the efficiency "
            "fitted to the shipped measurements (± the fit's error; the roofline alone where no measurement covers the kernel)"
            if mode == "predicted" else "median per-step time over CUDA-graph replays, ± half the interquartile range (noisy above 10%)"),
        f"%BW: modelled bytes over the time, as a share of the {bw}; AI: FLOP per byte",
        "speedup: the baseline's µs per token over the row's, same preset, batch and dtypes (quartile range); the baseline is the conventional step at the same state precision, "
        "for split precision the fp32 conventional step, for spec-replay the snapshot-writing spec-conventional step (vs decode: over plain conventional decode); spec-conventional times decode_multi only (accept is a pointer move, as in vLLM)",
        "flush cost/share: extra µs of a flush step over a non-flush one / its share of the average step; MiB/seq over all SSM layers of the preset; seqs fit in free GPU memory",
    ]
    if baselines:
        lines.append("baseline:<name>: an outside kernel at its fastest launch settings; 'ours N.NNx': its µs over our kernel's of the variant it competes with (above 1, ours is faster)")
    return "\n".join(lines)
