"""``akter check``: the pre-deploy check of the code in a module against the live database.

It loads ``module:runtime`` without starting it and runs :meth:`akter.Runtime.check`: read-only,
bounded, paged reads of every durable table, judged by the same decode rules the runtime uses.
Exit status: 0 when there is no error finding, 1 when something would be refused, parked or
lost, 2 when the check could not run (database unreachable, schema missing or older than the
code, a read past the statement timeout, a target that does not load). ``--json`` prints one
JSON object on stdout; the default output is a table per actor type, errors first, each finding
with its fix. A progress bar is drawn on stderr only when it is a terminal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from akter.check import SEVERITY_ORDER, CheckReport, Finding
from akter.cli._common import JsonOption, Steps, TargetArg, load_runtime, stderr, stdout
from akter.errors import AkterError

check_app = typer.Typer()

#: Exit statuses.
EXIT_OK, EXIT_FINDINGS, EXIT_UNAVAILABLE = 0, 1, 2
_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


@check_app.command("check")
def check_command(
    target: TargetArg,
    sample: Annotated[
        int | None,
        typer.Option(
            "--sample",
            min=1,
            help="Decode the first N stored states of each actor type [default: all].",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.001, help="Longest one read may take (s).")
    ] = 30.0,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=100_000, help="Rows per page of a scan.")
    ] = 1_000,
) -> None:
    """Check the code against the database before a deploy; writes nothing, starts nothing."""
    with _unavailable_exit():
        runtime = load_runtime(target)
        with _progress() as steps:

            def tell(what: str, done: int, total: int | None) -> None:
                if steps is not None:
                    steps.update(done, total, what)

            report = asyncio.run(
                runtime.check(
                    sample, statement_timeout=timeout, batch_size=batch_size, progress=tell
                )
            )
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        _print(report)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FINDINGS)


@contextmanager
def _unavailable_exit() -> Iterator[None]:
    """A check that could not run: its one-sentence message on stderr and exit status 2."""
    try:
        yield
    except AkterError as exc:  # CheckUnavailable, or a target that does not load
        stderr.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None


@contextmanager
def _progress() -> Iterator[Steps | None]:
    if not stderr.is_terminal:
        yield None  # no bar, and no progress lines, off a terminal
        return
    with Steps("checking", None) as steps:
        yield steps


def _print(report: CheckReport) -> None:
    by_type: dict[str, list[Finding]] = {}
    for finding in report.findings:
        by_type.setdefault(finding.actor_type or "(schema)", []).append(finding)
    # Types with errors first, then warnings; the findings within keep the report's order.
    for actor_type, findings in sorted(
        by_type.items(), key=lambda kv: (min(_rank(f) for f in kv[1]), kv[0])
    ):
        table = Table("severity", "kind", "member", "count", "finding", title=actor_type)
        for f in findings:
            text = f.message + (f"\nfix: {f.fix}" if f.fix else "")
            text += "".join(f"\n  e.g. {example}" for example in f.examples[:3])
            table.add_row(
                f"[{_STYLE[f.severity]}]{f.severity}[/]",
                f.kind,
                escape(f.member or ""),
                str(f.count),
                escape(text),
            )
        stdout.print(table)
    errors, warnings = (sum(f.severity == s for f in report.findings) for s in ("error", "warning"))
    verdict = "ok: nothing would be refused, parked or lost" if report.ok else "not ok"
    stdout.print(f"{verdict} ({errors} errors, {warnings} warnings)")


def _rank(finding: Finding) -> int:
    return SEVERITY_ORDER[finding.severity]


__all__ = ["check_app"]
