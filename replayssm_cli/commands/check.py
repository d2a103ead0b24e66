"""`replayssm check`: every kernel against its reference on this device, or (--compile) compiled for every GPU
generation."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from replayssm_cli import options
from replayssm_cli.model.dtypes import Op
from replayssm_cli.errors import UserError, cli_command

EXIT_FAILED = 1


@cli_command
def check(
    op: Annotated[Optional[Op], typer.Option("--op", help="Check one op's kernels only.", show_default="both", case_sensitive=False)] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the results as JSON on stdout.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="Compile every kernel with every shipped launch row for each GPU generation instead (on the CPU, nothing launched): registers, spills and shared memory, against the committed spill baseline.")] = False,
    target: Annotated[Optional[str], typer.Option("--target", help="With --compile: these targets only, e.g. sm_80,sm_90.", show_default="sm_80,sm_86,sm_89,sm_90,sm_100,sm_120")] = None,
    function: Annotated[Optional[str], typer.Option("--function", help="With --compile: one public kernel function only (decode, decode_multi, accept_snapshot, replay, materialize, verify, accept).", show_default=False)] = None,
    update_baseline: Annotated[bool, typer.Option("--update-baseline", help="With --compile: record these spills as the baseline of this Triton release series.")] = False,
    jobs: Annotated[Optional[int], typer.Option("--jobs", min=1, help="With --compile: compiler processes.", show_default="CPU count")] = None,
    stochastic_rounding: Annotated[bool, options.stochastic_rounding(
        "Also check the 16-bit and 8-bit states' kernels rounding stochastically (the fp32 cases are stored exactly).")] = False,
) -> None:
    """Run every kernel (decode, replay with flushes, split precision, verify + accept, decode_multi) against its reference on small random cases.

    Runs on the CUDA GPU, or on the CPU through Triton's interpreter when TRITON_INTERPRET=1 is set.
    Exits non-zero when any kernel fails.

    --compile compiles them instead, ahead of time and for every GPU generation, without a GPU; it exits
    non-zero on a compile error, a row over a chip's shared memory, or spills over the baseline.

    Examples:

      replayssm check

      TRITON_INTERPRET=1 replayssm check --op mamba2 --json

      replayssm check --compile --target sm_80,sm_120 --op gdn

      TRITON_INTERPRET=1 replayssm check --stochastic-rounding
    """
    from replayssm_cli.console import err, out, print_json

    if not compile_ and (target or function or update_baseline or jobs):
        raise UserError("--target, --function, --update-baseline and --jobs go with --compile", "add --compile")
    if compile_ and stochastic_rounding:
        raise UserError("--stochastic-rounding checks the kernels against their references, --compile only compiles them",
                        "drop one of them")
    if compile_:
        _compile(op.value if op else None, target, function, update_baseline, jobs, json_)
        return
    from replayssm_cli.measure import check as checks

    dev = checks.device()
    results = checks.run_checks(checks.cases(op.value if op else None, "stochastic" if stochastic_rounding else "nearest"), dev)
    if json_:
        print_json(results)
    else:
        out.print(checks.render(results, dev))
    failed = [r for r in results if r["ok"] is False]
    if failed:
        err.print(f"[red]{len(failed)} of {len(results)} kernel checks failed[/]", highlight=False)
        raise typer.Exit(EXIT_FAILED)


def _compile(op: str | None, target: str | None, function: str | None, update_baseline: bool, jobs: int | None,
             json_: bool) -> None:
    from replayssm_cli.measure import compile_check as cc
    from replayssm_cli.console import err, note, out, print_json

    arches = cc.parse_targets(target)
    indices = cc.select(op, function)
    rows = cc.run(arches, indices, jobs=jobs)
    baseline = cc.load_baseline()
    if json_:
        print_json(rows)
    else:
        out.print(cc.render(rows))
    if update_baseline:
        cc.write_baseline(rows)
        note(f"spill baseline of triton {cc.triton_series(rows[0]['triton'])} written to {cc.BASELINE}")
        return
    for series in cc.has_baseline(rows, baseline):
        note(f"no spill baseline for triton {series} in {cc.BASELINE.name}: every spill counts as new")
    failures = cc.judge(rows, baseline)
    for line in failures:
        err.print(f"[red]FAIL[/] {line}", highlight=False, soft_wrap=True)
    if failures:
        err.print(f"[red]{len(failures)} compile check(s) failed[/]", highlight=False)
        raise typer.Exit(EXIT_FAILED)
