"""The runtime: the facade users hold — wiring, lifecycle and addressing.

What a runner does lives below it: the call paths (``_engine.calls``), the turn engine, the
relay, the job executor, the runner registry, retention. Each receives ``Services`` (the
validated ``RuntimeConfig``, the store, the clock, hooks, metrics, the registry and the
supervisor) and the callbacks it needs; none of them sees this class.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Literal, TypeVar, Unpack, cast

from akter._config import RuntimeConfig, RuntimeOptions
from akter._drain import DrainReport
from akter._engine.calls import Calls, check_access
from akter._engine.dispatcher import Dispatcher
from akter._engine.events import EventBus, follow, read_events
from akter._engine.history import History
from akter._engine.hooks import Hooks
from akter._engine.jobs.executor import JobExecutor
from akter._engine.jobs.progress import ProgressStreams
from akter._engine.jobs.streams import JobStream
from akter._engine.lifecycle import Lifecycle
from akter._engine.live import Live
from akter._engine.loop.passes import PassLoop
from akter._engine.loop.wakes import CommitWakes
from akter._engine.outcomes import wait as wait_outcome
from akter._engine.relay.intents import Relay
from akter._engine.runners import Runners
from akter._engine.services import Readiness, Registry, Services, Supervisor
from akter._engine.subscriptions import SubscriptionLane
from akter._engine.turn import Followed, Result, TurnEngine
from akter._engine.workflows.engine import WorkflowEngine
from akter._ids import uuid7
from akter._local_clock import LocalClock
from akter._members import refuse_internal
from akter._store.gateway.outbox import OutboxGateway
from akter._store.migrate import Deployment
from akter._store.pool import Clock, Store
from akter._tenant_rows import TenantRows
from akter.actor import AccessKind, Actor, ActorDefinition
from akter.callers import ActorRef, Caller, current_caller
from akter.check import CheckOptions, CheckReport
from akter.context import LoopLease
from akter.errors import ConfigurationError
from akter.events import EventRecord
from akter.handles import FencedRuntime, Handle, local_handle
from akter.operators import (
    Actors,
    Database,
    DeadLetters,
    Jobs,
    Operators,
    Outbox,
    RunnerControl,
)
from akter.resources import Resources
from akter.telemetry import Metrics
from akter.workflows import WorkflowMember, WorkflowRun

log = logging.getLogger("akter.runtime")

A = TypeVar("A", bound=Actor[Any])


class Runtime:
    """An akter runner: hosts actors, runs their turns, relays messages, executes jobs.

    Args:
        actors: The actor classes this runtime hosts.
        hooks: Fault points for tests (``akter.testing``).
        local_clock: The local monotonic clock of job lease deadlines (tests pass
            ``akter.testing.ManualClock()``; default the process's own).
        resources: The clients and resources job executors reach with ``call.resource(key)``,
            set up when the runtime starts and torn down when it stops
            (docs/guides/jobs-resources.md).
        **options: The runner's options (``akter._config.RuntimeConfig`` documents each, with
            its default and bounds; the README's option table lists them): ``database_url``
            (default ``$AKTER_DATABASE_URL``, else an embedded server), ``schema``,
            ``retry_window``, ``pool_size``, ``pool_wait``, ``singleton_lease``, ...

    Use it as an async context manager::

        async with akter.Runtime(actors=[Order]) as runtime:
            await runtime.get(Order, "o-1").place(1200)
    """

    def __init__(
        self,
        actors: Sequence[type[Actor[Any]]] = (),
        *,
        hooks: Hooks | None = None,
        local_clock: LocalClock | None = None,
        resources: Resources | None = None,
        **options: Unpack[RuntimeOptions],
    ) -> None:
        self._registry = Registry(actors)
        self.definitions = self._registry.definitions
        #: The validated options.
        self.config = config = RuntimeConfig(tuple(self.definitions.values()), **options)
        self.hooks = hooks or Hooks()
        # Built once; bound to the server's URL at start().
        self._store = Store(
            "", config.schema, max_size=config.pool_size, framework_size=config.framework_pool_size
        )
        self._clock = Clock(self._store)
        self._clock.offset_ms = config.clock_offset_ms
        self.metrics = Metrics(
            self.definitions,
            [(name, job.name) for name, d in self.definitions.items() for job in d.jobs.values()],
        )
        self._supervisor = Supervisor(on_fatal=self._refuse_work)
        self._services = services = Services(
            config,
            self._store,
            self._clock,
            self.hooks,
            self.metrics,
            self._registry,
            self._supervisor,
            local=local_clock or LocalClock(),
        )
        # Built in dependency order, each whole: the pass loop first (every lane's waker), then
        # the lanes and what turns and callers go through; last, the loop is told its lanes.
        self._events = EventBus()
        outbox = OutboxGateway(self._store, self._clock)  # the relay's own claim/settle connections
        self._runners = Runners(services, run_singleton_loop=self.run_singleton_loop)
        #: The pass loop: wakes, idle polls, the skew watch, the backlog gate; one pass per lane.
        self._loop = loop = PassLoop(
            services, outbox=outbox, heard=self._events.wake_all, runner_id=self._runners.runner_id
        )
        self._jobs = JobExecutor(services, wake=loop.wake, wake_jobs=loop.wake_jobs)
        #: Job progress frames published on this runner (semantics §5.11).
        self._progress = self._jobs.progress
        self._progress_streams = ProgressStreams(services, self._progress, check_access)
        self._engine = TurnEngine(
            self._store,
            self._clock,
            self.hooks,
            window_ms=config.window_ms,
            on_commit=CommitWakes(self._clock, loop, self._jobs, self._events),
            pool_wait=config.pool_wait_ms / 1000,
            metrics=self.metrics,
            state_paths=self._runners.state_paths,
            followed=(followed := Followed.of(self.definitions.values())),
        )
        self._use_resources(resources)
        #: The last hour of this runner's metrics, for the console's overview charts.
        self.history = History(self.metrics)
        self._dispatcher = Dispatcher(
            self._engine,
            max_resident_actors=config.max_resident_actors,
            max_pending_commands=config.max_pending_commands,
            admission=loop.backlog,
        )
        #: The call paths: commands, deliveries, queries, singleton loops.
        self._calls = Calls(services, self._dispatcher, self.read_events)
        self.live = Live(services, self._calls)  # query watches, broadcasts (live.md)
        self._engine.on_commit = self.live.after(self._engine.on_commit)
        self._build_lanes(services, loop, outbox)
        subs = SubscriptionLane.of(services, self._calls, loop, followed)  # the subscriptions spec
        loop.drive(self._relay, self._jobs, self._workflow_engine, subs)
        self._lifecycle.lanes.append(subs)  # stopped after the loop, before the job lane
        self._database_url = config.database_url
        self.last_drain: DrainReport | None = None

    def _build_lanes(self, services: Services, loop: PassLoop, outbox: OutboxGateway) -> None:
        """The workflows and intent lanes, the operator objects and the lifecycle (``__init__``)."""
        #: The workflow engine: runs, their steps and wakes (the workflows spec).
        self._workflow_engine = WorkflowEngine(
            services,
            calls=self._calls,
            make_handle=Handle,
            wake=loop.wake_everywhere,
            runner_id=self._runners.runner_id,
            cancel_jobs=self._jobs.cancel_signal,
        )
        #: Workflow runs by id: status, journals, signals, cancels, retries (operators, HTTP).
        self.workflows = self._workflow_engine.ops
        #: The intent lane: claims and delivers intents and timers.
        self._relay = Relay(
            services,
            outbox=outbox,
            deliver=self._calls.deliver_decoded,  # the relay's decode validated the payload
            waker=loop,
            passes=loop,
            workflows=self._workflow_engine,
            declared_elsewhere=self._runners.declares_command,
        )
        #: Dead-letter operations: list, show, retry, discard (semantics §5.10).
        self.dead_letters = DeadLetters(services, wake=loop.announce)
        #: Parked outbox rows: list, retry, discard (evolution E3).
        self.outbox = Outbox(services, wake=loop.announce)
        self._lifecycle = Lifecycle(
            services,
            self._dispatcher,
            loop,
            self._jobs,
            self._relay,
            self._runners,
            self._workflow_engine,
        )

    def reconfigure(self, **changes: Unpack[RuntimeOptions]) -> None:
        """Change options before the runtime starts (the CLI's worker and operator roles).

        Raises:
            ConfigurationError: If the runtime has started, or a changed option is invalid.
        """
        if self._supervisor.started:
            raise ConfigurationError("reconfigure() is only possible before the runtime starts.")
        definitions = tuple(self.definitions.values())
        self.config = replace(self.config, definitions=definitions, **changes)
        self._services.config = self.config
        self._database_url = self.config.database_url

    def _use_resources(self, resources: Resources | None) -> None:
        #: The job resources' declaration (``Runtime(resources=...)``); live ones at start.
        self.resources = resources if resources is not None else Resources()

    async def _open_resources(self) -> None:
        """Set up the job resources (before any attempt can start; closed if start fails)."""
        await self.resources.open(self._services.resources)

    def _refuse_work(self) -> None:
        self._dispatcher.accepting = False

    @property
    def readiness(self) -> Readiness:
        """Where the runner is in its life: ``starting``, ``ready``, ... ``failed``.

        ``storage`` while the database cannot be reached: a heartbeat failed, or callers are
        being refused ``database_unreachable`` (until a connection opens again).
        """
        status = self._supervisor.readiness
        if status == "ready" and self._store.unreachable:
            return "storage"
        return status

    @readiness.setter
    def readiness(self, value: Readiness) -> None:
        self._supervisor.readiness = value

    @property
    def fatal(self) -> BaseException | None:
        """The error of a supervised background task that died, if one did."""
        return self._supervisor.fatal

    def supervise(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Watch a named background task: if it dies while the runtime runs, fail loudly."""
        return self._supervisor.supervise(task)

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def schema(self) -> str:
        """The schema holding akter's tables."""
        return self.config.schema

    @property
    def database_url(self) -> str:
        """The URL in use (known once started)."""
        return self._store.url

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

    def use_database(self, url: str) -> None:
        """Use the server at ``url`` instead of the configured one (before start; ``akter dev``)."""
        self._database_url = url

    async def start(self) -> None:
        """Connect (or start the embedded server), migrate, and start background work."""
        if self._supervisor.started:
            return
        await self._open_resources()
        try:
            await self._lifecycle.start(self._database_url)
        except BaseException:
            await self._services.resources.close()
            raise
        self.history.start()
        self._supervisor.started = True
        self.readiness = "ready"

    async def stop(self) -> DrainReport:
        """Drain: refuse new commands, let in-flight turns finish (bounded), release, close."""
        if not self._supervisor.started:
            await self._lifecycle.close()
            return DrainReport("clean")
        self._supervisor.stopping = True
        self.readiness = "draining"
        await self.live.stop()
        await self.history.stop()
        self.last_drain = await self._lifecycle.drain()
        self._supervisor.started = False
        self._supervisor.stopping = False
        self.readiness = "drained"
        await self._services.resources.close()  # after the drain: no attempt uses them any more
        return self.last_drain

    @property
    def deployment(self) -> Deployment | None:
        """The deployment row (retry window, placements) read at start."""
        return self._lifecycle.deployment

    async def run_singleton_loop(
        self, actor_type: str, runner_id: str, epoch: int | None = None
    ) -> None:
        """Run a singleton's ``run()`` loop for its "default"-tenant instance (lease owner).

        ``epoch`` is ``acquired_at_ms`` of the lease acquisition that started the loop: the
        commands the loop sends through ``self.runtime`` handles are fenced on it.
        """
        lease = (
            None
            if epoch is None
            else LoopLease(actor_type, runner_id, epoch, self._runners.lease_key(actor_type))
        )
        facade = self if lease is None else FencedRuntime(self, lease, self._calls)
        await self._calls.run_loop(actor_type, runner_id, lease, facade)

    async def cancel_job(self, job_id: str) -> str:
        """Cancel a job by id in its own transaction (``akter jobs cancel``).

        Returns ``"deleted"`` (it never ran), ``"cancelled"`` (its attempt or report settles it)
        or ``"unknown"`` (no such live job).
        """
        return await self.operators.jobs.cancel(job_id)

    async def check(
        self, sample: int | None = None, **options: Unpack[CheckOptions]
    ) -> CheckReport:
        """Compare this code with the live database before a deploy (evolution E5).

        Reads only, over a connection of its own; works on a runtime that was not started.
        ``options``: ``statement_timeout`` (s), ``batch_size``, ``progress`` (``check_database``).

        Raises:
            akter.check.CheckUnavailable: The database is unreachable, the schema is missing
                or older than this code, or a read took longer than ``statement_timeout``.
        """
        from akter._engine.check import check_database, check_url

        url = check_url(self._store.url or self._database_url, self.config.data_dir)
        return await check_database(
            url,
            self._store.queries,
            self.definitions,
            offset_ms=self._clock.offset_ms,
            sample=sample,
            **options,
        )

    async def cleanup(self) -> Any:
        """Run one retention sweep now (what the ``$maintenance`` owner does every 60 s)."""
        from akter._engine.retention import sweep

        self._supervisor.require_started()
        return await sweep(self._services)

    # --- addressing ---------------------------------------------------------------------------

    def definition(self, actor: type[Actor[Any]] | str) -> ActorDefinition:
        """The definition of a hosted actor type (by class or name)."""
        return self._registry.definition(actor)

    def ref(
        self, actor: type[Actor[Any]] | str, id: str = "", *, tenant: str = "default"
    ) -> ActorRef:
        """Validate and build an actor address."""
        return self._registry.ref(actor, id, tenant=tenant)

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> A:
        """A typed handle to one actor (``runtime.get(Billing)`` for a singleton)."""
        return cast(A, local_handle(self, self._calls, actor, self.ref(actor, id, tenant=tenant)))

    def rows(self, table: Any, *, tenant: str) -> TenantRows:
        """One tenant's rows of an owned table, read-only (``akter._tenant_rows.TenantRows``)."""
        return TenantRows(self._store, table, tenant, self.config.query_pool_wait_ms / 1000)

    async def create(self, actor: type[A], *, tenant: str = "default") -> A:
        """A handle to a new actor with a minted UUIDv7 id; nothing is written yet."""
        return self.get(actor, uuid7(), tenant=tenant)

    def routing_key(self, ref: ActorRef) -> int:
        """The routing key of an address."""
        return self._registry.routing_key(ref)

    async def outcome(self, cid: str, *, timeout: float = 30, ref: ActorRef | None = None) -> Any:  # noqa: ASYNC109
        """A command's outcome by id, its receipt awaited (``akter._engine.outcomes``)."""
        return await wait_outcome(self._services, cid, ref=ref, timeout=timeout)

    # --- events and progress -------------------------------------------------------------------

    async def read_events(
        self, ref: ActorRef, after: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """Committed events of an actor after a cursor (access kind ``events``)."""
        await self._check_read(ref, "events")
        return await read_events(self._services, ref, after, limit)

    async def follow_events(
        self, ref: ActorRef, after: str | None = None
    ) -> AsyncIterator[EventRecord]:
        """Replay after a cursor, then follow new commits live (access kind ``events``)."""
        await self._check_read(ref, "events")
        async for record in follow(self._services, self._events, ref, after):
            yield record

    def job_progress(self, ref: ActorRef, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """Progress frames of a job, then a closing message (access kind ``progress``)."""
        from akter._engine.jobs.progress import job_progress

        return job_progress(self._progress_streams, ref, job_id)

    def job_stream(self, ref: ActorRef, job_id: str, after: int = 0) -> JobStream:
        """A job's output stream after seq ``after``, then its close (access kind ``progress``)."""
        return self._jobs.streams.reader(self._progress_streams, ref, job_id, after)

    async def _check_read(
        self,
        ref: ActorRef,
        kind: Literal["events", "progress"],
        caller: Caller | None = None,
    ) -> None:
        self._supervisor.require_started()
        definition = self.definition(ref.type)
        await check_access(definition, ref, caller or current_caller(), kind)

    # --- workflows ----------------------------------------------------------------------------

    def workflow_run(self, run_id: str) -> WorkflowRun[Any]:
        """A handle to a workflow run by id (``result``, ``status``, ``signal``, ``cancel``)."""
        return self.workflows.run(run_id)

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
        caller: Caller | None = None,
    ) -> WorkflowRun[Any]:
        """Start a run of ``flow`` on ``ref`` (``handle.<workflow>.start``; HTTP's entry)."""
        return await self._workflow_engine.start_from_handle(flow, ref, body, pinned, caller)

    async def retry_workflow(self, run_id: str) -> bool:
        """Make a run parked as diverged runnable again (``akter workflows retry``)."""
        self._supervisor.require_started()
        return await self.workflows.retry(run_id)

    # --- call paths ---------------------------------------------------------------------------

    async def mint_command_id(self) -> str:
        """A fresh command id from the framework clock."""
        return self._calls.mint_command_id()

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
        """An internal delivery, as the relay makes it: no access policy, the id as given."""
        return await self._calls.deliver(ref, command, payload, command_id, caller, within=within)

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
            raise refuse_internal(ref.type, found.name, "command", "Runtime.call")
        body = found.validate_payload(payload)
        if found.kind == "query":
            return await self._calls.query(found, ref, body, caller)
        return await self._calls.command(found, ref, body, command_id, caller, retry=retry)

    # --- the operator door --------------------------------------------------------------------

    @property
    def jobs(self) -> Jobs:
        """Job rows across actors: overview, recent, cancel, progress (``operators.jobs``)."""
        return self.operators.jobs

    @functools.cached_property
    def operators(self) -> Operators:
        """The operator objects: dead letters, outbox, workflows, jobs, actors, database, runner.

        The one door of the CLI, the HTTP routes, the console and the test kit
        (:mod:`akter.operators`). ``dead_letters``, ``outbox`` and ``workflows`` are also this
        runtime's attributes of those names.
        """
        return Operators(
            dead_letters=self.dead_letters,
            outbox=self.outbox,
            workflows=self.workflows,
            jobs=Jobs(
                self._services,
                self._progress_streams,
                self._jobs.cancel_signal,
                self._loop.announce,
            ),
            actors=Actors(self._services),
            database=Database(self._services),
            runner=RunnerControl(
                self._services,
                dispatcher=self._dispatcher,
                relay=self._relay,
                jobs=self._jobs,
                workflows=self._workflow_engine,
                runners=self._runners,
                owner=self,
                components=(
                    self._dispatcher,
                    self._engine,
                    self._loop,
                    self._relay,
                    self._jobs,
                    self._jobs.runner,
                    self._progress,
                    self._runners,
                    self._events,
                    self.history,
                    self._lifecycle,
                ),
                own_tasks=lambda: self._lifecycle.tasks,
            ),
        )

    @property
    def runner_id(self) -> str:
        """This runner's id (a new one per process start)."""
        return self._runners.runner_id

    def holds_singleton(self, actor_type: str) -> bool:
        """Whether this runner holds the lease of ``actor_type``'s singleton (runs its loop)."""
        return self._runners.owns(actor_type)

    def advertise_http(self, address: str) -> None:
        """The ``host:port`` this runner serves HTTP on, as its runner row shows (before start)."""
        self._runners.http_address = address

    def require_started(self) -> None:
        """Raise ``ConfigurationError`` unless started and its background work is alive."""
        self._supervisor.require_started()

    @property
    def running(self) -> bool:
        """Whether the runtime is started, not stopping, and its background work alive."""
        supervisor = self._supervisor
        return supervisor.started and not supervisor.stopping and supervisor.fatal is None

    async def check_access(
        self, ref: ActorRef, caller: Caller, kind: AccessKind, member: str | None = None
    ) -> None:
        """Raise ``Unauthorized`` unless the policy lets ``caller`` do ``kind`` on ``member``.

        ``member``: the command, query or workflow called (``None`` for event and progress reads).
        """
        await check_access(self.definition(ref.type), ref, caller, kind, member)

    def clock_estimate_ms(self) -> int:
        """A lower bound of the framework clock now, in ms, without a round trip.

        Raises:
            RuntimeError: Before the runtime has started (the clock was never sampled).
        """
        return self._clock.estimate()
