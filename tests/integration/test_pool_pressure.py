"""Pool pressure (hardening finding 6): user turns holding every pooled connection.

A runner with ``pool_size=2`` holds two turns open in their handlers (on a gate the test
controls) while four more commands, a query and another type's command want a connection. The
callers must get ``ActorError`` ``ActorUnavailable`` (code ``pool_exhausted``, retryable, with
``retry_after``) within ``pool_wait`` / ``query_pool_wait``, never a driver exception; and the
framework's own work, on its own pool, must go on: the ``$maintenance`` lease keeps being
refreshed (a 1 s lease, so it would lapse within a second otherwise) and heartbeats keep landing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter._store.pool import Store
from akter.testing import ActorTest
from tests._support import until

MakeTest = Callable[..., ActorTest]

#: The gate the held turns wait on and the count of turns inside ``Held.hold`` (set per test).
GATE: dict[str, Any] = {}


class Count(BaseModel):
    """How many holds completed."""

    n: int = 0


class Held(akter.Actor[Count], execution_timeout=60.0):
    """A turn that keeps its pooled connection until the test opens the gate."""

    @akter.command
    async def hold(self) -> int:
        """Wait inside the turn for the gate, then count."""
        GATE["inside"] += 1
        if GATE["inside"] == GATE["want"]:
            GATE["full"].set()
        await GATE["open"].wait()
        self.state.n += 1
        return self.state.n

    @akter.query
    async def peek(self) -> int:
        """An unlocked read."""
        return self.state.n


class Other(akter.Actor[Count]):
    """Another actor type."""

    @akter.command
    async def ping(self) -> int:
        """Count one."""
        self.state.n += 1
        return self.state.n


POOL_WAIT = 0.3
QUERY_POOL_WAIT = 0.2
LEASE = 1.0  # refreshed every ~0.29 s; its loop would stop 0.86 s after a missed refresh
#: Scheduling slack on a loaded 2-core CI machine.
SLACK = 1.0


async def timed(call: Any) -> tuple[float, BaseException | None, Any]:
    started = time.monotonic()
    try:
        value = await call
    except Exception as exc:  # the test inspects whatever came back
        return time.monotonic() - started, exc, None
    return time.monotonic() - started, None, value


def assert_exhausted(outcome: tuple[float, BaseException | None, Any], bound: float) -> None:
    took, error, _ = outcome
    assert isinstance(error, akter.ActorError), repr(error)
    assert not isinstance(error, psycopg.Error)
    assert (error.reason, error.code, error.retryable) == (
        "ActorUnavailable",
        "pool_exhausted",
        True,
    )
    assert error.retry_after is not None and error.retry_after > 0
    assert bound - 0.05 <= took <= bound + SLACK, took


async def db_row(url: str, query: str, *params: Any) -> tuple[Any, ...]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        assert row is not None
        return row


async def test_h6_user_turns_holding_the_pool_starve_neither_callers_nor_the_framework(
    akter_test: MakeTest,
) -> None:
    GATE.update(inside=0, want=2, full=asyncio.Event(), open=asyncio.Event())
    async with akter_test([Held, Other], maintenance=False) as t:
        rt = akter.Runtime(
            [Held, Other],
            database_url=t.database_url,
            schema=t.schema,
            pool_size=2,
            pool_wait=POOL_WAIT,
            query_pool_wait=timedelta(seconds=QUERY_POOL_WAIT),
            singleton_lease=LEASE,
        )
        rt._runners.heartbeat_ms = 100
        await rt.start()
        t.runtimes.append(rt)
        runner = rt._runners.runner_id
        lease_sql = (
            f"SELECT owner::text, lease_until_ms FROM {t.schema}.singletons"
            " WHERE actor_type = '$maintenance'"
        )
        beat_sql = (
            f"SELECT heartbeat_at_ms, {t.schema}.now_ms(0) FROM {t.schema}.runners"
            " WHERE runner_id = %s"
        )

        async def owned() -> bool:
            return rt._runners.owns("$maintenance")

        await until(owned, within=10, what="this runner owning $maintenance", interval=0.05)
        lease = rt._runners._leases["$maintenance"]
        runs = lease.runs

        # Six commands, each wanting a turn: two get the pool's two connections and hold them.
        ids = [await rt.mint_command_id() for _ in range(6)]
        holds = [
            asyncio.create_task(timed(rt.get(Held, f"h{i}").with_command_id(ids[i]).hold()))
            for i in range(6)
        ]
        await asyncio.wait_for(GATE["full"].wait(), 10)
        _, held_from = await db_row(t.database_url, beat_sql, runner)
        try:
            # The four without a connection are refused once pool_wait has passed.
            done, _ = await asyncio.wait(holds, timeout=POOL_WAIT + SLACK + 5)
            refused = [task.result() for task in done]
            assert len(refused) == 4, refused
            for outcome in refused:
                assert_exhausted(outcome, POOL_WAIT)
            # So are a query and an event read (the query bound) and another type's command.
            assert_exhausted(await timed(rt.get(Held, "q").peek()), QUERY_POOL_WAIT)
            assert_exhausted(await timed(rt.read_events(rt.ref(Held, "q"))), QUERY_POOL_WAIT)
            assert_exhausted(await timed(rt.get(Other, "o").ping()), POOL_WAIT)

            # Meanwhile the framework's pool keeps the $maintenance lease and the heartbeats
            # going: refreshes carry the lease past three lease lengths from here.
            async def refreshed() -> bool:
                owner, until_ms = await db_row(t.database_url, lease_sql)
                return bool(owner == runner and until_ms > held_from + 3 * LEASE * 1000)

            async def beating() -> bool:
                beat_ms, _ = await db_row(t.database_url, beat_sql, runner)
                return bool(beat_ms > held_from + 2 * LEASE * 1000)

            await until(
                refreshed,
                within=3 * LEASE + 5,
                what="a $maintenance lease refresh",
                interval=0.05,
            )
            await until(beating, within=5, what="a new heartbeat", interval=0.05)
            assert rt._runners.owns("$maintenance")
            assert lease.runs == runs and [e for e, _ in lease.events].count("stopped") == 0
            assert GATE["inside"] == 2  # the refused commands never ran a handler
        finally:
            GATE["open"].set()
        results = await asyncio.gather(*holds)
        assert sorted(r[2] for r in results if r[1] is None) == [1, 1]
        # The refusals were honest: a retry with the same id runs once the pool is free.
        refused_ids = [ids[i] for i, r in enumerate(results) if r[1] is not None]
        assert len(refused_ids) == 4
        for i, result in enumerate(results):
            if result[1] is not None:
                assert await rt.get(Held, f"h{i}").with_command_id(ids[i]).hold() == 1
        assert await rt.get(Other, "o").ping() == 1
        assert await rt.get(Held, "h0").peek() == 1


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("framework_pool_size", 0, "framework_pool_size must be an integer from 1 to 100"),
        ("framework_pool_size", 101, "framework_pool_size must be an integer from 1 to 100"),
        ("framework_pool_size", True, "framework_pool_size must be an integer from 1 to 100"),
        ("pool_wait", 0, "pool_wait must be between 1 ms and 1 hour"),
        ("pool_wait", 3601, "pool_wait must be between 1 ms and 1 hour"),
        ("query_pool_wait", -1, "query_pool_wait"),
        ("query_pool_wait", "soon", "query_pool_wait"),
    ],
)
def test_h6_pool_options_are_validated(option: str, value: Any, message: str) -> None:
    with pytest.raises(akter.ConfigurationError, match=message):
        akter.Runtime([Held], **{option: value})


async def test_h6_a_cancelled_wait_for_a_pooled_connection_stays_cancelled(akter_db: str) -> None:
    """A cancellation arriving as a connection is handed over is delivered, not dropped.

    psycopg_pool waits with ``asyncio.wait_for``, which on Python 3.11 returns the connection and
    drops the cancellation then; a small framework pool makes that moment common, and a
    background loop that loses its cancellation keeps ``Runtime.stop()`` waiting forever.
    """
    store = Store(akter_db, "akter_pool_cancel", min_size=1, max_size=1, framework_size=1)
    store.url = akter_db
    await store.open()
    try:
        held = await store.pool.getconn()
        waiter = asyncio.create_task(store.pool.getconn(timeout=10))
        for _ in range(1000):  # loop steps until the waiter is queued for a connection
            if store.pool.get_stats().get("requests_waiting"):
                break
            await asyncio.sleep(0)
        assert store.pool.get_stats().get("requests_waiting") == 1
        await store.pool.putconn(held)  # handed to the waiter ...
        waiter.cancel()  # ... as its cancellation arrives
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # The connection went back to the pool: it is there for the next caller.
        async with store.pool.connection(timeout=1) as conn:
            await conn.execute("SELECT 1")
    finally:
        await store.close()
