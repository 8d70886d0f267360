"""The lean watch vacuums the outbox itself (issue 45, ``akter._engine.loop.vacuum``).

Real PostgreSQL, the runtime's own gateway and framework pool; the relay is off so the test
alone drives the watch, and its clock is the test's. Dead tuples are made the way claims and
settles make them (rows written, then deleted); another connection plays the adversaries: a
transaction that holds a snapshot across the deletes (an idle-in-transaction session) and one
that holds the table's vacuum lock (a peer's vacuum or autovacuum). Ordering comes from those
held transactions, never from sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from akter._engine.loop.vacuum import HELD_RETRY_S, MIN_DEAD, VacuumWatch
from akter._store.gateway.vacuum import VacuumGateway
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests.integration.relay_actors import ALL

Make = Callable[..., ActorTest]

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(ON_CITUS, reason="the lean watch runs on plain PostgreSQL only"),
]

#: Rows written and deleted per test: past the watch's bound, with room.
CHURN = MIN_DEAD + 500

_INSERT = (
    "INSERT INTO {schema}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type,"
    " actor_id, target_type, target_id, command, payload, caller, due_at_ms, scheduled_at_ms,"
    " parked_at_ms)"
    " SELECT 0, %(prefix)s || g, 0, 'intent', 'default', 'Sender', 's', 'Receiver', 'r',"
    " 'record', '{}', '[]', 0, 0, 1 FROM generate_series(1, %(n)s) g"
)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def churn(t: ActorTest, prefix: str, n: int = CHURN) -> None:
    """Write ``n`` parked rows and delete them, then flush this session's statistics."""
    async with await psycopg.AsyncConnection.connect(t.database_url, autocommit=True) as conn:
        await conn.execute(t.substitute(_INSERT), {"prefix": prefix, "n": n})
        await conn.execute(
            t.substitute("DELETE FROM {schema}.outbox WHERE intent_id LIKE %(p)s"),
            {"p": prefix + "%"},
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")  # the flush ran when the session went idle before this


async def vacuums(t: ActorTest) -> int:
    """Manual vacuums of the outbox the server counted."""
    rows = await t.rows(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass(%(t)s)",
        {"t": t.substitute("{schema}.outbox")},
    )
    return int(rows[0]["vacuum_count"])


def watch_of(t: ActorTest, clock: Clock) -> tuple[VacuumWatch, VacuumGateway]:
    gateway = VacuumGateway(t.runtime._store)
    return VacuumWatch(gateway, clock), gateway


async def kept_row(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT intent_id, parked_at_ms FROM {schema}.outbox ORDER BY 1")


async def test_the_watch_vacuums_the_outbox_once_dead_tuples_pile_up(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        watch, gateway = watch_of(t, Clock())
        await t.rows(_INSERT.replace("%(prefix)s || g", "'kept'"), {"n": 1})
        await churn(t, "a-", n=MIN_DEAD // 2)
        counted = await vacuums(t)
        await watch.check()  # below the bound: no vacuum
        assert watch.vacuums == 0 and await vacuums(t) == counted

        await churn(t, "b-")
        before = await gateway.tuples()
        assert before.dead >= CHURN
        await watch.check()
        assert watch.vacuums == 1 and await vacuums(t) == counted + 1
        after = await gateway.tuples()
        assert after.dead < before.dead // 10
        # A vacuum removes only versions no snapshot sees: the live row is untouched.
        assert await kept_row(t) == [{"intent_id": "kept", "parked_at_ms": 1}]


async def test_a_held_snapshot_keeps_the_dead_and_the_watch_waits_for_its_release(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        clock = Clock()
        watch, gateway = watch_of(t, clock)
        holder = await psycopg.AsyncConnection.connect(t.database_url)
        try:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.execute("SELECT 1")  # the snapshot: every row deleted below stays
            await churn(t, "h-")
            watch.observe(force=True)
            await watch.settled()
            assert watch.vacuums == 1
            held = await gateway.tuples()
            assert held.dead >= CHURN  # nothing removable while the snapshot lives

            clock.now += HELD_RETRY_S / 2
            watch.observe()  # the vacuum removed nothing: no new check before HELD_RETRY_S
            assert not watch.checking
            await holder.commit()  # the idle transaction ends
        finally:
            await holder.close()
        clock.now += HELD_RETRY_S
        watch.observe()
        assert watch.checking
        await watch.settled()
        assert watch.vacuums == 2
        assert (await gateway.tuples()).dead < held.dead // 10


async def test_a_vacuum_lock_held_elsewhere_is_skipped_not_waited_for(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        watch, gateway = watch_of(t, Clock())
        await churn(t, "l-")
        counted = await vacuums(t)
        peer = await psycopg.AsyncConnection.connect(t.database_url)
        try:
            await peer.execute("BEGIN")
            # What a peer's vacuum (or autovacuum) holds while it runs.
            await peer.execute(
                t.substitute("LOCK TABLE {schema}.outbox IN SHARE UPDATE EXCLUSIVE MODE")
            )
            await asyncio.wait_for(watch.check(), timeout=10)  # SKIP_LOCKED: returns
            assert await vacuums(t) == counted
            assert (await gateway.tuples()).dead >= CHURN
        finally:
            await peer.rollback()
            await peer.close()


async def test_the_runtime_wires_the_watch_to_its_passes(akter_test: Make) -> None:
    # The pass's call itself is checked in tests/unit/test_lean_watch.py (interval, first look).
    async with akter_test(ALL, relay=False) as t:
        await churn(t, "p-")
        counted = await vacuums(t)
        watch = t.runtime._loop.vacuum
        await t.runtime._relay.run_pass()  # within a second of the start: no look yet
        assert not watch.checking and await vacuums(t) == counted
        watch.observe(force=True)  # what a pass a second later does
        await watch.settled()
        assert await vacuums(t) == counted + 1
        assert (await VacuumGateway(t.runtime._store).tuples()).dead < CHURN // 10
