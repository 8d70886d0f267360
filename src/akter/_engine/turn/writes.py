"""Flight 2 of a turn: what the batch writes, and the commit flight that writes it.

:func:`plan` decides, without the database, which statements the batch needs (nothing at all
rolls back instead of committing); :func:`send` queues them in the turn's pipeline in their
fixed order — actor row (with the receipts, in one statement, when the state changed),
events, timer deletes, job cancels, outbox, workflow starts (only when the batch starts a
run), ticks, receipts (when it did not), loop fences and their clock check, ``COMMIT``;
:func:`answers` reads the flight's results once the pipeline has synced.
The release check's clock is not read here: :func:`release_clock` bounds it from the turn's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from akter import telemetry
from akter._contexts import LoopLease
from akter._engine.ticks import first_ticks
from akter._engine.turn import subscribed
from akter._engine.turn.admission import fence_of
from akter._engine.turn.flights import CommitFlight
from akter._engine.turn.owned import OwnedTurn
from akter._engine.turn.types import (
    Activation,
    BatchRun,
    BatchWrites,
    Outcome,
    Request,
    Retryable,
)
from akter._kinds import RowKind
from akter._staging import StagedRow
from akter._store.gateway import actors, staged
from akter._store.gateway.workflows import start_in_turn
from akter._store.pipeline import Statements
from akter._store.queries import Queries
from akter.actor import ActorDefinition


@dataclass
class Plan:
    """What the commit flight of one batch writes."""

    #: The commands that get a receipt, with their outcomes.
    receipts: list[tuple[Outcome, Request]]
    state_changed: bool
    #: Leases of the batch's loop commands that passed the admission check, held to ``COMMIT``.
    fences: list[LoopLease]
    #: The earliest end of those leases as the admission read them (``Admitted.lease_ends``):
    #: the commit flight's own clock reading must be before it (``hold_fence_clock``).
    fences_until: int | None
    #: ``insert_ticks`` parameters when a cold scheduled actor makes sure of its ticks.
    ticks: actors.Params | None
    #: The batch writes nothing: the flight rolls back.
    nothing: bool


def plan(
    act: Activation,
    batch: Sequence[Request],
    ran: BatchRun,
    stale: set[int],
    now_ms: int,
    window_ms: int,
    lease_ends: Mapping[int, int] | None = None,
) -> Plan:
    """Decide the commit flight's statements (pure: ``act`` is only read).

    ``lease_ends``: the end of each current loop lease by its command's index
    (``Admitted.lease_ends``).
    """
    definition = act.definition
    receipts = [(o, r) for o, r in zip(ran.outcomes, batch, strict=True) if o.receipt]
    state_changed = (
        ran.state_json != act.state_json
        or ran.created != act.created
        or ran.event_seq != act.event_seq
    )
    # A cold activation of a created, scheduled actor makes sure its ticks exist (§2.6.5).
    ticks = None
    # ``ran.state_json`` is None only when the stored state could not be decoded: write nothing.
    decoded = ran.state_json is not None
    if decoded and definition.schedules and not definition.singleton and not act.ticks_ensured:
        if ran.created:
            ticks = first_ticks(definition, act.ref, act.routing_key, now_ms, window_ms)
    fences = {
        (f.actor_type, f.owner, f.epoch): f
        for i, r in enumerate(batch)
        if (f := r.fence) is not None and i not in stale
    }
    ends = [end for i, end in (lease_ends or {}).items() if i not in stale]
    nothing = not (state_changed or receipts or ticks is not None) and ran.writes.empty
    held = list(fences.values())
    return Plan(receipts, state_changed, held, min(ends, default=None), ticks, nothing)


@dataclass
class Sent:
    """The cursors of a sent commit flight, read by :func:`answers`."""

    end: actors.Cursor
    cancels: actors.Cursor | None


async def send(
    flights: CommitFlight,
    q: Queries,
    act: Activation,
    todo: Plan,
    ran: BatchRun,
    *,
    key: actors.Key,
    now_ms: int,
    off: int,
    locked_version: int,
    arrived_at: float,
    fence_off: int | None = None,
    meanwhile: Callable[[], None] | None = None,
    owned: OwnedTurn | None = None,
    followed: subscribed.Followed | None = None,
) -> Sent:
    """Queue the commit flight and sync the pipeline (the flight's one round trip).

    ``arrived_at`` is when the admission's answers were in (``Admitted.arrived_at``): relative
    delays count from the commit, whose clock is taken as :func:`commit_clock`. ``off`` is the
    clock offset the turn's reading was taken at; ``fence_off`` the offset now (``off`` if
    ``None``): the fences read the clock in this flight, at the offset it has as it is sent.
    ``meanwhile`` runs once the flight is sent (``TurnPipeline.sync``). ``owned``: the batch's
    owned-row writes, sent first. A warm turn's lead goes first (``Flights.lead``).
    """
    started_ns = time.time_ns() if flights.recording else 0
    writes = ran.writes
    pipe = flights.pipe
    cancels = None
    async with flights.commit(meanwhile):
        if todo.nothing:
            end = await actors.end_turn(pipe, commit=False)
        else:
            commit_ms = commit_clock(now_ms, arrived_at)
            receipts = _receipt_params(todo)
            if owned is not None:
                # First: it may start by rolling back to a failed command's savepoint, which
                # must not undo anything else of this flight (turn/owned.py).
                await owned.send()
            if todo.state_changed:
                await actors.update_actor(
                    pipe,
                    q,
                    key,
                    state_json=ran.state_json,
                    # A migrated state is written at the code's version (lazy migration).
                    state_version=act.definition.state_version,
                    created=ran.created,
                    event_seq=ran.event_seq,
                    now_ms=now_ms,
                    locked_version=locked_version,
                    receipts=receipts,
                    rows_apart=flights.rows_apart,
                )
            if not writes.empty:
                cancels = await _send_staged(flights, q, act, key, writes, now_ms, commit_ms)
            writes.fed = await _queue_subscriptions(
                flights, q, act, key, todo, ran, followed, now_ms
            )
            if todo.ticks is not None:
                await actors.insert_ticks(pipe, q, todo.ticks)
            if receipts is not None and not todo.state_changed:
                await actors.insert_receipts(pipe, q, key, receipts, rows_apart=flights.rows_apart)
            if todo.fences or todo.fences_until is not None:
                fence_off = off if fence_off is None else fence_off
                await _hold_fences(pipe, q, todo, commit_ms, off, fence_off)
            end = await actors.end_turn(pipe, commit=True)
    if flights.recording:
        telemetry.child_span("akter.commit", act.ref, started_ns)
    return Sent(end, cancels)


async def _queue_subscriptions(
    flights: CommitFlight,
    q: Queries,
    act: Activation,
    key: actors.Key,
    todo: Plan,
    ran: BatchRun,
    followed: subscribed.Followed | None,
    now_ms: int,
) -> bool:
    """Queue the batch's subscription writes (``subscribed.queue``); whether it wrote any."""
    return await subscribed.queue(
        flights.pipe,
        q,
        key,
        definition=act.definition,
        followed=followed,
        events=ran.writes.events,
        first_seq=act.event_seq + 1,
        follows=ran.writes.follows,
        delivered=((r.member.name, r.payload) for _, r in todo.receipts),
        now_ms=now_ms,
        rows_apart=flights.rows_apart,
    )


