"""The lean watch's rules (``akter._engine.loop.vacuum``), without a database.

The gateway is a stub that returns the counts and the horizon the test set and records vacuums;
the clock is the test's own. The statements run against PostgreSQL in
``tests/integration/test_lean_outbox.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import psycopg
import pytest

from akter._engine.loop.vacuum import (
    AFTER_HOLD_MIN_DEAD,
    CHECK_EVERY_S,
    DEAD_SHARE,
    HELD_RETRY_MAX_S,
    HELD_RETRY_S,
    MIN_DEAD,
    Held,
    VacuumWatch,
    due,
    due_tables,
    futile,
    held_after,
    retry,
)
from akter._store.gateway.vacuum import Table, Tuples

EMPTY = Tuples(0, 0)
HELD = Tuples(0, 4 * MIN_DEAD)


class Stub:
    """The tables' counts, the horizon, the vacuums and a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.counts: list[dict[Table, Tuples]] = [{"outbox": EMPTY, "actors": EMPTY}]
        self.horizon_now: str | None = None
        #: When set: a new horizon at every look (a busy database's short transactions).
        self.moving: Iterator[int] | None = None
        self.horizons = 0
        self.vacuumed: list[list[Table]] = []
        self.warnings: list[str] = []
        self.applies = True
        self.fail: Exception | None = None
        self.now = 50.0

    def set(self, *counts: Tuples, actors: Tuples = EMPTY) -> None:
        """The outbox's counts at the next reads (the last one stays), the actors' fixed."""
        self.counts = [{"outbox": c, "actors": actors} for c in counts]

    async def tuples(self) -> dict[Table, Tuples]:
        if self.fail is not None:
            raise self.fail
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]

    async def horizon(self) -> str | None:
        self.horizons += 1
        return self.horizon_now if self.moving is None else str(next(self.moving))

    async def vacuum(self, tables: Sequence[Table]) -> list[str]:
        self.vacuumed.append(list(tables))
        return list(self.warnings)

    def clock(self) -> float:
        return self.now


async def look(watch: VacuumWatch, stub: Stub, seconds: float = CHECK_EVERY_S) -> None:
    """Move the clock and let a pass call the watch."""
    stub.now += seconds
    watch.observe()
    await watch.settled()


def test_the_bound_is_a_floor_plus_a_share_of_the_live_rows() -> None:
    assert not due(Tuples(live=0, dead=MIN_DEAD - 1))
    assert due(Tuples(live=0, dead=MIN_DEAD))
    live = 100_000
    bound = MIN_DEAD + DEAD_SHARE * live
    assert not due(Tuples(live=live, dead=int(bound) - 1))
    assert due(Tuples(live=live, dead=int(bound)))


def test_each_table_has_its_own_bound() -> None:
    few, many = Tuples(100_000, MIN_DEAD), Tuples(0, MIN_DEAD)
    assert due_tables({"outbox": few, "actors": many}) == ["actors"]
    assert due_tables({"outbox": many, "actors": many}) == ["outbox", "actors"]
    assert due_tables({"outbox": few, "actors": few}) == []


