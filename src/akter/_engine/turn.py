"""The turn engine: one batch of one actor's commands in one fenced transaction.

Two pipelined round trips in the common case (design §5):

1. admission: ``BEGIN``, transaction-local timeouts, the row insert for an actor the cache does
   not know, the locked read of the actor row (state shipped only when the cached version is
   stale), then — in a fresh snapshot taken after the lock — the pinned clock and the batch's
   receipts, and for each command of a singleton's ``run()`` loop a check of its lease row
   (the fence: a stale lease refuses that command with ``LeaseLost``);
2. commit: the guarded state update, events, outbox writes, receipts, ``COMMIT`` and the
   release-check clock read.

Handlers run between the two, on private copies of the state, with nothing else held open.

Both flights are one psycopg pipeline (``_Flights``): the admission flight ends with a Sync whose
results are read without a Flush, so while the handlers run the server sees a transaction idle
after a ReadyForQuery and its idle-in-transaction timer is armed. That is the server-side bound
on a turn whose process froze (SIGSTOP, a VM pause) while holding the actor row lock:
``transaction_timeout`` on PostgreSQL 17+, ``idle_in_transaction_session_timeout`` before, both
set per turn to ``execution_timeout`` + ``SERVER_BOUND_GRACE_MS`` (a live process gives up at
``execution_timeout`` first). The server then ends the frozen session and its locks; on resume
the turn's commit fails and it is retried into a fresh turn (README, "Connections").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ValidationError

from akter import telemetry
from akter._engine.hooks import Hooks
from akter._ids import CommandId, bucket, child_id, is_uuid8, mint_framework_id
from akter._json import (
    Unstorable,
    check_finite,
    storable_json,
    stored_value,
    unserializable_path,
)
from akter._store.pool import TRANSACTION_TIMEOUT_SINCE, Clock, Connection, Store
from akter.actor import ActorDefinition, Member
from akter.callers import ActorRef, Caller, System, caller_key
from akter.context import IN_TURN, LoopLease, StagedRow, TurnContext
from akter.errors import ActorError, DeclaredError, InjectedCrash

log = logging.getLogger("akter.turn")

EVENT_BYTES_LIMIT = 1_048_576
BATCH_LIMIT = 32
#: The server ends a turn's session this long after its execution timeout (module docstring).
SERVER_BOUND_GRACE_MS = 1_000


@dataclass
class Request:
    """One command waiting in an actor's mailbox."""

    member: Member
    ref: ActorRef
    payload: dict[str, Any]
    payload_hash: str
    command_id: CommandId
    caller: Caller
    external: bool
    future: asyncio.Future[Result]
    enqueued_at: float = field(default_factory=time.monotonic)
    #: A singleton loop's lease: the turn refuses the command unless it is still current.
    fence: LoopLease | None = None
    #: The caller's OpenTelemetry context: the batch span becomes a child of the first request's.
    trace_context: Any = field(default_factory=telemetry.current_context)
    #: Set once a commit flight carrying this command was sent: only then can a failure leave
    #: its outcome unknown (an ``ActorUnavailable`` coded ``outcome_unknown``).
    commit_sent: bool = False

    @property
    def caller_key(self) -> str:
        """The caller key stored in receipts."""
        return caller_key(self.caller)


@dataclass
class Result:
    """What one command's turn produced, as the caller will see it."""

    kind: Literal["ok", "declared", "error"]
    value: Any = None
    error: BaseException | None = None
    replayed: bool = False


class BatchDefect(Exception):
    """A defect aborted a batch: its commands are re-run one per transaction."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


class _Retryable(Exception):
    """The batch failed in a retryable way."""


@dataclass
class Activation:
    """The in-memory cache of one actor: a cache only, never an authority."""

    definition: ActorDefinition
    ref: ActorRef
    routing_key: int
    exists: bool = False
    version: int | None = None
    state: BaseModel | None = None
    state_json: str | None = None
    state_version: int = 0
    created: bool = False
    event_seq: int = 0
    last_used: float = field(default_factory=time.monotonic)
    backoff: float = 0.0
    ticks_ensured: bool = False

    @property
    def bucket(self) -> int:
        """The actor's bucket (``routing_key >> 56``)."""
        return bucket(self.routing_key)

    def drop_cache(self) -> None:
        """Forget everything cached: the next turn reloads from the database."""
        self.exists = False
        self.version = None
        self.state = None
        self.state_json = None


@dataclass
class _Outcome:
    """Per command: the receipt to write (its stored JSON text, if any) and the caller's result."""

    result: Result
    receipt: str | None = None
    expires_ms: int = 0
    #: A successful handler's new state, as stored JSON text.
    state_json: str | None = None


