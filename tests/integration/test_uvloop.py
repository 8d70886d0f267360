"""The engine under uvloop's event loop (docs/guides/operating.md, "The event loop").

An application that serves akter from its own uvicorn (``uvicorn[standard]`` installs uvloop, and
uvicorn then picks it) runs every lane on ``uvloop.Loop``, not on asyncio's: the turn pipeline's
socket watch (``loop.add_reader`` on libpq's socket), the pass loop's wakes and timers, the job
executor's leases, the workflow engine's resumptions. Each test runs a runtime of its own under
``uvloop.run`` on a fresh schema and checks the durable rows and answers, not only "no error":

- warm turns take the one flight (no fallback counted) and their receipts replay;
- an intent, a timer, a job with its ``on_success`` route and a workflow with a command step, a
  job step and a durable sleep all land exactly once;
- a cancelled caller (its task cancelled while its turn waits on the socket) leaves the runtime
  usable and the row as the turns that committed left it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel, Field

import akter
from tests._support.citus import ON_CITUS
from tests._support.polling import until

uvloop = pytest.importorskip(
    "uvloop"
)  # a dev dependency: CI installs it, so this never skips there

pytestmark = pytest.mark.timeout(90)


class Tally(BaseModel):
    n: int = 0
    got: list[str] = Field(default_factory=list)


class Work(BaseModel):
    k: int


class Hub(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n

    @akter.command
    async def fan(self, to: str) -> str:
        self.send(Hub.note, to, "intent")
        self.later(after=timedelta(milliseconds=50)).send(Hub.note, to, "timer")
        self.enqueue(Hub.square, Work(k=7))
        return self.start_workflow(Hub.flow, to)

    @akter.command
    async def note(self, what: str) -> None:
        self.state.got.append(what)

    @akter.query
    async def tally(self) -> dict[str, Any]:
        return self.state.model_dump()

    @akter.job(attempts=2, backoff=(0.01, 0.01))
    async def square(call: akter.JobCall, work: Work) -> int:
        return work.k * work.k

    @square.on_success
    async def squared(self, value: int) -> None:
        self.state.got.append(f"job {value}")

    @akter.workflow(timeout=timedelta(minutes=1))
    async def flow(wf: akter.Workflow, to: str) -> int:
        await wf.get(Hub, to).note("workflow step")
        value = await wf.job(Hub.square, Work(k=3))
        await wf.sleep(timedelta(milliseconds=50))
        await wf.get(Hub, to).note(f"workflow {value}")
        return value


async def _count(runtime: akter.Runtime, query: str) -> int:
    url, schema = runtime.config.database_url, runtime.config.schema
    assert url is not None
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql.SQL(query).format(schema=sql.Identifier(schema)))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def _under_uvloop(url: str, body: Callable[[akter.Runtime], Awaitable[None]]) -> None:
    """Run ``body`` with a started runtime on a fresh schema, all under ``uvloop.run``."""
    schema = f"akter_uvloop_{uuid.uuid4().hex[:10]}"

    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        try:
            async with akter.Runtime([Hub], database_url=url, schema=schema) as runtime:
                await body(runtime)
        finally:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )

    uvloop.run(main())


@pytest.mark.skipif(ON_CITUS, reason="one flight on plain PostgreSQL only; the rest runs below")
def test_warm_turns_take_one_flight_and_replay_under_uvloop(akter_db: str) -> None:
    async def body(runtime: akter.Runtime) -> None:
        hub = runtime.get(Hub, "h")
        assert [await hub.add(1) for _ in range(20)] == list(range(1, 21))
        engine = runtime._engine
        assert dict(engine.fallbacks) == {}
        # A retry with the command id of a committed call replays its receipt.
        pinned = await runtime.mint_command_id()
        first = await hub.with_command_id(pinned).add(5)
        again = await hub.with_command_id(pinned).add(5)
        assert (first, again) == (25, 25)
        assert await hub.tally() == {"n": 25, "got": []}

    _under_uvloop(akter_db, body)


def test_every_lane_lands_once_under_uvloop(akter_db: str) -> None:
    async def body(runtime: akter.Runtime) -> None:
        run_id = await runtime.get(Hub, "from").fan("to")
        want = ["intent", "job 49", "timer", "workflow 9", "workflow step"]
        got = await until(
            lambda: runtime.get(Hub, "to").tally(),
            within=30,
            what="the intent, the timer and the workflow's steps at 'to'",
            holds=lambda t: len(t["got"]) >= 4,
        )
        source = await until(
            lambda: runtime.get(Hub, "from").tally(),
            within=30,
            what="the job's on_success route at 'from'",
            holds=lambda t: t["got"] == ["job 49"],
        )
        assert await runtime.workflow_run(run_id).result(timeout=30) == 9
        got = await runtime.get(Hub, "to").tally()
        assert sorted(got["got"] + source["got"]) == want  # each exactly once

    _under_uvloop(akter_db, body)


def test_a_cancelled_caller_leaves_the_runtime_usable_under_uvloop(akter_db: str) -> None:
    async def body(runtime: akter.Runtime) -> None:
        hub = runtime.get(Hub, "c")
        await hub.add(1)
        callers = [asyncio.create_task(hub.add(1)) for _ in range(50)]
        await asyncio.sleep(0)  # every caller has submitted its command
        for task in callers[::2]:
            task.cancel()
        answers = await asyncio.gather(*callers, return_exceptions=True)
        committed = [a for a in answers if isinstance(a, int)]
        assert len(committed) >= 25  # only the cancelled half may have gone unanswered
        final = await hub.add(0)
        # The ledger: the count is one per add(1) turn that committed, each with its receipt,
        # whether or not its caller was still there for the answer (a cancelled caller's
        # command may have run); no update lost or doubled.
        receipts = await _count(
            runtime, "SELECT count(*) FROM {schema}.receipts WHERE actor_id = 'c'"
        )
        assert final == receipts - 1  # every add(1) receipt, plus add(0)'s, counted once
        assert 1 + len(committed) <= final <= 51
        assert await hub.add(1) == final + 1

    _under_uvloop(akter_db, body)
