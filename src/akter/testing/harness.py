"""``ActorTest``: the real runtime on a real PostgreSQL, a fresh schema per test.

It adds database-clock control (``advance``), fault injection (``crash_next``/``pause_next``),
durable-row inspection (``inspect``, ``rows``) and several runners in one process on the same
schema: ``add_runtime``, or a cluster (``ActorTest(..., runners=3)`` / ``await
t.cluster(runners=3)``) whose runners die like processes (``kill(i)``) and come back with a new
runner id (``restart(i)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row

from akter._ids import ms_from_duration
from akter.actor import Actor
from akter.callers import ActorRef
from akter.check import CheckReport
from akter.errors import DrainError
from akter.operators.runner import Match, Pause
from akter.runtime import Runtime
from akter.workflows import WorkflowStatus

A = TypeVar("A", bound=Actor[Any])

DRAIN_ROUNDS = 100
#: Where a killed runner's next connection attempts go: nowhere (no such socket directory).
_DEAD_CONNINFO = "host=/nonexistent/akter-killed-runner dbname=killed connect_timeout=1"
#: How long a kill waits for the server to see its connections end.
_KILL_WAIT_S = 10.0


@dataclass
class Inspection:
    """The durable rows of one actor.

    ``state`` is the stored JSON as it is in the row, at ``state_version`` (which may be older
    than the code's: a row is migrated only by a turn that writes it).
    """

    exists: bool
    version: int = 0
    created: bool = False
    event_seq: int = 0
    state: dict[str, Any] | None = None
    state_version: int = 0
    routing_key: int | None = None
    receipts: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class ActorTest:
    """A test harness around one or more runtimes sharing a fresh schema.

    ``runners`` (default 1) runtimes start on entry, numbered from 0 in ``runtimes``; each is a
    runner with its own runner id, pool and background work, sharing the schema and the clock
    offset. ``get``/``create`` take ``runner=i``; ``crash_next``/``pause_next`` take
    ``runtime=i``; ``advance``/``drain`` work across every live runner; ``kill(i)`` is a process
    death of runner ``i`` and ``restart(i)`` starts a new runner in its slot.

    Example:
        ``async with ActorTest([Counter], database_url=url) as t: await t.get(Counter, "c").add(1)``

        ``async with ActorTest([Counter], database_url=url, runners=3) as t: await t.kill(1)``

        Runtime options pass through, ``resources=`` too: a test replaces one job resource with
        ``ActorTest([Order], database_url=url, resources=app.override(PAYMENTS, fake))``
        (docs/guides/jobs-resources.md).
    """

    def __init__(
        self,
        actors: Sequence[type[Actor[Any]]],
        *,
        database_url: str,
        schema: str | None = None,
        keep_schema: bool = False,
        runners: int = 1,
        **runtime_options: Any,
    ) -> None:
        if isinstance(runners, bool) or not isinstance(runners, int) or runners < 1:
            raise ValueError(f"runners must be an integer ≥ 1, got {runners!r}.")
        self.actors = list(actors)
        self.database_url = database_url
        self.schema = schema or f"akter_t_{uuid.uuid4().hex[:12]}"
        self.keep_schema = keep_schema
        self.runners = runners
        self.runtime_options = runtime_options
        #: The runtimes by index (a killed one keeps its slot until ``restart``).
        self.runtimes: list[Runtime] = []
        # Per runtime: how it was built (for restart) and the application_name tagging its
        # connections (for kill).
        self._specs: dict[Runtime, tuple[list[type[Actor[Any]]] | None, dict[str, Any]]] = {}
        self._tags: dict[Runtime, str] = {}
        self._killed: set[Runtime] = set()

    @property
    def runtime(self) -> Runtime:
        """The first runtime (``runtimes[0]``, even once killed)."""
        return self.runtimes[0]

    @property
    def live_runtimes(self) -> list[Runtime]:
        """The runtimes that were not killed, in index order."""
        return [rt for rt in self.runtimes if rt not in self._killed]

    @property
    def on_citus(self) -> bool:
        """Whether the harness's database is a Citus coordinator (known once a runner started)."""
        return self.runtime.operators.runner.on_citus

    def killed(self, runner: int) -> bool:
        """Whether runner ``runner`` was killed (and not restarted)."""
        return self.runtimes[runner] in self._killed

    async def __aenter__(self) -> ActorTest:
        await self.cluster(self.runners)
        return self

    async def cluster(self, runners: int = 3, **options: Any) -> list[Runtime]:
        """Grow the harness to ``runners`` runtimes (runners 0 … n−1) and return them all.

        The added runtimes take the harness's actors and options, updated by ``options``; they
        share the schema and the clock offset. ``ActorTest(..., runners=3)`` does the same on
        entry.
        """
        if isinstance(runners, bool) or not isinstance(runners, int) or runners < 1:
            raise ValueError(f"runners must be an integer ≥ 1, got {runners!r}.")
        while len(self.runtimes) < runners:
            await self.add_runtime(**options)
        return self.runtimes

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for runtime in reversed(self.runtimes):
            if runtime not in self._killed:
                await runtime.stop()
        if not self.keep_schema:
            async with await psycopg.AsyncConnection.connect(
                self.database_url, autocommit=True
            ) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    async def add_runtime(
        self, actors: Sequence[type[Actor[Any]]] | None = None, **options: Any
    ) -> Runtime:
        """Start another runtime (another runner) on the same database and schema."""
        runtime = await self._start_runtime(actors, options)
        self.runtimes.append(runtime)
        return runtime

    async def _start_runtime(
        self, actors: Sequence[type[Actor[Any]]] | None, options: dict[str, Any]
    ) -> Runtime:
        # Every connection of the runtime carries its own application_name: a kill finds them
        # all, on this side and on the server.
        tag = f"akter-runner-{uuid.uuid4().hex[:16]}"
        runtime = Runtime(
            actors if actors is not None else self.actors,
            database_url=_tagged(self.database_url, tag),
            schema=self.schema,
            **{**self.runtime_options, **options},
        )
        offset = self._offset_ms()
        if offset is not None:
            runtime.operators.runner.offset_ms = offset
        if not self.runtimes:
            await _distribute_on_citus(runtime, self.database_url)
        await runtime.start()
        self._specs[runtime] = (list(actors) if actors is not None else None, dict(options))
        self._tags[runtime] = tag
        return runtime

    def _offset_ms(self) -> int | None:
        """The cluster's clock offset: a live runtime's, else the furthest one's."""
        live = self.live_runtimes
        if live:
            return live[0].operators.runner.offset_ms
        return max((rt.operators.runner.offset_ms for rt in self.runtimes), default=None)

    def _live(self, runner: int) -> Runtime:
        runtime = self.runtimes[runner]
        if runtime in self._killed:
            raise RuntimeError(f"Runner {runner} was killed; restart({runner}) it first.")
        return runtime

    def _any_live(self) -> Runtime:
        live = self.live_runtimes
        if not live:
            raise RuntimeError("Every runner was killed; restart one first.")
        return live[0]

    # --- process death and restart ----------------------------------------------------------

    async def kill(self, runner: int) -> None:
        """Kill runner ``runner`` like a process death (SIGKILL), in-process.

        In one step, with no graceful action: its connections are cut (each socket is shut
        down, so the server sees them end and rolls back their open transactions; new
        connections are impossible), then every background task is cancelled where it stands
        — relay passes and deliveries, job attempts, mailboxes, heartbeats, singleton loops.
        Nothing is drained, released, settled or unregistered: intent claims and job attempts
        stay until their leases end (running attempts stay running and ambiguous), held
        singleton leases stay until they end, and the runner's row stays until its liveness
        expires (35 s of ``advance``). In-flight callers on the runner get a retryable
        ``ActorUnavailable`` with their command id (retry it through another runner); new calls
        are refused. The kill returns once the server shows none of its connections.

        The runner keeps its slot in ``runtimes`` (excluded from ``advance``/``drain``) until
        ``restart(runner)``.
        """
        runtime = self._live(runner)
        control = runtime.operators.runner
        tag = self._tags[runtime]
        self._killed.add(runtime)
        # --- the instant of death: no await until every task is cancelled -------------------
        # Calls are refused, its dying tasks are not reported as failures, and direct
        # connections and the pools' new ones fail.
        control.die(_DEAD_CONNINFO)
        connections = _connections_tagged(tag)
        for conn in connections:
            _cut(conn)
        tasks = control.background_tasks()
        for task in tasks:
            task.cancel()
        # --- after death: let the dead settle, with every database call failing ---------------
        # Closing the pool fails callers waiting for a connection at once.
        await control.close_pools()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Tasks a dying task started while it unwound (none should survive either).
        late = control.background_tasks() - tasks
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        control.drop_caches()
        for conn in connections + _connections_tagged(tag):
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
        await self._await_server_sees_death(tag)

    async def _await_server_sees_death(self, tag: str) -> None:
        """Terminate whatever server session of ``tag`` remains; wait until none does."""
        deadline = time.monotonic() + _KILL_WAIT_S
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            while True:
                cur = await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (tag,),
                )
                if not await cur.fetchall():
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"The killed runner's sessions ({tag}) did not end.")
                await asyncio.sleep(0.01)

    async def restart(self, runner: int) -> Runtime:
        """Start a new runtime (a new runner id) in slot ``runner``, same actors and options.

        A killed runner is replaced; a live one is stopped gracefully first (SIGTERM, then a
        new process). The new runtime shares the schema and the cluster's clock offset.
        """
        old = self.runtimes[runner]
        if old not in self._killed:
            await old.stop()
        actors, options = self._specs[old]
        self._killed.add(old)  # while replaced: never a live member of the cluster
        runtime = await self._start_runtime(actors, options)
        self.runtimes[runner] = runtime
        self._killed.discard(old)
        del self._specs[old], self._tags[old]
        return runtime

    # --- calls --------------------------------------------------------------------------------

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default", runner: int = 0) -> A:
        """A handle whose calls go through runner ``runner`` (the first runtime by default)."""
        return self.runtimes[runner].get(actor, id, tenant=tenant)

    async def create(self, actor: type[A], *, tenant: str = "default", runner: int = 0) -> A:
        """A handle to a minted actor, through runner ``runner`` (the first by default)."""
        return await self.runtimes[runner].create(actor, tenant=tenant)

    # --- faults and time ----------------------------------------------------------------------

    def crash_next(self, point: str, match: Match | None = None, *, runtime: int = 0) -> None:
        """Abandon the next operation reaching ``point`` like a process death."""
        self.runtimes[runtime].operators.runner.hooks.crash_next(point, match)

    def pause_next(self, point: str, match: Match | None = None, *, runtime: int = 0) -> Pause:
        """Hold the next operation reaching ``point`` until released."""
        return self.runtimes[runtime].operators.runner.hooks.pause_next(point, match)

    async def advance(self, by: float | timedelta = 0) -> None:
        """Move the framework clock of every live runtime forward, then drain due work.

        The leases of job attempts a runtime is executing move with the clock, so a jump never
        steals a live lease (semantics §3.5.3). After the jump every live runner does what its
        background work would have done meanwhile: it heartbeats (it stays live while a killed
        runner's heartbeat ages) and refreshes its singleton leases, holders first, then the
        others contend (a killed holder's lease, once ended, is taken over). Killed runners are
        left out.
        """
        ms = ms_from_duration(by, "advance")
        live = [rt.operators.runner for rt in self.live_runtimes]
        for control in live:
            # A workflow attempt under way ends first: a jump must not end its lease under it.
            await control.wait_workflows_idle()
        if ms:
            # Leases move first: between two offsets another runner must not see a live lease
            # as ended, nor a moved one as written before a backward clock jump (skew).
            for control in live:
                control.jumping(True)
            try:
                for control in live:
                    await control.shift_leases(ms)
                for control in live:
                    control.offset_ms += ms
                running = [control for control in live if control.serving]
                for control in running:
                    await control.heartbeat()
                for owned in (True, False):
                    for control in running:
                        await control.refresh_leases(owned=owned)
            finally:
                for control in live:
                    control.jumping(False)
        await self.drain()

    async def drain(self, rounds: int = DRAIN_ROUNDS) -> None:
        """Deliver due intents and run due jobs until a pass claims nothing while nothing ran.

        Raises:
            DrainError: the outbox did not settle within ``rounds`` passes.
        """
        live = [rt.operators.runner for rt in self.live_runtimes]

        def progress() -> tuple[int, ...]:
            return tuple(n for control in live for n in control.progress)

        for _ in range(rounds):
            for control in live:
                await control.wait_idle()
            before = progress()
            claimed = 0
            for control in live:
                claimed += await control.run_pass()
            busy = any(control.busy for control in live)
            # Work that finished during this round (a background pass, an attempt's settle)
            # may have made new rows due after the pass looked: go round again.
            if claimed == 0 and not busy and progress() == before:
                return
        raise DrainError(f"Outbox did not settle after {rounds} drain rounds.")

    async def wait_idle(self, runner: int = 0) -> None:
        """Await every job attempt runner ``runner`` started so far (a killed runner's too).

        Nothing new is claimed meanwhile by this call; :meth:`drain` runs passes until the
        outbox settles.
        """
        await self.runtimes[runner].operators.runner.wait_jobs_idle()

    async def workflow(self, run_id: str) -> WorkflowStatus:
        """A workflow run's status and step journal (read through a live runner)."""
        return await self._any_live().workflow_run(run_id).status()

    async def now_ms(self) -> int:
        """The framework clock (read through a live runner)."""
        return await self._any_live().operators.runner.now_ms()

    # --- durable rows -------------------------------------------------------------------------

    async def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run SQL with ``{schema}`` substituted; returns rows as dicts (tests only)."""
        text = self.substitute(sql)
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(text, params or {})
            return await cur.fetchall() if cur.description else []

    async def sql(self, sql: str, params: Any = None) -> list[dict[str, Any]]:
        """Run SQL with ``{schema}`` substituted in a ``READ ONLY`` transaction; rows as dicts.

        ``params`` are psycopg's (a mapping for ``%(name)s``, a sequence for ``%s``). A
        statement that writes fails with ``psycopg.errors.ReadOnlySqlTransaction``.
        """
        text = self.substitute(sql)
        async with await psycopg.AsyncConnection.connect(self.database_url) as conn:
            await conn.set_read_only(True)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(text, params)
            rows = await cur.fetchall() if cur.description else []
            await conn.rollback()
            return rows

    def substitute(self, sql: str) -> LiteralString:
        """``sql`` with ``{schema}`` replaced by the harness schema's quoted name."""
        return self.runtime.operators.database.substitute(sql)

    async def check(self, sample: int | None = None, **options: Any) -> CheckReport:
        """``akter check`` of the harness's actors against its schema (evolution E5).

        It runs on a runtime of its own that never starts, so it works with or without live
        runners, and on a schema restored from a snapshot of production
        (``ActorTest(actors, database_url=..., schema="akter", keep_schema=True)``, not
        entered). ``options`` are :meth:`akter.Runtime.check`'s (``statement_timeout``,
        ``batch_size``, ``progress``).
        """
        runtime = Runtime(
            self.actors, database_url=self.database_url, schema=self.schema, **self.runtime_options
        )
        offset = self._offset_ms()
        if offset is not None:
            runtime.operators.runner.offset_ms = offset
        return await runtime.check(sample, **options)

    async def inspect(self, target: Any) -> Inspection:
        """The durable rows of an actor (a handle or an :class:`ActorRef`)."""
        ref: ActorRef = target if isinstance(target, ActorRef) else target.ref
        rows = await self.runtime.operators.actors.history(self.database_url, ref)
        actor, receipts, outbox, events = rows.actor, rows.receipts, rows.outbox, rows.events
        if actor is None:
            return Inspection(exists=False, receipts=receipts, outbox=outbox, events=events)
        return Inspection(
            exists=True,
            version=int(actor["version"]),
            created=bool(actor["created"]),
            event_seq=int(actor["event_seq"]),
            state=json.loads(json.dumps(actor["state"])),
            state_version=int(actor["state_version"] or 0),
            routing_key=self.runtime.routing_key(ref),
            receipts=receipts,
            outbox=outbox,
            events=events,
        )


