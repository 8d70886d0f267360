"""Owned rows across actors (``runtime.rows``) and atomicity under the turn's fault points.

docs/guides/owned-tables.md ("Across actors", "Atomicity").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import akter
from akter.testing import ActorTest
from tests.integration.owned_actors import SCHEMA, Order, lines, owned_schema

Make = Callable[..., ActorTest]


@pytest.fixture(scope="module")
def tables(akter_db: str) -> Iterator[str]:
    yield from owned_schema(akter_db)


async def test_a_tenant_query_across_actors_never_crosses_tenants(
    tables: str, akter_test: Make
) -> None:
    tag = uuid.uuid4().hex[:6]
    async with akter_test([Order]) as t:
        for i in range(3):
            await t.get(Order, f"{tag}-{i}", tenant="acme").add(f"sku{i}", 100 * (i + 1))
        await t.get(Order, f"{tag}-x", tenant="other").add("theirs", 999)
        rows = t.runtime.rows(lines, tenant="acme")
        big = rows.select.where(lines.c.cents >= 200, lines.c.actor_id.like(f"{tag}-%"))
        found = await rows.all(big.order_by(lines.c.cents))
        assert [r["sku"] for r in found] == ["sku1", "sku2"]
        # joined with the owners' state
        joined = rows.join_state(
            sa.select(lines.c.actor_id, rows.state.c.state["total"].astext.label("total"))
            .select_from(lines)
            .where(lines.c.actor_id.like(f"{tag}-%"))
        ).order_by(lines.c.actor_id)
        assert [(r["actor_id"], r["total"]) for r in await rows.all(joined)] == [
            (f"{tag}-0", "100"),
            (f"{tag}-1", "200"),
            (f"{tag}-2", "300"),
        ]
        # a select that did not start from rows.select is still the tenant's only
        everything = await rows.all(sa.select(lines).where(lines.c.actor_id.like(f"{tag}-%")))
        assert {r["tenant_id"] for r in everything} == {"acme"}
        # a select naming the other tenant finds nothing: the tenant filter is ANDed to it
        theirs = sa.select(lines).where(lines.c.tenant_id == "other")
        assert await rows.all(theirs) == []
        # keyset pages
        seen: list[str] = []
        after: tuple[Any, ...] | None = None
        mine = rows.select.where(lines.c.actor_id.like(f"{tag}-%"))
        while True:
            page, after = await rows.page(
                mine, key=[lines.c.actor_id, lines.c.line_no], after=after, limit=2
            )
            seen += [r["actor_id"] for r in page]
            if after is None:
                break
        assert seen == [f"{tag}-0", f"{tag}-1", f"{tag}-2"]


async def test_a_tenant_query_never_writes(tables: str, akter_test: Make) -> None:
    async with akter_test([Order]) as t:
        rows = t.runtime.rows(lines, tenant="acme")
        with pytest.raises(akter.RowScopeError):
            await rows.all(sa.delete(lines))  # type: ignore[arg-type]
        # a SELECT that writes (a data-modifying CTE) is refused by the READ ONLY transaction
        wrote = sa.delete(lines).where(lines.c.tenant_id == "acme").returning(lines.c.sku).cte()
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await rows.all(sa.select(wrote.c.sku).select_from(lines))
        unowned = sa.Table("stray", sa.MetaData(), *akter.owner_columns())
        with pytest.raises(akter.DefinitionError, match="no actor class owns"):
            t.runtime.rows(unowned, tenant="acme")


@pytest.mark.parametrize("point", ["before_handler", "before_commit", "after_commit"])
async def test_a_crash_at_a_fault_point_leaves_all_or_nothing(
    tables: str, akter_test: Make, point: str
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, f"f-{uuid.uuid4().hex[:8]}")
        await order.add("first", 1)
        pinned = await t.runtime.mint_command_id()
        t.crash_next(point)
        # the handle's retry runs the command again after the injected crash: one commit, with
        # every row (a crash that had left some would make the retry's inserts collide)
        assert await order.with_command_id(pinned).add_many(10) == 11
        assert not t.runtime.hooks.armed(point)  # the crash happened
        count = f'SELECT count(*) AS n FROM "{SCHEMA}".order_lines WHERE actor_id = %(id)s'
        assert (await t.rows(count, {"id": order.id}))[0]["n"] == 11
        state = await t.rows(
            "SELECT state FROM {schema}.actors WHERE actor_id = %(id)s", {"id": order.id}
        )
        assert state[0]["state"]["lines"] == 11
        receipts = await t.rows(
            "SELECT count(*) AS n FROM {schema}.receipts WHERE command_id = %(c)s", {"c": pinned}
        )
        assert receipts[0]["n"] == 1
        # a replay of the same id: the stored outcome, no row touched
        assert await order.with_command_id(pinned).add_many(10) == 11
        assert (await t.rows(count, {"id": order.id}))[0]["n"] == 11


async def test_rows_a_read_sent_stay_invisible_until_the_commit(
    tables: str, akter_test: Make
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, f"p-{uuid.uuid4().hex[:8]}")
        await order.add("a", 1)
        pause = t.pause_next("before_commit")
        running = asyncio.create_task(order.reprice("a", 7))  # its read sent the update
        await pause.wait()
        cents = f'SELECT cents FROM "{SCHEMA}".order_lines WHERE actor_id = %(id)s'
        assert (await t.rows(cents, {"id": order.id}))[0]["cents"] == 1  # not committed yet
        pause.release()
        assert await running == 7
        assert (await t.rows(cents, {"id": order.id}))[0]["cents"] == 7
