"""``ActorTest``: the real runtime on a real PostgreSQL, a fresh schema per test.

It adds database-clock control (``advance``), fault injection (``crash_next``/``pause_next``),
durable-row inspection (``inspect``, ``rows``) and extra runtimes on the same schema (two
runners in one process).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from akter._engine.hooks import Match, Pause
from akter._ids import ms_from_duration
from akter.actor import Actor
from akter.callers import ActorRef
from akter.errors import DrainError
from akter.runtime import Runtime

A = TypeVar("A", bound=Actor[Any])

DRAIN_ROUNDS = 100


@dataclass
class Inspection:
    """The durable rows of one actor."""

    exists: bool
    version: int = 0
    created: bool = False
    event_seq: int = 0
    state: dict[str, Any] | None = None
    routing_key: int | None = None
    receipts: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


class ActorTest:
    """A test harness around one or more runtimes sharing a fresh schema.

    Example:
        ``async with ActorTest([Counter], database_url=url) as t: await t.get(Counter, "c").add(1)``
    """

    def __init__(
        self,
        actors: Sequence[type[Actor[Any]]],
        *,
        database_url: str,
        schema: str | None = None,
        keep_schema: bool = False,
        **runtime_options: Any,
    ) -> None:
        self.actors = list(actors)
        self.database_url = database_url
        self.schema = schema or f"akter_t_{uuid.uuid4().hex[:12]}"
        self.keep_schema = keep_schema
        self.runtime_options = runtime_options
        self.runtimes: list[Runtime] = []

    @property
    def runtime(self) -> Runtime:
        """The first runtime."""
        return self.runtimes[0]

    async def __aenter__(self) -> ActorTest:
        await self.add_runtime()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for runtime in reversed(self.runtimes):
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
        runtime = Runtime(
            actors if actors is not None else self.actors,
            database_url=self.database_url,
            schema=self.schema,
            **{**self.runtime_options, **options},
        )
        if self.runtimes:
            runtime.clock.offset_ms = self.runtime.clock.offset_ms
        await runtime.start()
        self.runtimes.append(runtime)
        return runtime

    # --- calls --------------------------------------------------------------------------------

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> A:
        """A handle from the first runtime."""
        return self.runtime.get(actor, id, tenant=tenant)

    async def create(self, actor: type[A], *, tenant: str = "default") -> A:
        """A handle to a minted actor from the first runtime."""
        return await self.runtime.create(actor, tenant=tenant)

    # --- faults and time ----------------------------------------------------------------------

    def crash_next(self, point: str, match: Match | None = None, *, runtime: int = 0) -> None:
        """Abandon the next operation reaching ``point`` like a process death."""
        self.runtimes[runtime].hooks.crash_next(point, match)

    def pause_next(self, point: str, match: Match | None = None, *, runtime: int = 0) -> Pause:
        """Hold the next operation reaching ``point`` until released."""
        return self.runtimes[runtime].hooks.pause_next(point, match)

    async def advance(self, by: float | timedelta = 0) -> None:
        """Move the framework clock of every runtime forward, then drain due work.

        The leases of job attempts a runtime is executing move with the clock, so a jump never
        steals a live lease (semantics §3.5.3).
        """
        ms = ms_from_duration(by, "advance")
        if ms:
            # Leases move first: between two offsets another runner must not see a live lease
            # as ended.
            for runtime in self.runtimes:
                await runtime.jobs.shift(ms)
            for runtime in self.runtimes:
                runtime.clock.offset_ms += ms
        await self.drain()

    async def drain(self, rounds: int = DRAIN_ROUNDS) -> None:
        """Deliver due intents and run due jobs until a pass claims nothing while nothing ran.

        Raises:
            DrainError: the outbox did not settle within ``rounds`` passes.
        """

        def progress() -> tuple[int, ...]:
            return tuple(
                n
                for rt in self.runtimes
                for n in (rt.relay.delivered, rt.relay.retried, rt.jobs.finished)
            )

        for _ in range(rounds):
            for runtime in self.runtimes:
                await runtime.relay.wait_idle()
                await runtime.jobs.wait_idle()
            before = progress()
            claimed = 0
            for runtime in self.runtimes:
                claimed += await runtime.relay.run_pass(drain=True)
            busy = any(rt.relay.in_flight or rt.jobs.running for rt in self.runtimes)
            # Work that finished during this round (a background pass, an attempt's settle)
            # may have made new rows due after the pass looked: go round again.
            if claimed == 0 and not busy and progress() == before:
                return
        raise DrainError(f"Outbox did not settle after {rounds} drain rounds.")

    async def now_ms(self) -> int:
        """The framework clock."""
        return await self.runtime.clock.read()

    # --- durable rows -------------------------------------------------------------------------

    async def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run SQL with ``{schema}`` substituted; returns rows as dicts (tests only)."""
        text = self.runtime.store.queries.substitute(sql)
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(text, params or {})
            return await cur.fetchall() if cur.description else []

    async def inspect(self, target: Any) -> Inspection:
        """The durable rows of an actor (a handle or an :class:`ActorRef`)."""
        ref: ActorRef = target if isinstance(target, ActorRef) else target.ref
        q = self.runtime.store.queries
        key = {
            "rk": self.runtime.routing_key(ref),
            "tenant": ref.tenant,
            "type": ref.type,
            "id": ref.id,
        }
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q["query_actor"], key)
            actor = await cur.fetchone()
            await cur.execute(q["inspect_receipts"], key)
            receipts = await cur.fetchall()
            await cur.execute(q["inspect_outbox"], key)
            outbox = await cur.fetchall()
            await cur.execute(q["inspect_events"], key)
            events = await cur.fetchall()
        if actor is None:
            return Inspection(exists=False, receipts=receipts, outbox=outbox, events=events)
        return Inspection(
            exists=True,
            version=int(actor["version"]),
            created=bool(actor["created"]),
            event_seq=int(actor["event_seq"]),
            state=json.loads(json.dumps(actor["state"])),
            routing_key=self.runtime.routing_key(ref),
            receipts=receipts,
            outbox=outbox,
            events=events,
        )
