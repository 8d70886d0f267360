"""akter.stage on a psycopg 3 connection (sync and async): the rules (issue 41, part 1).

Each test stages on a connection of its own (the application's), commits or rolls back, then
runs the relay's passes on the harness's runtime (``relay=False``: every pass is the test's) and
reads what the receiver committed from its rows: delivered once, never, or refused with nothing
written. The outcome is read by id through ``runtime.outcome``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import akter
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests._support.polling import until
from tests.integration.stage_actors import ALL, Account, Order, Overdrawn

pytestmark = pytest.mark.timeout(60)


async def seen(t: ActorTest, id: str) -> list[dict[str, Any]]:
    """The deliveries ``Account/id`` committed, in order (``[]`` without a row)."""
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = %(id)s",
        {"id": id},
    )
    return list(rows[0]["state"]["seen"]) if rows else []


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY intent_id")


async def test_commit_delivers_once(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            conn.execute("CREATE TEMP TABLE orders (n int)")  # the application's own write
            conn.execute("INSERT INTO orders VALUES (1)")
            cid = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=500)
            # Before COMMIT another connection sees nothing.
            assert await outbox(t) == []
        row = (await outbox(t))[0]
        # The target's routing key and bucket; no source actor; the System transaction caller.
        assert row["routing_key"] == t.runtime.routing_key(t.runtime.ref(Account, "a-1"))
        assert (row["actor_type"], row["actor_id"], row["kind"]) == ("$transaction", "", "intent")
        assert row["bucket"] == row["routing_key"] >> 56
        assert (row["target_type"], row["target_id"], row["command"]) == (
            "Account",
            "a-1",
            "deposit",
        )
        await t.drain()
        await t.drain()
        assert [(s["cid"], s["cents"]) for s in await seen(t, "a-1")] == [(cid, 500)]
        assert (await seen(t, "a-1"))[0]["caller"] == '["System","transaction",null,null]'
        assert await outbox(t) == []
        assert await t.runtime.outcome(cid, timeout=5) == 500
        assert await t.runtime.get(Account, "a-1").outcome(cid) == 500


async def test_id_is_minted_from_the_statement_clock_and_the_deployment_window(
    akter_test: Any, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False, retry_window=timedelta(hours=2)) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            before = conn.execute("SELECT floor(extract(epoch FROM now()) * 1000)").fetchone()
            cid = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=1)
        assert before is not None
        _, issued, expires, _ = cid.split(".")
        assert int(issued) >= int(before[0])
        execution_timeout = 30_000
        assert int(expires) - int(issued) == 2 * 3_600_000 + execution_timeout


async def test_rollback_never_delivers(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn:
            with pytest.raises(ZeroDivisionError), conn.transaction():
                cid = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=500)
                raise ZeroDivisionError
        await t.drain()
        assert await seen(t, "a-1") == []
        assert await outbox(t) == []
        with pytest.raises(akter.ActorError) as caught:
            await t.runtime.outcome(cid, timeout=0.2)
        assert caught.value.reason == "Timeout"


async def test_async_connection(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        async with await psycopg.AsyncConnection.connect(akter_db) as conn:
            async with conn.transaction():
                cid = await akter.stage(conn, Account, "a-2", schema=t.schema).deposit(cents=7)
                cid2 = await akter.astage(conn, Account, "a-2", schema=t.schema).send(
                    Account.deposit, cents=8
                )
        await t.drain()
        got = sorted((s["cid"], s["cents"]) for s in await seen(t, "a-2"))
        assert got == sorted([(cid, 7), (cid2, 8)])


async def test_same_pinned_id_twice_is_one_command(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        pinned = await t.runtime.mint_command_id()
        with psycopg.connect(akter_db) as conn:
            for _ in range(2):
                with conn.transaction():
                    stager = akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema)
                    assert stager.deposit(cents=5) == pinned
            assert len(await outbox(t)) == 1
            await t.drain()
            # Delivered: the receipt holds the id, so staging it again is still a no-op.
            with conn.transaction():
                stager = akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema)
                assert stager.deposit(cents=5) == pinned
            await t.drain()
            assert [(s["cid"], s["cents"]) for s in await seen(t, "a-1")] == [(pinned, 5)]
            # Another payload or another command: a conflict, nothing written, and the
            # application's transaction goes on.
            stager = akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema)
            for command, cents in (("deposit", 6), ("withdraw", 5)):
                with conn.transaction():
                    with pytest.raises(akter.ActorError) as caught:
                        getattr(stager, command)(cents=cents)
                    assert caught.value.reason == "CommandConflict"
                    conn.execute("SELECT 1")
            assert await outbox(t) == []
            # An id is per actor, as a handle's: on another actor it is another command.
            with conn.transaction():
                stager = akter.stage(conn, Account, "a-9", command_id=pinned, schema=t.schema)
                assert stager.deposit(cents=5) == pinned
            await t.drain()
            assert [(s["cid"], s["cents"]) for s in await seen(t, "a-9")] == [(pinned, 5)]


async def test_pinned_conflict_with_a_pending_row(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        pinned = await t.runtime.mint_command_id()
        with psycopg.connect(akter_db) as conn:
            with conn.transaction():
                akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema).deposit(1)
            with conn.transaction():
                stager = akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema)
                with pytest.raises(akter.ActorError) as caught:
                    stager.withdraw(cents=1)
                assert caught.value.reason == "CommandConflict"
        assert len(await outbox(t)) == 1


async def test_pinned_id_of_another_window_is_refused(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        other = "v1.1700000000000.1700000001000.0b7c6c57-4d5b-4c4a-9a0e-4c3f3b0f1a11"
        with psycopg.connect(akter_db) as conn, conn.transaction():
            stager = akter.stage(conn, Account, "a-1", command_id=other, schema=t.schema)
            with pytest.raises(akter.ActorError) as caught:
                stager.deposit(cents=1)
            assert (caught.value.reason, caught.value.code) == ("InvalidCommandId", "window")
            with pytest.raises(akter.ActorError) as caught:
                akter.stage(conn, Account, "a-1", command_id="nope", schema=t.schema)
            assert caught.value.reason == "InvalidCommandId"
        assert await outbox(t) == []


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).deposit(cents="x"), "cents"),
        (
            lambda c, s: akter.stage(c, Account, "a-1", schema=s).deposit(cents=float("nan")),
            "cents",
        ),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).deposit(1, note="a\x00b"), "note"),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).deposit(10**5000), "cents"),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).deposit(), None),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).nope(cents=1), None),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).balance(), None),
        (lambda c, s: akter.stage(c, Account, "a-1", schema=s).audit(cents=1), None),
        (lambda c, s: akter.stage(c, Account, "a-1", tenant="no way", schema=s), "tenant"),
        (lambda c, s: akter.stage(c, Account, "", schema=s), "id"),
        (lambda c, s: akter.stage(c, Account, "a-1", after=-1, schema=s), "after"),
        (
            lambda c, s: akter.stage(c, Account, "a-1", at=datetime(2030, 1, 1), schema=s),
            "at",
        ),
        (lambda c, s: akter.stage(c, Account, "a-1", caller=akter.System(), schema=s), "caller"),
    ],
)
async def test_invalid_arguments_write_nothing(
    akter_test: Any, akter_db: str, build: Any, field: str | None
) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            with pytest.raises(akter.ActorError) as caught:
                build(conn, t.schema)
            assert caught.value.reason == "InvalidInput"
            if field is not None:
                assert caught.value.field == field
            conn.execute("SELECT 1")  # the transaction is not aborted
        assert await outbox(t) == []


async def test_unmigrated_schema_or_another_database_is_a_named_error(
    akter_test: Any, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn:
            with pytest.raises(akter.ConfigurationError, match="akter_nowhere"):
                with conn.transaction():
                    akter.stage(conn, Account, "a-1", schema="akter_nowhere").deposit(cents=1)
            # With a pinned id: the probe is the statement that finds no schema.
            pinned = akter.staged(Account, "a-1", command_id=await t.runtime.mint_command_id())
            with pytest.raises(akter.ConfigurationError, match="akter_nowhere"):
                with conn.transaction():
                    akter.stage_many(conn, [pinned.deposit(1)], schema="akter_nowhere")
        # A connection to another database of the server: the schema is not there.
        # template1: a database of every server that is not the tests' (the embedded one tests in
        # "postgres"); the URL may be a socket form, so the name is replaced, not the path
        other = psycopg.conninfo.make_conninfo(akter_db, dbname="template1")
        with psycopg.connect(other) as conn:
            with pytest.raises(akter.ConfigurationError, match=t.schema):
                with conn.transaction():
                    akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=1)
        with psycopg.connect(akter_db) as conn:
            with pytest.raises(akter.ConfigurationError, match="no deployment row"):
                with conn.transaction():
                    conn.execute(f'DELETE FROM "{t.schema}".deployment')
                    akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=1)
        assert await outbox(t) == []


async def test_staged_timer_after_and_at(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            later = akter.stage(conn, Account, "a-1", after=3600, schema=t.schema).deposit(1)
            when = datetime.now(UTC) + timedelta(hours=2)
            at = akter.stage(conn, Account, "a-1", at=when, schema=t.schema).deposit(2)
        rows = {r["intent_id"]: r for r in await outbox(t)}
        now = await t.now_ms()
        assert 3_590_000 < rows[later]["due_at_ms"] - now <= 3_600_000
        assert rows[at]["due_at_ms"] == int(when.timestamp() * 1000)
        await t.drain()
        assert await seen(t, "a-1") == []
        await t.advance(timedelta(minutes=61))
        assert [s["cid"] for s in await seen(t, "a-1")] == [later]
        await t.advance(timedelta(hours=1))
        assert [s["cid"] for s in await seen(t, "a-1")] == [later, at]


async def test_staged_workflow_start(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            run_id = akter.stage(conn, Order, "o-1", schema=t.schema).checkout.start(cents=3)
        assert "~" in run_id
        await t.drain()
        status = await t.workflow(run_id)
        assert (status.status, status.result) == ("completed", 3), status
        assert status.actor == t.runtime.ref(Order, "o-1")


async def test_outcome_of_a_declared_error_and_after_retention(
    akter_test: Any, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            cid = akter.stage(conn, Account, "a-1", schema=t.schema).withdraw(cents=3)
        await t.drain()
        with pytest.raises(Overdrawn) as caught:
            await t.runtime.outcome(cid, timeout=5)
        assert caught.value.short == 3
        ref = t.runtime.ref(Account, "a-1")
        with pytest.raises(Overdrawn):
            await t.runtime.outcome(cid, timeout=5, ref=ref)
        with pytest.raises(Overdrawn):
            await t.runtime.get(Account, "a-1").outcome(cid, timeout=5)
        # Past the id's expiry and the receipt's retention the sweep deletes it: the answer is
        # a named "unknown", not a wait until the timeout.
        await t.advance(timedelta(days=8))
        await t.runtime.cleanup()
        for where in (None, ref):
            with pytest.raises(akter.ActorError) as gone:
                await t.runtime.outcome(cid, timeout=5, ref=where)
            assert (gone.value.reason, gone.value.code) == ("CommandExpired", "receipt_gone")


@pytest.mark.parametrize("cents", [5, 6])
async def test_same_pinned_id_in_two_concurrent_transactions(
    akter_test: Any, akter_db: str, cents: int
) -> None:
    """The second waits for the first's row (the outbox key), then compares it: one command."""
    async with akter_test(ALL, relay=False) as t:
        pinned = await t.runtime.mint_command_id()
        tag = f"akter-stage-race-{cents}"
        first = psycopg.connect(akter_db)
        try:
            first.execute("SELECT 1")  # the first transaction is open
            akter.stage(first, Account, "a-1", command_id=pinned, schema=t.schema).deposit(5)

            def second() -> str:
                with psycopg.connect(akter_db, application_name=tag) as conn, conn.transaction():
                    stager = akter.stage(conn, Account, "a-1", command_id=pinned, schema=t.schema)
                    return str(stager.deposit(cents=cents))

            racing = asyncio.create_task(asyncio.to_thread(second))

            async def waiting() -> list[dict[str, Any]]:
                # On Citus the wait is a worker's, on the row's shard: its lock-wait view.
                sql = (
                    "SELECT 1 FROM citus_lock_waits WHERE blocked_statement LIKE %(like)s"
                    if ON_CITUS
                    else "SELECT 1 FROM pg_stat_activity WHERE application_name = %(tag)s"
                    " AND wait_event_type = 'Lock'"
                )
                rows: list[dict[str, Any]] = await t.rows(
                    sql, {"tag": tag, "like": f"%{t.schema}%"}
                )
                return rows

            await until(waiting, what="the second staging to wait for the first's row")
            first.commit()
            if cents == 5:
                assert await racing == pinned
            else:
                with pytest.raises(akter.ActorError) as caught:
                    await racing
                assert caught.value.reason == "CommandConflict"
        finally:
            first.close()
        await t.drain()
        assert [(s["cid"], s["cents"]) for s in await seen(t, "a-1")] == [(pinned, 5)]


async def test_operators_see_a_staged_row(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            cid = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=1)
        outbox = t.runtime.operators.outbox
        pending = await outbox.pending(10, 5000)
        assert [(r["intent_id"], r["target_type"], r["command"]) for r in pending] == [
            (cid, "Account", "deposit")
        ]
        overview = await asyncio.to_thread(outbox.overview, akter_db, 10)
        assert [r["intent_id"] for r in overview] == [cid]
