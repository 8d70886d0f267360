"""Actors of the chaos drill (issue 5), hosted by ``tests.faults.chaos_child`` runners.

Every effect leaves a durable trace that makes a double application visible:

- ``Account.work`` appends the uuid of its command id to ``applied`` (a second transition of one
  command would show as a repeated entry), sends one intent to an ``Inbox`` and enqueues one
  ``Account.process`` job; it returns the job id, the runner that ran the turn and the turn's
  clock (a replay returns the stored outcome of the one commit).
- ``Inbox.note`` appends ``<uuid of its intent id>:<uuid of the sending command>`` to
  ``notes`` (a second delivery of one intent would show as a repeated intent uuid).
- ``Account.process`` (the job executor) records every attempt in ``<schema>.chaos_attempts``
  and applies its effect idempotently under the job id in ``<schema>.chaos_effects``;
  ``on_success`` appends the job uuid to ``done``, ``on_dead_letter`` to ``dead``.

Handlers record ``RUNNER["id"]`` (set by the child) so the parent can tell which runner
committed a turn. Uuids, not whole ids, keep the states small (each entry is 36 characters).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import akter

#: The runner hosting these actors in this process (its ``runner_id``; set by the child).
RUNNER = {"id": "?"}

#: The child's pool for the executor's side tables, and their schema (set by the child).
SIDE: dict[str, Any] = {"pool": None, "schema": "akter"}

#: How long an attempt "calls the provider" (uniform, seconds): long enough that SIGKILLs catch
#: attempts in flight, so some jobs are re-attempted after their lease.
PROVIDER_S = (0.02, 0.3)

ACTORS = 256

SIDE_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.chaos_attempts (
    job_id text NOT NULL,
    attempt int NOT NULL,
    runner_id text NOT NULL,
    at_ms bigint NOT NULL DEFAULT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    PRIMARY KEY (job_id, attempt, runner_id)
);
CREATE TABLE IF NOT EXISTS {schema}.chaos_effects (
    job_id text PRIMARY KEY,
    attempt int NOT NULL,
    runner_id text NOT NULL,
    applications int NOT NULL DEFAULT 1
);
"""


def uuid_of(command_id: str) -> str:
    """The uuid part of a v1 id (its last 36 characters)."""
    return command_id[-36:]


def side_ddl(schema: str) -> sql.Composed:
    """The side tables of the executor in ``schema``."""
    return sql.SQL(SIDE_DDL.replace("{schema}", "{0}")).format(sql.Identifier(schema))


class Work(BaseModel):
    """A job payload: the command that enqueued it."""

    command: str


class Ack(BaseModel):
    """What ``Account.work`` returns."""

    job_id: str
    by: str
    now_ms: int


class Ledger(BaseModel):
    """An account's applied commands and its finished jobs (uuids)."""

    applied: list[str] = Field(default_factory=list)
    done: list[str] = Field(default_factory=list)
    dead: list[str] = Field(default_factory=list)
    by: str = ""


class Notes(BaseModel):
    """The intents an inbox was delivered: ``<intent uuid>:<sending command uuid>``."""

    notes: list[str] = Field(default_factory=list)


class Inbox(
    akter.Actor[Notes],
    placement="actor",
    max_state_bytes=4_000_000,
):
    """Receives one intent per applied ``Account.work``."""

    @akter.command
    async def note(self, source: str) -> int:
        """Record this delivery."""
        self.state.notes.append(f"{uuid_of(self.command_id)}:{source}")
        return len(self.state.notes)


class Account(
    akter.Actor[Ledger],
    access=akter.public,
    placement="actor",
    max_state_bytes=4_000_000,
):
    """The callers' target: each command mutates state, sends an intent, enqueues a job."""

    @akter.command
    async def work(self, inbox: int) -> Ack:
        """Apply one command: record it, notify ``Inbox/i<inbox>``, enqueue its job."""
        me = uuid_of(self.command_id)
        self.state.applied.append(me)
        self.state.by = RUNNER["id"]
        self.send(Inbox.note, f"i{inbox}", me)
        job_id = self.enqueue(Account.process, Work(command=me))
        return Ack(job_id=job_id, by=RUNNER["id"], now_ms=self.now_ms)

    @akter.query
    async def ledger(self) -> Ledger:
        """The state (for inspection)."""
        return self.state

    @akter.job(attempts=40, backoff=(0.2, 2.0), timeout=10)
    async def process(call: akter.JobCall, payload: Work) -> int:
        """Record the attempt, "call the provider", apply the effect once per job id."""
        pool: AsyncConnectionPool[Any] | None = SIDE["pool"]
        assert pool is not None, "the child sets SIDE['pool'] before it starts the runtime"
        schema = sql.Identifier(SIDE["schema"])
        async with pool.connection() as conn:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.chaos_attempts (job_id, attempt, runner_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING"
                ).format(schema),
                (call.job_id, call.attempt, RUNNER["id"]),
            )
        await asyncio.sleep(random.uniform(*PROVIDER_S))
        async with pool.connection() as conn:
            # Idempotent under the job id, like a provider honouring an idempotency key.
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.chaos_effects (job_id, attempt, runner_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT (job_id) DO UPDATE"
                    " SET applications = chaos_effects.applications + 1"
                ).format(schema),
                (call.job_id, call.attempt, RUNNER["id"]),
            )
        return call.attempt

    @process.on_success
    async def processed(self, attempt: int) -> None:
        """The job's success route (command id = job id)."""
        self.state.done.append(uuid_of(self.command_id))

    @process.on_dead_letter
    async def process_dead(self, letter: akter.DeadLetter[Work]) -> None:
        """The job's dead-letter route (command id = job id)."""
        self.state.dead.append(uuid_of(self.command_id))
