"""How a job's output stream ends, and the append's guarantees (docs/guides/job-streams.md).

A dead-lettered job's stream has both attempts' segments and closes ``dead_lettered``; a job
cancelled while it runs closes ``cancelled``; a synchronous executor streams from its thread; a
value JSON cannot hold is refused by name; a caller the access policy refuses reads nothing. The
append statement itself: a retry of an append that committed writes nothing twice, and an
append of a superseded attempt writes nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import akter
import akter.jobs
from akter._store.gateway.streams import ItemKind, StreamKey, StreamsGateway
from akter.job_streams import AttemptStarted, Chunk, Closed, JobStreamError, StreamItem
from akter.testing import ActorTest
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

GATE = asyncio.Event()
THREADS: list[int] = []
CODES: list[str] = []


class Nothing(BaseModel):
    pass


def readers(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: str) -> bool:
    """Commands for everyone; job streams only for the principal ``reader``."""
    if kind == "progress":
        return isinstance(caller, akter.User) and caller.subject == "reader"
    return True


class Ender(akter.Actor[Nothing], access=readers):
    @akter.command
    async def doomed(self) -> str:
        return self.enqueue(Ender.fail, Nothing())

    @akter.command
    async def long(self) -> str:
        return self.enqueue(Ender.wait, Nothing(), key="long")

    @akter.command
    async def stop(self) -> None:
        self.cancel_job("long")

    @akter.command
    async def threaded(self) -> str:
        return self.enqueue(Ender.in_thread, Nothing())

    @akter.job(attempts=2, backoff=(0.001, 0.001), timeout=20)
    async def fail(call: akter.JobCall, _: Nothing) -> None:
        call.stream({"attempt": call.attempt})
        raise RuntimeError("always")

    @akter.job(attempts=1, timeout=20)
    async def wait(call: akter.JobCall, _: Nothing) -> None:
        call.stream("started")
        try:
            call.stream({1, 2})
        except JobStreamError as exc:
            CODES.append(exc.code)
        await GATE.wait()

    @akter.job(attempts=1, timeout=20)
    def in_thread(call: akter.JobCall, _: Nothing) -> int:
        THREADS.append(threading.get_ident())
        for i in range(3):
            call.stream(i)
        return 3

    @fail.on_dead_letter
    async def failed(self, letter: akter.DeadLetter[Nothing]) -> None:
        pass

    @wait.on_cancelled
    async def waited(self, report: akter.jobs.Cancelled[Nothing, None]) -> None:
        pass


@pytest.fixture(autouse=True)
def reset() -> None:
    global GATE
    GATE = asyncio.Event()
    THREADS.clear()
    CODES.clear()


def shape(items: list[StreamItem]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        match item:
            case AttemptStarted(_, attempt):
                out.append({"attempt": attempt})
            case Chunk(_, _, data):
                out.append(data)
            case Closed(_, outcome):
                out.append(outcome)
    return out


async def read(handle: Any, job_id: str, after: int = 0) -> list[StreamItem]:
    with akter.as_caller(akter.User("reader")):
        return [item async for item in handle.job_stream(job_id, after=after)]


async def test_a_dead_lettered_job_closes_with_both_segments(akter_test: Make) -> None:
    async with akter_test([Ender]) as t:
        ender = t.get(Ender, "e1")
        job_id = await ender.doomed()
        items = await asyncio.wait_for(read(ender, job_id), 20)
        assert shape(items) == [
            {"attempt": 1}, {"attempt": 1}, {"attempt": 2}, {"attempt": 2}, "dead_lettered"
        ]  # fmt: skip
        assert [type(i).__name__ for i in items] == [
            "AttemptStarted", "Chunk", "AttemptStarted", "Chunk", "Closed"
        ]  # fmt: skip


async def test_a_job_cancelled_while_it_runs_closes_cancelled(akter_test: Make) -> None:
    async with akter_test([Ender]) as t:
        ender = t.get(Ender, "e1")
        job_id = await ender.long()
        reader = asyncio.create_task(read(ender, job_id))
        stored = "SELECT 1 FROM {schema}.job_streams WHERE job_id = %(j)s"
        await until(lambda: t.rows(stored, {"j": job_id}))
        await ender.stop()
        items = await asyncio.wait_for(reader, 20)
        assert shape(items) == [{"attempt": 1}, "started", "cancelled"]
        assert CODES == ["chunk_not_json"]


async def test_a_synchronous_executor_streams_from_its_thread(akter_test: Make) -> None:
    async with akter_test([Ender]) as t:
        ender = t.get(Ender, "e1")
        job_id = await ender.threaded()
        items = await asyncio.wait_for(read(ender, job_id), 20)
        assert shape(items) == [{"attempt": 1}, 0, 1, 2, "succeeded"]
        assert THREADS and THREADS[0] != threading.get_ident()


async def test_a_caller_the_policy_refuses_reads_nothing(akter_test: Make) -> None:
    async with akter_test([Ender]) as t:
        ender = t.get(Ender, "e1")
        job_id = await ender.threaded()
        await t.drain()
        with akter.as_caller(akter.User("mallory")), pytest.raises(akter.ActorError) as refused:
            await anext(aiter(ender.job_stream(job_id)))
        assert refused.value.reason == "Unauthorized"
        assert len(await read(ender, job_id)) == 5


async def test_an_append_retried_after_it_committed_writes_nothing_twice(akter_test: Make) -> None:
    async with akter_test([Ender], relay=False) as t:
        ender = t.get(Ender, "e1")
        job_id = await ender.long()
        assert await t.runtime._jobs.run_pass() == 1  # attempt 1 runs, held at the gate
        stored = "SELECT seq, attempt, item, data FROM {schema}.job_streams WHERE job_id = %(j)s"
        await until(lambda: t.rows(stored, {"j": job_id}), holds=lambda rows: len(rows) == 2)
        ref = ender.ref
        key = StreamKey(t.runtime.routing_key(ref), ref.tenant, ref.type, ref.id, job_id)
        gateway = StreamsGateway(t.runtime._store, t.runtime._clock)
        batch: list[tuple[ItemKind, str | None]] = [("chunk", '"a"'), ("chunk", '"b"')]
        first = await gateway.append(key, 1, batch, expect=2)
        assert (first.held, first.last_seq, first.written) == (True, 2, 2)
        again = await gateway.append(key, 1, batch, expect=2)  # its answer was "lost"
        assert (again.held, again.last_seq, again.written) == (True, 4, 0)
        first_try = await gateway.append(key, 1, [("attempt", None)], expect=None)
        assert (first_try.marked, first_try.written) == (True, 0)  # the marker is there
        stale = await gateway.append(key, 7, [("attempt", None), ("chunk", '"z"')], expect=None)
        assert (stale.held, stale.written) == (False, 0)
        rows = await t.rows(stored + " ORDER BY seq", {"j": job_id})
        assert [(r["seq"], r["item"], r["data"]) for r in rows] == [
            (1, "attempt", None), (2, "chunk", '"started"'), (3, "chunk", '"a"'),
            (4, "chunk", '"b"'),
        ]  # fmt: skip
        GATE.set()
        await t.wait_idle()
