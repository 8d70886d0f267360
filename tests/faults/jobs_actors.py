"""Actors, the durable call log and the lease log of the job fault tests (no tests here).

The same classes run in the parent test process and in its child runners
(``tests.faults.jobs_child``), so every executor below records what it did in the database,
where all processes can see it and a SIGKILL cannot take it back:

- ``<schema>.job_calls``: one row per executor call, written by :data:`RECORDER` *before* the
  call does anything (``started_ms``) and when it returns or is interrupted (``ended_ms``,
  ``outcome``), both stamped with the database clock (``clock_timestamp()``, fractional ms) and
  the process id. A call whose runner was killed keeps ``ended_ms`` NULL.
- ``<schema>.job_leases``: a trigger on akter's ``outbox`` logs every write that leaves a job row
  running (a claim, a renewal), with its attempt, lease end, ready time, transaction id and the
  database clock, so a test can tell when a killed attempt's lease really ended and in which
  order, and in which claim transactions, attempts were taken. Not on distributed Citus tables,
  which refuse triggers.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import akter
import akter.jobs
from tests._support.citus import ON_CITUS, trigger_refused

#: Seconds a ``Crowd`` job tagged ``long`` holds: a call the caps drill can kill surely mid-call.
LONG_HOLD = 1.5

#: The database clock in fractional epoch ms.
DB_MS = "extract(epoch FROM clock_timestamp()) * 1000"

CALLS_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.job_calls (
    id bigserial PRIMARY KEY,
    job_id text NOT NULL,
    attempt int NOT NULL,
    job text NOT NULL,
    actor_id text NOT NULL,
    tag text NOT NULL,
    pid int NOT NULL,
    started_ms double precision NOT NULL,
    ended_ms double precision,
    outcome text
)
"""

LEASES_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.job_leases (
    id bigserial PRIMARY KEY,
    intent_id text NOT NULL,
    actor_id text NOT NULL,
    command text NOT NULL,
    attempts int NOT NULL,
    due_at_ms bigint NOT NULL,
    ready_at_ms bigint NOT NULL,
    claimed boolean NOT NULL,
    xid bigint NOT NULL,
    at_ms double precision NOT NULL
);
CREATE OR REPLACE FUNCTION {schema}.log_job_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind = 'job' AND NEW.running THEN
        INSERT INTO {schema}.job_leases (intent_id, actor_id, command, attempts, due_at_ms,
            ready_at_ms, claimed, xid, at_ms)
        VALUES (NEW.intent_id, NEW.actor_id, NEW.command, NEW.attempts, NEW.due_at_ms,
            NEW.ready_at_ms, NEW.attempts > OLD.attempts, txid_current(),
            extract(epoch FROM clock_timestamp()) * 1000);
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS job_leases ON {schema}.outbox;
CREATE TRIGGER job_leases AFTER UPDATE ON {schema}.outbox
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_job_lease();
"""


#: Why the drills that read the lease log do not run on distributed Citus tables.
NO_LEASE_LOG = trigger_refused("the lease log", "the outbox")


async def install(url: str, schema: str) -> None:
    """Create the call log and the lease log (with its trigger) in the test's schema.

    On Citus only the call log: the drills that read the lease log skip there (``NO_LEASE_LOG``).
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for ddl in (CALLS_DDL,) if ON_CITUS else (CALLS_DDL, LEASES_DDL):
            await conn.execute(sql.SQL(ddl).format(schema=sql.Identifier(schema)))


class Work(BaseModel):
    """A job's payload: a tag for the tests, and how long the call holds.

    ``hold`` is in seconds; ``None`` takes the default of the process running the call, and a
    negative value holds until the call is interrupted or its process killed.
    """

    tag: str = ""
    hold: float | None = None


class Recorder:
    """Logs every executor call durably, then holds it as configured.

    Configure it once per process (:meth:`configure`); it opens a small connection pool of its
    own on first use, in the running event loop.
    """

    def __init__(self) -> None:
        self.url = ""
        self.schema = ""
        #: Seconds a call holds unless its payload says otherwise (negative: forever).
        self.hold = 0.0
        #: Called with (job id, attempt) once a call is logged as started.
        self.on_start: Callable[[str, int], None] | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._insert: sql.Composable = sql.SQL("")
        self._end: sql.Composable = sql.SQL("")

    def configure(
        self,
        url: str,
        schema: str,
        *,
        hold: float = 0.0,
        on_start: Callable[[str, int], None] | None = None,
    ) -> None:
        """Record into ``<schema>.job_calls`` on ``url``."""
        self.url, self.schema, self.hold, self.on_start = url, schema, hold, on_start
        table = sql.Identifier(schema, "job_calls")
        self._insert = sql.SQL(
            "INSERT INTO {} (job_id, attempt, job, actor_id, tag, pid, started_ms)"
            " VALUES (%s, %s, %s, %s, %s, %s, {}) RETURNING id"
        ).format(table, sql.SQL(DB_MS))
        self._end = sql.SQL("UPDATE {} SET ended_ms = {}, outcome = %s WHERE id = %s").format(
            table, sql.SQL(DB_MS)
        )

    async def close(self) -> None:
        """Close the pool (each test process or test ends with this)."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _connections(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            assert self.url, "Recorder.configure() was not called in this process"
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
            )
            await pool.open(wait=True)
            self._pool = pool
        return self._pool

    async def call(self, job: str, call: akter.JobCall, work: Work) -> int:
        """One provider call: logged, held, logged again; returns the attempt number."""
        pool = await self._connections()
        assert call.ref is not None
        async with pool.connection() as conn:
            cur = await conn.execute(
                self._insert,
                (call.job_id, call.attempt, job, call.ref.id, work.tag, os.getpid()),
            )
            found = await cur.fetchone()
        assert found is not None
        record = int(found[0])
        if self.on_start is not None:
            self.on_start(call.job_id, call.attempt)
        outcome = "interrupted"
        try:
            hold = self.hold if work.hold is None else work.hold
            if hold < 0:
                await asyncio.Event().wait()
            elif hold > 0:
                await asyncio.sleep(hold)
            outcome = "succeeded"
            return call.attempt
        finally:
            async with pool.connection() as conn:
                await conn.execute(self._end, (outcome, record))


#: The recorder every executor below calls (one per process).
RECORDER = Recorder()


class Log(BaseModel):
    """What an actor's routes received, in order, and how many successes it saw."""

    reports: list[dict[str, Any]] = Field(default_factory=list)
    done: int = 0