async def test_checks_at_most_every_interval_and_vacuums_only_the_due_tables() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.set(Tuples(10, MIN_DEAD // 2))
    await look(watch, stub)  # the first look comes one interval after the start
    assert stub.vacuumed == []
    stub.set(Tuples(0, MIN_DEAD), Tuples(10, 3))
    watch.observe()  # within the interval: no check
    assert not watch.checking
    await look(watch, stub)
    assert stub.vacuumed == [["outbox"]] and watch.vacuums == 1
    stub.set(Tuples(0, 0), actors=Tuples(500, MIN_DEAD + 50))
    stub.counts.append({"outbox": EMPTY, "actors": Tuples(500, 10)})
    await look(watch, stub)
    assert stub.vacuumed[-1] == ["actors"]  # the actors alone: the outbox is clean
    stub.set(Tuples(0, MIN_DEAD), actors=Tuples(0, MIN_DEAD))
    stub.counts.append({"outbox": EMPTY, "actors": EMPTY})
    await look(watch, stub)
    assert stub.vacuumed[-1] == ["outbox", "actors"]  # both in one check
    assert stub.horizons == 0  # every vacuum worked: no look at the horizon


async def test_citus_is_left_to_the_shards_autovacuum() -> None:
    stub = Stub()
    stub.applies = False
    stub.set(Tuples(0, 10 * MIN_DEAD))
    watch = VacuumWatch(stub, stub.clock)
    stub.now += CHECK_EVERY_S
    watch.observe()
    assert not watch.checking and stub.vacuumed == []


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
    with caplog.at_level(logging.INFO, logger="akter.relay"):
        await look(watch, stub)
    assert [r.levelno for r in caplog.records] == [level]
    stub.fail = None
    stub.set(Tuples(0, MIN_DEAD), Tuples(0, 0))
    await look(watch, stub)
    assert stub.vacuumed == [["outbox"]]
    await watch.stop()


async def test_a_vacuum_the_server_skips_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    stub = Stub()
    stub.warnings = ['skipping "outbox" --- only table or database owner can vacuum it']
    stub.set(HELD)  # skipped: nothing removed
    watch = VacuumWatch(stub, stub.clock)
    with caplog.at_level(logging.WARNING, logger="akter.relay"):
        await look(watch, stub)
        await look(watch, stub, HELD_RETRY_S)
    assert len(stub.vacuumed) == 2  # retried as a futile vacuum, by the fallback
    assert [r.getMessage().endswith(stub.warnings[0]) for r in caplog.records] == [True]


async def next_vacuum(watch: VacuumWatch, stub: Stub) -> float:
    """Move the clock a check at a time until the watch vacuums again; how long that took."""
    start, vacuums = stub.now, watch.vacuums
    while watch.vacuums == vacuums:
        await look(watch, stub)
        assert stub.now - start <= 60, "no vacuum within a minute"
    return stub.now - start


async def test_the_fallback_for_an_unseen_holder_doubles_up_to_its_bound_and_resets() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.set(HELD)  # every vacuum leaves them all; no horizon the watch can see
    await look(watch, stub)
    waits = [await next_vacuum(watch, stub) for _ in range(4)]
    assert waits == [HELD_RETRY_S, 2 * HELD_RETRY_S, HELD_RETRY_MAX_S, HELD_RETRY_MAX_S]
    stub.set(HELD, EMPTY)  # released: the next vacuum removes them
    await next_vacuum(watch, stub)
    assert watch.held is None
    stub.set(HELD)  # held again: the fallback starts over
    assert await next_vacuum(watch, stub) == CHECK_EVERY_S
    assert await next_vacuum(watch, stub) == HELD_RETRY_S


async def test_a_seen_holder_released_is_followed_by_a_vacuum_at_the_next_check() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.horizon_now = "700"  # an idle transaction's snapshot
    stub.set(HELD)
    await look(watch, stub)  # futile: the watch notes the horizon
    assert watch.held is not None and watch.held.horizon == "700"
    await look(watch, stub)  # the same horizon again: a holder that stays; no vacuum
    assert len(stub.vacuumed) == 1 and watch.held.seen_again
    stub.horizon_now = "912"  # released: the oldest snapshot now is a newer one
    stub.set(HELD, EMPTY)
    await look(watch, stub)
    assert len(stub.vacuumed) == 2 and watch.held is None  # within the fallback's 2 s


async def test_the_vacuum_after_a_hold_takes_every_table_past_the_lower_floor() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.horizon_now = "700"
    some = Tuples(500, AFTER_HOLD_MIN_DEAD + 50 + 10)  # under MIN_DEAD: the steady rule skips it
    stub.set(HELD, actors=some)
    await look(watch, stub)
    assert stub.vacuumed == [["outbox"]]
    await look(watch, stub)
    stub.horizon_now = "912"
    stub.counts = [{"outbox": HELD, "actors": some}, {"outbox": EMPTY, "actors": EMPTY}]
    await look(watch, stub)
    assert stub.vacuumed[-1] == ["outbox", "actors"] and watch.held is None


def test_a_vacuum_is_futile_when_it_left_half_of_the_dead_it_ran_for() -> None:
    before: dict[Table, Tuples] = {"outbox": Tuples(0, 2000), "actors": Tuples(500, 200)}
    # The actors' count grew (turns reported their kills late), the outbox's fell: it worked.
    after: dict[Table, Tuples] = {"outbox": Tuples(0, 20), "actors": Tuples(500, 300)}
    assert not futile(before, after, ["outbox", "actors"])
    assert futile(before, after, ["actors"])
    assert futile(before, {"outbox": Tuples(0, 1900), "actors": EMPTY}, ["outbox", "actors"])


async def test_a_holder_seen_across_futile_fallbacks_is_followed_at_once() -> None:
    stub = Stub()
    watch = VacuumWatch(stub, stub.clock)
    stub.horizon_now = "700"
    stub.set(HELD)
    await look(watch, stub)
    await next_vacuum(watch, stub)  # the fallback, futile: the same horizon holds
    assert watch.held is not None and watch.held.seen_again
    stub.horizon_now = None  # released: no snapshot left in the database
    stub.set(HELD, EMPTY)
    assert await next_vacuum(watch, stub) == CHECK_EVERY_S  # released in the first second


async def test_a_horizon_that_moves_at_every_look_leaves_the_fallback_alone() -> None:
    stub = Stub()
    stub.set(HELD)  # a holder the watch cannot see, behind a busy database's transactions
    stub.moving = iter(range(1000, 2000))
    watch = VacuumWatch(stub, stub.clock)
    await look(watch, stub)
    waits = [await next_vacuum(watch, stub) for _ in range(4)]
    assert waits == [HELD_RETRY_S, 2 * HELD_RETRY_S, HELD_RETRY_MAX_S, HELD_RETRY_MAX_S]
    assert stub.horizons == sum(waits) + 5  # one look a second, one after each futile vacuum


def test_the_horizon_rules() -> None:
    held = held_after(None, "7", now=10.0)
    assert held == Held("7", seen_again=False, retry_at=10.0 + HELD_RETRY_S, wait=HELD_RETRY_S)
    assert retry(held, "9", 11.0) == (False, Held("9", False, held.retry_at, held.wait))
    again, seen = retry(held, "7", 11.0)
    assert not again and seen.seen_again
    assert retry(seen, "9", 11.5)[0] and retry(seen, None, 11.5)[0]
    assert retry(held, "9", held.retry_at)[0]  # the fallback, whatever the horizon
    nothing_seen = held_after(None, None, now=10.0)
    assert not retry(retry(nothing_seen, None, 11.0)[1], "5", 11.5)[0]  # a new snapshot
    later = held_after(seen, "7", now=12.0)
    assert later.seen_again and later.wait == 2 * HELD_RETRY_S
    assert held_after(later, "8", now=14.0).seen_again is False


async def test_the_first_look_waits_one_interval_after_the_start() -> None:
    stub = Stub()
    stub.set(Tuples(0, MIN_DEAD), Tuples(0, 0))
    watch = VacuumWatch(stub, stub.clock)
    watch.observe()  # the first pass, at once: a runner just started looks later
    assert not watch.checking
    await look(watch, stub)
    assert stub.vacuumed == [["outbox"]]
