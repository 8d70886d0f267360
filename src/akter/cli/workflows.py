"""``akter workflows list|show|cancel|signal|retry``: operating workflow runs (workflows W4).

``list`` shows runs across actors, newest first (``--status``, ``--type``, ``--limit``);
``show`` one run: its status, what it waits for and until when, its error, the step journal
and its signals. ``cancel`` asks a live run to cancel (its next durable await raises
``WorkflowCancelled``; a run parked as diverged ends cancelled at once); ``signal`` sends a
signal given as JSON (validated by the wait that takes it: one that does not validate is set
aside); ``retry`` makes a run parked as ``diverged`` runnable again after a fix (W5). A run
that does not exist or has ended, a malformed JSON payload and a retry of a run that is not
diverged are refusals: a one-sentence message and exit code 1.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from akter._engine.workflow_ops import ENDED, RunDetail, RunSummary
from akter.cli._common import JsonOption, TargetArg, operate, refusals_exit, stdout
from akter.errors import ConfigurationError
from akter.runtime import Runtime

workflows_app = typer.Typer(
    name="workflows",
    help="Workflow runs: list, show, cancel, signal, retry.",
    no_args_is_help=True,
)

#: The statuses ``--status`` takes (the ``workflows.status`` column).
STATUSES = ("runnable", "running", "suspended", "completed", "failed", "cancelled", "diverged")

RunArg = Annotated[str, typer.Argument(help="The run id (what start returned).")]


@workflows_app.command("list")
def workflows_list(
    target: TargetArg,
    status: Annotated[
        str | None,
        typer.Option("--status", help=f"Only runs in this status ({', '.join(STATUSES)})."),
    ] = None,
    actor_type: Annotated[
        str | None, typer.Option("--type", help="Only runs of this actor type.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Runs to show.", min=1)] = 100,
    as_json: JsonOption = False,
) -> None:
    """List workflow runs, newest first."""
    with refusals_exit():
        if status is not None and status not in STATUSES:
            raise ConfigurationError(
                f"--status takes one of {', '.join(STATUSES)}, not {status!r}."
            )

        async def work(rt: Runtime) -> list[RunSummary]:
            return await rt.workflows.runs(status=status, actor_type=actor_type, limit=limit)

        runs: list[RunSummary] = operate(target, work)
        if as_json:
            print(json.dumps([r.to_json() for r in runs], default=str))
            return
        table = Table(
            Column("run id", overflow="fold"),
            "actor",
            "workflow",
            "status",
            "waiting",
            "attempts",
            "started",
            "error",
            title="workflow runs",
        )
        for r in runs:
            table.add_row(
                r.run_id,
                f"{r.actor.type}/{r.actor.id}",
                r.workflow,
                _status(r.status, r.cancel_requested),
                escape(_waiting(r.status, r.waiting, r.wake_at_ms)),
                str(r.attempts),
                _time(r.started_at_ms),
                escape(r.error.message[:60]) if r.error else "",
            )
        stdout.print(table)


@workflows_app.command("show")
def workflows_show(target: TargetArg, run_id: RunArg, as_json: JsonOption = False) -> None:
    """Show one run: status, wake condition, error, the step journal and its signals."""
    with refusals_exit():
        detail: RunDetail = operate(target, lambda rt: rt.workflows.detail(run_id))
        if as_json:
            print(json.dumps(detail.to_json(), default=str))
            return
        _print_detail(detail)


@workflows_app.command("cancel")
def workflows_cancel(target: TargetArg, run_id: RunArg) -> None:
    """Cancel a live run: its next durable await raises WorkflowCancelled.

    A run parked as diverged ends cancelled at once, without running again.
    """
    with refusals_exit():
        outcome = operate(target, lambda rt: rt.workflows.operator_cancel(run_id))
        if outcome == "cancelled":
            stdout.print(f"cancelled diverged run {run_id}", markup=False)
        else:
            stdout.print(f"cancel requested for run {run_id}", markup=False)


@workflows_app.command("signal")
def workflows_signal(
    target: TargetArg,
    run_id: RunArg,
    signal: Annotated[
        str, typer.Argument(help="The signal's class name (what the run waits for).")
    ],
    payload: Annotated[str, typer.Argument(help="The signal as a JSON object.")] = "{}",
) -> None:
    """Send a signal, given as JSON, to a live run."""
    with refusals_exit():
        try:
            body: Any = json.loads(payload)
        except ValueError as exc:
            raise ConfigurationError(f"The signal's payload is not JSON: {exc}.") from None
        if not isinstance(body, dict):
            raise ConfigurationError("The signal's payload must be a JSON object.")
        operate(target, lambda rt: rt.workflows.signal_json(run_id, signal, body))
        stdout.print(f"sent {signal} to run {run_id}", markup=False)


@workflows_app.command("retry")
def workflows_retry(target: TargetArg, run_id: RunArg) -> None:
    """Make a run parked as diverged runnable again (after deploying a fix)."""
    with refusals_exit():

        async def work(rt: Runtime) -> str | None:
            if await rt.retry_workflow(run_id):
                return None
            return (await rt.workflows.detail(run_id)).status.status

        status = operate(target, work)
        if status is not None:
            raise ConfigurationError(
                f"Workflow run {run_id!r} is {status}, not diverged; only a diverged run is "
                "retried."
            )
        stdout.print(f"retrying run {run_id}", markup=False)


# --- output -----------------------------------------------------------------------------------


def _time(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _status(status: str, cancel_requested: bool) -> str:
    return f"{status} (cancel requested)" if cancel_requested and status not in ENDED else status


def _waiting(status: str, waiting: str | None, wake_at_ms: int | None) -> str:
    """What a suspended run waits for and until when (nothing for other statuses)."""
    if status != "suspended":
        return ""
    what = waiting or "a wake"
    if waiting and waiting.startswith("sleep until"):
        what = "sleep"
    return f"{what} until {_time(wake_at_ms)}" if wake_at_ms is not None else what


def _print_detail(detail: RunDetail) -> None:
    s = detail.status
    out = stdout
    out.print(
        f"[bold]run {escape(s.run_id)}[/bold]  {escape(s.actor.type)}/{escape(s.actor.id)!r}"
        f" tenant {escape(s.actor.tenant)!r}  workflow {escape(s.workflow)}"
        + (f"  key {escape(s.key)!r}" if s.key else "")
    )
    out.print(f"status      {_status(s.status, s.cancel_requested)}", markup=False)
    if s.status == "suspended":
        out.print(f"waiting     {_waiting(s.status, s.waiting, detail.wake_at_ms)}", markup=False)
    elif s.waiting:
        out.print(f"last note   {s.waiting}", markup=False)
    out.print(f"attempts    {s.attempts}", markup=False)
    out.print(f"started     {_time(s.started_at_ms)}", markup=False)
    if detail.deadline_ms is not None and s.status not in ENDED:
        out.print(f"deadline    {_time(detail.deadline_ms)}", markup=False)
    if s.finished_at_ms is not None:
        out.print(f"finished    {_time(s.finished_at_ms)}", markup=False)
    if s.error is not None:
        out.print(f"error       {s.error.type}: {s.error.message}", markup=False)
    elif s.status == "completed":
        out.print(f"result      {json.dumps(s.result, default=str)}", markup=False)
    table = Table("seq", "kind", "name", "status", "recorded", "outcome / detail", title="steps")
    for step in s.steps:
        table.add_row(
            str(step.seq),
            step.kind,
            escape(step.name),
            step.status,
            _time(step.recorded_at_ms),
            escape(_short(step.outcome if step.status == "done" else step.detail)),
        )
    out.print(table)
    signals = Table("signal id", "name", "sent", "state", "payload", title="signals")
    for g in detail.signals:
        state = g.state if g.state != "consumed" else f"consumed at step {g.consumed_seq}"
        signals.add_row(
            escape(g.signal_id),
            escape(g.name),
            _time(g.sent_at_ms),
            state,
            escape(_short(g.payload)),
        )
    out.print(signals)


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["workflows_app"]