# --- process death ------------------------------------------------------------------------------


async def _distribute_on_citus(runtime: Runtime, url: str) -> None:
    """On a Citus coordinator, migrate and distribute the schema before the first runtime starts.

    Plain PostgreSQL: nothing (the runtime migrates at start, as always). ``url`` is the
    harness's: ``runtime.database_url`` is known only once the runtime has started (before,
    it is empty, and libpq's defaults named some other server: the schema stayed local).
    """
    database = runtime.operators.database
    if await database.is_citus(url):
        await database.distribute(url)


def _tagged(url: str, tag: str) -> str:
    """``url`` (a URI or key=value conninfo) with ``application_name`` set to ``tag``."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urllib.parse.urlsplit(url)
        query = [
            (k, v)
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            if k != "application_name"
        ]
        query.append(("application_name", tag))
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    return psycopg.conninfo.make_conninfo(url, application_name=tag)


def _connections_tagged(tag: str) -> list[psycopg.AsyncConnection[Any]]:
    """Every open connection of this process whose session is named ``tag``.

    Pooled, the relay's own and listeners alike: the kill must not depend on where the runtime
    keeps them.
    """
    found: list[psycopg.AsyncConnection[Any]] = []
    for obj in gc.get_objects():
        try:
            is_connection = isinstance(obj, psycopg.AsyncConnection)
        except ReferenceError:
            continue  # a weakref.proxy whose referent is gone (SQLAlchemy and others keep them)
        if is_connection and not obj.closed:
            with contextlib.suppress(psycopg.Error):
                if obj.info.parameter_status("application_name") == tag:
                    found.append(obj)
    return found


def _cut(conn: psycopg.AsyncConnection[Any]) -> None:
    """Shut the connection's socket down both ways (the descriptor stays open until closed).

    The server reads end-of-file and ends the session, rolling back an open transaction; every
    later use on this side fails like a broken network.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()
