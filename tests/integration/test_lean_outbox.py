"""The lean watch vacuums the outbox and the actors (issue 45, ``akter._engine.loop.vacuum``).

Real PostgreSQL, the runtime's own gateway and framework pool; the relay is off so the test
alone drives the watch (``check()`` by hand), and its clock is the test's. Dead tuples are made
the way claims and settles make them (outbox rows written, then deleted) and the way turns make
them (actor rows rewritten); another connection plays the adversaries: a transaction that holds
a snapshot across the deletes (an idle-in-transaction session), one that holds the table's
vacuum lock (a peer's vacuum or autovacuum), a role that does not own the tables. Ordering comes
from those held transactions, never from sleeps. The shared test server runs with autovacuum
off, and every writer flushes its statistics before the watch reads them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from akter._engine.loop.vacuum import CHECK_EVERY_S, HELD_RETRY_S, MIN_DEAD, VacuumWatch
from akter._store.gateway.vacuum import Tuples, VacuumGateway
from akter._store.pool import Store
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests.integration.relay_actors import ALL

Make = Callable[..., ActorTest]

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(ON_CITUS, reason="the lean watch runs on plain PostgreSQL only"),
]


@pytest.fixture(scope="module")
def akter_db(akter_db: str) -> Iterator[str]:
    """A database of this module's own on the server.

    What a vacuum may remove, and the horizon the watch follows, depend on every session of the
    database, and other suites share the test database (a snapshot one of them held for a while
    kept these tests' dead tuples).
    """
    name = f"akter_lean_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        yield make_conninfo(akter_db, dbname=name)
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


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


async def vacuums(t: ActorTest, table: str = "outbox") -> int:
    """Manual vacuums of ``table`` the server counted."""
    rows = await t.rows(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = to_regclass(%(t)s)",
        {"t": t.substitute("{schema}." + table)},
    )
    return int(rows[0]["vacuum_count"])


async def outbox(gateway: VacuumGateway) -> Tuples:
    return (await gateway.tuples())["outbox"]


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
        before = await outbox(gateway)
        assert before.dead >= CHURN
        await watch.check()
        assert watch.vacuums == 1 and await vacuums(t) == counted + 1
        after = await outbox(gateway)
        assert after.dead < before.dead // 10
        # A vacuum removes only versions no snapshot sees: the live row is untouched.
        assert await kept_row(t) == [{"intent_id": "kept", "parked_at_ms": 1}]


async def xmin_of(t: ActorTest, session: psycopg.AsyncConnection[Any]) -> str:
    rows = await t.rows(
        "SELECT backend_xmin::text AS x FROM pg_stat_activity WHERE pid = %(pid)s",
        {"pid": session.info.backend_pid},
    )
    return str(rows[0]["x"])


async def hold(t: ActorTest) -> psycopg.AsyncConnection[Any]:
    """A session idle in a REPEATABLE READ transaction: its snapshot keeps what dies next.

    Skips the test when another session of this shared database holds an older horizon (a
    long test elsewhere on the server): then no vacuum here could remove what the test kills,
    and the horizon the watch follows is not the test's.
    """
    holder = await psycopg.AsyncConnection.connect(t.database_url)
    await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await holder.execute("SELECT 1")
    mine, gateway = await xmin_of(t, holder), VacuumGateway(t.runtime._store)
    for _ in range(20):  # a passing query elsewhere may hold an older one for a moment
        if await gateway.horizon() == mine:
            break
    else:
        await holder.close()
        pytest.skip("another session of the shared test database holds an older snapshot")
    return holder


async def test_a_held_snapshot_keeps_the_dead_and_its_release_is_followed_at_once(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        clock = Clock()
        watch, gateway = watch_of(t, clock)
        holder = await hold(t)
        try:
            await churn(t, "h-")
            await watch.check()
            assert watch.vacuums == 1
            held = await outbox(gateway)
            assert held.dead >= CHURN  # nothing removable while the snapshot lives
            assert watch.held is not None and watch.held.horizon is not None

            # The next looks, well within the fallback's wait: the same horizon, no vacuum.
            for _ in range(3):
                clock.now += CHECK_EVERY_S / 4
                await watch.check()
                if watch.held.seen_again:
                    break
            assert watch.held.seen_again and watch.vacuums == 1
            await holder.commit()  # the idle transaction ends
        finally:
            await holder.close()
        # The next checks: the horizon moves once no session holds the holder's xmin any more
        # (a transaction elsewhere may have taken that very xid and still run for a moment).
        while watch.vacuums == 1:
            clock.now += CHECK_EVERY_S / 100
            assert clock.now < watch.held.retry_at  # before the fallback would have come
            await watch.check()
        assert watch.vacuums == 2 and watch.held is None
        assert (await outbox(gateway)).dead < held.dead // 10


async def test_without_a_horizon_to_follow_the_fallback_waits(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        clock = Clock()
        watch, gateway = watch_of(t, clock)
        holder = await hold(t)
        try:
            await churn(t, "f-")
            await watch.check()
            assert watch.vacuums == 1 and watch.held is not None
            # Released before any look saw the horizon again: nothing the watch can follow.
            await holder.commit()
        finally:
            await holder.close()
        clock.now += HELD_RETRY_S / 2
        await watch.check()
        assert watch.vacuums == 1  # no vacuum before the fallback's time
        clock.now += HELD_RETRY_S / 2
        await watch.check()
        assert watch.vacuums == 2 and watch.held is None
        assert (await outbox(gateway)).dead < CHURN // 10


async def churn_actors(t: ActorTest, rows: int, rewrites: int) -> None:
    """Rewrite ``rows`` actor rows ``rewrites`` times each, as turns do; flush the statistics."""
    async with await psycopg.AsyncConnection.connect(t.database_url, autocommit=True) as conn:
        await conn.execute(
            t.substitute(
                "INSERT INTO {schema}.actors (routing_key, tenant_id, actor_type, actor_id,"
                " state, updated_at_ms) SELECT g, 'default', 'Lean', 'a' || g, '{}', 0"
                " FROM generate_series(1, %(n)s) g"
            ),
            {"n": rows},
        )
        for _ in range(rewrites):
            await conn.execute(
                t.substitute(
                    "UPDATE {schema}.actors SET updated_at_ms = updated_at_ms + 1"
                    " WHERE actor_type = 'Lean'"
                )
            )
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")


async def test_the_watch_vacuums_the_actors_once_their_dead_versions_pile_up(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        watch, gateway = watch_of(t, Clock())
        holder = await hold(t)  # no page pruning while it lives: the versions stay dead
        try:
            await churn_actors(t, rows=50, rewrites=(MIN_DEAD + 200) // 50)
        finally:
            await holder.rollback()
            await holder.close()
        counted = await vacuums(t, "actors"), await vacuums(t, "outbox")
        before = (await gateway.tuples())["actors"]
        assert before.dead >= MIN_DEAD
        await watch.check()
        assert watch.vacuums == 1 and watch.last_vacuumed == ["actors"]  # the outbox is clean
        assert (await vacuums(t, "actors"), await vacuums(t, "outbox")) == (
            counted[0] + 1,
            counted[1],
        )
        assert (await gateway.tuples())["actors"].dead < before.dead // 10
        kept = await t.rows(
            "SELECT count(*) AS n, min(updated_at_ms) AS low, max(updated_at_ms) AS high"
            " FROM {schema}.actors WHERE actor_type = 'Lean'"
        )
        rewrites = (MIN_DEAD + 200) // 50
        assert kept == [{"n": 50, "low": rewrites, "high": rewrites}]


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
            assert (await outbox(gateway)).dead >= CHURN
        finally:
            await peer.rollback()
            await peer.close()


async def test_the_runtime_wires_the_watch_to_its_passes(akter_test: Make) -> None:
    # The pass's call itself is checked in tests/unit/test_lean_watch.py (interval, first look).
    async with akter_test(ALL, relay=False) as t:
        passes = t.runtime._loop
        await passes.vacuum.stop()
        # The runtime's watch on the test's clock: no look until the test moves it, however
        # long the churn takes on a loaded machine.
        clock = Clock()
        passes.vacuum = watch = VacuumWatch(VacuumGateway(t.runtime._store), clock)
        await churn(t, "p-")
        counted = await vacuums(t)
        await t.runtime._relay.run_pass()  # within a second of the start: no look yet
        assert not watch.checking and await vacuums(t) == counted
        clock.now += CHECK_EVERY_S
        await t.runtime._relay.run_pass()  # a pass a second later looks
        await watch.settled()
        assert await vacuums(t) == counted + 1
        assert (await outbox(VacuumGateway(t.runtime._store))).dead < CHURN // 10


async def test_a_vacuum_the_server_refuses_is_logged_and_loses_nothing(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    # A runner whose role can use the tables but does not own them: the server warns and
    # skips each VACUUM, no error. A role of the shared server, dropped at the end.
    async with akter_test(ALL, relay=False) as t:
        schema = t.runtime._store.queries.schema
        name = f"akter_lean_{uuid.uuid4().hex[:12]}"
        role = sql.Identifier(name)
        grant = sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role)
        async with await psycopg.AsyncConnection.connect(t.database_url, autocommit=True) as su:
            await su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
            try:
                await su.execute(grant)
                store = Store(
                    make_conninfo(t.database_url, user=name),
                    schema,
                    framework_size=1,
                )
                await store.framework.open(wait=True, timeout=30.0)
                try:
                    watch = VacuumWatch(VacuumGateway(store), Clock())
                    await t.rows(_INSERT.replace("%(prefix)s || g", "'kept'"), {"n": 1})
                    await churn(t, "r-")
                    counted = await vacuums(t)
                    with caplog.at_level(logging.WARNING, logger="akter.relay"):
                        await watch.check()
                    assert watch.vacuums == 1 and await vacuums(t) == counted  # skipped
                    assert [r.levelno for r in caplog.records] == [logging.WARNING]
                    # PG 15: 'skipping "outbox" --- only table or database owner can vacuum
                    # it'; PG 16+: 'permission denied to vacuum "outbox", skipping it'.
                    said = caplog.records[0].getMessage()
                    assert '"outbox"' in said and "skipping" in said
                    assert watch.held is not None  # tried again as a futile vacuum
                    # The horizon it follows includes other roles' snapshots: pg_stat_activity
                    # shows every session's backend_xmin to every role.
                    holder = await hold(t)
                    try:
                        assert await VacuumGateway(store).horizon() == await xmin_of(t, holder)
                    finally:
                        await holder.close()
                finally:
                    await store.framework.close()
            finally:
                await su.execute(
                    sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(
                        sql.Identifier(schema), role
                    )
                )
                await su.execute(sql.SQL("DROP ROLE {}").format(role))
        # Nothing lost: the row stands, and the owner's watch removes the dead tuples.
        assert await kept_row(t) == [{"intent_id": "kept", "parked_at_ms": 1}]
        owner, gateway = watch_of(t, Clock())
        await owner.check()
        assert await vacuums(t) == counted + 1
        assert (await outbox(gateway)).dead < CHURN // 10
