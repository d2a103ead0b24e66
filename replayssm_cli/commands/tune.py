"""`replayssm tune`: the window and state precision to run for a preset, GPU and batch sizes, and whether ReplaySSM pays."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from replayssm_cli import options
from replayssm_cli.model.dtypes import IODtype, ReadDtype, StateDtype
from replayssm_cli.errors import UserError, cli_command

DEFAULT_BATCHES = (1, 16, 64, 256)


def _dtypes(values: list[str] | None, enum: type, option: str, *, allow_none: bool = False) -> tuple[str, ...] | None:
    words = [p.strip() for v in values or [] for p in v.split(",") if p.strip()]
    if not words:
        return None
    if allow_none and words == ["none"]:
        return ()
    out = []
    for w in words:
        try:
            out.append(enum(w).value)
        except ValueError:
            choices = ", ".join(e.value for e in enum) + (", or none" if allow_none else "")
            raise UserError(f"{option} {w!r} is not a dtype it takes", f"choose from {choices}") from None
    return tuple(dict.fromkeys(out))




@cli_command
def tune(
    preset: Annotated[Optional[list[str]], options.preset("Model preset name or preset file (see `replayssm presets`); one per run.")] = None,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    batch: Annotated[Optional[list[str]], options.batch(show_default="1,16,64,256")] = None,
    window: Annotated[Optional[list[str]], options.window("Candidate windows W, comma-separated or repeated.", show_default="4,8,16,32,64")] = None,
    state_dtype: Annotated[
        Optional[list[str]], options.state_dtype("Candidate state (checkpoint) dtypes (auto: the preset's):", auto="preset", show_default="all")
    ] = None,
    read_dtype: Annotated[
        Optional[list[str]], options.read_dtype("Candidate read-copy dtypes over an fp32 checkpoint:", none=True, show_default="all")
    ] = None,
    draft: Annotated[Optional[list[str]], options.draft("Speculative widths T: also tune verify of T drafts.")] = None,
    accept_rate: Annotated[float, options.accept_rate("Probability that each draft is accepted (the first rejection ends the run), as in `profile`.")] = 0.8,
    error_budget: Annotated[
        float, typer.Option("--error-budget", help="Largest relative output error against fp64 in the longest generation bucket.")
    ] = 1e-3,
    memory_budget: Annotated[
        Optional[float], typer.Option("--memory-budget", help="GiB per GPU for SSM states and buffers. (default: the GPU's memory)")
    ] = None,
    results: Annotated[
        Optional[Path], options.input_file("--results", "Use the times in this results file instead of measuring.", "results file", "-r")
    ] = None,
    measured_only: Annotated[
        bool,
        typer.Option("--measured-only", help="With --results: only candidates the file measured; the others are not predicted."),
    ] = False,
    gpu: Annotated[Optional[str], options.gpu("GPU to predict for when nothing is measured; the H200 reads the shipped reference profile first.", show_default="h200")] = None,
    tp: Annotated[int, options.tp()] = 1,
    io_dtype: Annotated[Optional[str], options.io_dtype("Dtype of inputs and outputs:", show_default="the results file's, else bf16")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Generated tokens the quality run decodes.")] = 4096,
    heads: Annotated[int, typer.Option("--heads", help="Heads of one layer the quality run decodes.")] = 4,
    trace: Annotated[
        Optional[Path], options.input_file("--trace", "Run quality on a recorded trace (benchmarks/record_trace.py) instead of drawn inputs.", "trace file")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the drawn quality inputs.")] = 0,
    stochastic_rounding: Annotated[bool, options.stochastic_rounding(
        "Also weigh every 16-bit and 8-bit state stored with stochastic rounding (a per-slot Philox stream), beside the "
        "same state rounded to nearest: the error by bucket shows which drifts and which holds.")] = False,
    energy: Annotated[bool, typer.Option("--energy", help=(
        "On a GPU, also measure joules per step from NVML's energy counter (about 3 s more per configuration) for the "
        "verdict's tokens per joule; without one the verdict reads the shipped H200 energy profiles."))] = False,
    precompile: Annotated[bool, typer.Option("--precompile/--no-precompile", help=(
        "On a GPU, compile the kernels of the configurations to measure in worker processes (the cores less one, at "
        "most 12; started before the quality run) while the ones already compiled are timed, so that each timed run "
        "loads its kernels from Triton's cache instead of compiling them in turn."))] = True,
    out: Annotated[Optional[Path], options.out("Also write the full report as JSON to this file.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout instead of tables.")] = False,
    details: Annotated[bool, typer.Option("--details", help="After the verdict, every candidate's table and the error by bucket.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Show every column of the --details tables, whatever the terminal's width.")] = False,
) -> None:
    """Recommend a variant, window and state precision per batch size, within an error and a memory budget.

    Every candidate (conventional per state dtype, replay per window and state dtype, split per window and read dtype, and their speculative forms with --draft) gets a time per token (from --results, else measured on this GPU, else from the shipped H200 reference profile when --gpu is the H200, else predicted from the cost model for --gpu; candidates a file lacks are predicted and scaled by its measured ones), an output error against fp64 over a long decode, and its memory per sequence. Over-budget and slower candidates are rejected with the reason; ReplaySSM is recommended only where it beats conventional decode by more than the measurement spread.

    Examples:

      replayssm tune --preset nemotron-3-super-120b-a12b --results runs/h200.json --measured-only

      replayssm tune --preset qwen3.5-122b-a10b --gpu b200 --batch 1,64,256 --memory-budget 40

      replayssm tune --preset nemotron-3-super-120b-a12b --draft 4 --trace layer12.npz --json

      replayssm tune -p nemotron-3-super-120b-a12b --state-dtype bf16,int8 --read-dtype bf16 --stochastic-rounding --details --wide

    The verdict comes first, one line per batch size; --details adds every candidate and the error by bucket, their
    secondary columns left out on a narrow terminal (--wide shows them). On a GPU the kernels of the configurations to
    measure are compiled in parallel worker processes while earlier ones are timed (--no-precompile: each as it is
    first timed).
    """
    from replayssm_cli.advise import tuner, tuning

    preset = options.one_preset(preset, preset_file, "tune")
    if not preset:
        raise UserError("tune needs a preset", "pass --preset NAME (see `replayssm presets`)")
    given = _dtypes(state_dtype, StateDtype, "--state-dtype")
    state_dtypes = given or tuner.DEFAULT_STATE_DTYPES

    read_dtypes = _dtypes(read_dtype, ReadDtype, "--read-dtype", allow_none=True)
    io = _dtypes([io_dtype] if io_dtype else None, IODtype, "--io-dtype")
    spec = tuning.TuneSpec(
        preset=preset,
        batches=options.ints_given(batch, "--batch") or DEFAULT_BATCHES,
        windows=options.ints_given(window, "--window") or tuner.DEFAULT_WINDOWS,
        state_dtypes=state_dtypes,
        read_dtypes=tuner.DEFAULT_READ_DTYPES if read_dtypes is None else read_dtypes,
        drafts=options.ints_given(draft, "--draft"),
        io_dtype=io[0] if io else None,
        accept_rate=accept_rate, error_budget=error_budget, memory_budget=memory_budget, results=results,
        measured_only=measured_only, gpu=gpu, tp=tp, steps=steps, heads=heads, trace=trace, seed=seed, out=out,
        state_dtypes_given=given is not None, rounding="stochastic" if stochastic_rounding else "nearest",
        energy=energy, precompile=precompile,
    )
    done = tuning.run(spec)
    if json_:
        from replayssm_cli.console import print_json

        print_json(done.report)
    else:
        tuning.print_run(done, details=details, wide=wide)