def _receipt_params(todo: Plan) -> actors.Params | None:
    """The receipts' parameters: one receipt as scalars when it rides in the state's update."""
    if len(todo.receipts) == 1 and todo.state_changed:
        # One receipt rides in the update as scalars (update_actor_receipt), not as six
        # one-element arrays.
        return _one_receipt(*todo.receipts[0])
    if todo.receipts:
        return _receipts(todo.receipts)
    return None


async def _send_staged(
    flights: CommitFlight,
    q: Queries,
    act: Activation,
    key: actors.Key,
    writes: BatchWrites,
    now_ms: int,
    commit_ms: int,
) -> actors.Cursor | None:
    """Queue what the batch's commands staged, in the flight's order; the job cancels' cursor.

    On Citus (``flights.rows_apart``) each row goes in a routed statement of its own.
    """
    pipe, rows_apart = flights.pipe, flights.rows_apart
    cancels = None
    if writes.events:
        await staged.insert_events(
            pipe, q, key, now_ms, act.event_seq + 1, writes.events, rows_apart=rows_apart
        )
    if writes.timer_deletes:
        await staged.delete_timers(pipe, q, key, writes.timer_deletes)
    if writes.job_cancels:
        cancels = await staged.cancel_jobs(pipe, q, key, writes.job_cancels, now_ms)
    if writes.rows:
        await staged.insert_outbox(
            pipe,
            q,
            key,
            bucket=act.bucket,
            commit_ms=commit_ms,
            rows=writes.rows,
            ordinals=ordinals(act.definition, writes.rows),
            traceparent=telemetry.traceparent(),  # the batch span staged them
            rows_apart=rows_apart,
        )
    if writes.runs:
        await start_in_turn(
            pipe,
            q,
            key,
            commit_ms=commit_ms,
            runs=writes.runs,
            traceparent=telemetry.traceparent(),
            rows_apart=rows_apart,
        )
    return cancels