@dataclass
class _BatchWrites:
    """Staged work of the batch's successful commands, merged in order."""

    events: list[tuple[str, str, str]] = field(default_factory=list)  # tag, payload, command id
    rows: list[StagedRow] = field(default_factory=list)
    timer_deletes: list[str] = field(default_factory=list)
    job_cancels: list[str] = field(default_factory=list)

    def apply(self, ctx: TurnContext) -> None:
        for tag, payload in ctx.staged.events:
            self.events.append((tag, payload, ctx.command_id or ""))
        for op, arg in ctx.staged.ops:
            if op == "row":
                self.rows.append(arg)
            elif op == "cancel_timer":
                # The last staging of a key wins; a cancellation drops earlier stagings.
                self.rows = [
                    r for r in self.rows if not (r.kind == "intent" and r.timer_key == arg)
                ]
                if arg not in self.timer_deletes:
                    self.timer_deletes.append(arg)
            elif op == "cancel_job":
                self.rows = [r for r in self.rows if not (r.kind == "job" and r.timer_key == arg)]
                if arg not in self.job_cancels:
                    self.job_cancels.append(arg)


def _ms_text(ms: int) -> str:
    return f"{max(ms, 1)}ms"


class TurnEngine:
    """Runs batches; owned by the dispatcher."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        hooks: Hooks,
        *,
        window_ms: int,
        on_commit: Any = None,
    ) -> None:
        self._metrics = telemetry.Metrics()
        self.store = store
        self.q = store.queries
        self.clock = clock
        self.hooks = hooks
        self.window_ms = window_ms
        self.on_commit = on_commit
        #: The longest a batch waits for a pooled connection, in seconds (``Runtime(pool_wait=)``).
        self.pool_wait = 2.0

    # The runtime replaces both (its own metrics; a new store at start): the store's pool records
    # its connection waits into the runner's metrics.
    @property
    def store(self) -> Store:
        """The store turns run on."""
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = store
        store.metrics = self._metrics

    @property
    def metrics(self) -> telemetry.Metrics:
        """The runner's metrics."""
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: telemetry.Metrics) -> None:
        self._metrics = metrics
        self._store.metrics = metrics

    async def run(self, act: Activation, batch: Sequence[Request]) -> list[Result]:
        """Run a batch; a defect re-runs its commands one per transaction."""
        started = time.time_ns()
        span, token = telemetry.start_batch(act.ref, batch)
        try:
            results = await self._run(act, batch)
            telemetry.record_turns(self.metrics, act.ref, batch, results, started)
        finally:
            telemetry.end_batch(span, token)
        return results

    async def _run(self, act: Activation, batch: Sequence[Request]) -> list[Result]:
        try:
            return await self._run_batch(act, batch)
        except BatchDefect as defect:
            if len(batch) == 1:
                return [self._defect_result(act, batch[0], defect.message)]
        results: list[Result] = []
        for request in batch:
            try:
                results.extend(await self._run_batch(act, [request]))
            except BatchDefect as defect:
                results.append(self._defect_result(act, request, defect.message))
        return results

    def _defect_result(self, act: Activation, request: Request, message: str) -> Result:
        log.error(
            "Deterministic actor defect",
            extra={
                "actor": act.ref.type,
                "id": act.ref.id,
                "tenant": act.ref.tenant,
                "command": request.member.name,
                "command_id": request.command_id.raw,
                "defect": message,
            },
        )
        return Result(
            "error",
            error=ActorError("Defect", message, command_id=request.command_id.raw),
        )

    async def _run_batch(self, act: Activation, batch: Sequence[Request]) -> list[Result]:
        policy = act.definition.policy
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.execution_timeout / 1000
        known = act.exists
        try:
            async with self.store.pool.connection(timeout=self.pool_wait) as conn:
                flights = _Flights(conn)
                try:
                    async with asyncio.timeout_at(deadline):
                        return await self._transaction(conn, act, batch, flights)
                except BaseException as exc:
                    # Whatever happened, the open transaction must not survive: leave the
                    # pipeline and roll back. Only a failure raised between the flights leaves
                    # the connection in a known state (``_consistent``); after any other, close
                    # it so the pool replaces it.
                    left = await flights.leave()
                    if not (left and _consistent(exc) and await _rollback_quietly(conn)):
                        await _discard(conn)
                    if not known:
                        act.exists = False  # a row inserted by this admission is gone again
                    raise
        except BatchDefect:
            raise
        except PoolTimeout:
            what = f"the turn of {act.ref.type}/{act.ref.id!r}"
            return [
                Result("error", error=self.store.exhausted(self.pool_wait, what, r.command_id.raw))
                for r in batch
            ]
        except InjectedCrash:
            act.drop_cache()
            return [self._unavailable(r, "injected crash", r.commit_sent) for r in batch]
        except TimeoutError:
            act.drop_cache()
            why = f"execution timeout of {policy.execution_timeout} ms"
            return [self._unavailable(r, why, r.commit_sent) for r in batch]
        except (psycopg.Error, _Retryable) as exc:
            act.drop_cache()
            reason = _describe_db_error(exc)
            unanswered = _commit_unanswered(exc)
            return [self._unavailable(r, reason, r.commit_sent and unanswered) for r in batch]

    def _unavailable(self, request: Request, why: str, in_doubt: bool) -> Result:
        # Honest about the outcome (hardening 9): unknown only when the commit flight was sent
        # and its answer lost; before that (lock wait, handler, admission) nothing committed.
        turn = f"The turn for {request.ref.type}/{request.ref.id!r}"
        if in_doubt:
            message = (
                f"{turn} was not confirmed ({why}); it may or may not have committed: retry "
                "with the same command id."
            )
        else:
            message = (
                f"{turn} failed ({why}); it was not committed: retry with the same command id."
            )
        return Result(
            "error",
            error=ActorError(
                "ActorUnavailable",
                message,
                code="outcome_unknown" if in_doubt else None,
                command_id=request.command_id.raw,
            ),
        )

    async def _transaction(
        self, conn: Connection, act: Activation, batch: Sequence[Request], flights: _Flights
    ) -> list[Result]:
        definition = act.definition
        ref = act.ref
        key = {"rk": act.routing_key, "tenant": ref.tenant, "type": ref.type, "id": ref.id}
        off = self.clock.offset_ms
        ensured = not act.exists
        admission_ns = time.time_ns()
        # Everything a flight sends is built before the pipeline opens: an exception between
        # two queued statements would leave the connection's prepared-statement cache unsure.
        default_json = _default_state_json(definition) if ensured else ""
        # --- flight 1: admission -------------------------------------------------------------
        async with flights.admission():
            await conn.execute("BEGIN")
            await conn.execute(
                self.q["turn_settings"],
                {
                    "lock_timeout": _ms_text(definition.policy.lock_wait),
                    "statement_timeout": _ms_text(definition.policy.execution_timeout),
                    "bound_setting": (
                        "transaction_timeout"
                        if self.store.server_version >= TRANSACTION_TIMEOUT_SINCE
                        else "idle_in_transaction_session_timeout"
                    ),
                    "bound": _ms_text(definition.policy.execution_timeout + SERVER_BOUND_GRACE_MS),
                },
            )
            if ensured:
                await conn.execute(
                    self.q["ensure_actor"],
                    {
                        **key,
                        "state": default_json,
                        "state_version": 0,
                        "off": off,
                    },
                )
            lock_cur = await conn.execute(
                self.q["lock_actor"], {**key, "cached_version": act.version}
            )
            read_cur = await conn.execute(
                self.q["admission_read"],
                {**key, "off": off, "command_ids": [r.command_id.raw for r in batch]},
            )
            # Commands of a singleton's loop: their lease, checked now (unlocked: a turn paused
            # between the flights must not hold off a takeover) and held in the commit flight.
            fence_curs = [
                (i, await conn.execute(self.q["check_singleton_fence"], _fence_params(r, off)))
                for i, r in enumerate(batch)
                if r.fence is not None
            ]
        locked = await lock_cur.fetchone()
        admission = await read_cur.fetchone()
        stale = {i for i, cur in fence_curs if await cur.fetchone() is None}
        if locked is None:
            # The cache believed the row existed; insert it in the next attempt.
            act.drop_cache()
            raise _Retryable("actor row missing")
        assert admission is not None
        version, created, event_seq, shipped_state, shipped_sv = locked
        now_ms = int(admission[0])  # type: ignore[call-overload]
        self.clock.observe(now_ms)
        stored: list[dict[str, Any]] = admission[1]  # type: ignore[assignment]
        receipts = {r["command_id"]: r for r in stored}
        locked_version = int(version)  # type: ignore[call-overload]

        # The fence: a stale cache is replaced inside this transaction.
        state_error: str | None = None
        if shipped_state is not None or act.version is None or act.version != locked_version:
            act.state = None
            act.version = locked_version
            act.created = bool(created)
            act.event_seq = int(event_seq)  # type: ignore[call-overload]
            act.state_version = int(shipped_sv or 0)  # type: ignore[call-overload]
            state_error = self._decode_state(act, shipped_state)
        act.exists = True
        act.created = bool(created)
        act.event_seq = int(event_seq)  # type: ignore[call-overload]
        telemetry.child_span("akter.admission", ref, admission_ns)

        # --- decisions and handlers ----------------------------------------------------------
        outcomes: list[_Outcome] = []
        writes = _BatchWrites()
        state = act.state
        new_state_json = act.state_json
        batch_created = act.created
        seq = act.event_seq
        for index, request in enumerate(batch):
            if index in stale and request.command_id.raw not in receipts:
                outcomes.append(_Outcome(Result("error", error=_lease_lost(request))))
                continue
            outcome, new_state, ctx = await self._decide_and_run(
                act, request, index, now_ms, receipts, state, batch_created, state_error
            )
            outcomes.append(outcome)
            if ctx is not None and outcome.result.kind == "ok":
                state, new_state_json = new_state, outcome.state_json
                writes.apply(ctx)
                seq += len(ctx.staged.events)
                if request.member.spec.creates or not definition.gated:
                    batch_created = True
        if self.hooks.armed("before_commit"):
            await self.hooks.at("before_commit", {"ref": ref, "batch": batch})

        # --- flight 2: commit ----------------------------------------------------------------
        receipt_rows = [(o, r) for o, r in zip(outcomes, batch, strict=True) if o.receipt]
        state_changed = (
            new_state_json != act.state_json or batch_created != act.created or seq != act.event_seq
        )
        nothing = not (state_changed or writes.rows or writes.timer_deletes)
        nothing = nothing and not (writes.job_cancels or receipt_rows or writes.events)
        cancelled: list[tuple[str, bool]] = []
        # A cold activation of a created, scheduled actor makes sure its ticks exist (§2.6.5).
        tick_params = None
        if definition.schedules and not definition.singleton and not act.ticks_ensured:
            if batch_created:
                tick_params = tick_rows(definition, act, now_ms, self.window_ms)
        nothing = nothing and tick_params is None
        commit_ns = time.time_ns()
        fences = {
            (r.fence.actor_type, r.fence.owner, r.fence.epoch): r
            for i, r in enumerate(batch)
            if r.fence is not None and i not in stale
        }
        for request in batch:
            request.commit_sent = not nothing  # from here a lost answer leaves it unknown
        async with flights.commit():
            if nothing:
                end_cur = await conn.execute("ROLLBACK")
            else:
                # The fence through COMMIT: the whole flight is sent before the server runs it,
                # so the lock is held for no client time. A lost lease fails the flight
                # (serialization_failure); the retry's admission check refuses with LeaseLost.
                for fenced in fences.values():
                    await conn.execute(self.q["hold_singleton_fence"], _fence_params(fenced, off))
                if state_changed:
                    await conn.execute(
                        self.q["update_actor"],
                        {
                            **key,
                            "state": new_state_json,
                            "state_version": act.state_version,
                            "created": batch_created,
                            "event_seq": seq,
                            "now": now_ms,
                            "locked_version": locked_version,
                        },
                    )
                if writes.events:
                    await conn.execute(
                        self.q["insert_events"],
                        {
                            **key,
                            "now": now_ms,
                            "seqs": list(range(act.event_seq + 1, seq + 1)),
                            "tags": [e[0] for e in writes.events],
                            "payloads": [e[1] for e in writes.events],
                            "command_ids": [e[2] for e in writes.events],
                        },
                    )
                if writes.timer_deletes:
                    await conn.execute(
                        self.q["delete_timers"], {**key, "keys": writes.timer_deletes}
                    )
                cancel_cur = None
                if writes.job_cancels:
                    await conn.execute(
                        self.q["cancel_jobs_unstarted"], {**key, "keys": writes.job_cancels}
                    )
                    cancel_cur = await conn.execute(
                        self.q["cancel_jobs_started"],
                        {**key, "keys": writes.job_cancels, "now": now_ms},
                    )
                if writes.rows:
                    await conn.execute(
                        self.q["insert_outbox"], _outbox_params(key, act, writes, off)
                    )
                if tick_params is not None:
                    await conn.execute(self.q["insert_ticks"], tick_params)
                if receipt_rows:
                    await conn.execute(
                        self.q["insert_receipts"],
                        {
                            **key,
                            "command_ids": [r.command_id.raw for _, r in receipt_rows],
                            "commands": [r.member.name for _, r in receipt_rows],
                            "payload_hashes": [r.payload_hash for _, r in receipt_rows],
                            "caller_keys": [r.caller_key for _, r in receipt_rows],
                            "outcomes": [o.receipt for o, _ in receipt_rows],
                            "expires": [o.expires_ms for o, _ in receipt_rows],
                        },
                    )
                end_cur = await conn.execute("COMMIT")
            clock_cur = await conn.execute(self.q["clock_now"], {"off": off})
        telemetry.child_span("akter.commit", ref, commit_ns)
        if not nothing:
            if end_cur.statusmessage != "COMMIT":
                raise _Retryable(f"COMMIT answered {end_cur.statusmessage}")
            if cancel_cur is not None:
                cancelled = [(str(r[0]), bool(r[1])) for r in await cancel_cur.fetchall()]
        clock_row = await clock_cur.fetchone()
        released_at = int(clock_row[0]) if clock_row else now_ms  # type: ignore[call-overload]
        if ensured and nothing:
            act.exists = False  # the ROLLBACK removed a row the admission may have inserted
        # The commit landed: from here on a crash leaves the caller retrying into a replay.
        if not nothing:
            if tick_params is not None:
                act.ticks_ensured = True
            if state_changed:
                act.version = locked_version + 1
                act.state = state
                act.state_json = new_state_json
                act.created = batch_created
                act.event_seq = seq
        if self.hooks.armed("after_commit"):
            try:
                await self.hooks.at("after_commit", {"ref": ref, "batch": batch})
            except InjectedCrash:
                act.drop_cache()
                raise
        if self.on_commit is not None and not nothing:
            self.on_commit(act, writes, cancelled)
        if not nothing:
            if writes.events:
                self.metrics.count("akter.events.appended", len(writes.events), actor_type=ref.type)
            for row in writes.rows:
                self.metrics.count("akter.outbox.staged", kind=row.kind)
            if receipt_rows:
                self.metrics.count("akter.receipts.written", len(receipt_rows), actor_type=ref.type)
        return [self._release(o, r, released_at) for o, r in zip(outcomes, batch, strict=True)]

    def _release(self, outcome: _Outcome, request: Request, released_at: int) -> Result:
        # Release check (semantics §2.3): an external caller gets an outcome only while its id
        # is unexpired on a clock read taken after the transaction ended.
        result = outcome.result
        if (
            request.external
            and result.kind in ("ok", "declared")
            and released_at >= request.command_id.expires_ms
        ):
            return Result("error", error=_expired(request))
        return result

    def _decode_state(self, act: Activation, shipped: Any) -> str | None:
        model = act.definition.state_model
        if shipped is None:
            act.state = model()
            act.state_json = _default_state_json(act.definition)
            return None
        if act.state_version > 0:
            return (
                f"Stored state of {act.ref.type}/{act.ref.id!r} has state_version "
                f"{act.state_version}, newer than this code's 0."
            )
        try:
            act.state = model.model_validate(shipped)
            act.state_json = storable_json(act.state.model_dump(mode="json"), "state")
        except (ValidationError, ValueError) as exc:
            act.state = None
            act.state_json = None
            return f"Stored state of {act.ref.type}/{act.ref.id!r} fails validation: {exc}"
        return None

    async def _decide_and_run(
        self,
        act: Activation,
        request: Request,
        index: int,
        now_ms: int,
        receipts: dict[str, Any],
        state: BaseModel | None,
        created: bool,
        state_error: str | None,
    ) -> tuple[_Outcome, BaseModel | None, TurnContext | None]:
        definition = act.definition
        member = request.member
        cid = request.command_id
        # 1. future ids (external only)
        if request.external and cid.issued_ms > now_ms:
            wait = (cid.issued_ms - now_ms) / 1000
            return (
                _Outcome(
                    Result(
                        "error",
                        error=ActorError(
                            "InvalidCommandId",
                            f"Command id {cid.raw!r} was issued in the future of the database "
                            "clock; retry shortly.",
                            code="future",
                            retryable=True,
                            retry_after=wait,
                            command_id=cid.raw,
                        ),
                    )
                ),
                state,
                None,
            )
        # 2. receipts: privacy, conflicts, replay
        stored = receipts.get(cid.raw)
        if stored is not None:
            return _Outcome(self._replay(request, stored)), state, None
        # 3. expiry of first executions (external only)
        if request.external and now_ms >= cid.expires_ms:
            return _Outcome(Result("error", error=_expired(request))), state, None
        # 4. internal commands from non-System callers are defects
        if member.internal and not isinstance(request.caller, System):
            raise BatchDefect(
                index,
                f"Internal command {definition.name}.{member.name} was called by "
                f"{type(request.caller).__name__}; only the framework may send it.",
            )
        # 5. creation gate
        if definition.gated and not created and not member.spec.creates:
            return (
                _Outcome(
                    Result(
                        "error",
                        error=ActorError(
                            "NotCreated",
                            f"{definition.name}/{act.ref.id!r} has not been created; call one of "
                            f"its creating commands first.",
                            command_id=cid.raw,
                        ),
                    )
                ),
                state,
                None,
            )
        # 6. minted children need their parent's proof
        if not created and is_uuid8(act.ref.id) and not _valid_mint(request, act):
            return (
                _Outcome(
                    Result(
                        "error",
                        error=ActorError(
                            "Unauthorized",
                            f"{definition.name}/{act.ref.id!r} is a minted child; only its "
                            "parent's creating intent may run the first command.",
                            code="access_denied",
                            command_id=cid.raw,
                        ),
                    )
                ),
                state,
                None,
            )
        if state_error is not None or state is None:
            raise BatchDefect(index, state_error or "The actor's state could not be loaded.")
        return await self._run_handler(act, request, index, now_ms, state)

    def _replay(self, request: Request, stored: dict[str, Any]) -> Result:
        cid = request.command_id.raw
        if stored["caller_key"] != request.caller_key:
            return Result(
                "error",
                error=ActorError(
                    "Unauthorized",
                    f"Command id {cid!r} belongs to another caller.",
                    code="receipt_access_denied",
                    command_id=cid,
                ),
            )
        if (
            stored["command"] != request.member.name
            or stored["payload_hash"] != request.payload_hash
        ):
            return Result(
                "error",
                error=ActorError(
                    "CommandConflict",
                    f"Command id {cid!r} was already used for a different command or payload; "
                    "mint a new id for a new call.",
                    command_id=cid,
                ),
            )
        return _receipt_result(request.member, stored["outcome"], replayed=True)

    async def _run_handler(
        self, act: Activation, request: Request, index: int, now_ms: int, state: BaseModel
    ) -> tuple[_Outcome, BaseModel | None, TurnContext | None]:
        definition = act.definition
        member = request.member
        working = state.model_copy(deep=True)
        ctx = TurnContext(
            definition=definition,
            ref=act.ref,
            caller=request.caller,
            command_id=request.command_id.raw,
            now_ms=now_ms,
            state=working,
            window_ms=self.window_ms,
            readonly=False,
        )
        instance = definition.cls.__new__(definition.cls)
        instance.__dict__["_akter_ctx"] = ctx
        if self.hooks.armed("before_handler"):
            await self.hooks.at("before_handler", {"ref": act.ref, "command": member.name})
        arguments = member.arguments(request.payload)
        token = IN_TURN.set(ctx)
        ctx.task = asyncio.current_task()
        ctx.active = True
        try:
            value = await member.fn(instance, **arguments)
        except DeclaredError as exc:
            ctx.active = False
            if ctx.poisoned:
                raise BatchDefect(index, ctx.poisoned) from None
            allowed = member.spec.errors
            if allowed and not isinstance(exc, allowed):
                raise BatchDefect(
                    index,
                    f"{definition.name}.{member.name} raised {type(exc).__name__}, which it does "
                    "not declare in errors=.",
                ) from None
            try:
                check_finite(_error_fields(exc), "error")
                receipt = storable_json({"error": type(exc).tag, "fields": exc.fields}, "error")
            except Unstorable as bad:
                raise BatchDefect(
                    index,
                    f"{definition.name}.{member.name} raised {type(exc).__name__} with a field "
                    f"akter cannot store: {bad}.",
                ) from None
            # The caller sees what a replay of the receipt will show (plus the raised message).
            outcome = _receipt_result(member, stored_value(receipt), message=str(exc))
            return _Outcome(outcome, receipt, self._receipt_expiry(request)), state, None
        except (TimeoutError, asyncio.CancelledError, InjectedCrash):
            if ctx.poisoned:
                raise BatchDefect(index, ctx.poisoned) from None
            raise
        except Exception as exc:
            raise BatchDefect(
                index, f"{definition.name}.{member.name} raised {type(exc).__name__}: {exc}"
            ) from None
        except BaseException:
            if ctx.poisoned:  # a handle call from inside the turn
                raise BatchDefect(index, ctx.poisoned) from None
            raise
        finally:
            ctx.active = False
            IN_TURN.reset(token)
        if ctx.poisoned:
            raise BatchDefect(index, ctx.poisoned)
        try:
            check_finite(value, "result")
            checked = member.result.validate_python(value)
            result_json = storable_json(member.result.dump_python(checked, mode="json"), "result")
            receipt = '{"ok":' + result_json + "}"  # canonical: one key
        except ValidationError as exc:
            raise BatchDefect(
                index,
                f"{definition.name}.{member.name} returned a value that fails its annotation: "
                f"{exc.errors()[0]['msg'] if exc.errors() else exc}",
            ) from None
        except (ValueError, TypeError, RecursionError) as exc:  # Unstorable, serialization
            raise BatchDefect(
                index,
                f"{definition.name}.{member.name} returned a value akter cannot store: "
                f"{_named(exc, value, 'result')}.",
            ) from None
        try:
            python_state = ctx.state.model_dump(mode="python")
            check_finite(python_state, "state")
            new_state = definition.state_model.model_validate(python_state)
            state_json = storable_json(new_state.model_dump(mode="json"), "state")
            # What the next turn sees is what a cold load of the stored row would decode.
            new_state = definition.state_model.model_validate(stored_value(state_json))
        except ValidationError as exc:
            raise BatchDefect(index, f"The new state of {act.ref.type} is invalid: {exc}") from None
        except (ValueError, TypeError, RecursionError) as exc:
            raise BatchDefect(
                index,
                f"The new state of {act.ref.type}/{act.ref.id!r} cannot be stored: "
                f"{_named(exc, ctx.state, 'state')}.",
            ) from None
        size = len(state_json.encode())
        if size > definition.policy.max_state_bytes:
            raise BatchDefect(
                index,
                f"The new state of {act.ref.type}/{act.ref.id!r} is {size} bytes, over "
                f"max_state_bytes={definition.policy.max_state_bytes}.",
            )
        event_bytes = sum(len(p.encode()) for _, p in ctx.staged.events)
        if event_bytes > EVENT_BYTES_LIMIT:
            raise BatchDefect(
                index, f"The command's events total {event_bytes} bytes, over 1,048,576."
            )
        # The reply is decoded from the receipt's stored JSON, exactly as a replay decodes it.
        outcome = _receipt_result(member, stored_value(receipt))
        expires = self._receipt_expiry(request)
        return _Outcome(outcome, receipt, expires, state_json), new_state, ctx

    def _receipt_expiry(self, request: Request) -> int:
        return request.command_id.expires_ms


