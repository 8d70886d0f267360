"""Actors and the durable effect log of the workflow kill tests (WF-02 … WF-04, the drills).

The same classes run in the parent test process and in its child runners
(``tests.faults.workflow_child``). What really ran is logged where a SIGKILL cannot take it back:

- ``<schema>.wf_effects``: one row per execution of a command handler (``kind = 'handler'``,
  written from inside the turn on a connection of its own, so it stays even when the turn rolls
  back), of a local step's function (``'local'``) and of a job executor call (``'job'``, with the
  job id and attempt), each with the process id and the database clock;
- ``<schema>.wf_job_ends``: a trigger on akter's ``outbox`` logs when each job row stops being a
  job (its settle rewrites it into the route intent, a workflow step's ``$workflow.job``, or
  deletes it), so a test can tell that no attempt of a job started after its terminal outcome.
  Not on distributed Citus tables, which refuse triggers.

Committed effects live in the ``Flow`` actor's state (``applied``: how many committed turns
applied each step), read back with its ``applied`` query.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import akter
from tests._support.citus import ON_CITUS, trigger_refused

#: The database clock in fractional epoch ms.
DB_MS = "extract(epoch FROM clock_timestamp()) * 1000"

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.wf_effects (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    step text NOT NULL,
    kind text NOT NULL,
    job_id text,
    attempt int,
    pid int NOT NULL,
    at_ms double precision NOT NULL
);
"""

JOB_ENDS_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.wf_job_ends (
    job_id text PRIMARY KEY,
    at_ms double precision NOT NULL
);
CREATE OR REPLACE FUNCTION {schema}.log_job_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.kind = 'job' AND (TG_OP = 'DELETE' OR NEW.kind <> 'job') THEN
        INSERT INTO {schema}.wf_job_ends (job_id, at_ms)
        VALUES (OLD.intent_id, extract(epoch FROM clock_timestamp()) * 1000)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS wf_job_ends ON {schema}.outbox;
CREATE TRIGGER wf_job_ends AFTER UPDATE OR DELETE ON {schema}.outbox
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_job_end();
"""


#: Why the drill that reads the job end log does not run on distributed Citus tables.
NO_JOB_END_LOG = trigger_refused("the job end log", "the outbox")


async def install(url: str, schema: str) -> None:
    """Create the effect log and the job end log (with its trigger) in the test's schema.

    On Citus only the effect log: the drill that reads the job end log skips there.
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for ddl in (EFFECTS_DDL,) if ON_CITUS else (EFFECTS_DDL, JOB_ENDS_DDL):
            await conn.execute(
                sql.SQL(ddl.replace("{schema}", "{0}")).format(sql.Identifier(schema))
            )


class Effects:
    """Logs executions durably on a small pool of its own (configure it once per process)."""

    def __init__(self) -> None:
        self.url = ""
        self.schema = ""
        self._pool: AsyncConnectionPool[Any] | None = None

    def configure(self, url: str, schema: str) -> None:
        """Log into ``<schema>.wf_effects`` on ``url``."""
        self.url, self.schema = url, schema

    async def close(self) -> None:
        """Close the pool (each test process or test ends with this)."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def log(
        self,
        run_id: str,
        step: str,
        kind: str,
        job_id: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """One execution, committed at once."""
        if self._pool is None:
            assert self.url, "EFFECTS.configure() was not called in this process"
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
            )
            await pool.open(wait=True)
            self._pool = pool
        insert = sql.SQL(
            "INSERT INTO {} (run_id, step, kind, job_id, attempt, pid, at_ms)"
            " VALUES (%s, %s, %s, %s, %s, %s, {})"
        ).format(sql.Identifier(self.schema, "wf_effects"), sql.SQL(DB_MS))
        async with self._pool.connection() as conn:
            await conn.execute(insert, (run_id, step, kind, job_id, attempt, os.getpid()))


#: The effect log every handler, step and executor below writes (one per process).
EFFECTS = Effects()


class FlowState(BaseModel):
    """How many committed turns applied each step of the actor's run."""

    applied: dict[str, int] = Field(default_factory=dict)


class Charge(BaseModel):
    """A job step's payload: attempts up to ``fail_until`` fail (known not applied).

    Each call holds ``hold`` seconds first (a window for a kill mid-attempt).
    """

    run_id: str
    fail_until: int = 0
    hold: float = 0.0


class Go(BaseModel):
    """The signal the chaos drill's parent sends each run."""

    n: int


async def touch(run_id: str) -> str:
    """A local step with a durable side effect outside the journal."""
    await EFFECTS.log(run_id, "touch", "local")
    return f"touched {run_id}"


#: The ``timed`` workflow's ``timeout=`` (seconds) in the cancel drill.
TIMED_TIMEOUT_S = 5.0


