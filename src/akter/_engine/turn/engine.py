"""The turn engine: one batch of one actor's commands in one fenced transaction.

Two pipelined round trips in the common case (design §5):

1. admission: ``BEGIN``, transaction-local timeouts, the row insert for an actor the cache does
   not know, the locked read of the actor row (state shipped only when the cached version is
   stale), then — in a fresh snapshot taken after the lock — the pinned clock and the batch's
   receipts, and for each command of a singleton's ``run()`` loop a check of its lease row
   (the fence: a stale lease refuses that command with ``LeaseLost``);
2. commit: the guarded state update, events, outbox writes, receipts and ``COMMIT``.

The turn reads the clock once (``lock_admit``): the writes get it as a parameter, and the
release check after ``COMMIT`` uses an upper bound derived from it (``writes.release_clock``).
A warm turn sends four statements: ``BEGIN``, ``lock_admit`` (which sets the timeouts and, on
plain PostgreSQL, generic plans for the rest of the transaction: ``actors.turn_settings``, locks
the row, then reads the clock and the receipts of every command whose id was not minted for
its call: ``Request.unseen``), ``update_actor`` with the receipts (``update_actor_receipt``
with one command's), ``COMMIT``.
On Citus the lock and the receipts are two statements (``lock_actor``, ``admission_read``) and
the clock a third, the coordinator's (``admission.admit``).

Handlers run between the two, on private copies of the state, with nothing else held open.

A warm activation's turn is one flight on plain PostgreSQL (``turn.warm``, issue 45): handlers
first, on the cached state and the clock estimate, then ``BEGIN``, ``turn_guard``, the writes
and ``COMMIT``; a failed guard rolls back and the batch runs as the two flights above.

Both flights are one libpq pipeline (``flights.Flights`` on ``akter._store.pipeline``: the
statements prepared once per connection and sent through ``psycopg.pq``, not psycopg's cursors): the
admission flight ends with a Sync whose answers are all read, so while the handlers run the server
sees a transaction idle after a ReadyForQuery and its idle-in-transaction timer is armed. That is
the server-side bound on a turn whose process froze (SIGSTOP, a VM pause) while holding the actor
row lock: ``transaction_timeout`` on PostgreSQL 17+, ``idle_in_transaction_session_timeout`` before,
both set per turn to ``execution_timeout`` + ``SERVER_BOUND_GRACE_MS`` (a live process gives up at
``execution_timeout`` first). The server then ends the frozen session and its locks; on resume the
turn's commit fails and it is retried into a fresh turn (README, "Connections").
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg_pool import PoolTimeout

from akter import telemetry
from akter._engine.hooks import Hooks
from akter._engine.turn import admission, rules, too_new, warm, writes
from akter._engine.turn.flights import (
    CommitFlight,
    Flights,
    commit_unanswered,
    consistent,
    describe_db_error,
    discard,
    rollback_quietly,
)
from akter._engine.turn.invoke import Prepared, Ran, decode_replies, run_handler
from akter._engine.turn.owned import OwnedTurn, owned_turn
from akter._engine.turn.shared import SharedFlights, SharedWriter
from akter._engine.turn.subscribed import Followed
from akter._engine.turn.types import (
    Activation,
    BatchDefect,
    BatchRun,
    BatchWrites,
    LiveKeyTaken,
    Outcome,
    Request,
    Result,
    Retryable,
)
from akter._policy import ResolvedPolicy
from akter._store.gateway import actors
from akter._store.pool import Clock, Connection, Store
from akter.errors import InjectedCrash

#: The longest a mailbox worker keeps one pooled connection for its consecutive batches. A
#: sequential caller's next command joins the worker that ran its last (``Dispatcher._more``),
#: and its turn then skips the pool: no ``putconn`` and ``getconn`` between the two. The
#: connection goes back once anyone waits for one, when the worker ends, and after this long
#: (the pool then checks and replaces it as its own settings say).
HOLD_MAX_S = 1.0


class _TypeSettings(NamedTuple):
    """A type's turn settings (timeouts, plan cache mode), built once per policy and server."""

    policy: ResolvedPolicy
    server_version: int
    #: ``admission.settings``: the parameters of the transaction-local settings.
    params: dict[str, str | None]
    #: On Citus, the ``SET LOCAL`` that bounds the row lock's wait on the worker; else ``None``.
    worker_lock_wait: bytes | None