def _receipt_result(
    member: Member, outcome: dict[str, Any], *, replayed: bool = False, message: str | None = None
) -> Result:
    """The caller's result from a receipt's decoded outcome: first reply and replay alike."""
    if "ok" in outcome:
        try:
            value = member.result.validate_python(outcome["ok"])
        except ValidationError:
            value = outcome["ok"]
        return Result("ok", value=value, replayed=replayed)
    error = DeclaredError.from_receipt(
        outcome["error"], outcome.get("fields", {}), message or outcome.get("message")
    )
    return Result("declared", error=error, replayed=replayed)


def _named(exc: BaseException, value: Any, path: str) -> str:
    """An encoding failure's message, naming the path inside ``value`` where it can."""
    if isinstance(exc, Unstorable):
        return str(exc) if exc.path.startswith(path) else f"{path}: {exc}"
    if isinstance(exc, RecursionError):
        return f"{path} nests too deeply to encode"
    return f"{unserializable_path(value, path)}: {exc}"


def _error_fields(exc: DeclaredError) -> dict[str, Any]:
    """A declared error's fields as the handler set them (before JSON mode turned NaN to null)."""
    return {name: getattr(exc, name, None) for name in type(exc)._fields_model.model_fields}


def _default_state_json(definition: ActorDefinition) -> str:
    try:
        return storable_json(definition.default_state().model_dump(mode="json"), "state")
    except (ValueError, TypeError) as exc:
        raise BatchDefect(
            0, f"The default state of {definition.name} cannot be stored: {exc}."
        ) from None