async def guarded(wf: akter.Workflow, fail_until: int, hold: float) -> str:
    """The cancel drill's body: a command, a job, a sleep, a signal wait, a command.

    The job runs one call at a time across all runners (``concurrency=1``); a cancel (or the
    deadline) anywhere runs one compensating command, ``undo``.
    """
    flow = wf.get(Flow, wf.ref.id)
    try:
        await flow.apply(wf.run_id, "s1", hold)
        attempt = await wf.job(
            Flow.charge_one, Charge(run_id=wf.run_id, fail_until=fail_until, hold=hold)
        )
        await wf.sleep(timedelta(seconds=1))
        go = await wf.wait(Go)
        assert go is not None
        await flow.apply(wf.run_id, "s5", hold)
        return f"charged at attempt {attempt}, go {go.n}"
    except akter.WorkflowCancelled:
        await flow.apply(wf.run_id, "undo", hold)
        raise


class Flow(akter.Actor[FlowState], access=akter.public):
    """One workflow run per actor; every step's effect is logged and counted."""

    @akter.command
    async def apply(self, run_id: str, step: str, hold: float = 0.0) -> int:
        """A command step's handler: logged when it runs, counted when its turn commits.

        It holds ``hold`` seconds inside the turn (a window for a kill before the commit).
        """
        await EFFECTS.log(run_id, step, "handler")
        if hold > 0:
            await asyncio.sleep(hold)
        self.state.applied[step] = self.state.applied.get(step, 0) + 1
        return self.state.applied[step]

    @akter.query
    async def applied(self) -> dict[str, int]:
        """The committed count of each step."""
        return self.state.applied

    @akter.job(attempts=6, backoff=(0.05, 0.2), timeout=10)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        await EFFECTS.log(payload.run_id, "charge", "job", call.job_id, call.attempt)
        if payload.hold > 0:
            await asyncio.sleep(payload.hold)
        if call.attempt <= payload.fail_until:
            raise akter.JobFailure(f"flaky: attempt {call.attempt} of {payload.fail_until}")
        return call.attempt

    @akter.job(attempts=3, backoff=(0.05, 0.2), timeout=10, concurrency=1)
    async def charge_one(call: akter.JobCall, payload: Charge) -> int:
        """``charge`` one call at a time across all runners (the cancel drill)."""
        await EFFECTS.log(payload.run_id, "charge", "job", call.job_id, call.attempt)
        if payload.hold > 0:
            await asyncio.sleep(payload.hold)
        if call.attempt <= payload.fail_until:
            raise akter.JobFailure(f"flaky: attempt {call.attempt} of {payload.fail_until}")
        return call.attempt

    @akter.workflow
    async def cancellable(wf: akter.Workflow, fail_until: int, hold: float = 0.0) -> str:
        """The cancel drill's runs its parent cancels (:func:`guarded`)."""
        return await guarded(wf, fail_until, hold)

    @akter.workflow(timeout=timedelta(seconds=TIMED_TIMEOUT_S))
    async def timed(wf: akter.Workflow, fail_until: int, hold: float = 0.0) -> str:
        """The cancel drill's runs that time out wherever they are (:func:`guarded`)."""
        return await guarded(wf, fail_until, hold)

    @akter.workflow
    async def three(wf: akter.Workflow) -> list[int]:
        """Three command steps (WF-02, WF-03)."""
        return [await wf.get(Flow, wf.ref.id).apply(wf.run_id, f"s{i}") for i in (1, 2, 3)]

    @akter.workflow
    async def local(wf: akter.Workflow) -> str:
        """A command, a local step with a side effect, a command (WF-04)."""
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s1")
        touched = await wf.step(touch, wf.run_id)
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s3")
        return touched

    @akter.workflow
    async def paid(wf: akter.Workflow) -> int:
        """A command, a job step, a command: the job's attempt number."""
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s1")
        attempt = await wf.job(Flow.charge, Charge(run_id=wf.run_id))
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s3")
        return attempt

    @akter.workflow
    async def chaos(wf: akter.Workflow, fail_until: int, hold: float = 0.0) -> str:
        """The chaos drill's five steps: a command, a flaky job, a sleep, a signal, a command.

        A job that dead-letters (``fail_until`` ≥ its attempts) fails the run; the handlers
        and the job's calls hold ``hold`` seconds.
        """
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s1", hold)
        attempt = await wf.job(
            Flow.charge, Charge(run_id=wf.run_id, fail_until=fail_until, hold=hold)
        )
        await wf.sleep(timedelta(seconds=1))
        go = await wf.wait(Go)
        assert go is not None
        await wf.get(Flow, wf.ref.id).apply(wf.run_id, "s5", hold)
        return f"charged at attempt {attempt}, go {go.n}"


ACTORS: list[type[akter.Actor[Any]]] = [Flow]
