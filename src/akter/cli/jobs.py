"""``akter jobs list|cancel|watch``: job rows, cancelling one, following one to its outcome.

``jobs watch`` follows one job's progress frames (semantics §5.11) until the job is terminal and
exits with the outcome its closing message carries: ``0`` succeeded (or ``unknown``: ended without
a trace to tell more), ``2`` dead-lettered, ``3`` cancelled; ``1`` is a refusal, as everywhere in
the CLI (an unknown job, a malformed id). Frames published by another process reach it only
when that runner was built with ``notify=True``; without it, the watch still ends when the job
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Annotated, Any

import typer

from akter.callers import ActorRef
from akter.cli._common import (
    JsonOption,
    Steps,
    TargetArg,
    database_url,
    load_runtime,
    operate,
    refusals_exit,
    stderr,
    stdout,
)
from akter.cli._tables import (
    RESOLVE_LIMIT,
    Col,
    WideOption,
    is_full_id,
    print_table,
    resolve_id,
)
from akter.errors import ConfigurationError
from akter.runtime import Runtime

jobs_app = typer.Typer(name="jobs", help="List, watch and cancel jobs.", no_args_is_help=True)

#: ``jobs watch`` exit codes by outcome (a refusal is 1, as for every command).
WATCH_EXIT = {"succeeded": 0, "unknown": 0, "dead_lettered": 2, "cancelled": 3}
#: Longest wait for the progress listener (``LISTEN``) before ``jobs watch`` starts anyway.
_LISTEN_WAIT = 10.0


@jobs_app.command("list")
def jobs_list(
    target: TargetArg, limit: int = 100, as_json: JsonOption = False, wide: WideOption = False
) -> None:
    """List job rows, oldest due first (short job ids; --wide for full ones)."""
    with refusals_exit():
        runtime = load_runtime(target)
        rows = runtime.operators.jobs.overview(database_url(runtime), limit)
        if as_json:
            print(json.dumps(rows, default=str))
            return
        # v_jobs' status: pending, running, waiting, waiting_slot, waiting_rate, backoff,
        # cancelled, parked (docs/flow-control.md for the two flow-control states).
        print_table(
            stdout,
            "jobs",
            [
                Col("job id", "id"),
                Col("actor", "text"),
                Col("job", "text"),
                Col("priority", "number"),
                Col("attempts", "number"),
                Col("state"),
                Col("last error", "text"),
            ],
            [
                [
                    str(r["job_id"]),
                    f"{r['actor_type']}/{r['actor_id']}",
                    str(r["job"]),
                    str(r["priority"]),
                    str(r["attempts"]),
                    str(r["status"]),
                    str(r["last_error"] or ""),
                ]
                for r in rows
            ],
            wide=wide,
        )


def resolve_job(runtime: Runtime, given: str) -> str:
    """The job ``given`` names: a full id as it is, a short one looked up among the job rows."""
    if is_full_id(given):
        return given
    rows = runtime.operators.jobs.overview(database_url(runtime), RESOLVE_LIMIT)
    return resolve_id(given, (str(r["job_id"]) for r in rows), "job")


JobArg = Annotated[
    str, typer.Argument(help="The job id (what enqueue returned), or its short form as listed.")
]


@jobs_app.command("cancel")
def jobs_cancel(target: TargetArg, job_id: JobArg) -> None:
    """Cancel one job by id (never-run jobs are deleted; others settle as cancelled)."""
    with refusals_exit():
        runtime = load_runtime(target)
        job_id = resolve_job(runtime, job_id)
        outcome = operate(runtime, lambda rt: rt.operators.jobs.cancel(job_id))
        stdout.print(outcome)
        if outcome == "unknown":
            raise typer.Exit(1)


@jobs_app.command("watch")
def jobs_watch(
    target: TargetArg,
    actor_type: Annotated[str, typer.Argument(help="The type of the actor that owns the job.")],
    actor_id: Annotated[str, typer.Argument(help="The actor id ('' for a singleton).")],
    job_id: JobArg,
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
    as_json: JsonOption = False,
) -> None:
    """Follow a job's progress until it is terminal; the exit code tells its outcome.

    A frame with numeric ``done`` and ``total`` fields (and an optional ``message``) drives the
    bar; other frames are shown as JSON. With --json, every message is one JSON line on stdout,
    the last one the close with an ``outcome``. Exit codes: 0 succeeded (or unknown: it ended
    where this watch could not hear the settle and left no route to tell more), 2 dead-lettered
    (also a cancelled job that became an ambiguous dead letter), 3 cancelled, 1 unknown job or
    refusal.
    """
    with refusals_exit():
        runtime = load_runtime(target)
        job_id = resolve_job(runtime, job_id)
        runtime.reconfigure(notify=True)  # hear the frames of executors in other processes

        async def work(rt: Runtime) -> str:
            return await _watch(rt, rt.ref(actor_type, actor_id, tenant=tenant), job_id, as_json)

        outcome = operate(runtime, work)
        if not as_json:
            stdout.print(outcome.replace("_", "-"))
        raise typer.Exit(WATCH_EXIT[outcome])


async def _watch(rt: Runtime, ref: ActorRef, job_id: str, as_json: bool) -> str:
    # Subscribes before the first look at the job's rows: nothing published after it is missed;
    # a job that no row names is refused here (unknown_job, exit 1).
    messages = await rt.operators.jobs.progress(ref, job_id)
    try:
        if rt.config.notify:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rt.operators.jobs.hearing(), _LISTEN_WAIT)
        stderr.print(f"watching job {job_id} of {ref.type}/{ref.id!r}", markup=False)
        with Steps(f"{ref.type}/{ref.id}", None, plain_every=0) as steps:
            async for message in messages:
                if message.get("closed"):
                    if as_json:
                        _emit(message)
                    return str(message.get("outcome") or "unknown")
                if as_json:
                    _emit(message)
                    continue
                _show(steps, message)
    finally:
        await messages.aclose()
    raise ConfigurationError("The runtime stopped before the job's progress closed.")


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def _show(steps: Steps, message: dict[str, Any]) -> None:
    frame = message.get("frame")
    done = total = None
    text = ""
    if isinstance(frame, dict):
        done, total = frame.get("done"), frame.get("total")
        text = str(frame.get("message") or "")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (done, total))
    if not numeric:
        done, total = float(message.get("seq") or 0), None
        text = json.dumps(frame, separators=(",", ":"))
    steps.update(done, total, f"attempt {message.get('attempt')}  {text}".rstrip())


__all__ = ["WATCH_EXIT", "jobs_app"]