def _expired(request: Request) -> ActorError:
    return ActorError(
        "CommandExpired",
        f"Command id {request.command_id.raw!r} has expired; whether an earlier attempt "
        "committed is unknown here. Query the actor, then mint a new id if needed.",
        command_id=request.command_id.raw,
    )


def _fence_params(request: Request, off: int) -> dict[str, Any]:
    fence = request.fence
    assert fence is not None
    return {
        "actor_type": fence.actor_type,
        "owner": fence.owner,
        "epoch": fence.epoch,
        "off": off,
    }


def _lease_lost(request: Request) -> ActorError:
    fence = request.fence
    assert fence is not None
    return ActorError(
        "LeaseLost",
        f"The lease of the {fence.actor_type!r} loop (runner {fence.owner!r}, epoch "
        f"{fence.epoch}) is no longer current, so {request.ref.type}.{request.member.name} was "
        f"not run and its id {request.command_id.raw!r} stays unused; end this loop step, the "
        "loop runs again wherever the lease is held.",
        command_id=request.command_id.raw,
    )


def tick_rows(
    definition: ActorDefinition, act: Activation, now_ms: int, window_ms: int
) -> dict[str, Any]:
    """Parameters of ``insert_ticks``: one pending tick per schedule entry of the actor."""
    from akter.callers import caller_to_json
    from akter.schedules import next_fire

    dues = [next_fire(entry, now_ms) for entry in definition.schedules]
    return {
        "rk": act.routing_key,
        "tenant": act.ref.tenant,
        "type": act.ref.type,
        "id": act.ref.id,
        "bucket": act.bucket,
        "caller": caller_to_json(System(source="cron", ref=act.ref)),
        "intent_ids": [mint_framework_id(now_ms, due, 0, window_ms) for due in dues],
        "commands": [entry.command for entry in definition.schedules],
        "dues": dues,
        "keys": [entry.key for entry in definition.schedules],
    }


