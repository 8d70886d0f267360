"""The runtime: wiring, lifecycle, the embedded database default, and the call paths."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar, cast

from psycopg_pool import PoolTimeout
from pydantic import ValidationError

from akter._config import RuntimeConfig
from akter._engine.dispatcher import Dispatcher, routing_key_of
from akter._engine.events import follow, read_events
from akter._engine.hooks import Hooks
from akter._engine.services import Readiness, Registry, Services, Supervisor
from akter._engine.turn import Request, Result, TurnEngine
from akter._ids import (
    FUTURE_WAIT_MS,
    canonical_json,
    parse_command_id,
    parse_framework_id,
    payload_hash,
    uuid7,
    validate_actor_id,
    validate_tenant,
)
from akter._store.migrate import Deployment, migrate
from akter._store.pool import Clock, Store
from akter.actor import AccessKind, Actor, ActorDefinition, Member
from akter.callers import ActorRef, Caller, System, current_caller
from akter.context import IN_TURN, LoopLease, TurnContext, unwrap_read_only
from akter.errors import ActorError
from akter.events import EventRecord

log = logging.getLogger("akter.runtime")

A = TypeVar("A", bound=Actor[Any])


@dataclass(frozen=True)
class DrainReport:
    """How a graceful stop went (semantics §8.3).

    Attributes:
        status: ``clean``, or ``deadline_expired`` when turns had to be cancelled.
        interrupted_turns: Mailboxes cancelled (rolled back) at the deadline.
        interrupted_attempts: Job attempts interrupted without settling (taken over after lease).
        released_claims: Intent claims handed back for another runner.
    """

    status: Literal["clean", "deadline_expired"]
    interrupted_turns: int = 0
    interrupted_attempts: int = 0
    released_claims: int = 0


_WINDOW_MIN_MS = 1
_WINDOW_MAX_MS = 30 * 24 * 3600 * 1000
_SINGLETON_LEASE_MIN_MS = 1_000
_SINGLETON_LEASE_MAX_MS = 24 * 3600 * 1000
_CLOCK_OFFSET_MAX_MS = 366 * 24 * 3600 * 1000
_POOL_WAIT_MAX_MS = 3600 * 1000


class _RequestReplyInTurn(BaseException):
    """A handle call from inside a turn (a deterministic defect of the calling turn)."""


class Runtime:
    """An akter runner: call actors in-process, and (with later layers) relay and execute.

    Args:
        actors: The actor classes this runtime hosts.
        database_url: A PostgreSQL URL; default ``$AKTER_DATABASE_URL``, else an embedded server
            under ``./.akter`` (or ``$AKTER_DATA_DIR``), started and stopped with the runtime.
        schema: The schema holding akter's tables (default ``akter``).
        retry_window: How long a command id stays valid (default 24 h); must match the
            deployment's recorded window.
        max_resident_actors: Activations kept in memory before refusing new ones.
        max_pending_commands: Commands queued on this runner before refusing new ones.
        pool_size: Largest number of pooled connections for turns and queries (default 20).
        framework_pool_size: Connections of the framework's own pool (default 3, 1 to 100):
            heartbeats, singleton leases, relay backoffs, job claims and settles, retention.
            User turns never take them.
        pool_wait: The longest a turn waits for a pooled connection, in seconds or a
            ``timedelta`` (default 2 s, 1 ms to 1 h); then its commands fail with a retryable
            ``ActorError`` ``ActorUnavailable`` (code ``pool_exhausted``), not retried by handles.
        query_pool_wait: The same bound for a query (default 2 s, 1 ms to 1 h).
        drain_deadline: Longest graceful shutdown, in seconds.
        singleton_lease: The lease on a singleton's ``run()`` loop (and ``$maintenance``), in
            seconds or a ``timedelta``, 1 s to 1 day (default 35 s, semantics §8.2). The owner
            refreshes it every lease × 10/35 and stops its loop min(5 s, lease ÷ 7) before it
            could end; a dead owner's loop is taken over once its lease ends. Every runner of a
            deployment should use the same value.
        clock_offset: Moves this runner's framework clock ahead of the database clock, in
            seconds or a ``timedelta`` (default 0; at most 366 days). The test offset of
            semantics §1.7, for demos and drills that need a time of day (a nightly schedule):
            every runner of the schema must use the same offset. Never set it in production.

    Use it as an async context manager::

        async with akter.Runtime(actors=[Order]) as runtime:
            await runtime.get(Order, "o-1").place(1200)
    """

    def __init__(
        self,
        actors: Sequence[type[Actor[Any]]] = (),
        *,
        database_url: str | None = None,
        schema: str = "akter",
        retry_window: float | timedelta = timedelta(hours=24),
        max_resident_actors: int = 10_000,
        max_pending_commands: int = 10_000,
        pool_size: int = 20,
        framework_pool_size: int = 3,
        pool_wait: float | timedelta = 2.0,
        query_pool_wait: float | timedelta = 2.0,
        drain_deadline: float | timedelta = 30.0,
        data_dir: str | Path | None = None,
        hooks: Hooks | None = None,
        notify: bool = False,
        poll: float | timedelta = 1.0,
        pass_limit: int = 256,
        delivery_concurrency: int = 16,
        max_backoff: float | timedelta = 256.0,
        claim_lease: float | timedelta | None = None,
        executor_concurrency: int = 64,
        lease: float | timedelta = 60.0,
        cancel_check: float | timedelta | None = None,
        jobs: Sequence[Any] | None = None,
        relay: bool = True,
        maintenance: bool = True,
        host_actors: bool = True,
        singleton_lease: float | timedelta = 35.0,
        clock_offset: float | timedelta = 0.0,
    ) -> None:
        self.registry = Registry(actors)
        self.definitions = self.registry.definitions
        self.event_types = self.registry.event_types
        #: The validated options (``akter._config.RuntimeConfig``).
        self.config = config = RuntimeConfig.build(
            self.definitions.values(),
            database_url=database_url,
            schema=schema,
            retry_window=retry_window,
            max_resident_actors=max_resident_actors,
            max_pending_commands=max_pending_commands,
            pool_size=pool_size,
            framework_pool_size=framework_pool_size,
            pool_wait=pool_wait,
            query_pool_wait=query_pool_wait,
            drain_deadline=drain_deadline,
            data_dir=data_dir,
            notify=notify,
            poll=poll,
            pass_limit=pass_limit,
            delivery_concurrency=delivery_concurrency,
            max_backoff=max_backoff,
            claim_lease=claim_lease,
            executor_concurrency=executor_concurrency,
            lease=lease,
            cancel_check=cancel_check,
            jobs=jobs,
            relay=relay,
            maintenance=maintenance,
            host_actors=host_actors,
            singleton_lease=singleton_lease,
            clock_offset=clock_offset,
        )
        self._compat_config(config)
        self.hooks = hooks or Hooks()
        # Built once; bound to the server's URL at start().
        self.store = Store(
            "", config.schema, max_size=config.pool_size, framework_size=config.framework_pool_size
        )
        self.clock = Clock(self.store)
        self.clock.offset_ms = config.clock_offset_ms
        from akter.telemetry import Metrics

        self.metrics = Metrics()
        self.supervisor = Supervisor(on_fatal=self._refuse_work)
        self.services = Services(
            config, self.store, self.clock, self.hooks, self.metrics, self.registry, self.supervisor
        )
        self.engine = TurnEngine(self.store, self.clock, self.hooks, window_ms=self.window_ms)
        self.engine.pool_wait = self.pool_wait_ms / 1000
        self.dispatcher = Dispatcher(
            self.engine,
            max_resident_actors=max_resident_actors,
            max_pending_commands=max_pending_commands,
        )
        from akter._engine.events import EventBus
        from akter._engine.jobs import JobExecutor
        from akter._engine.progress import ProgressStreams
        from akter._engine.relay import Relay
        from akter._engine.runners import Runners

        services = self.services
        self.events = EventBus()
        self.engine.metrics = self.metrics
        self.jobs = JobExecutor(services, wake=lambda: self.relay.wake())
        #: Job progress frames published on this runner (semantics §5.11).
        self.progress = self.jobs.progress
        self.progress_streams = ProgressStreams(services, self.progress, self._check_access_kind)
        self.runners = Runners(services, run_singleton_loop=self.run_singleton_loop)
        self.relay = Relay(
            services,
            deliver=self.deliver,
            events=self.events,
            jobs=self.jobs,
            runner_id=self.runners.runner_id,
        )
        from akter.dead_letters import DeadLetters

        #: Dead-letter operations: list, show, retry, discard (semantics §5.10).
        self.dead_letters = DeadLetters(services, wake=self.relay.wake)
        self.engine.on_commit = self._after_commit
        self.deployment: Deployment | None = None
        self._embedded: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.last_drain: DrainReport | None = None

    def _compat_config(self, config: RuntimeConfig) -> None:
        # Transitional: components still read these from the runtime until they take Services.
        self.maintenance = config.maintenance
        self.hosts_actors = config.host_actors
        self.window_ms = config.window_ms
        self.singleton_lease_ms = config.singleton_lease_ms
        self.pool_wait_ms = config.pool_wait_ms
        self.query_pool_wait_ms = config.query_pool_wait_ms
        self.schema = config.schema
        self.drain_deadline = config.drain_deadline_ms / 1000
        self.notify = config.notify
        self.poll_ms = config.poll_ms
        self.pass_limit = config.pass_limit
        self.delivery_concurrency = config.delivery_concurrency
        self.max_backoff_ms = config.max_backoff_ms
        self.claim_lease_ms = config.claim_lease_ms
        self.executor_concurrency = config.executor_concurrency
        self.job_lease_ms = config.job_lease_ms
        self.cancel_check_ms = config.cancel_check_ms
        self.executes = set(config.executes)
        self.relay_enabled = config.relay
        self._database_url = config.database_url

    def _sync_compat_config(self) -> None:
        # Transitional: the CLI sets these attributes after construction (executor-only runners,
        # `akter migrate`, `jobs watch`); components read them from services.config, so they are
        # folded back in at start.
        config = dataclasses.replace(
            self.config,
            notify=bool(self.notify),
            host_actors=bool(self.hosts_actors),
            executes=frozenset(self.executes),
            relay=bool(self.relay_enabled),
            maintenance=bool(self.maintenance),
        )
        self.config = config
        object.__setattr__(self.services, "config", config)

    def _refuse_work(self) -> None:
        self.dispatcher.accepting = False

    @property
    def readiness(self) -> Readiness:
        """Where the runner is in its life: ``starting``, ``ready``, ... ``failed``."""
        return self.supervisor.readiness

    @readiness.setter
    def readiness(self, value: Readiness) -> None:
        self.supervisor.readiness = value

    @property
    def fatal(self) -> BaseException | None:
        """The error of a supervised background task that died, if one did."""
        return self.supervisor.fatal

    def supervise(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Watch a named background task: if it dies while the runtime runs, fail loudly."""
        return self.supervisor.supervise(task)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The URL in use (known once started)."""
        return self.store.url

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect (or start the embedded server), migrate, and start background work."""
        if self.supervisor.started:
            return
        self._sync_compat_config()
        url = self.config.database_url
        if url is None:
            from akter._store.embedded import EmbeddedPostgres, default_data_dir

            self._embedded = EmbeddedPostgres(self.config.data_dir or default_data_dir())
            url = await asyncio.to_thread(self._embedded.start)
        assert url is not None
        self.store.bind(url)
        try:
            conn = await self.store.connect_direct()
            try:
                self.deployment = await migrate(
                    conn,
                    self.store.queries,
                    retry_window_ms=self.window_ms,
                    placements={d.name: d.placement for d in self.definitions.values()},
                )
            finally:
                await conn.close()
            await self.store.open()
            await self.clock.read()
            await self._ensure_singleton_ticks()
            await self.jobs.start()
            if self.relay_enabled:
                await self.relay.start()
            else:
                await self.relay.listen()  # live event feeds still hear other runners
            await self.runners.start()
            self._tasks.append(
                self.supervise(asyncio.create_task(self._hibernation(), name="akter.hibernation"))
            )
        except BaseException:
            await self._close_resources()
            raise
        self.supervisor.started = True
        self.readiness = "ready"

    async def stop(self) -> DrainReport:
        """Drain: refuse new commands, let in-flight turns finish (bounded), release, close."""
        if not self.supervisor.started:
            await self._close_resources()
            return DrainReport("clean")
        self.supervisor.stopping = True
        self.readiness = "draining"
        self.dispatcher.accepting = False
        deadline = time.monotonic() + self.drain_deadline
        released = await self.relay.stop(deadline)
        attempts = self.jobs.running
        await self.jobs.stop()
        interrupted = await self.dispatcher.quiesce(deadline)
        await self.runners.stop()
        if interrupted:
            log.warning("Drain deadline expired", extra={"interrupted_turns": interrupted})
        await self._close_resources()
        self.supervisor.started = False
        self.supervisor.stopping = False
        self.readiness = "drained"
        self.last_drain = DrainReport(
            "deadline_expired" if interrupted else "clean", interrupted, attempts, released
        )
        return self.last_drain

    async def _close_resources(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.store.url:
            await self.store.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None

    def _after_commit(self, act: Any, writes: Any, cancelled: list[tuple[str, bool]]) -> None:
        """After a local commit: wake the relay, signal cancellations, publish events."""
        now = self.clock.estimate()
        due = any(
            (r.at_ms is not None and r.at_ms <= now) or (r.at_ms is None and not r.delay_ms)
            for r in writes.rows
        )
        running = [job_id for job_id, is_running in cancelled if is_running]
        if running:
            self.jobs.cancel_signal(running)
        if due or len(running) < len(cancelled):
            self.relay.wake()
        if writes.rows or cancelled:
            self.relay.poke_others()
        if writes.events:
            self.events.publish(act.ref)
            self.relay.poke_others()

    async def _hibernation(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.dispatcher.hibernate()

    async def run_singleton_loop(
        self, actor_type: str, runner_id: str, epoch: int | None = None
    ) -> None:
        """Run a singleton's ``run()`` loop for its "default"-tenant instance (lease owner).

        ``epoch`` is ``acquired_at_ms`` of the lease acquisition that started the loop: the
        commands the loop sends through ``self.runtime`` handles are fenced on it.
        """
        definition = self.definition(actor_type)
        ref = ActorRef("default", definition.name, "")
        ctx = TurnContext(
            definition=definition,
            ref=ref,
            caller=System("process"),
            command_id=None,
            now_ms=self.clock.estimate(),
            state=definition.default_state(),
            window_ms=self.window_ms,
            readonly=True,
        )
        ctx.loop_runtime = self
        ctx.runner_id = runner_id
        if epoch is not None:
            ctx.lease = LoopLease(definition.name, runner_id, epoch)
        instance = definition.cls.__new__(definition.cls)
        instance.__dict__["_akter_ctx"] = ctx
        ctx.task = asyncio.current_task()
        ctx.active = True
        try:
            await instance.run()
        finally:
            ctx.active = False

    async def _ensure_singleton_ticks(self) -> None:
        """Every runner inserts its singletons' default instance and ticks, once per deployment."""
        from akter._engine.turn import Activation, tick_rows

        for definition in self.definitions.values():
            if not (definition.singleton and definition.schedules and self.hosts_actors):
                continue
            ref = ActorRef("default", definition.name, "")
            act = Activation(definition, ref, routing_key_of(definition, ref))
            now = await self.clock.read()
            q = self.store.queries
            async with self.store.framework.connection() as conn, conn.transaction():
                await conn.execute(
                    q["ensure_actor"],
                    {
                        "rk": act.routing_key,
                        "tenant": ref.tenant,
                        "type": ref.type,
                        "id": ref.id,
                        "state": canonical_json(definition.default_state().model_dump(mode="json")),
                        "state_version": 0,
                        "off": self.clock.offset_ms,
                    },
                )
                await conn.execute(
                    q["insert_ticks"], tick_rows(definition, act, now, self.window_ms)
                )

    async def cancel_job(self, job_id: str) -> str:
        """Cancel a job by id in its own transaction (``akter jobs cancel``).

        Returns ``"deleted"`` (it never ran), ``"cancelled"`` (its attempt or report settles it)
        or ``"unknown"`` (no such live job).
        """
        self._require_started()
        q = self.store.queries
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(q["cancel_job_by_id_unstarted"], {"job_id": job_id})
            if await cur.fetchall():
                return "deleted"
            cur = await conn.execute(
                q["cancel_job_by_id_started"], {"job_id": job_id, "off": self.clock.offset_ms}
            )
            rows = await cur.fetchall()
        if not rows:
            return "unknown"
        if any(bool(r[1]) for r in rows):
            self.jobs.cancel_signal([job_id])
        self.relay.wake()
        return "cancelled"

    async def cleanup(self) -> Any:
        """Run one retention sweep now (what the ``$maintenance`` owner does every 60 s)."""
        from akter._engine.retention import sweep

        self._require_started()
        return await sweep(self.services)

    def _require_started(self) -> None:
        self.supervisor.require_started()

    # --- addressing ---------------------------------------------------------------------------

    def definition(self, actor: type[Actor[Any]] | str) -> ActorDefinition:
        """The definition of a hosted actor type (by class or name)."""
        return self.registry.definition(actor)

    def ref(
        self, actor: type[Actor[Any]] | str, id: str = "", *, tenant: str = "default"
    ) -> ActorRef:
        """Validate and build an actor address."""
        definition = self.definition(actor)
        tenant = validate_tenant(tenant)
        if definition.singleton:
            if id != "":
                raise ActorError(
                    "InvalidInput",
                    f"{definition.name} is a singleton; get it without an id.",
                    field="id",
                )
        else:
            id = validate_actor_id(id)
        return ActorRef(tenant, definition.name, id)

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> A:
        """A typed handle to one actor (``runtime.get(Billing)`` for a singleton)."""
        from akter.handles import Handle

        ref = self.ref(actor, id, tenant=tenant)
        return cast(A, Handle(self, self.definition(actor), ref))

    async def create(self, actor: type[A], *, tenant: str = "default") -> A:
        """A handle to a new actor with a minted UUIDv7 id; nothing is written yet."""
        return self.get(actor, uuid7(), tenant=tenant)

    def routing_key(self, ref: ActorRef) -> int:
        """The routing key of an address."""
        return self.registry.routing_key(ref)

    # --- events -------------------------------------------------------------------------------

    async def read_events(
        self, ref: ActorRef, after: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Committed events of an actor after a cursor (access kind ``events``)."""
        self._require_started()
        definition = self.definition(ref.type)
        await self._check_access_kind(definition, ref, current_caller(), "events")
        return await read_events(self.services, ref, after, limit)

    async def follow_events(
        self, ref: ActorRef, after: str | None = None
    ) -> AsyncIterator[EventRecord]:
        """Replay after a cursor, then follow new commits live (access kind ``events``)."""
        self._require_started()
        definition = self.definition(ref.type)
        await self._check_access_kind(definition, ref, current_caller(), "events")
        async for record in follow(self.services, self.events, ref, after):
            yield record

    def job_progress(self, ref: ActorRef, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """Progress frames of a job, then a closing message (access kind ``progress``)."""
        from akter._engine.progress import job_progress

        return job_progress(self, ref, job_id)

    async def _check_access_kind(
        self, definition: ActorDefinition, ref: ActorRef, caller: Caller, kind: AccessKind
    ) -> None:
        allowed = definition.access(caller, ref, "events", kind)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if not allowed:
            raise ActorError(
                "Unauthorized",
                f"{type(caller).__name__} may not read the {kind} of {ref.type}/{ref.id!r}.",
                code="access_denied",
            )

    # --- call paths ---------------------------------------------------------------------------

    def _refuse_inside_turn(self) -> None:
        ctx = IN_TURN.get()
        if ctx is not None and ctx.active:
            ctx.poisoned = (
                "request/reply inside a turn: a handler called another actor through a handle; "
                "use self.send(...) instead."
            )
            raise _RequestReplyInTurn(ctx.poisoned)

    async def mint_command_id(self) -> str:
        """A fresh command id from the framework clock."""
        from akter._ids import mint_command_id

        self._require_started()
        return mint_command_id(self.clock.estimate(), self.window_ms)

    async def _check_access(
        self, member: Member, ref: ActorRef, caller: Caller, kind: AccessKind
    ) -> None:
        allowed = member.owner.access(caller, ref, member.name, kind)
        if inspect.isawaitable(allowed):
            allowed = await allowed
        if not allowed:
            raise ActorError(
                "Unauthorized",
                f"{type(caller).__name__} may not call {ref.type}.{member.name}.",
                code="access_denied",
            )

    async def _command(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        pinned: str | None,
        caller: Caller | None = None,
        *,
        retry: bool = True,
        fence: LoopLease | None = None,
    ) -> Any:
        """An external command: admission, then retries with one id until the deadline.

        With ``retry=False`` (the HTTP path) a retryable refusal is raised at once, for the
        remote caller to retry with the same id after ``retry_after``. ``fence`` (a singleton
        loop's lease) makes the turn refuse the command with ``LeaseLost`` once it is stale.
        """
        self._require_started()
        caller = caller or current_caller()
        raw = pinned if pinned is not None else await self.mint_command_id()
        command_id = parse_command_id(raw, self.window_ms)
        if member.internal:
            raise ActorError(
                "InvalidInput",
                f"{ref.type}.{member.name} is internal and cannot be called from outside.",
                code="unknown_member",
            )
        await self._check_access(member, ref, caller, "command")
        digest = payload_hash(payload)
        policy = member.owner.policy
        start = time.monotonic()
        deadline = start + policy.delivery_timeout / 1000
        first_wait: float | None = None
        wait = 0.0
        in_doubt = False  # some attempt's commit was sent and not answered
        while True:
            result = await self._submit_and_wait(
                member,
                ref,
                payload,
                digest,
                command_id,
                caller,
                external=True,
                deadline=deadline,
                fence=fence,
            )
            if result.kind == "ok":
                return result.value
            error = result.error
            assert error is not None
            if not (isinstance(error, ActorError) and error.retryable) or not retry:
                raise error
            if not self.supervisor.started:
                raise error  # the runtime stopped or died: the caller retries elsewhere
            if error.reason == "Timeout" or error.code == "pool_exhausted":
                raise error  # pool_exhausted: the turn already waited pool_wait; shed the load
            in_doubt = in_doubt or error.code == "outcome_unknown"
            if error.reason == "InvalidCommandId" and (
                (error.retry_after or 0) * 1000 > FUTURE_WAIT_MS
                or time.monotonic() + (error.retry_after or 0) >= deadline
            ):
                raise error  # a pinned id far in the future: refused, not a Timeout (_ids)
            first_wait = first_wait or max(error.retry_after or 0.05, 0.001)
            wait = first_wait if wait == 0 else min(wait * 2, max(0.5, first_wait))
            now = time.monotonic()
            expiry_guard = (command_id.expires_ms - 1000 - self.clock.estimate()) / 1000
            if now + wait >= deadline or wait >= expiry_guard:
                # Nothing of this command is in flight now: it may have committed only if an
                # attempt's commit went unanswered (hardening 9).
                outcome = "it may have committed" if in_doubt else "it was not committed"
                raise ActorError(
                    "Timeout",
                    f"{ref.type}/{ref.id!r}.{member.name} did not complete within the delivery "
                    f"timeout (last error: {error.reason}); {outcome} — retry with "
                    f"command id {command_id.raw!r}.",
                    code="outcome_unknown" if in_doubt else None,
                    command_id=command_id.raw,
                )
            await asyncio.sleep(wait)

    async def _submit_and_wait(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        digest: str,
        command_id: Any,
        caller: Caller,
        *,
        external: bool,
        deadline: float,
        fence: LoopLease | None = None,
    ) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        request = Request(
            member, ref, payload, digest, command_id, caller, external, future, fence=fence
        )
        try:
            self.dispatcher.submit(member.owner, request)
        except ActorError as exc:
            return Result("error", error=exc)
        try:
            # The caller's deadline never cancels an admitted turn: shield it.
            # asyncio.timeout, not wait_for: on 3.11 wait_for can drop the caller's own
            # cancellation when the result arrives at the same moment (see akter._waits).
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await asyncio.shield(future)
        except TimeoutError:
            return Result(
                "error",
                error=ActorError(
                    "Timeout",
                    f"{ref.type}/{ref.id!r}.{member.name} did not complete within the delivery "
                    f"timeout; it may still commit — retry with command id {command_id.raw!r}.",
                    code="outcome_unknown",  # still queued or running: it may commit later
                    command_id=command_id.raw,
                ),
            )

    async def deliver(
        self,
        ref: ActorRef,
        command: str,
        payload: dict[str, Any],
        command_id: str,
        caller: Caller,
        *,
        within: float | None = None,
    ) -> Result:
        """An internal delivery (relay): no access policy, no expiry, the id as given."""
        self._require_started()
        definition = self.definition(ref.type)
        member = definition.member(command, "command")
        body = member.validate_payload(payload)
        parsed = parse_framework_id(command_id)
        policy = definition.policy
        deadline = time.monotonic() + (within or policy.delivery_timeout / 1000)
        return await self._submit_and_wait(
            member, ref, body, payload_hash(body), parsed, caller, external=False, deadline=deadline
        )

    async def call(
        self,
        actor: type[Actor[Any]] | str,
        id: str,
        member: str,
        payload: dict[str, Any],
        *,
        tenant: str = "default",
        command_id: str | None = None,
        caller: Caller | None = None,
        retry: bool = True,
    ) -> Any:
        """Call a command or query by name with a JSON payload (the HTTP path's entry)."""
        ref = self.ref(actor, id, tenant=tenant)
        found = self.definition(ref.type).member(member)
        if found.internal:
            raise ActorError(
                "InvalidInput",
                f"Actor type {ref.type!r} has no public command or query {member!r}.",
                code="unknown_member",
            )
        body = found.validate_payload(payload)
        if found.kind == "query":
            return await self._query(found, ref, body, caller)
        return await self._command(found, ref, body, command_id, caller, retry=retry)

    async def _query(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        caller: Caller | None = None,
    ) -> Any:
        """A query: one unlocked read of committed state, a read-only view, no receipt."""
        self._require_started()
        caller = caller or current_caller()
        await self._check_access(member, ref, caller, "query")
        definition = member.owner
        key = {
            "rk": routing_key_of(definition, ref),
            "tenant": ref.tenant,
            "type": ref.type,
            "id": ref.id,
        }
        wait = self.query_pool_wait_ms / 1000
        try:
            async with self.store.pool.connection(timeout=wait) as conn:
                cur = await conn.execute(self.store.queries["query_actor"], key)
                row = await cur.fetchone()
                now_ms = await self.clock.read_on(conn)
        except PoolTimeout:
            raise self.store.exhausted(wait, f"the query {ref.type}.{member.name}") from None
        if row is None or not row[1]:
            if definition.gated:
                raise ActorError(
                    "NotCreated", f"{definition.name}/{ref.id!r} has not been created."
                )
        if row is None:
            state = definition.default_state()
            cursor = 0
        else:
            try:
                state = definition.state_model.model_validate(row[3])
            except ValidationError as exc:
                raise ActorError(
                    "Defect", f"Stored state of {ref.type}/{ref.id!r} fails validation: {exc}"
                ) from None
            cursor = int(row[2])  # type: ignore[call-overload]
        ctx = TurnContext(
            definition=definition,
            ref=ref,
            caller=caller,
            command_id=None,
            now_ms=now_ms,
            state=state,
            window_ms=self.window_ms,
            readonly=True,
            cursor=cursor,
            events_reader=lambda after, limit: read_events(self.services, ref, after, limit),
        )
        instance = definition.cls.__new__(definition.cls)
        instance.__dict__["_akter_ctx"] = ctx
        ctx.task = asyncio.current_task()
        ctx.active = True
        try:
            async with asyncio.timeout(definition.policy.execution_timeout / 1000):
                value = await member.fn(instance, **member.arguments(payload))
        finally:
            ctx.active = False
        await self._check_access(member, ref, caller, "query")
        try:
            return member.result.validate_python(unwrap_read_only(value))
        except ValidationError as exc:
            raise ActorError(
                "Defect", f"{ref.type}.{member.name} returned a value that fails its annotation."
            ) from exc
