"""Synchronous executors keep their slot until their thread returns (issue 38, finding 10).

A plain ``def`` executor runs in a thread that nothing can stop: not its timeout, not a
cancellation, not a lost lease. Before the fix, a timed-out sync attempt was settled at once and
its slot given back while its thread still ran: with ``concurrency=2`` five calls ran at once,
``per_actor=1`` let a second call of the actor start beside it, and the job's next attempt
overlapped the first. Now the attempt keeps its row running, renewing the lease, until the thread
returns; only then is its (timed-out, ambiguous) outcome settled. Each test counts the threads
inside the executor itself and blocks them on :class:`threading.Event` barriers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest
from pydantic import BaseModel

import akter
import akter.jobs
from akter.testing import ActorTest
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: The warning an attempt logs when its thread outlives it.
HELD = "its synchronous executor is still running"


class Inside:
    """The executor threads inside a call now, the most seen at once, and every entry."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.entries: list[str] = []
        self.exits: list[str] = []
        self.gate = threading.Event()

    def enter(self, tag: str) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.entries.append(tag)

    def leave(self, tag: str) -> None:
        with self.lock:
            self.now -= 1
            self.exits.append(tag)


INSIDE = Inside()


class Item(BaseModel):
    tag: str


class Tally(BaseModel):
    done: list[str] = []
    cancelled: list[str] = []


def _blocked(call: akter.JobCall, item: Item) -> str:
    tag = f"{item.tag}#{call.attempt}"
    INSIDE.enter(tag)
    try:
        INSIDE.gate.wait(30)  # far past the 200 ms timeout, until the test opens the gate
    finally:
        INSIDE.leave(tag)
    return tag


class Provider(akter.Actor[Tally], access=akter.public):
    """Sync executors, as a blocking provider client would be called."""

    @akter.command
    async def fill(self, job: str, n: int) -> list[str]:
        target = {"capped": Provider.capped, "retried": Provider.retried, "paired": Provider.paired}
        return [self.enqueue(target[job], Item(tag=f"{self.ref.id}-{i}")) for i in range(n)]

    @akter.command
    async def start_slow(self) -> str:
        return self.enqueue(Provider.slow, Item(tag=self.ref.id), key="slow")

    @akter.command
    async def stop_slow(self) -> None:
        self.cancel_job("slow")

    @akter.job(attempts=1, timeout=30)
    def slow(call: akter.JobCall, item: Item) -> str:
        return _blocked(call, item)

    @slow.on_cancelled
    async def slow_cancelled(self, report: akter.jobs.Cancelled[Item, str]) -> None:
        self.state.cancelled.append(type(report.outcome).__name__)

    @akter.query
    async def cancelled(self) -> list[str]:
        return self.state.cancelled

    @akter.job(attempts=1, timeout=0.2, concurrency=2)
    def capped(call: akter.JobCall, item: Item) -> str:
        return _blocked(call, item)

    @akter.job(attempts=2, timeout=0.2, backoff=(0.01, 0.01))
    def retried(call: akter.JobCall, item: Item) -> str:
        return _blocked(call, item)

    @akter.job(attempts=1, timeout=0.2, per_actor=1)
    def paired(call: akter.JobCall, item: Item) -> str:
        return _blocked(call, item)

    @capped.on_success
    async def capped_done(self, tag: str) -> None:
        self.state.done.append(tag)

    @retried.on_success
    async def retried_done(self, tag: str) -> None:
        self.state.done.append(tag)

    @paired.on_success
    async def paired_done(self, tag: str) -> None:
        self.state.done.append(tag)

    @akter.query
    async def done(self) -> list[str]:
        return self.state.done


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    global INSIDE
    INSIDE = Inside()
    yield
    INSIDE.gate.set()


async def held(t: ActorTest, caplog: pytest.LogCaptureFixture, n: int) -> None:
    """Pass on every runner until ``n`` attempts timed out holding their thread, or more ran."""

    async def check() -> bool:
        await passes(t)
        return sum(HELD in m for m in caplog.messages) >= n or INSIDE.most > n

    await until(check, what=f"{n} timed-out attempts holding their thread")


async def passes(t: ActorTest) -> int:
    """A pass on every runner; how many rows they claimed."""
    claimed = 0
    for rt in t.runtimes:
        claimed += await rt._jobs.run_pass()
    return claimed