def _valid_mint(request: Request, act: Activation) -> bool:
    caller = request.caller
    if request.external or not isinstance(caller, System) or caller.mint is None:
        return False
    if caller.source != "actor" or caller.ref is None:
        return False
    parent_command_id, ordinal = caller.mint
    expected = child_id(
        tenant=act.ref.tenant,
        parent_type=caller.ref.type,
        parent_id=caller.ref.id,
        parent_command_id=parent_command_id,
        ordinal=ordinal,
        child_type=act.ref.type,
    )
    return expected == act.ref.id and caller.ref.tenant == act.ref.tenant


def _outbox_params(
    key: dict[str, Any], act: Activation, writes: _BatchWrites, off: int
) -> dict[str, Any]:
    rows = writes.rows
    return {
        **key,
        "bucket": act.bucket,
        "off": off,
        "intent_ids": [r.intent_id for r in rows],
        "kinds": [r.kind for r in rows],
        "target_types": [r.target_type for r in rows],
        "target_ids": [r.target_id for r in rows],
        "commands": [r.command for r in rows],
        "payloads": [r.payload for r in rows],
        "callers": [r.caller for r in rows],
        "delays": [r.delay_ms for r in rows],
        "ats": [r.at_ms for r in rows],
        "timer_keys": [r.timer_key for r in rows],
        "ords": _ordinals(act.definition, rows),
    }


