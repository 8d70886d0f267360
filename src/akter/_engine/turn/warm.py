"""A warm turn in one round trip (issue 45, ``docs/internals/one-flight-turn.md``).

When the activation's cache is current (its version and state were written by this runner's
last commit of the actor or read by its last admission), the turn runs the handlers first, on
the cached state, with ``now`` from the runner's estimate of the database clock
(``Clock.estimate``, a lower bound), and sends one pipelined flight: ``BEGIN``, ``turn_guard``
(the turn's settings, the row lock, and one check per assumption, each failure a SQLSTATE of
class ``AK``: migration 0019), the batch's writes exactly as the commit flight sends them
(``writes.send``), ``COMMIT``. A failed check aborts the flight: the runner rolls it back and
:func:`turn` answers ``None``, and the engine runs the batch as the two-flight turn, handlers
again, on the locked state.

Only a batch of commands whose ids were minted for their call (``Request.unseen``) or that are a
relay's first delivery of an intent (``Request.first_delivery``) is warm: an id that may have a
receipt (a retry, a pinned id, a redelivery, a staged command, a timer) takes two flights, so a
replay never runs its handler, not even speculatively. A first delivery's id is probed by the
guard (``AK002``): only a redelivery that raced it (its claim's lease ran out meanwhile) can have
committed it, and then the handler's speculative run is discarded and the fallback replays.

Not warm, so two flights, also: a cold activation (first command, an evicted or dropped
cache, a state that could not be decoded), Citus (the lock and the receipts are two statements
there), a batch with a singleton loop's command (its fence reads the lease in the admission), a
type that owns tables (its handlers read and write rows inside the transaction), the re-run of a
batch after a start met a live key, a command id near its expiry or issued after the estimate
(the two-flight turn decides those on the database clock), and a turn with a fault armed at
``before_commit`` (a pause there holds the row lock, inside the transaction, as it always did).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import psycopg

from akter import telemetry
from akter._engine.turn import admission, writes
from akter._engine.turn.flights import CommitFlight
from akter._engine.turn.invoke import Prepared, decode_replies
from akter._engine.turn.owned import OwnedTurn, raise_refused
from akter._engine.turn.subscribed import Followed
from akter._engine.turn.types import Activation, BatchRun, LiveKeyTaken, Request, Result
from akter._store.gateway import actors
from akter._store.gateway.turn_guard import guard_answer, guard_failed, turn_guard
from akter._store.gateway.workflows import live_key_taken
from akter._store.pipeline import Statements
from akter._store.pool import SKEW_MARGIN_MS, Clock
from akter._store.queries import Queries


class Engine(Protocol):
    """What a warm turn uses of ``engine.TurnEngine`` (which imports this module)."""

    clock: Clock
    q: Queries
    window_ms: int
    followed: Followed | None
    fallbacks: collections.Counter[str]

    async def run_commands(
        self,
        act: Activation,
        batch: Sequence[Request],
        admitted: admission.Admitted,
        prepared: Prepared,
        owned: OwnedTurn | None = None,
    ) -> BatchRun: ...

    async def landed(
        self,
        act: Activation,
        batch: Sequence[Request],
        ran: BatchRun,
        todo: writes.Plan,
        cancelled: list[tuple[str, bool]],
        released_at: int,
        locked_version: int,
    ) -> list[Result]: ...


#: How far above the handlers' ``now`` the database clock may be at the guard (``AK004``).
BOUND_MS = SKEW_MARGIN_MS


def eligible(act: Activation, batch: Sequence[Request], strategy: str, live_keys: bool) -> bool:
    """Whether the batch may take the one-flight path (module docstring)."""
    return (
        strategy != "citus"
        and not live_keys
        and act.exists
        and act.version is not None
        and act.state_json is not None
        and not act.definition.tables
        and all(r.fence is None and (r.unseen or r.first_delivery) for r in batch)
    )


def _handler_now(batch: Sequence[Request], estimate_ms: int) -> int | None:
    """The handlers' ``now``: the estimate, or ``None`` when an id does not fit it.

    An external id minted from this runner's estimate (``Clock.estimate`` when it was called)
    was issued at a lower bound of the database clock, so a later one is one too: an id issued
    a little after the estimate (another turn's answer, read late under load, moved the estimate
    back) lifts ``now`` to its issue time; the guard checks it against the database clock all
    the same (``AK004``). An id issued further ahead than the bound, or that expires within it,
    takes the two-flight turn.
    """
    now_ms = estimate_ms
    for r in batch:
        if r.external:
            issued = r.command_id.issued_ms
            if issued > estimate_ms + BOUND_MS:
                return None
            now_ms = max(now_ms, issued)
    if all(r.command_id.expires_ms > now_ms + BOUND_MS for r in batch if r.external):
        return now_ms
    return None


async def turn(
    engine: Engine,
    flights: CommitFlight,
    act: Activation,
    batch: Sequence[Request],
    key: actors.Key,
    settings: actors.Params,
) -> list[Result] | None:
    """Run the batch in one flight; ``None`` when a check failed (nothing was written).

    Raises what the two-flight turn's commit flight raises (``engine._run_batch`` answers it).
    """
    started_ns = time.time_ns() if flights.recording else 0
    clock = engine.clock
    off = clock.offset_ms
    estimated_at = time.monotonic()
    fits = _handler_now(batch, clock.estimate())
    if fits is None:
        engine.fallbacks["estimate"] += 1
        return None
    now_ms = fits
    assert act.version is not None
    locked_version = act.version
    checked = admission.Admitted(
        now_ms, {}, locked_version, set(), None, estimated_at, estimated_at
    )
    prepared = Prepared()
    prepared.fill(act, batch)
    if flights.recording:  # the local admission: its checks ride in the commit flight
        telemetry.child_span("akter.admission", act.ref, started_ns)
    ran = await engine.run_commands(act, batch, checked, prepared)
    todo = writes.plan(act, batch, ran, set(), now_ms, engine.window_ms)
    lead, guards = _guard(engine.q, batch, key, settings, locked_version, now_ms, off)
    for request in batch:
        request.commit_sent = not todo.nothing  # the flight carries its COMMIT from the start
    sent_at = time.monotonic()
    flights.lead = lead
    try:
        sent = await writes.send(
            flights,
            engine.q,
            act,
            todo,
            ran,
            key=key,
            now_ms=now_ms,
            off=off,
            locked_version=locked_version,
            arrived_at=estimated_at,
            meanwhile=lambda: decode_replies(ran.outcomes),
            followed=engine.followed,
        )
    except psycopg.Error as exc:
        if guard_failed(exc.sqlstate) and await flights.rolled_back():
            for request in batch:
                request.commit_sent = False
            engine.fallbacks[str(exc.sqlstate)] += 1
            return None
        _unsent(flights, batch)
        commit_failed(exc, ran, None)
        raise
    except BaseException:
        _unsent(flights, batch)
        raise
    decode_replies(ran.outcomes)
    cancelled = await writes.answers(sent, todo)
    db_now = await guard_answer(guards[0])
    clock.observe(db_now)
    released_at = writes.release_clock(db_now, sent_at, clock.offset_ms - off)
    return await engine.landed(act, batch, ran, todo, cancelled, released_at, locked_version)


def _guard(
    q: Queries,
    batch: Sequence[Request],
    key: actors.Key,
    settings: actors.Params,
    locked_version: int,
    now_ms: int,
    off: int,
) -> tuple[Callable[[Statements], Awaitable[None]], list[actors.Cursor]]:
    """The flight's lead (``BEGIN`` and ``turn_guard``), and the list its answer joins."""
    guards: list[actors.Cursor] = []

    async def lead(pipe: Statements) -> None:
        await actors.begin_turn(pipe, q, None)
        guards.append(
            await turn_guard(
                pipe,
                q,
                key,
                cached_version=locked_version,
                settings=settings,
                command_ids=[r.command_id.raw for r in batch if not r.unseen],
                expires=[r.command_id.expires_ms for r in batch if r.external],
                handler_now=now_ms,
                bound_ms=BOUND_MS,
                off=off,
            )
        )

    return lead, guards


def _unsent(flights: CommitFlight, batch: Sequence[Request]) -> None:
    """A flight that certainly never reached the server committed nothing (``shared``)."""
    if flights.unsent():
        for request in batch:
            request.commit_sent = False


def commit_failed(exc: psycopg.Error, ran: BatchRun, owned: OwnedTurn | None) -> None:
    """Raise what a failed commit flight means, if more than the error itself.

    A keyed workflow start that met a live run of its key (``LiveKeyTaken``), or a value an
    owned table refused (the batch's defect: ``owned.raise_refused``).
    """
    if live_key_taken(exc):
        if any(r.key is not None for r in ran.writes.runs):
            raise LiveKeyTaken(
                "a workflow start met a live run of its key, started meanwhile"
            ) from exc
    raise_refused(owned, exc)