async def test_sync_executor_holds_its_slot_until_the_thread_returns(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.jobs")
    async with akter_test([Provider], relay=False, runners=2) as t:
        await t.get(Provider, "p1").fill("capped", 5)
        await passes(t)
        await until(lambda: INSIDE.now == 2, what="two sync calls inside")
        await held(t, caplog, 2)
        # Both attempts timed out; their threads are still inside: no runner may start another.
        assert await passes(t) == 0
        assert INSIDE.most == 2 and len(INSIDE.entries) == 2
        running = await t.rows(
            "SELECT count(*) AS n FROM {schema}.outbox WHERE kind = 'job' AND running"
        )
        assert running == [{"n": 2}]
        INSIDE.gate.set()  # the threads return; their slots come back, the rest run
        await until(lambda: len(INSIDE.exits) == 2, what="the held threads returned")
        for _ in range(20):
            await passes(t)
            for runner in range(len(t.runtimes)):
                await t.wait_idle(runner)
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        await t.drain()
        assert INSIDE.most == 2
        assert len(INSIDE.entries) == 5
        letters = await t.rows("SELECT cause, ambiguous FROM {schema}.dead_letters")
        # The timed-out calls: their thread's late return is discarded, the outcome ambiguous.
        assert letters == [{"cause": "Executor timed out after 200 ms", "ambiguous": True}] * 2
        assert len(await t.get(Provider, "p1").done()) == 3


async def test_sync_executor_next_attempt_waits_for_the_thread(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.jobs")
    async with akter_test([Provider], relay=False, runners=2) as t:
        await t.get(Provider, "r1").fill("retried", 1)
        await passes(t)
        await until(lambda: INSIDE.now == 1, what="the first attempt inside")
        await held(t, caplog, 1)
        assert await passes(t) == 0  # attempt 2 waits: attempt 1's thread is still inside
        rows = await t.rows("SELECT attempts, running FROM {schema}.outbox WHERE kind = 'job'")
        assert rows == [{"attempts": 1, "running": True}]
        assert INSIDE.entries == ["r1-0#1"]
        INSIDE.gate.set()
        await until(lambda: INSIDE.exits == ["r1-0#1"], what="attempt 1's thread returned")
        for _ in range(20):
            await passes(t)
            for runner in range(len(t.runtimes)):
                await t.wait_idle(runner)
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        await t.drain()
        assert INSIDE.most == 1
        assert INSIDE.entries == ["r1-0#1", "r1-0#2"]
        assert INSIDE.exits == ["r1-0#1", "r1-0#2"]
        assert await t.get(Provider, "r1").done() == ["r1-0#2"]


async def test_per_actor_cap_counts_a_running_sync_thread(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.jobs")
    async with akter_test([Provider], relay=False, runners=2) as t:
        await t.get(Provider, "a1").fill("paired", 3)
        await passes(t)
        await until(lambda: INSIDE.now == 1, what="the actor's first call inside")
        await held(t, caplog, 1)
        # The actor's other rows wait for the wake of the first one's settle, which waits for
        # its thread: no runner starts them.
        assert await passes(t) == 0
        rows = await t.rows("SELECT running FROM {schema}.outbox WHERE kind = 'job'")
        assert sorted(r["running"] for r in rows) == [False, False, True]
        assert INSIDE.most == 1 and INSIDE.entries == ["a1-0#1"]
        INSIDE.gate.set()
        await until(lambda: len(INSIDE.exits) == 1, what="the held thread returned")
        for _ in range(30):
            await passes(t)
            for runner in range(len(t.runtimes)):
                await t.wait_idle(runner)
            await t.advance(0.5)
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        assert INSIDE.most == 1
        assert INSIDE.entries == ["a1-0#1", "a1-1#1", "a1-2#1"]
        assert await t.get(Provider, "a1").done() == ["a1-1#1", "a1-2#1"]


async def test_a_cancelled_sync_attempt_settles_once_its_thread_returns(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.jobs")
    async with akter_test([Provider], relay=False) as t:
        order = t.get(Provider, "c1")
        await order.start_slow()
        await passes(t)
        await until(lambda: INSIDE.now == 1, what="the call inside")
        await order.stop_slow()  # interrupts the attempt at once; the thread runs on
        await until(lambda: any(HELD in m for m in caplog.messages), what="the held thread")
        rows = await t.rows(
            "SELECT running, cancelled_at_ms IS NOT NULL AS cancelled FROM {schema}.outbox"
            " WHERE kind = 'job'"
        )
        assert rows == [{"running": True, "cancelled": True}]  # its slot is still taken
        assert await order.cancelled() == []
        INSIDE.gate.set()
        await until(lambda: INSIDE.exits == ["c1#1"], what="the thread returned")
        for runner in range(len(t.runtimes)):
            await t.wait_idle(runner)
        await t.drain()
        # Reported once, as Unknown: what the thread returned after the interruption is dropped.
        assert await order.cancelled() == ["Unknown"]
        assert await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'") == []