def _ordinals(definition: ActorDefinition, rows: list[StagedRow]) -> list[int]:
    """Staging order (from 1) of each capped job row among the batch's rows of the same job.

    Uncapped jobs and intents get 0: their ready time is just their due time.
    """
    seen: dict[str, int] = {}
    ords: list[int] = []
    for row in rows:
        job = definition.jobs.get(row.command) if row.kind == "job" else None
        if job is not None and job.options.per_actor is not None:
            seen[row.command] = seen.get(row.command, 0) + 1
            ords.append(seen[row.command])
        else:
            ords.append(0)
    return ords


def _consistent(exc: BaseException) -> bool:
    """Whether the connection's client-side state is known after ``exc`` (see ``_run_batch``).

    Only failures raised between the flights qualify. A server error inside a pipeline aborts
    the statements queued behind it, and psycopg may already count one of them as prepared: the
    connection then fails every later use of that statement ("prepared statement _pg3_N does
    not exist") and the turns of whichever actors draw it back off until their delivery timeout.
    Reconnecting costs milliseconds; such errors (lock waits, a refused write) are rare.
    """
    return isinstance(exc, BatchDefect | _Retryable | InjectedCrash)


async def _discard(conn: Connection) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error, OSError):
            await asyncio.shield(conn.close())