async def _hold_fences(
    pipe: Statements, q: Queries, todo: Plan, commit_ms: int, off: int, fence_off: int
) -> None:
    """Queue the loop fences, last before ``COMMIT`` so that they are held through it.

    libpq may send a long flight's first statements before its Sync, so a process frozen
    mid-flight leaves the server waiting for the rest with no timer armed (before PostgreSQL
    17's transaction_timeout): the lease row is then locked only from the last check on, and
    every row stamped before it.
    The check reads the server's clock too: the estimate is stale after a freeze. A lost lease
    fails the flight (serialization_failure), and the retry's admission check refuses with
    LeaseLost. The offset ``fence_off`` is the clock's as the flight is sent: a lease may end on
    a clock moved while the owner was between flights (``off``: the offset of the turn's
    reading). Then the clock is read once more, by a statement on no table: on Citus the held
    check runs on a worker and compares with the estimate alone, and this one runs on the
    coordinator, whose clock wrote the lease.
    """
    for f in todo.fences:
        fence_ms = commit_ms + fence_off - off
        await actors.hold_fence(pipe, q, fence_of(f), fence_ms, fence_off)
    if todo.fences_until is not None:
        await actors.hold_fence_clock(pipe, q, todo.fences_until, fence_off)


def _one_receipt(outcome: Outcome, request: Request) -> actors.Params:
    assert outcome.receipt is not None  # Plan.receipts holds only outcomes with one
    return actors.one_receipt_params(
        command_id=request.command_id.raw,
        command=request.member.name,
        payload_hash=request.digest(),
        caller_key=request.caller_key,
        outcome=outcome.receipt,
        expires=outcome.expires_ms,
    )


def _receipts(rows: list[tuple[Outcome, Request]]) -> actors.Params:
    return actors.receipt_params(
        command_ids=[r.command_id.raw for _, r in rows],
        commands=[r.member.name for _, r in rows],
        payload_hashes=[r.digest() for _, r in rows],
        caller_keys=[r.caller_key for _, r in rows],
        outcomes=[o.receipt for o, _ in rows],
        expires=[o.expires_ms for o, _ in rows],
    )


async def answers(sent: Sent, todo: Plan) -> list[tuple[str, bool]]:
    """The cancelled jobs ``(job id, was running)``.

    Raises:
        Retryable: ``COMMIT`` was answered with something else (the server rolled back).
    """
    if todo.nothing:
        return []
    if sent.end.statusmessage != "COMMIT":
        raise Retryable(f"COMMIT answered {sent.end.statusmessage}")
    if sent.cancels is None:
        return []
    return await actors.cancelled_jobs(sent.cancels)


def release_clock(now_ms: int, sent_at: float, offset_delta_ms: int) -> int:
    """An upper bound of the framework clock now, from the turn's one clock reading.

    The server read the turn's ``now_ms`` after ``sent_at`` (``time.monotonic()`` before the
    admission flight left), so the clock now is at most ``now_ms`` plus the time since, rounded
    up, plus whatever a test moved the runtime's offset by meanwhile. The release check after
    ``COMMIT`` (semantics §2.3) refuses on this bound: whenever a read would have, and within one
    turn's duration of the expiry a little earlier, without a statement after ``COMMIT``.
    """
    return now_ms + math.ceil((time.monotonic() - sent_at) * 1000) + offset_delta_ms


def commit_clock(now_ms: int, arrived_at: float) -> int:
    """The clock relative delays count from: a lower bound of the clock as the commit is sent.

    The server read ``now_ms`` before its answer arrived at ``arrived_at``, so ``now_ms`` plus
    the time since is never ahead of the database clock: an intent sent at once is due at once,
    and a delay counts from at most the admission answer's latency before the commit statement's
    own clock, which the turn no longer reads (one clock reading per turn, one node on Citus).
    """
    return now_ms + int((time.monotonic() - arrived_at) * 1000)


def ordinals(definition: ActorDefinition, rows: list[StagedRow]) -> list[int]:
    """Staging order (from 1) of each capped job row among the batch's rows of the same job.

    Uncapped jobs and intents get 0: their ready time is just their due time.
    """
    seen: dict[str, int] = {}
    ords: list[int] = []
    for row in rows:
        job = definition.jobs.get(row.command) if row.kind == RowKind.JOB else None
        if job is not None and job.options.per_actor is not None:
            seen[row.command] = seen.get(row.command, 0) + 1
            ords.append(seen[row.command])
        else:
            ords.append(0)
    return ords