class Worker(akter.Actor[Log], access=akter.public):
    """The kill tests' actor: an uncapped job with every route, a capped one, a single-shot one."""

    @akter.command
    async def start(self, tag: str = "", key: str | None = None) -> str:
        """Enqueue ``charge``."""
        return self.enqueue(Worker.charge, Work(tag=tag), key=key)

    @akter.command
    async def start_serial(self, tags: list[str]) -> list[str]:
        """Enqueue ``serial`` jobs, in this order."""
        return [self.enqueue(Worker.serial, Work(tag=tag)) for tag in tags]

    @akter.command
    async def start_once(self, tag: str = "") -> str:
        """Enqueue ``once``."""
        return self.enqueue(Worker.once, Work(tag=tag))

    @akter.command
    async def cancel(self, key: str) -> None:
        """Cancel the job enqueued with ``key``."""
        self.cancel_job(key)

    @akter.query
    async def reports(self) -> list[dict[str, Any]]:
        """What the routes received."""
        return self.state.reports

    # --- charge: four attempts, every route ---------------------------------------------------

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=60)
    async def charge(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("charge", call, work)

    @charge.on_success
    async def charged(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @charge.on_dead_letter
    async def charge_dead(self, letter: akter.DeadLetter[Work]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )

    @charge.on_cancelled
    async def charge_cancelled(self, report: akter.jobs.Cancelled[Work, int]) -> None:
        self.state.reports.append(
            {"route": "cancelled", "id": self.command_id, **report.model_dump(mode="json")}
        )

    # --- serial: one attempt per actor at a time ----------------------------------------------

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=60, per_actor=1)
    async def serial(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("serial", call, work)

    @serial.on_success
    async def serial_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    # --- once: a single attempt ---------------------------------------------------------------

    @akter.job(attempts=1, timeout=60)
    async def once(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("once", call, work)

    @once.on_success
    async def once_done(self, result: int) -> None:
        self.state.reports.append({"route": "success", "id": self.command_id, "value": result})

    @once.on_dead_letter
    async def once_dead(self, letter: akter.DeadLetter[Work]) -> None:
        self.state.reports.append(
            {"route": "dead_letter", "id": self.command_id, **letter.model_dump(mode="json")}
        )


class Crowd(akter.Actor[Log], access=akter.public):
    """The caps drill's actor: ``pair`` runs at most two attempts per actor across runners."""

    @akter.command
    async def fill(self, n: int, hold: float, tag: str = "", long: int = -1) -> list[str]:
        """Enqueue ``n`` ``pair`` jobs, in this order; the one at index ``long`` holds 1.5 s."""
        return [
            self.enqueue(
                Crowd.pair,
                Work(tag="long", hold=LONG_HOLD) if i == long else Work(tag=tag, hold=hold),
            )
            for i in range(n)
        ]

    @akter.query
    async def done(self) -> int:
        """How many successes were routed."""
        return self.state.done

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=60, per_actor=2)
    async def pair(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("pair", call, work)

    @pair.on_success
    async def paired(self, result: int) -> None:
        self.state.done += 1

    @pair.on_dead_letter
    async def pair_dead(self, letter: akter.DeadLetter[Work]) -> None:
        self.state.reports.append({"route": "dead_letter", "id": self.command_id})


class Paced(akter.Actor[Log], access=akter.public):
    """The flow-control drills' actor.

    ``slots`` runs at most three attempts across all runners, ``paced`` at most 50 per second
    (burst 50) across all runners.
    """

    @akter.command
    async def fill_slots(self, n: int, hold: float, long: int = -1) -> list[str]:
        """Enqueue ``n`` ``slots`` jobs; the one at index ``long`` holds 1.5 s."""
        return [
            self.enqueue(
                Paced.slots,
                Work(tag="long", hold=LONG_HOLD) if i == long else Work(tag="slot", hold=hold),
            )
            for i in range(n)
        ]

    @akter.command
    async def fill_paced(self, n: int) -> list[str]:
        """Enqueue ``n`` ``paced`` jobs that return at once."""
        return [self.enqueue(Paced.paced, Work(tag="paced", hold=0.0)) for _ in range(n)]

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=60, concurrency=3)
    async def slots(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("slots", call, work)

    @slots.on_success
    async def slotted(self, result: int) -> None:
        self.state.done += 1

    @akter.job(attempts=4, backoff=(0.01, 0.04), timeout=60, rate=akter.Rate(50, per=1))
    async def paced(call: akter.JobCall, work: Work) -> int:
        return await RECORDER.call("paced", call, work)

    @paced.on_success
    async def paced_done(self, result: int) -> None:
        self.state.done += 1


#: The drills' types.
ACTORS: list[type[akter.Actor[Any]]] = [Worker, Crowd, Paced]