#: How long a rollback after a failed turn may take before the connection is discarded instead.
ROLLBACK_WAIT_S = 2.0


class _Flights:
    """One psycopg pipeline for both flights of a turn (module docstring).

    ``admission()`` enters the pipeline and ends with ``sync()``: its results are read without
    the Flush that leaving a pipeline sends, which would disarm the server's idle timer.
    ``commit()`` leaves the pipeline, whose Sync ends the commit flight. ``leave()`` leaves it
    after a failure in between.
    """

    def __init__(self, conn: Connection) -> None:
        self._cm = conn.pipeline()
        self._pipeline: psycopg.AsyncPipeline | None = None

    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        self._pipeline = await self._cm.__aenter__()
        yield
        await self._pipeline.sync()

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[None]:
        assert self._pipeline is not None
        try:
            yield
        except BaseException as exc:
            self._pipeline = None
            await self._cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._pipeline = None
        await self._cm.__aexit__(None, None, None)

    async def leave(self) -> bool:
        """Leave a pipeline still open after a failure; ``False`` if the connection is unusable."""
        if self._pipeline is None:
            return True
        self._pipeline = None
        try:
            await asyncio.shield(self._cm.__aexit__(None, None, None))
        except (psycopg.Error, asyncio.CancelledError):
            return False
        return True


