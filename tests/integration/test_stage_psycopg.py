"""akter.stage on a psycopg 3 connection (sync and async): the core rules (issue 41, part 1).

Each test stages on a connection of its own (the application's), commits or rolls back, then
runs the relay's passes on the harness's runtime and reads what the receiver committed from
its rows: delivered once, never delivered, or refused with nothing written.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import akter
from akter.testing import ActorTest
from tests.integration.stage_actors import ALL, Account

pytestmark = pytest.mark.timeout(60)


async def seen(t: ActorTest, id: str) -> list[dict[str, Any]]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = %(id)s",
        {"id": id},
    )
    return list(rows[0]["state"]["seen"]) if rows else []


async def outbox_count(t: ActorTest) -> int:
    rows = await t.rows("SELECT count(*) AS n FROM {schema}.outbox")
    return int(rows[0]["n"])


async def test_commit_delivers_once(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn, conn.transaction():
            conn.execute("SELECT 1")  # the application's own work
            cid = akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=500)
        assert cid.startswith("v1.")
        await t.drain()
        await t.drain()
        assert [(s["cid"], s["cents"]) for s in await seen(t, "a-1")] == [(cid, 500)]
        assert await outbox_count(t) == 0


async def test_rollback_never_delivers(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with psycopg.connect(akter_db) as conn:
            with pytest.raises(ZeroDivisionError), conn.transaction():
                akter.stage(conn, Account, "a-1", schema=t.schema).deposit(cents=500)
                raise ZeroDivisionError
        await t.drain()
        assert await seen(t, "a-1") == []
        assert await outbox_count(t) == 0


async def test_async_connection(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        async with await psycopg.AsyncConnection.connect(akter_db) as conn:
            async with conn.transaction():
                cid = await akter.stage(conn, Account, "a-2", schema=t.schema).deposit(cents=7)
                cid2 = await akter.astage(conn, Account, "a-2", schema=t.schema).send(
                    Account.deposit, cents=8
                )
        await t.drain()
        assert [(s["cid"], s["cents"]) for s in await seen(t, "a-2")] == [(cid, 7), (cid2, 8)]
