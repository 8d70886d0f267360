"""Job output streams (docs/guides/job-streams.md): order, resume, bounds, retries and the close.

Each test reads the stored items through the in-process reader (``handle.job_stream``) and checks
the rows of ``job_streams`` too. Ordering comes from gates and the harness's passes, never sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, Field

import akter
from akter.job_streams import (
    MAX_CHUNK_BYTES,
    AttemptStarted,
    Chunk,
    Closed,
    JobStreamError,
    StreamItem,
)
from akter.testing import ActorTest
from tests._support import policy_override, until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

GATE = asyncio.Event()
#: What the executors saw: refusals by code, per test.
SEEN: list[str] = []


class Ask(BaseModel):
    words: list[str] = Field(default_factory=list)
    fail_first: bool = False
    oversize: bool = False


class Log(BaseModel):
    routes: list[str] = Field(default_factory=list)


class Writer(akter.Actor[Log], access=akter.public):
    @akter.command
    async def ask(self, words: list[str], fail_first: bool = False, oversize: bool = False) -> str:
        return self.enqueue(
            Writer.answer, Ask(words=words, fail_first=fail_first, oversize=oversize)
        )

    @akter.query
    async def routes(self) -> list[str]:
        return self.state.routes

    @akter.job(attempts=2, timeout=20, backoff=(0.001, 0.001))
    async def answer(call: akter.JobCall, ask: Ask) -> int:
        if ask.oversize:
            try:
                call.stream("x" * MAX_CHUNK_BYTES)
            except JobStreamError as exc:
                SEEN.append(exc.code)
            call.stream({"ok": True})
            return 0
        for word in ask.words:
            call.stream(word)
        if ask.fail_first and call.attempt == 1:
            raise RuntimeError("the model went away")
        await GATE.wait()
        return len(ask.words)

    @akter.job(attempts=3, timeout=20)
    async def haunted(call: akter.JobCall, ask: Ask) -> int:
        call.stream(f"attempt {call.attempt}")
        ENTERED[call.attempt].set()
        await RELEASE[call.attempt].wait()
        try:
            call.stream("late")  # after a takeover or a settle: this chunk must not land
        except JobStreamError as exc:
            SEEN.append(exc.code)
        if call.attempt == 1 and ask.fail_first:
            raise RuntimeError("the stale attempt fails")
        return call.attempt

    @akter.command
    async def haunt(self, stale_wins: bool = False) -> str:
        return self.enqueue(Writer.haunted, Ask(fail_first=not stale_wins))

    @answer.on_success
    async def answered(self, n: int) -> None:
        self.state.routes.append(f"success {n}")

    @answer.on_dead_letter
    async def lost(self, letter: akter.DeadLetter[Ask]) -> None:
        self.state.routes.append("dead_letter")


ENTERED: dict[int, asyncio.Event] = {}
RELEASE: dict[int, asyncio.Event] = {}


@pytest.fixture(autouse=True)
def gate() -> None:
    global GATE
    GATE = asyncio.Event()
    SEEN.clear()
    for n in (1, 2, 3):
        ENTERED[n], RELEASE[n] = asyncio.Event(), asyncio.Event()


async def read_all(stream: Any) -> list[StreamItem]:
    return [item async for item in stream]


def shape(items: list[StreamItem]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        match item:
            case AttemptStarted(_, attempt):
                out.append({"attempt": attempt})
            case Chunk(_, attempt, data):
                out.append((attempt, data))
            case Closed(_, outcome):
                out.append(outcome)
    return out


async def test_chunks_in_order_then_the_outcome(akter_test: Make) -> None:
    async with akter_test([Writer]) as t:
        writer = t.get(Writer, "w1")
        job_id = await writer.ask(["Hello", ", ", "world"])
        GATE.set()
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert shape(items) == [{"attempt": 1}, (1, "Hello"), (1, ", "), (1, "world"), "succeeded"]
        assert [item.seq for item in items] == [1, 2, 3, 4, 5]
        rows = await t.rows(
            "SELECT seq, attempt, item, data FROM {schema}.job_streams WHERE job_id = %(j)s "
            "ORDER BY seq",
            {"j": job_id},
        )
        assert [(r["item"], r["data"]) for r in rows] == [
            ("attempt", None),
            ("chunk", '"Hello"'),
            ("chunk", '", "'),
            ("chunk", '"world"'),
            ("closed", "succeeded"),
        ]
        await until(writer.routes, holds=lambda routes: routes == ["success 3"])


async def test_a_reader_resumes_after_its_cursor_missing_and_repeating_nothing(
    akter_test: Make,
) -> None:
    async with akter_test([Writer]) as t:
        writer = t.get(Writer, "w1")
        job_id = await writer.ask(["a", "b", "c", "d"])
        first = writer.job_stream(job_id)
        seen: list[StreamItem] = []
        async for item in first:
            seen.append(item)
            if len(seen) == 3:  # the marker, "a", "b": then the connection drops
                break
        await first.aclose()
        GATE.set()
        rest = await asyncio.wait_for(read_all(writer.job_stream(job_id, after=seen[-1].seq)), 20)
        assert shape(seen + rest) == [
            {"attempt": 1}, (1, "a"), (1, "b"), (1, "c"), (1, "d"), "succeeded"
        ]  # fmt: skip
        assert [i.seq for i in seen + rest] == list(range(1, 7))


async def test_a_retried_attempt_opens_a_new_segment(akter_test: Make) -> None:
    async with akter_test([Writer]) as t:
        writer = t.get(Writer, "w1")
        job_id = await writer.ask(["x", "y"], fail_first=True)
        GATE.set()
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert shape(items) == [
            {"attempt": 1}, (1, "x"), (1, "y"),
            {"attempt": 2}, (2, "x"), (2, "y"),
            "succeeded",
        ]  # fmt: skip


async def test_an_oversize_chunk_is_refused_by_name_and_nothing_of_it_stored(
    akter_test: Make,
) -> None:
    async with akter_test([Writer]) as t:
        writer = t.get(Writer, "w1")
        job_id = await writer.ask([], oversize=True)
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert SEEN == ["chunk_too_large"]
        assert shape(items) == [{"attempt": 1}, (1, {"ok": True}), "succeeded"]


async def test_a_late_reader_gets_the_whole_stream_and_the_outcome(akter_test: Make) -> None:
    async with akter_test([Writer]) as t:
        writer = t.get(Writer, "w1")
        job_id = await writer.ask(["late", "reader"])
        GATE.set()
        await until(writer.routes, holds=lambda routes: routes == ["success 2"])
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert shape(items) == [{"attempt": 1}, (1, "late"), (1, "reader"), "succeeded"]


async def test_a_superseded_attempts_chunks_never_land(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Writer], relay=False) as t:
        await t.add_runtime()
        writer = t.get(Writer, "w1")
        job_id = await writer.haunt()
        assert await t.runtimes[0]._jobs.run_pass() == 1
        await asyncio.wait_for(ENTERED[1].wait(), 10)
        stored = "SELECT attempt, item, data FROM {schema}.job_streams WHERE job_id = %(j)s"
        await until(lambda: t.rows(stored, {"j": job_id}), holds=lambda rows: len(rows) == 2)
        # Runner 1's clock is past runner 0's lease: it takes the row over (attempt 2) while
        # attempt 1 still runs on runner 0, which has not noticed yet.
        t.runtimes[1]._clock.offset_ms += t.runtime.config.job_lease_ms + 1000
        assert await t.runtimes[1]._jobs.run_pass() == 1
        await asyncio.wait_for(ENTERED[2].wait(), 10)
        with caplog.at_level(logging.WARNING, logger="akter.jobs.streams"):
            RELEASE[1].set()
            await t.wait_idle()
        assert any("Job stream chunks refused" in r.getMessage() for r in caplog.records)
        RELEASE[2].set()
        await t.wait_idle(runner=1)
        rows = await t.rows(stored + " ORDER BY seq", {"j": job_id})
        assert [(r["attempt"], r["item"], r["data"]) for r in rows] == [
            (1, "attempt", None),
            (1, "chunk", '"attempt 1"'),
            (2, "attempt", None),
            (2, "chunk", '"attempt 2"'),
            (2, "chunk", '"late"'),  # attempt 2 still owns the row: its chunk lands
            (2, "closed", "succeeded"),
        ]
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert shape(items) == [
            {"attempt": 1}, (1, "attempt 1"), {"attempt": 2}, (2, "attempt 2"), (2, "late"),
            "succeeded",
        ]  # fmt: skip
        assert SEEN == []  # attempt 1's "late" was buffered; its flush was refused, not the call


async def test_retention_deletes_a_whole_stream_after_keep_streams(akter_test: Make) -> None:
    with policy_override(Writer, akter.Policy(keep_streams=60)):
        async with akter_test([Writer]) as t:
            writer = t.get(Writer, "w1")
            old = await writer.ask(["old"])
            GATE.set()
            await asyncio.wait_for(read_all(writer.job_stream(old)), 20)
            await t.advance(61)
            GATE.clear()
            new = await writer.ask(["new"])
            await until(
                lambda: t.rows(
                    "SELECT 1 FROM {schema}.job_streams WHERE job_id = %(j)s", {"j": new}
                )
            )
            counts = await t.runtime.cleanup()
            assert counts.streams == 1
            left = await t.rows("SELECT DISTINCT job_id FROM {schema}.job_streams")
            assert [r["job_id"] for r in left] == [new]
            with pytest.raises(akter.ActorError) as gap:
                await anext(aiter(writer.job_stream(old, after=2)))
            assert gap.value.reason == "RetentionGap"
            GATE.set()


async def test_a_stale_success_closes_the_stream_naming_its_attempt(akter_test: Make) -> None:
    async with akter_test([Writer], relay=False) as t:
        await t.add_runtime()
        writer = t.get(Writer, "w1")
        job_id = await writer.haunt(stale_wins=True)
        assert await t.runtimes[0]._jobs.run_pass() == 1
        await asyncio.wait_for(ENTERED[1].wait(), 10)
        stored = "SELECT attempt, item, data FROM {schema}.job_streams WHERE job_id = %(j)s"
        await until(lambda: t.rows(stored, {"j": job_id}), holds=lambda rows: len(rows) == 2)
        t.runtimes[1]._clock.offset_ms += t.runtime.config.job_lease_ms + 1000
        assert await t.runtimes[1]._jobs.run_pass() == 1
        await asyncio.wait_for(ENTERED[2].wait(), 10)
        await until(lambda: t.rows(stored, {"j": job_id}), holds=lambda rows: len(rows) == 4)
        RELEASE[1].set()  # attempt 1's success wins (the first success of any attempt)
        await t.wait_idle()
        RELEASE[2].set()
        await t.wait_idle(runner=1)
        items = await asyncio.wait_for(read_all(writer.job_stream(job_id)), 20)
        assert shape(items) == [
            {"attempt": 1}, (1, "attempt 1"), {"attempt": 2}, (2, "attempt 2"), "succeeded"
        ]  # fmt: skip
        closed = items[-1]
        assert isinstance(closed, Closed) and closed.attempt == 1
        rows = await t.rows(stored, {"j": job_id})
        assert not [r for r in rows if r["data"] == '"late"']
