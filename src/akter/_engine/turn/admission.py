"""Flight 1 of a turn: the actor row lock, the pinned clock, the receipts and the loop fences.

The admission also refreshes the actor's cache inside the transaction when the locked row's
version is not the cached one (the cache is never an authority). That refresh is the only place
a turn decodes stored state (evolution E1): migrations, validation and the loss guard run on a
cold load or a changed row, never on a warm turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from akter import telemetry
from akter._contexts import LoopLease
from akter._engine.turn.flights import Flights
from akter._engine.turn.types import (
    SERVER_BOUND_GRACE_MS,
    Activation,
    BatchDefect,
    Request,
    Retryable,
)
from akter._evolution import StateDecodeError
from akter._json import storable_json
from akter._store.gateway import actors
from akter._store.gateway.workflows import live_keyed_runs, live_keys_answer
from akter._store.pool import TRANSACTION_TIMEOUT_SINCE
from akter._store.queries import Queries
from akter.actor import ActorDefinition


@dataclass
class Admitted:
    """What the admission flight established for the batch."""

    now_ms: int
    #: Stored receipts of the batch's command ids, by id.
    receipts: dict[str, Any]
    locked_version: int
    #: Indexes of loop commands whose lease is no longer current.
    stale: set[int]
    #: Why the stored state cannot be used, if it cannot: ``too_new`` refuses the batch with
    #: ``StateTooNew``; any other kind makes its handlers defects. Nothing is written either way.
    state_error: StateDecodeError | None
    #: ``time.monotonic()`` just before the flight was sent: the server read ``now_ms`` after it,
    #: so ``now_ms`` + the time elapsed since bounds the database clock from above.
    sent_at: float = 0.0
    #: ``time.monotonic()`` once its answers were in: ``now_ms`` + the time since bounds the
    #: database clock from below.
    arrived_at: float = 0.0
    #: The end of each current loop lease (by the index of its command), as read here: the
    #: commit flight checks its own clock reading against it (``writes.send``).
    lease_ends: dict[int, int] = field(default_factory=dict)
    #: The actor's live keyed runs by (workflow, key), read only when the batch is re-run after
    #: a start met a live key (``admit(live_keys=True)``); else ``None``.
    live_runs: dict[tuple[str, str], str] | None = None


def bound_setting(server_version: int) -> str:
    """The setting that ends a frozen turn's session on this server (``engine`` docstring)."""
    if server_version >= TRANSACTION_TIMEOUT_SINCE:
        return "transaction_timeout"
    return "idle_in_transaction_session_timeout"


def settings(
    definition: ActorDefinition, server_version: int, *, generic_plans: bool
) -> dict[str, str | None]:
    """The parameters of the turn's transaction-local settings for a type (built once per type).

    ``generic_plans``: the turn's statements after the lock keep one plan per connection
    (:func:`akter._store.gateway.actors.turn_settings`). Not on Citus, whose planner prunes a
    statement's shards while planning it for its parameters.
    """
    policy = definition.policy
    return actors.turn_settings(
        lock_wait_ms=policy.lock_wait,
        statement_timeout_ms=policy.execution_timeout,
        bound_setting=bound_setting(server_version),
        bound_ms=policy.execution_timeout + SERVER_BOUND_GRACE_MS,
        generic_plans=generic_plans,
    )


