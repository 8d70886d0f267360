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
from typing import Annotated, Any

import typer
from rich.markup import escape

from akter.cli._common import JsonOption, TargetArg, operate, refusals_exit, stdout
from akter.cli._tables import (
    RESOLVE_LIMIT,
    Col,
    WideOption,
    is_full_id,
    print_table,
    resolve_id,
    when,
)
from akter.errors import ConfigurationError
from akter.operators.workflows import ENDED, RunDetail, RunSummary
from akter.runtime import Runtime

workflows_app = typer.Typer(
    name="workflows",
    help="Workflow runs: list, show, cancel, signal, retry.",
    no_args_is_help=True,
)

#: The statuses ``--status`` takes (the ``workflows.status`` column).
STATUSES = ("runnable", "running", "suspended", "completed", "failed", "cancelled", "diverged")

RunArg = Annotated[
    str, typer.Argument(help="The run id (what start returned), or its short form as listed.")
]


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
    wide: WideOption = False,
) -> None:
    """List workflow runs, newest first (short run ids; --wide for full ones)."""
    with refusals_exit():
        if status is not None and status not in STATUSES:
            raise ConfigurationError(
                f"--status takes one of {', '.join(STATUSES)}, not {status!r}."
            )

        async def work(rt: Runtime) -> list[RunSummary]:
            return await rt.operators.workflows.runs(
                status=status, actor_type=actor_type, limit=limit
            )

        runs: list[RunSummary] = operate(target, work)
        if as_json:
            print(json.dumps([r.to_json() for r in runs], default=str))
            return
        if wide:
            columns = [
                Col("run id", "id"),
                Col("actor", "text"),
                Col("workflow", "text"),
                Col("status", "text"),
                Col("waiting", "text"),
                Col("attempts", "number"),
                Col("started"),
                Col("error", "text"),
            ]
            rows = [
                [
                    r.run_id,
                    f"{r.actor.type}/{r.actor.id}",
                    r.workflow,
                    _status(r.status, r.cancel_requested),
                    _waiting(r.status, r.waiting, r.wake_at_ms, wide=True),
                    str(r.attempts),
                    when(r.started_at_ms, True),
                    r.error.message if r.error else "",
                ]
                for r in runs
            ]
        else:  # what a run waits for goes with its status; attempts are in --wide
            columns = [
                Col("run id", "id"),
                Col("actor", "text"),
                Col("workflow", "text"),
                Col("status", "text", floor=18),
                Col("started"),
                Col("error", "text"),
            ]
            rows = [
                [
                    r.run_id,
                    f"{r.actor.type}/{r.actor.id}",
                    r.workflow,
                    ": ".join(
                        filter(
                            None,
                            [
                                _status(r.status, r.cancel_requested),
                                _waiting(r.status, r.waiting, r.wake_at_ms, wide=False),
                            ],
                        )
                    ),
                    when(r.started_at_ms, False),
                    r.error.message if r.error else "",
                ]
                for r in runs
            ]
        print_table(stdout, "workflow runs", columns, rows, wide=wide)


@workflows_app.command("show")
def workflows_show(
    target: TargetArg, run_id: RunArg, as_json: JsonOption = False, wide: WideOption = False
) -> None:
    """Show one run: status, wake condition, error, the step journal and its signals."""
    with refusals_exit():

        async def work(rt: Runtime) -> RunDetail:
            return await rt.operators.workflows.detail(await _run(rt, run_id))

        detail: RunDetail = operate(target, work)
        if as_json:
            print(json.dumps(detail.to_json(), default=str))
            return
        _print_detail(detail, wide)


@workflows_app.command("cancel")
def workflows_cancel(target: TargetArg, run_id: RunArg) -> None:
    """Cancel a live run: its next durable await raises WorkflowCancelled.

    A run parked as diverged ends cancelled at once, without running again.
    """
    with refusals_exit():

        async def work(rt: Runtime) -> tuple[str, str]:
            found = await _run(rt, run_id)
            return found, await rt.operators.workflows.operator_cancel(found)

        run_id, outcome = operate(target, work)
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

        async def work(rt: Runtime) -> str:
            found = await _run(rt, run_id)
            await rt.operators.workflows.signal_json(found, signal, body)
            return found

        run_id = operate(target, work)
        stdout.print(f"sent {signal} to run {run_id}", markup=False)


@workflows_app.command("retry")
def workflows_retry(target: TargetArg, run_id: RunArg) -> None:
    """Make a run parked as diverged runnable again (after deploying a fix)."""
    with refusals_exit():

        async def work(rt: Runtime) -> tuple[str, str | None]:
            found = await _run(rt, run_id)
            if await rt.retry_workflow(found):
                return found, None
            return found, (await rt.operators.workflows.detail(found)).status.status

        run_id, status = operate(target, work)
        if status is not None:
            raise ConfigurationError(
                f"Workflow run {run_id!r} is {status}, not diverged; only a diverged run is "
                "retried."
            )
        stdout.print(f"retrying run {run_id}", markup=False)


async def _run(rt: Runtime, given: str) -> str:
    """The run ``given`` names: a full run id as it is, a short one looked up among the runs."""
    if is_full_id(given):
        return given
    runs = await rt.operators.workflows.runs(limit=RESOLVE_LIMIT)
    return resolve_id(given, (r.run_id for r in runs), "workflow run")


# --- output -----------------------------------------------------------------------------------


def _time(ms: int | None) -> str:
    return when(ms, True)


def _status(status: str, cancel_requested: bool) -> str:
    return f"{status} (cancel requested)" if cancel_requested and status not in ENDED else status


def _waiting(status: str, waiting: str | None, wake_at_ms: int | None, *, wide: bool = True) -> str:
    """What a suspended run waits for and until when (nothing for other statuses)."""
    if status != "suspended":
        return ""
    what = waiting or "a wake"
    if waiting and waiting.startswith("sleep until"):
        what = "sleep"
    return f"{what} until {when(wake_at_ms, wide)}" if wake_at_ms is not None else what


def _print_detail(detail: RunDetail, wide: bool) -> None:
    s = detail.status
    out = stdout
    out.print(f"[bold]run {escape(s.run_id)}[/bold]")
    out.print(f"actor       {s.actor.type}/{s.actor.id!r} tenant {s.actor.tenant!r}", markup=False)
    out.print(f"workflow    {s.workflow}" + (f"  key {s.key!r}" if s.key else ""), markup=False)
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
    print_table(
        out,
        "steps",
        [
            Col("seq", "number"),
            Col("kind"),
            Col("name", "text"),
            Col("status"),
            Col("recorded"),
            Col("outcome / detail", "text"),
        ],
        [
            [
                str(step.seq),
                step.kind,
                step.name,
                step.status,
                when(step.recorded_at_ms, wide),
                _short(step.outcome if step.status == "done" else step.detail, wide),
            ]
            for step in s.steps
        ],
        wide=wide,
    )
    print_table(
        out,
        "signals",
        [
            Col("signal id", "id"),
            Col("name", "text"),
            Col("sent"),
            Col("state", "text"),
            Col("payload", "text"),
        ],
        [
            [
                g.signal_id,
                g.name,
                when(g.sent_at_ms, wide),
                g.state if g.state != "consumed" else f"consumed at step {g.consumed_seq}",
                _short(g.payload, wide),
            ]
            for g in detail.signals
        ],
        wide=wide,
    )


def _short(value: Any, wide: bool) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if wide or len(text) <= 60 else text[:59] + "…"


__all__ = ["workflows_app"]
