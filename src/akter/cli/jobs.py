"""``akter jobs list|cancel|watch``: job rows, cancelling one, following one to its outcome.

``jobs watch`` follows one job's progress frames (semantics §5.11) until the job is terminal and
exits with its outcome: ``0`` succeeded (or finished without a trace to tell more), ``2``
dead-lettered, ``3`` cancelled; ``1`` is a refusal, as everywhere in the CLI (an unknown job, a
malformed id). Frames published by another process reach it only when that runner was built
with ``notify=True``; without it, the watch still ends when the job does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.table import Table

from akter._engine.progress import open_progress
from akter._store.gateway.ops import actor_key, actor_outbox, actor_receipts, jobs_overview
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
from akter.errors import ActorError, ConfigurationError
from akter.runtime import Runtime

jobs_app = typer.Typer(name="jobs", help="List, watch and cancel jobs.", no_args_is_help=True)

#: ``jobs watch`` exit codes by outcome (a refusal is 1, as for every command).
WATCH_EXIT = {"succeeded": 0, "finished": 0, "dead_lettered": 2, "cancelled": 3}
#: Longest wait for the progress listener (``LISTEN``) before ``jobs watch`` starts anyway.
_LISTEN_WAIT = 10.0


@jobs_app.command("list")
def jobs_list(target: TargetArg, limit: int = 100, as_json: JsonOption = False) -> None:
    """List job rows, oldest due first."""
    with refusals_exit():
        runtime = load_runtime(target)
        rows = jobs_overview(database_url(runtime), runtime.store.queries, limit)
        if as_json:
            print(json.dumps(rows, default=str))
            return
        table = Table("job id", "actor", "job", "attempts", "state", "last error", title="jobs")
        for r in rows:
            state = (
                "cancelled"
                if r["cancelled_at_ms"]
                else "running"
                if r["running"]
                else "waiting"
                if r["waiting"]
                else "pending"
            )
            table.add_row(
                str(r["job_id"])[-12:],
                f"{r['actor_type']}/{r['actor_id']}",
                r["job"],
                str(r["attempts"]),
                state,
                str(r["last_error"] or "")[:50],
            )
        stdout.print(table)


@jobs_app.command("cancel")
def jobs_cancel(target: TargetArg, job_id: str) -> None:
    """Cancel one job by id (never-run jobs are deleted; others settle as cancelled)."""
    with refusals_exit():
        outcome = operate(target, lambda rt: rt.cancel_job(job_id))
        stdout.print(outcome)
        if outcome == "unknown":
            raise typer.Exit(1)


@jobs_app.command("watch")
def jobs_watch(
    target: TargetArg,
    actor_type: Annotated[str, typer.Argument(help="The type of the actor that owns the job.")],
    actor_id: Annotated[str, typer.Argument(help="The actor id ('' for a singleton).")],
    job_id: Annotated[str, typer.Argument(help="The job id (what enqueue returned).")],
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
    as_json: JsonOption = False,
) -> None:
    """Follow a job's progress until it is terminal; the exit code tells its outcome.

    A frame with numeric ``done`` and ``total`` fields (and an optional ``message``) drives the
    bar; other frames are shown as JSON. With --json, every message is one JSON line on stdout,
    the last one the close with an ``outcome``. Exit codes: 0 succeeded (or finished, when no
    route tells more), 2 dead-lettered (also a cancelled job that became an ambiguous dead
    letter), 3 cancelled, 1 unknown job or refusal.
    """
    with refusals_exit():
        runtime = load_runtime(target)
        runtime.reconfigure(notify=True)  # hear the frames of executors in other processes

        async def work(rt: Runtime) -> str:
            return await _watch(rt, rt.ref(actor_type, actor_id, tenant=tenant), job_id, as_json)

        outcome = operate(runtime, work)
        if not as_json:
            stdout.print(outcome.replace("_", "-"))
        raise typer.Exit(WATCH_EXIT[outcome])


@dataclass
class _Sighting:
    """What ``jobs watch`` saw of the job's row while following it."""

    cancelled: bool = False
    rows: int = 0
    routes: dict[str, str] = field(default_factory=dict)


async def _watch(rt: Runtime, ref: ActorRef, job_id: str, as_json: bool) -> str:
    definition = rt.definition(ref.type)
    # Route commands by name: the trace a finished job leaves is its route (command id = job id).
    routes = {
        fn.__name__: kind for job in definition.jobs.values() for kind, fn in job.routes.items()
    }
    seen = _Sighting(routes=routes)
    # Subscribe before the first look at the row: nothing published after it is missed.
    messages = await open_progress(rt, ref, job_id)
    tracker = asyncio.create_task(_track(rt, ref, job_id, seen), name="akter.cli.watch")
    try:
        if rt.config.notify:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rt.progress.hearing.wait(), _LISTEN_WAIT)
        await _look(rt, ref, job_id, seen)
        stderr.print(f"watching job {job_id} of {ref.type}/{ref.id!r}", markup=False)
        with Steps(f"{ref.type}/{ref.id}", None, plain_every=0) as steps:
            async for message in messages:
                if message.get("closed"):
                    outcome = await _outcome(rt, ref, job_id, seen)
                    if as_json:
                        _emit({**message, "outcome": outcome})
                    return outcome
                if as_json:
                    _emit(message)
                    continue
                _show(steps, message)
    finally:
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
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


async def _track(rt: Runtime, ref: ActorRef, job_id: str, seen: _Sighting) -> None:
    """Look at the job's row every poll: a cancellation may leave no other trace."""
    while True:
        await asyncio.sleep(rt.config.poll_ms / 1000)
        with contextlib.suppress(Exception):  # best-effort: the outcome is decided at the end
            await _look(rt, ref, job_id, seen)


async def _look(rt: Runtime, ref: ActorRef, job_id: str, seen: _Sighting) -> None:
    for row in await actor_outbox(rt.store, _key(rt, ref)):
        if row["intent_id"] == job_id and row["kind"] == "job":
            seen.rows += 1
            seen.cancelled = seen.cancelled or row["cancelled_at_ms"] is not None


def _key(rt: Runtime, ref: ActorRef) -> dict[str, Any]:
    return actor_key(rt.routing_key(ref), ref.tenant, ref.type, ref.id)


async def _outcome(rt: Runtime, ref: ActorRef, job_id: str, seen: _Sighting) -> str:
    """How the job ended, from the durable trace it left (its row is gone by now)."""
    with contextlib.suppress(ActorError):
        await rt.dead_letters.show(job_id)
        return "dead_lettered"
    # A route is an intent (command id = job id) until delivered, then a receipt.
    commands = [
        str(r["command"])
        for r in await actor_outbox(rt.store, _key(rt, ref))
        if r["intent_id"] == job_id and r["kind"] != "job"
    ]
    commands += [
        str(r["command"])
        for r in await actor_receipts(rt.store, _key(rt, ref))
        if r["command_id"] == job_id
    ]
    kinds = {seen.routes.get(c) for c in commands}
    if "cancelled" in kinds or seen.cancelled:
        return "cancelled"
    if "dead_letter" in kinds:
        return "dead_lettered"
    if "success" in kinds:
        return "succeeded"
    if seen.rows:
        return "finished"  # it ended without a route to say more (no on_success declared)
    raise ActorError(
        "InvalidInput",
        f"There is no job {job_id!r} of {ref.type}/{ref.id!r}, and none left a trace; check the "
        "id with 'akter jobs list'.",
        code="unknown_job",
        field="job_id",
    )


__all__ = ["WATCH_EXIT", "jobs_app"]