class TurnEngine:
    """Runs batches; owned by the dispatcher."""

    #: Whether a warm activation's turn is one flight (``turn.warm``); the tests run the turn
    #: suites both ways by setting it off (tests/integration/conftest.py, ``turn_mode``).
    one_flight: bool = True
    #: Whether a warm turn whose mailbox holds no connection shares a write with other actors'
    #: (``turn.shared``); the tests run the turn suites with it on and off (``turn_mode``).
    shared_writes: bool = True
    #: Whether a mailbox worker may keep its connection for its next batch (:data:`HOLD_MAX_S`);
    #: off, every warm turn shares writes (the tests' ``shared`` turn mode).
    hold_connections: bool = True

    def __init__(
        self,
        store: Store,
        clock: Clock,
        hooks: Hooks,
        *,
        window_ms: int,
        on_commit: Any = None,
        pool_wait: float = 2.0,
        metrics: telemetry.Metrics | None = None,
        state_paths: too_new.StatePaths | None = None,
        followed: Followed | None = None,
    ) -> None:
        self._metrics = metrics or telemetry.Metrics()
        self.store = store
        store.metrics = self._metrics
        self.q = store.queries
        self.clock = clock
        self.hooks = hooks
        self.window_ms = window_ms
        self.on_commit = on_commit
        #: The longest a batch waits for a pooled connection, in seconds (``Runtime(pool_wait=)``).
        self.pool_wait = pool_wait
        self.too_new_warnings = too_new.TooNewWarnings()
        #: Asks which state keys live runners' models declare: a row whose keys this code would
        #: drop is a newer deploy's while one declares them all.
        self.state_paths = state_paths
        self._turn_settings: dict[str, _TypeSettings] = {}
        #: The declared subscriptions by source type: a source's commit bumps their feeds.
        self.followed = followed
        #: Warm turns that ran again in two flights, by why (``turn.warm``): a guard's SQLSTATE,
        #: or ``estimate`` when an id was too near its expiry for the clock estimate.
        self.fallbacks: collections.Counter[str] = collections.Counter()
        #: Sends warm turns several per write: on half the pool's connections, at most 8.
        self.shared = SharedWriter(
            store,
            hooks,
            connections=min(8, max(1, store.pool.max_size // 2)),
            pool_wait=pool_wait,
            metrics=self._metrics,
        )

    @property
    def metrics(self) -> telemetry.Metrics:
        """The runner's metrics (the store's pool records its connection waits into them)."""
        return self._metrics

    async def run(self, act: Activation, batch: Sequence[Request]) -> list[Result]:
        """Run a batch; a defect re-runs its commands one per transaction."""
        started = time.time_ns()
        span, token = telemetry.start_batch(act.ref, batch[0].trace_context, len(batch))
        recording = span.is_recording()  # asked once: the flights and _record follow it
        try:
            results = await self._run(act, batch, recording)
            _record(self.metrics, act, batch, results, started, recording)
        finally:
            telemetry.end_batch(span, token)
        return results

    async def _run(
        self, act: Activation, batch: Sequence[Request], recording: bool
    ) -> list[Result]:
        try:
            return await self._run_batch(act, batch, recording)
        except BatchDefect as defect:
            if len(batch) == 1:
                return [rules.defect(act.ref, batch[0], defect.message)]
        results: list[Result] = []
        for request in batch:
            try:
                results.extend(await self._run_batch(act, [request], recording))
            except BatchDefect as defect:
                results.append(rules.defect(act.ref, request, defect.message))
        return results

    async def _run_batch(
        self, act: Activation, batch: Sequence[Request], recording: bool, live_keys: bool = False
    ) -> list[Result]:
        """One transaction of the batch; ``live_keys``: its re-run after a start met a live key.

        A keyed workflow start whose key a live run holds fails the commit flight
        (``wf_start_in_turn``), so nothing of the batch commits; the batch then runs once more,
        its admission reading the actor's live keyed runs, so that start returns the live run's
        id and stages nothing. The re-run's failures are answered as any turn's.
        """
        policy = act.definition.policy
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.execution_timeout / 1000
        known = act.exists
        pool = self.store.pool
        warm_first = self._warm(act, batch, live_keys)
        try:
            if warm_first and self.shared_writes and act.held is None:
                # No connection of its own: its one flight shares a write (``turn.shared``).
                keep = functools.partial(self._hold, act) if self.hold_connections else None
                shared = SharedFlights(
                    self.shared, act.ref, deadline, recording=recording, keep=keep
                )
                async with asyncio.timeout_at(deadline):
                    landed = await self._warm_turn(act, batch, shared)
                if landed is not None:
                    return landed
                warm_first = False  # its guard failed: the two-flight turn, on a connection
            # getconn/putconn, not ``pool.connection()``: that context also enters the
            # connection's own context, whose exit takes the connection's lock to commit an
            # autocommit session (a no-op here: the turn ends its transaction itself, and the
            # pool's putconn rolls back or replaces whatever a failure left).
            held, act.held = act.held, None
            if held is None:
                conn, taken = await pool.getconn(timeout=self.pool_wait), time.monotonic()
            else:
                conn, taken = held
            flights: Flights | None = None
            kept = False
            try:
                flights = Flights(
                    conn, recording=recording, rows_apart=self.store.strategy == "citus"
                )
                try:
                    async with asyncio.timeout_at(deadline):
                        results = await self._transaction(
                            act, batch, flights, live_keys, warm_first
                        )
                except BaseException as exc:
                    # Whatever happened, the open transaction must not survive: leave the
                    # pipeline and roll back. Only a failure raised between the flights leaves
                    # the connection in a known state (``consistent``); after any other, close
                    # it so the pool replaces it.
                    left = await flights.leave()
                    if not (left and consistent(exc) and await rollback_quietly(conn)):
                        await discard(conn)
                    if not known:
                        act.exists = False  # a row inserted by this admission is gone again
                    raise
                kept = self.hold_connections and _keep(conn, taken, pool.getting)
                if kept:
                    act.held = (conn, taken)
                return results
            finally:
                if not kept:
                    if flights is not None:
                        flights.pipe.unwatch()  # never pooled watched
                    await pool.putconn(conn)
        except BatchDefect:
            raise
        except LiveKeyTaken as taken:
            # The server rolled the batch back (nothing committed): run it again, once.
            for request in batch:
                request.commit_sent = False
            if not live_keys:
                return await self._run_batch(act, batch, recording, live_keys=True)
            act.drop_cache()
            return [rules.unavailable(r, str(taken), False) for r in batch]
        except (PoolTimeout, InjectedCrash, TimeoutError, psycopg.Error, Retryable) as exc:
            return self._failed(act, batch, exc)

    def _failed(
        self, act: Activation, batch: Sequence[Request], exc: BaseException
    ) -> list[Result]:
        """The answers to a batch whose turn failed: an error, or unavailable (retry, replay).

        No connection (``PoolTimeout``) is an error that names the pool's limit; after any other
        failure the cache is dropped (the next turn reads the row), and a command whose commit
        was sent is answered "outcome unknown" unless the failure shows that nothing committed.
        """
        if isinstance(exc, PoolTimeout):
            what = f"the turn of {act.ref.type}/{act.ref.id!r}"
            return [
                Result("error", error=self.store.exhausted(self.pool_wait, what, r.command_id.raw))
                for r in batch
            ]
        act.drop_cache()
        if isinstance(exc, InjectedCrash):
            return [rules.unavailable(r, "injected crash", r.commit_sent) for r in batch]
        if isinstance(exc, TimeoutError):
            why = f"execution timeout of {act.definition.policy.execution_timeout} ms"
            return [rules.unavailable(r, why, r.commit_sent) for r in batch]
        reason = describe_db_error(exc)
        unanswered = commit_unanswered(exc)
        return [rules.unavailable(r, reason, r.commit_sent and unanswered) for r in batch]

    def _warm(self, act: Activation, batch: Sequence[Request], live_keys: bool) -> bool:
        """Whether the batch tries the one-flight turn first (``turn.warm``).

        A pause or crash armed at ``before_commit`` keeps its meaning (the row locked, inside
        the transaction): such a turn takes two flights.
        """
        return (
            self.one_flight
            and warm.eligible(act, batch, self.store.strategy, live_keys)
            and not self.hooks.armed("before_commit")
        )

    async def _warm_turn(
        self, act: Activation, batch: Sequence[Request], flights: CommitFlight
    ) -> list[Result] | None:
        ref = act.ref
        key = actors.actor_key(act.routing_key, ref.tenant, ref.type, ref.id)
        return await warm.turn(self, flights, act, batch, key, self._settings(act).params)

    async def _transaction(
        self,
        act: Activation,
        batch: Sequence[Request],
        flights: Flights,
        live_keys: bool = False,
        warm_first: bool = False,
    ) -> list[Result]:
        ref = act.ref
        if live_keys and self.hooks.armed("before_keyed_start_retry"):
            await self.hooks.at("before_keyed_start_retry", {"ref": ref, "batch": batch})
        if warm_first:
            landed = await self._warm_turn(act, batch, flights)
            if landed is not None:
                return landed
        key = actors.actor_key(act.routing_key, ref.tenant, ref.type, ref.id)
        typed = self._settings(act)
        off = self.clock.offset_ms
        ensured = not act.exists
        prepared = Prepared()
        admitted = await admission.admit(
            flights,
            self.q,
            act,
            batch,
            key=key,
            off=off,
            settings=typed.params,
            observe=self.clock.observe,
            coordinator_clock=self.store.strategy == "citus",
            worker_lock_wait=typed.worker_lock_wait,
            meanwhile=lambda: prepared.fill(act, batch),
            live_keys=live_keys,
        )
        now_ms = admitted.now_ms
        owned = owned_turn(flights, self.q, act)
        ran = await self.run_commands(act, batch, admitted, prepared, owned)
        if self.hooks.armed("before_commit"):
            await self.hooks.at("before_commit", {"ref": ref, "batch": batch})
        todo = writes.plan(
            act, batch, ran, admitted.stale, now_ms, self.window_ms, admitted.lease_ends
        )
        for request in batch:
            request.commit_sent = not todo.nothing  # from here a lost answer leaves it unknown
        try:
            sent = await writes.send(
                flights,
                self.q,
                act,
                todo,
                ran,
                key=key,
                now_ms=now_ms,
                off=off,
                locked_version=admitted.locked_version,
                arrived_at=admitted.arrived_at,
                fence_off=self.clock.offset_ms,
                meanwhile=lambda: decode_replies(ran.outcomes),
                owned=owned,
                followed=self.followed,
            )
        except psycopg.Error as exc:
            warm.commit_failed(exc, ran, owned)
            raise
        decode_replies(ran.outcomes)  # done while the flight was out, unless there was none
        cancelled = await writes.answers(sent, todo)
        released_at = writes.release_clock(now_ms, admitted.sent_at, self.clock.offset_ms - off)
        if ensured and todo.nothing:
            act.exists = False  # the ROLLBACK removed a row the admission may have inserted
        return await self.landed(
            act, batch, ran, todo, cancelled, released_at, admitted.locked_version
        )

    async def landed(
        self,
        act: Activation,
        batch: Sequence[Request],
        ran: BatchRun,
        todo: writes.Plan,
        cancelled: list[tuple[str, bool]],
        released_at: int,
        locked_version: int,
    ) -> list[Result]:
        """After the ``COMMIT`` answer: the cache, the hooks and wakes, the callers' results."""
        # The commit landed: from here on a crash leaves the caller retrying into a replay.
        if not todo.nothing:
            _settle(act, todo, ran, locked_version)
        if self.hooks.armed("after_commit"):
            await self._after_commit_hook(act, batch)
        if self.on_commit is not None and not todo.nothing:
            self.on_commit(act, ran.writes, cancelled)
        if not todo.nothing:
            self._count_writes(act, ran.writes, len(todo.receipts))
        return [
            rules.release(o.result, r, released_at)
            for o, r in zip(ran.outcomes, batch, strict=True)
        ]

    async def _after_commit_hook(self, act: Activation, batch: Sequence[Request]) -> None:
        """The armed ``after_commit`` hook; a crash it injects also drops the cache."""
        try:
            await self.hooks.at("after_commit", {"ref": act.ref, "batch": batch})
        except InjectedCrash:
            act.drop_cache()
            raise

    def _hold(self, act: Activation, conn: Connection, taken: float) -> bool:
        """Whether ``act``'s mailbox keeps the connection its lone shared write took (``keep``)."""
        if act.held is None and _keep(conn, taken, self.store.pool.getting):
            act.held = (conn, taken)
            return True
        return False

    async def release(self, act: Activation) -> None:
        """Give back the connection ``act``'s mailbox worker kept (:data:`HOLD_MAX_S`).

        The dispatcher calls it when the worker ends, and before it waits out a backoff.
        """
        held, act.held = act.held, None
        if held is not None:
            actors.turn_pipeline(held[0]).unwatch()  # kept watched for the next batch
            await self.store.pool.putconn(held[0])

    def _settings(self, act: Activation) -> _TypeSettings:
        """The type's turn timeouts (``admission.settings``), rebuilt when its policy changes."""
        policy, version = act.definition.policy, self.store.server_version
        cached = self._turn_settings.get(act.definition.name)
        if cached is None or cached.policy is not policy or cached.server_version != version:
            on_citus = self.store.strategy == "citus"
            cached = _TypeSettings(
                policy,
                version,
                admission.settings(act.definition, version, generic_plans=not on_citus),
                actors.worker_lock_wait(self.q, policy.lock_wait) if on_citus else None,
            )
            self._turn_settings[act.definition.name] = cached
        return cached

    async def run_commands(
        self,
        act: Activation,
        batch: Sequence[Request],
        admitted: admission.Admitted,
        prepared: Prepared,
        owned: OwnedTurn | None = None,
    ) -> BatchRun:
        """Decide each command and run the handlers of those that run, in order."""
        definition = act.definition
        for request in batch:
            request.digest()  # made by ``prepared`` already, unless it failed: before any handler
        writes = BatchWrites(keyed=admitted.live_runs)
        ran = BatchRun([], writes, act.state_json, act.created, act.event_seq)
        problem = admitted.state_error
        if (
            problem is not None
            and problem.kind == "lost"
            and self.state_paths is not None
            and act.state_version == definition.state_version
        ):
            # Rare (a row another model wrote): one registry read while the row is locked.
            problem = await too_new.newer_writer(
                problem, act.ref, act.state_version, self.state_paths
            )
        if problem is not None and problem.kind == "too_new":
            # Never overwrite a newer code's row: refuse everything, write nothing (not even a
            # receipt), and let the caller's retry find a runner that knows the version.
            self.too_new_warnings.seen(act.ref.type, act.ref.id, problem)
            ran.outcomes = [Outcome(too_new.refusal(r, problem)) for r in batch]
            return ran
        for index, request in enumerate(batch):
            if index in admitted.stale and request.command_id.raw not in admitted.receipts:
                ran.outcomes.append(Outcome(Result("error", error=rules.lease_lost(request))))
                continue
            outcome, ctx = await self._decide_and_run(
                act, request, index, admitted, ran, prepared, owned
            )
            ran.outcomes.append(outcome)
            if ctx is not None and outcome.result.kind == "ok":
                ran.state_json = outcome.state_json
                ran.writes.apply(ctx.staged, ctx.command_id)
                ran.event_seq += len(ctx.staged.events)
                if request.member.spec.creates or not definition.gated:
                    ran.created = True
        return ran

    async def _decide_and_run(
        self,
        act: Activation,
        request: Request,
        index: int,
        admitted: admission.Admitted,
        ran: BatchRun,
        prepared: Prepared,
        owned: OwnedTurn | None,
    ) -> Ran:
        now_ms = admitted.now_ms
        decided = rules.decide(
            request, act.definition, act.ref, now_ms, admitted.receipts, ran.created, index
        )
        if decided is not None:
            return Outcome(decided), None
        if admitted.state_error is not None:
            raise BatchDefect(index, admitted.state_error.message)
        if ran.state_json is None:
            raise BatchDefect(index, "The actor's state could not be loaded.")
        return await run_handler(
            act,
            request,
            index,
            now_ms,
            ran.state_json,
            window_ms=self.window_ms,
            hooks=self.hooks,
            prepared=prepared,
            keyed_runs=ran.writes.keyed,
            owned=owned,
        )

    def _count_writes(self, act: Activation, batch_writes: BatchWrites, receipts: int) -> None:
        actor_type = act.ref.type
        if batch_writes.events:
            self.metrics.count(
                "akter.events.appended", len(batch_writes.events), actor_type=actor_type
            )
        for row in batch_writes.rows:
            self.metrics.count("akter.outbox.staged", kind=row.kind)
        if receipts:
            self.metrics.count("akter.receipts.written", receipts, actor_type=actor_type)


def _settle(act: Activation, todo: writes.Plan, ran: BatchRun, locked_version: int) -> None:
    """Bring the cache up to what the landed commit wrote."""
    if todo.ticks is not None:
        act.ticks_ensured = True
    if todo.state_changed:
        act.version = locked_version + 1
        act.state_version = act.definition.state_version  # what writes.send stored
        act.state_json = ran.state_json
        act.loaded = None  # the handler changed the model it was given: the text is the state
        act.created = ran.created
        act.event_seq = ran.event_seq


def _keep(conn: Connection, taken: float, getting: int) -> bool:
    """Whether a batch's connection may stay with its mailbox worker for the next batch.

    Only one a turn left idle (out of its pipeline, no transaction open), while no caller waits
    for a pooled connection (``getting``), and not past :data:`HOLD_MAX_S`.
    """
    return (
        getting == 0
        and time.monotonic() - taken < HOLD_MAX_S
        and not conn.closed
        and (pg := conn.pgconn).pipeline_status == psycopg.pq.PipelineStatus.OFF
        # pgconn's status, not conn.info's: that builds a ConnectionInfo on every call
        and pg.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


def _record(
    metrics: telemetry.Metrics,
    act: Activation,
    batch: Sequence[Request],
    results: Sequence[Result],
    started_ns: int,
    recording: bool,
) -> None:
    """Count the batch's turns; their server spans only when the batch span records."""
    outcomes = [
        telemetry.turn_outcome(r.kind, r.replayed, getattr(r.error, "reason", "")) for r in results
    ]
    commands = None
    if recording:
        commands = [
            telemetry.CommandSpan(
                r.member.name,
                r.command_id.raw,
                type(r.caller).__name__,
                "command" if r.external else getattr(r.caller, "source", "command"),
            )
            for r in batch
        ]
    telemetry.record_turns(metrics, act.ref, outcomes, started_ns, commands)