async def _rollback_quietly(conn: Connection) -> bool:
    """Roll back whatever is open; ``False`` when the connection is unusable."""
    if conn.closed or conn.broken:
        return False
    status = conn.info.transaction_status
    if status in (psycopg.pq.TransactionStatus.ACTIVE, psycopg.pq.TransactionStatus.UNKNOWN):
        return False  # results of an aborted pipeline still pending: a ROLLBACK could hang
    try:
        if status != psycopg.pq.TransactionStatus.IDLE:
            async with asyncio.timeout(ROLLBACK_WAIT_S):
                await asyncio.shield(conn.execute("ROLLBACK"))
    except (psycopg.Error, asyncio.CancelledError, TimeoutError):
        return False
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _describe_db_error(exc: BaseException) -> str:
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return "the actor row lock was not granted within lock_wait"
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return "statement timeout"
    if isinstance(exc, psycopg.Error):
        state = getattr(exc, "sqlstate", None)
        return f"database error {state or type(exc).__name__}"
    return str(exc)


#: SQLSTATE classes that do not prove the server rolled the transaction back: connection
#: exceptions, resources, operator intervention (shutdown, cancel), system and internal errors.
_UNPROVEN_CLASSES = frozenset({"08", "53", "57", "58", "XX"})


def _commit_unanswered(exc: BaseException) -> bool:
    """Whether a failure of a sent commit flight leaves its outcome unknown.

    A server error (an SQLSTATE) in the flight aborted the transaction before or at ``COMMIT``,
    so nothing committed; so did a ``COMMIT`` answered with anything but ``COMMIT``
    (``_Retryable``). A lost connection, or an error of the classes above, proves nothing (the
    release-check clock read after ``COMMIT`` can only fail that way: cancelled or cut off).
    """
    if isinstance(exc, _Retryable):
        return False
    state = getattr(exc, "sqlstate", None)
    return not state or state[:2] in _UNPROVEN_CLASSES
