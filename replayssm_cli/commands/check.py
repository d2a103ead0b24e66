"""`replayssm check`: every kernel against its reference on this device."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from replayssm_cli.dtypes import Op
from replayssm_cli.errors import cli_command

EXIT_FAILED = 1


@cli_command
def check(
    op: Annotated[Optional[Op], typer.Option("--op", help="Check one op's kernels only.", show_default="both", case_sensitive=False)] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the results as JSON on stdout.")] = False,
) -> None:
    """Run every kernel (decode, replay with flushes, split precision, verify + accept, decode_multi) against its reference on small random cases.

    Runs on the CUDA GPU, or on the CPU through Triton's interpreter when TRITON_INTERPRET=1 is set.
    Exits non-zero when any kernel fails.

    Examples:

      replayssm check

      replayssm check --op gdn --json

      TRITON_INTERPRET=1 replayssm check --op mamba2
    """
    from replayssm_cli import check as checks
    from replayssm_cli.console import err, out, print_json

    dev = checks.device()
    results = checks.run_checks(checks.cases(op.value if op else None), dev)
    if json_:
        print_json(results)
    else:
        out.print(checks.render(results, dev))
    failed = [r for r in results if r["ok"] is False]
    if failed:
        err.print(f"[red]{len(failed)} of {len(results)} kernel checks failed[/]", highlight=False)
        raise typer.Exit(EXIT_FAILED)