async def admit(
    flights: Flights,
    q: Queries,
    act: Activation,
    batch: Sequence[Request],
    *,
    key: actors.Key,
    off: int,
    settings: dict[str, str | None],
    observe: Callable[[int], None],
    coordinator_clock: bool = False,
    worker_lock_wait: bytes | None = None,
    meanwhile: Callable[[], None] | None = None,
    live_keys: bool = False,
) -> Admitted:
    """Send flight 1 and read its answers; ``act``'s cache is refreshed when it was stale.

    ``settings`` are the type's :func:`settings`; ``observe`` gets the pinned database clock
    (the runtime's clock estimate follows it). The row lock, the clock and the receipt probe
    are one statement (``lock_admit``), but with ``coordinator_clock`` (Citus): there the lock
    and the probe (``lock_actor``, ``admission_read``) run in the actor's shard, on a worker,
    and the clock is read by a statement of its own, which runs on the coordinator: a worker's
    clock is not the one every other write reads. There
    the row lock also waits on that worker: ``worker_lock_wait`` (the type's ``SET LOCAL``,
    :func:`akter._store.citus.worker_lock_wait`) bounds it by the policy's ``lock_wait``.
    ``meanwhile`` runs while the server answers the flight (``TurnPipeline.sync``).
    ``live_keys``: the flight also reads the actor's live keyed workflow runs, after the lock
    (``wf_live_keys``; only in a batch re-run after a start met a live key).

    Raises:
        Retryable: The cache believed the actor row existed, and it does not.
        BatchDefect: The default state cannot be stored.
    """
    ensured = not act.exists
    started_ns = time.time_ns() if flights.recording else 0
    # Everything a flight sends is built before the pipeline opens: an exception between
    # two queued statements would leave the connection's prepared-statement cache unsure.
    default_json = default_state_json(act.definition) if ensured else ""
    state_version = act.definition.state_version
    # The ids that may have a receipt: not those minted for their call (Request.unseen).
    command_ids = [r.command_id.raw for r in batch if not r.unseen]
    pipe = flights.pipe
    sent_at = time.monotonic()
    async with flights.admission(meanwhile):
        # A cold turn's ensure_actor may wait on another runner's insert of the row: it needs
        # the timeouts first. A warm turn's lock statement sets them itself (one statement less).
        await actors.begin_turn(pipe, q, settings if ensured else None)
        if worker_lock_wait is not None:
            await actors.bound_worker_locks(pipe, q, worker_lock_wait)
        if ensured:
            await actors.ensure_actor(pipe, q, key, default_json, state_version, off)
        if coordinator_clock:
            lock_cur = await actors.lock_actor(pipe, q, key, act.version, settings)
            read_cur = (
                await actors.read_admission(pipe, q, key, off, command_ids) if command_ids else None
            )
        else:  # one statement: the probe reads after the lock is granted (migration 0011)
            lock_cur = await actors.lock_admit(
                pipe, q, key, act.version, settings, off, command_ids
            )
            read_cur = None
        # Commands of a singleton's loop: their lease, checked now (unlocked: a turn paused
        # between the flights must not hold off a takeover) and held in the commit flight.
        fence_curs = [
            (i, await actors.check_fence(pipe, q, fence_of(f)))
            for i, r in enumerate(batch)
            if (f := r.fence) is not None
        ]
        live_cur = await live_keyed_runs(pipe, q, key) if live_keys else None
        # Last in the flight: the answer's arrival then bounds the reading closely (the commit
        # clock counts from it), however long the shard's statements before it took.
        clock_cur = await actors.read_clock(pipe, q, off) if coordinator_clock else None
    locked, admission = await actors.admission_answers(lock_cur, read_cur, coordinator_clock)
    clock = None if clock_cur is None else await actors.clock_answer(clock_cur)
    leases = [(i, await actors.fence_answer(cur)) for i, cur in fence_curs]
    live = None if live_cur is None else await live_keys_answer(live_cur)
    admitted = _admitted(act, sent_at, locked, admission, clock, leases, live, observe)
    if flights.recording:
        telemetry.child_span("akter.admission", act.ref, started_ns)
    return admitted


