"""The backlog gate's rules (``akter._engine.loop.backlog``), without a database.

The count is a stub that returns what the test set; the clock is the test's own, so growth
projection and the sample interval are exact. The gate's statement and its hook in the dispatcher
run against PostgreSQL in ``tests/integration/test_backlog.py``.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from akter._engine.loop.backlog import SAMPLE_EVERY_S, BacklogGate
from akter.errors import ActorError


class Stub:
    """A backlog count and a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.due = 0
        self.now = 100.0
        self.limits: list[int] = []
        self.fail = False
        self.failed = asyncio.Event()

    async def count(self, limit: int) -> int:
        self.limits.append(limit)
        if self.fail:
            self.failed.set()
            raise psycopg.OperationalError("connection lost")
        return min(self.due, limit)

    def clock(self) -> float:
        return self.now


async def sample(gate: BacklogGate, stub: Stub) -> None:
    """One saturated pass, then wait for its count."""
    taken = gate.samples
    gate.observe(True)
    await gate.wait_for(taken + 1)


async def test_refuses_at_the_bound_with_retry_after_and_reopens_without_a_count() -> None:
    stub = Stub()
    gate = BacklogGate(lambda: 100, stub.count, stub.clock)
    stub.due = 99
    await sample(gate, stub)
    stub.now += 10  # a long gap: growth per interval is small
    await sample(gate, stub)
    assert gate.backlog == 99 and not gate.refusing
    gate.admit("c-1")  # admitted

    stub.due = 150
    stub.now += 10
    await sample(gate, stub)
    assert stub.limits[-1] == 101  # bounded: never counts past the bound
    assert gate.backlog == 101 and gate.refusing
    with pytest.raises(ActorError) as caught:
        gate.admit("c-2")
    error = caught.value
    assert error.reason == "RunnerAtCapacity" and error.retryable
    assert error.retry_after is not None and error.retry_after > 0
    assert error.command_id == "c-2" and "max_outbox_backlog=100" in error.message

    counts = len(stub.limits)
    gate.observe(False)  # a claim that took fewer rows than it asked for: below one lane
    assert gate.backlog == 0 and not gate.refusing
    assert len(stub.limits) == counts  # no statement for that


async def test_growth_projected_over_one_interval_refuses_before_the_bound() -> None:
    stub = Stub()
    gate = BacklogGate(lambda: 1000, stub.count, stub.clock)
    stub.due = 500
    await sample(gate, stub)
    stub.now += 100
    await sample(gate, stub)  # steady: no growth
    assert not gate.refusing
    stub.due, stub.now = 700, stub.now + SAMPLE_EVERY_S
    await sample(gate, stub)  # +200 in one interval: 700 + 200 < 1000
    assert not gate.refusing
    stub.due, stub.now = 900, stub.now + SAMPLE_EVERY_S
    await sample(gate, stub)  # +200 again: 900 + 200 would pass the bound in the next interval
    assert gate.backlog == 900 and gate.refusing


async def test_counts_at_most_once_per_interval_and_never_without_a_bound() -> None:
    stub = Stub()
    gate = BacklogGate(lambda: 10, stub.count, stub.clock)
    stub.due = 3
    await sample(gate, stub)
    gate.observe(True)  # same instant: no second count
    gate.observe(True)
    assert len(stub.limits) == 1
    stub.now += SAMPLE_EVERY_S
    await sample(gate, stub)
    assert len(stub.limits) == 2

    off = Stub()
    unbounded = BacklogGate(lambda: None, off.count, off.clock)
    unbounded.observe(True)
    assert off.limits == [] and not unbounded.refusing
    unbounded.admit("c-3")


async def test_a_failed_count_keeps_the_last_sample() -> None:
    stub = Stub()
    gate = BacklogGate(lambda: 10, stub.count, stub.clock)
    stub.due = 20
    await sample(gate, stub)
    assert gate.refusing
    stub.fail, stub.now = True, stub.now + SAMPLE_EVERY_S
    gate.observe(True)
    await stub.failed.wait()  # the count raised in the same step: the gate has handled it
    await gate.stop()
    assert len(stub.limits) == 2 and gate.samples == 1
    assert gate.backlog == 11 and gate.refusing
