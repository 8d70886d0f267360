"""The lean watch's rules (``akter._engine.loop.vacuum``), without a database.

The gateway is a stub that returns the counts the test set and records vacuums; the clock is the
test's own. The statements run against PostgreSQL in ``tests/integration/test_lean_outbox.py``.
"""

from __future__ import annotations

import logging

import psycopg
import pytest

from akter._engine.loop.vacuum import (
    CHECK_EVERY_S,
    DEAD_SHARE,
    HELD_RETRY_MAX_S,
    HELD_RETRY_S,
    MIN_DEAD,
    VacuumWatch,
    due,
)
from akter._store.gateway.vacuum import Tuples


class Stub:
    """The outbox's counts, its vacuum and a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.counts = [Tuples(0, 0)]
        self.vacuumed = 0
        self.applies = True
        self.fail: Exception | None = None
        self.now = 50.0

    async def tuples(self) -> Tuples:
        if self.fail is not None:
            raise self.fail
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]

    async def vacuum(self) -> None:
        self.vacuumed += 1

    def clock(self) -> float:
        return self.now


def test_the_bound_is_a_floor_plus_a_share_of_the_live_rows() -> None:
    assert not due(Tuples(live=0, dead=MIN_DEAD - 1))
    assert due(Tuples(live=0, dead=MIN_DEAD))
    live = 100_000
    bound = MIN_DEAD + DEAD_SHARE * live
    assert not due(Tuples(live=live, dead=int(bound) - 1))
    assert due(Tuples(live=live, dead=int(bound)))


async def test_checks_at_most_every_interval_and_vacuums_only_past_the_bound() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S  # the first look comes one interval after the start
    stub.counts = [Tuples(10, MIN_DEAD // 2)]
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 0
    stub.counts = [Tuples(0, MIN_DEAD), Tuples(10, 3)]
    watch.observe()  # within the interval: no check
    assert not watch.checking
    stub.now += CHECK_EVERY_S
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 1 and watch.vacuums == 1
    stub.counts = [Tuples(0, MIN_DEAD), Tuples(10, 0)]
    stub.now += CHECK_EVERY_S
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 2  # it removed them: the next interval is the ordinary one


async def test_a_vacuum_that_removed_little_waits_for_the_snapshot() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S  # the first look comes one interval after the start
    stub.counts = [Tuples(0, 4 * MIN_DEAD), Tuples(0, 4 * MIN_DEAD)]
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 1
    stub.now += HELD_RETRY_S - 0.01
    watch.observe()
    assert not watch.checking
    stub.counts = [Tuples(0, 4 * MIN_DEAD), Tuples(10, 0)]
    stub.now += 0.02
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 2


async def test_citus_is_left_to_the_shards_autovacuum() -> None:
    stub = Stub()
    stub.applies = False
    stub.counts = [Tuples(0, 10 * MIN_DEAD)]
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S  # the first look comes one interval after the start
    watch.observe()
    assert not watch.checking and stub.vacuumed == 0


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (psycopg.OperationalError("connection lost"), logging.INFO),
        (psycopg.errors.InsufficientPrivilege("must be owner"), logging.WARNING),
    ],
)
async def test_a_failed_check_is_logged_and_tried_again_later(
    error: Exception, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    stub = Stub()
    stub.fail = error
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S  # the first look comes one interval after the start
    with caplog.at_level(logging.INFO, logger="akter.relay"):
        watch.observe()
        await watch.settled()
    assert [r.levelno for r in caplog.records] == [level]
    stub.fail = None
    stub.counts = [Tuples(0, MIN_DEAD), Tuples(0, 0)]
    stub.now += CHECK_EVERY_S
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 1
    await watch.stop()


async def next_check(watch: VacuumWatch, stub: Stub) -> float:
    """Move the clock in quarter seconds until the watch looks again; how long that took."""
    start = stub.now
    while True:
        stub.now += 0.25
        watch.observe()
        if watch.checking:
            await watch.settled()
            return stub.now - start


async def test_the_wait_for_a_held_snapshot_doubles_up_to_its_bound_and_resets() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S  # the first look comes one interval after the start
    held = Tuples(0, 4 * MIN_DEAD)
    stub.counts = [held]  # every vacuum leaves them all
    watch.observe()
    await watch.settled()
    waits = [await next_check(watch, stub) for _ in range(4)]
    assert waits == [HELD_RETRY_S, 2 * HELD_RETRY_S, HELD_RETRY_MAX_S, HELD_RETRY_MAX_S]
    assert stub.vacuumed == 5
    stub.counts = [held, Tuples(0, 0)]  # released: the next vacuum removes them
    await next_check(watch, stub)
    assert stub.vacuumed == 6
    stub.counts = [held]  # held again: the back-off starts over
    assert await next_check(watch, stub) == CHECK_EVERY_S
    assert await next_check(watch, stub) == HELD_RETRY_S


async def test_the_first_look_waits_one_interval_after_the_start() -> None:
    stub = Stub()
    stub.counts = [Tuples(0, MIN_DEAD), Tuples(0, 0)]
    watch = VacuumWatch(stub, stub.clock)
    watch.observe()  # the first pass, at once: a runner just started looks later
    assert not watch.checking
    stub.now += CHECK_EVERY_S
    watch.observe()
    await watch.settled()
    assert stub.vacuumed == 1
