"""CLI commands for jobs and dead letters: ``jobs list|cancel|watch``, ``dead-letters ...``.

``jobs watch`` follows one job's progress frames (semantics §5.11) until the job is terminal and
exits with its outcome: ``0`` succeeded (or finished without a trace to tell more), ``2``
dead-lettered, ``3`` cancelled; ``1`` is a refusal, as everywhere in the CLI (an unknown job, a
malformed id). Frames published by another process reach it only when that runner was built
with ``notify=True``; without it, the watch still ends when the job does.

``dead-letters retry|discard`` take job ids, or ``--all`` (narrowed by ``--type`` and ``--job``),
and show a progress bar over the letters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.table import Table

from akter._cli_runner import JsonOption, TargetArg, _fetch, _operate, _stdout, load_runtime
from akter._engine.progress import open_progress
from akter.callers import ActorRef
from akter.cli import Steps, _refusals_exit, _stderr, app
from akter.dead_letters import Letter
from akter.errors import ActorError, ConfigurationError
from akter.runtime import Runtime

jobs_app = typer.Typer(name="jobs", help="List, watch and cancel jobs.", no_args_is_help=True)
letters_app = typer.Typer(
    name="dead-letters", help="Dead letters: list, show, retry, discard.", no_args_is_help=True
)
app.add_typer(jobs_app)
app.add_typer(letters_app)

#: ``jobs watch`` exit codes by outcome (a refusal is 1, as for every command).
WATCH_EXIT = {"succeeded": 0, "finished": 0, "dead_lettered": 2, "cancelled": 3}
#: Most letters one ``--all`` takes (newest first); run it again for the rest.
_ALL_LIMIT = 100_000
#: Longest wait for the progress listener (``LISTEN``) before ``jobs watch`` starts anyway.
_LISTEN_WAIT = 10.0


# --- akter jobs -------------------------------------------------------------------------------


@jobs_app.command("list")
def jobs_list(target: TargetArg, limit: int = 100, as_json: JsonOption = False) -> None:
    """List job rows, oldest due first."""
    with _refusals_exit():
        runtime = load_runtime(target)
        rows = _fetch(runtime, "jobs_overview", {"limit": limit})
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
        _stdout.print(table)


@jobs_app.command("cancel")
def jobs_cancel(target: TargetArg, job_id: str) -> None:
    """Cancel one job by id (never-run jobs are deleted; others settle as cancelled)."""
    with _refusals_exit():
        outcome = _operate(target, lambda rt: rt.cancel_job(job_id))
        _stdout.print(outcome)
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
    with _refusals_exit():
        runtime = load_runtime(target)
        runtime.notify = True  # hear the frames of executors in other processes

        async def work(rt: Runtime) -> str:
            return await _watch(rt, rt.ref(actor_type, actor_id, tenant=tenant), job_id, as_json)

        outcome = _operate(runtime, work)
        if not as_json:
            _stdout.print(outcome.replace("_", "-"))
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
        if rt.notify:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rt.progress.hearing.wait(), _LISTEN_WAIT)
        await _look(rt, ref, job_id, seen)
        _stderr.print(f"watching job {job_id} of {ref.type}/{ref.id!r}", markup=False)
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
        await asyncio.sleep(rt.poll_ms / 1000)
        with contextlib.suppress(Exception):  # best-effort: the outcome is decided at the end
            await _look(rt, ref, job_id, seen)


async def _look(rt: Runtime, ref: ActorRef, job_id: str, seen: _Sighting) -> None:
    for row in await _actor_rows(rt, "inspect_outbox", ref):
        if row["intent_id"] == job_id and row["kind"] == "job":
            seen.rows += 1
            seen.cancelled = seen.cancelled or row["cancelled_at_ms"] is not None


async def _actor_rows(rt: Runtime, name: str, ref: ActorRef) -> list[dict[str, Any]]:
    from psycopg.rows import dict_row

    key = {"rk": rt.routing_key(ref), "tenant": ref.tenant, "type": ref.type, "id": ref.id}
    async with rt.store.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(rt.store.queries[name], key)
        return await cur.fetchall()


async def _outcome(rt: Runtime, ref: ActorRef, job_id: str, seen: _Sighting) -> str:
    """How the job ended, from the durable trace it left (its row is gone by now)."""
    with contextlib.suppress(ActorError):
        await rt.dead_letters.show(job_id)
        return "dead_lettered"
    # A route is an intent (command id = job id) until delivered, then a receipt.
    commands = [
        str(r["command"])
        for r in await _actor_rows(rt, "inspect_outbox", ref)
        if r["intent_id"] == job_id and r["kind"] != "job"
    ]
    commands += [
        str(r["command"])
        for r in await _actor_rows(rt, "inspect_receipts", ref)
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


# --- akter dead-letters -----------------------------------------------------------------------


def _letter_json(letter: Letter) -> dict[str, Any]:
    return letter.to_json()


@letters_app.command("list")
def letters_list(target: TargetArg, as_json: JsonOption = False) -> None:
    """List dead letters (never pruned)."""
    with _refusals_exit():
        letters = _operate(target, lambda rt: rt.dead_letters.list())
        if as_json:
            print(json.dumps([_letter_json(x) for x in letters], default=str))
            return
        table = Table(
            "job id", "actor", "job", "attempts", "ambiguous", "cause", title="dead letters"
        )
        for x in letters:
            table.add_row(
                x.job_id[-12:],
                f"{x.ref.type}/{x.ref.id}",
                x.job,
                str(x.attempts),
                "yes" if x.ambiguous else "no",
                x.cause[:60],
            )
        _stdout.print(table)


@letters_app.command("show")
def letters_show(target: TargetArg, job_id: str) -> None:
    """Show one dead letter as JSON."""
    with _refusals_exit():
        letter = _operate(target, lambda rt: rt.dead_letters.show(job_id))
        print(json.dumps(_letter_json(letter), default=str))


JobIdsArg = Annotated[
    list[str] | None, typer.Argument(help="Job ids of the letters (or use --all).")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every letter (narrow with filters).")]
TypeFilter = Annotated[
    str | None, typer.Option("--type", help="With --all: only letters of this actor type.")
]
JobFilter = Annotated[
    str | None, typer.Option("--job", help="With --all: only letters of this job name.")
]


@dataclass
class _Selection:
    ids: list[str]
    every: bool
    actor_type: str | None
    job: str | None

    def check(self) -> None:
        if self.ids and self.every:
            raise ConfigurationError("Name letters by job id or pass --all, not both.")
        if not self.ids and not self.every:
            raise ConfigurationError("Name the letters by job id, or pass --all.")
        if (self.actor_type or self.job) and not self.every:
            raise ConfigurationError("--type and --job narrow --all; pass --all with them.")

    async def letters(self, rt: Runtime) -> list[Letter]:
        """The named letters (all must exist), or every letter that matches the filters."""
        if not self.every:
            return [await rt.dead_letters.show(job_id) for job_id in dict.fromkeys(self.ids)]
        return [
            x
            for x in await rt.dead_letters.list(limit=_ALL_LIMIT)
            if (self.actor_type is None or x.ref.type == self.actor_type)
            and (self.job is None or x.job == self.job)
        ]


@contextlib.contextmanager
def _over(letters: list[Letter], description: str) -> Iterator[Steps]:
    with Steps(description, len(letters)) as steps:
        if not letters:
            steps.note("no dead letters match")
        yield steps


async def _each(
    rt: Runtime, letters: list[Letter], description: str, act: Any
) -> tuple[list[tuple[Letter, Any]], list[Letter]]:
    """Apply ``act`` to each letter with a progress bar; letters gone meanwhile are skipped."""
    done: list[tuple[Letter, Any]] = []
    gone: list[Letter] = []
    with _over(letters, description) as steps:
        for letter in letters:
            try:
                done.append((letter, await act(letter.job_id)))
            except ActorError as exc:
                if exc.code != "unknown_dead_letter":
                    raise
                gone.append(letter)  # another operator took it first
            steps.update(message=letter.job_id)
    for letter in gone:
        _stderr.print(
            f"[yellow]warning:[/yellow] dead letter {letter.job_id} was already gone; skipped."
        )
    return done, gone


@letters_app.command("retry")
def letters_retry(
    target: TargetArg,
    job_ids: JobIdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    job: JobFilter = None,
    as_json: JsonOption = False,
) -> None:
    """Re-enqueue dead letters as new jobs (new ids, printed one per line); warns if ambiguous."""
    with _refusals_exit():
        selection = _Selection(list(job_ids or []), every, actor_type, job)
        selection.check()

        async def work(rt: Runtime) -> tuple[list[tuple[Letter, Any]], list[Letter]]:
            letters = await selection.letters(rt)
            return await _each(rt, letters, "retrying dead letters", rt.dead_letters.retry)

        done, _ = _operate(target, work)
        ambiguous = [letter.job_id for letter, _ in done if letter.ambiguous]
        if ambiguous:
            _stderr.print(
                f"[yellow]warning:[/yellow] {len(ambiguous)} of these letters "
                f"({', '.join(ambiguous)}) are ambiguous: the provider may already have applied "
                "the call; the retry runs it again under a new job id."
            )
        if as_json:
            print(json.dumps([{"job_id": x.job_id, "new_job_id": new} for x, new in done]))
            return
        for _, new_id in done:
            print(new_id)


@letters_app.command("discard")
def letters_discard(
    target: TargetArg,
    job_ids: JobIdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    job: JobFilter = None,
    as_json: JsonOption = False,
) -> None:
    """Delete dead letters (printed one per line as they are discarded)."""
    with _refusals_exit():
        selection = _Selection(list(job_ids or []), every, actor_type, job)
        selection.check()

        async def work(rt: Runtime) -> tuple[list[tuple[Letter, Any]], list[Letter]]:
            letters = await selection.letters(rt)
            return await _each(rt, letters, "discarding dead letters", rt.dead_letters.discard)

        done, _ = _operate(target, work)
        if as_json:
            print(json.dumps([x.job_id for x, _ in done]))
            return
        for letter, _ in done:
            _stdout.print(f"discarded {letter.job_id}")


__all__ = ["WATCH_EXIT", "jobs_app", "letters_app"]