def _admitted(
    act: Activation,
    sent_at: float,
    locked: actors.LockedActor | None,
    admission: actors.AdmissionRead | None,
    clock: int | None,
    leases: list[tuple[int, int | None]],
    live: dict[tuple[str, str], str] | None,
    observe: Callable[[int], None],
) -> Admitted:
    """Read the flight's answers, all in: the clock, the receipts, the leases; refresh the cache.

    ``sent_at`` is when the flight left (``Admitted.sent_at``); ``locked`` the locked row;
    ``admission`` the clock and receipts (``admission_read`` on Citus, else ``lock_admit``'s
    own columns); ``clock`` the coordinator's clock (Citus); ``leases`` each loop command's
    lease end by its index; ``live`` the live keyed runs' ids, when read.

    Raises:
        Retryable: The cache believed the actor row existed, and it does not.
    """
    arrived_at = time.monotonic()
    if locked is None:
        # The cache believed the row existed; insert it in the next attempt.
        act.drop_cache()
        raise Retryable("actor row missing")
    if admission is None:
        # Citus, no id to probe (each minted for its call): no admission read was sent, as
        # its clock (the worker's) is not the turn's and no receipt can be stored for them.
        assert clock is not None
        admission = actors.AdmissionRead(clock, [])
    now_ms = admission.now_ms if clock is None else clock
    observe(now_ms)
    # A lease is current while it has not ended at the turn's clock.
    stale = {i for i, lease in leases if lease is None or lease <= now_ms}
    ends = {i: lease for i, lease in leases if lease is not None and i not in stale}
    stored = admission.receipts
    locked_version = locked.version
    state_error = refresh(
        act, locked_version, locked.created, locked.event_seq, locked.state, locked.state_version
    )
    receipts = {r["command_id"]: r for r in stored}
    return Admitted(
        now_ms, receipts, locked_version, stale, state_error, sent_at, arrived_at, ends, live
    )


def fence_of(lease: LoopLease) -> actors.Params:
    """The parameters of a loop lease's fence statements."""
    return actors.fence_params(lease.actor_type, lease.owner, lease.epoch, lease.routing_key)


def refresh(
    act: Activation,
    locked_version: int,
    created: Any,
    event_seq: Any,
    shipped_state: Any,
    shipped_sv: Any,
) -> StateDecodeError | None:
    """The fence on the cache: a stale cache is replaced by the locked row's values.

    Returns why the stored state cannot be used, if it cannot; the cache then forgets the row's
    version, so the next turn has the row shipped and decodes it again (with the same answer,
    or a newer runner's write, or a fixed deploy's).
    """
    state_error: StateDecodeError | None = None
    if shipped_state is not None or act.version is None or act.version != locked_version:
        act.loaded = None
        act.version = locked_version
        act.created = bool(created)
        act.event_seq = int(event_seq)
        act.state_version = int(shipped_sv or 0)
        state_error = decode_state(act, shipped_state)
        if state_error is not None:
            act.version = None
    act.exists = True
    act.created = bool(created)
    act.event_seq = int(event_seq)
    return state_error


def decode_state(act: Activation, shipped: Any) -> StateDecodeError | None:
    """Load shipped state into the cache (the default when none); why it failed, if it did.

    The one decode rule (``ActorDefinition.decode_state``: the chain from the stored version,
    validation, the loss guard), then akter's storable checks on the result: a migrated state
    is written by the next state write exactly as cached here. ``act.state_version`` stays the
    stored version; every write stores the code's (``writes.send``).
    """
    definition = act.definition
    if shipped is None:
        act.loaded = definition.default_state()
        act.state_json = default_state_json(definition)
        return None
    actor = f"{act.ref.type}/{act.ref.id!r}"
    act.loaded = None
    act.state_json = None
    try:
        state, dumped = definition.decode_state(shipped, act.state_version, actor)
        state_json = storable_json(dumped, "state")
    except StateDecodeError as exc:
        return exc
    except (ValueError, TypeError) as exc:  # Unstorable: a migration made NaN, NUL, ...
        return StateDecodeError(
            "invalid",
            f"The stored state of {actor} (version {act.state_version}) cannot be stored "
            f"once migrated: {exc}.",
        )
    act.loaded, act.state_json = state, state_json
    return None


def default_state_json(definition: ActorDefinition) -> str:
    """The stored JSON of the type's default state (a defect when it cannot be stored)."""
    try:
        return storable_json(definition.default_state().model_dump(mode="json"), "state")
    except (ValueError, TypeError) as exc:
        raise BatchDefect(
            0, f"The default state of {definition.name} cannot be stored: {exc}."
        ) from None
