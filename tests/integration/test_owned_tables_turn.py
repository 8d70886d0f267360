"""Owned tables in a command's turn: writes, reads, scoping, declared errors, replays, bad input.

docs/guides/owned-tables.md states the rules tested here; every test checks the rows left in the
database, not just the caller's answer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import akter
from akter.testing import ActorTest
from tests._support import until_pending
from tests.integration.owned_actors import SCHEMA, Order, owned_schema

Make = Callable[..., ActorTest]


@pytest.fixture(scope="module")
def tables(akter_db: str) -> Iterator[str]:
    yield from owned_schema(akter_db)


def oid() -> str:
    return f"o-{uuid.uuid4().hex[:8]}"


async def lines_of(t: ActorTest, actor_id: str) -> list[dict[str, Any]]:
    return await t.rows(
        f'SELECT tenant_id, line_no, sku, cents FROM "{SCHEMA}".order_lines'
        " WHERE actor_id = %(id)s ORDER BY tenant_id, line_no",
        {"id": actor_id},
    )


async def state_of(t: ActorTest, actor_id: str) -> dict[str, Any] | None:
    found = await t.rows(
        "SELECT state, version FROM {schema}.actors WHERE actor_id = %(id)s", {"id": actor_id}
    )
    return found[0] if found else None


async def test_rows_commit_with_the_state_and_reads_see_the_turns_writes(
    tables: str, akter_test: Make
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        assert await order.add("a", 100) == 1
        assert await order.add("b", 200) == 2
        # the update is staged, then the read in the same command sees it
        assert await order.reprice("a", 150) == 350
        assert [(r["sku"], r["cents"]) for r in await lines_of(t, order.id)] == [
            ("a", 150),
            ("b", 200),
        ]
        assert await order.upsert(2, "b2") == 2  # the existing line 2 is updated
        assert await order.upsert(3, "c") == 3
        assert await order.remove("a") == 2
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["b2", "c"]
        assert await order.skus() == ["b2", "c"]
        state = await state_of(t, order.id)
        assert state is not None and state["state"]["total"] == 350


async def test_rows_are_scoped_to_the_actor_and_its_tenant(tables: str, akter_test: Make) -> None:
    async with akter_test([Order]) as t:
        same = oid()
        mine, theirs = t.get(Order, same), t.get(Order, same, tenant="other")
        await mine.add("m", 1)
        await theirs.add("t", 2)
        assert await mine.skus() == ["m"]
        assert await theirs.skus() == ["t"]
        assert await mine.remove("t") == 1  # the other tenant's row is out of reach
        assert [r["tenant_id"] for r in await lines_of(t, same)] == ["default", "other"]
        neighbour = t.get(Order, oid())
        await neighbour.add("n", 3)
        assert await mine.reach(neighbour.id) == [0, 0, 1]  # its where() cannot widen the scope
        assert [r["sku"] for r in await lines_of(t, neighbour.id)] == ["n"]
        assert [(r["tenant_id"], r["sku"]) for r in await lines_of(t, same)] == [
            ("default", "m"),
            ("other", "t"),
        ]


@pytest.mark.parametrize("catch", [False, True])
async def test_a_write_naming_another_actors_keys_is_a_defect_and_writes_nothing(
    tables: str, akter_test: Make, catch: bool
) -> None:
    async with akter_test([Order]) as t:
        victim, thief = oid(), t.get(Order, oid())
        await thief.add("own", 1)
        before = await state_of(t, thief.id)
        with pytest.raises(akter.ActorError) as raised:
            await thief.steal(victim, catch=catch)
        assert raised.value.reason == "Defect"
        assert "actor_id" in str(raised.value)
        assert await lines_of(t, victim) == []
        assert [r["sku"] for r in await lines_of(t, thief.id)] == ["own"]
        assert await state_of(t, thief.id) == before
        with pytest.raises(akter.ActorError) as retag:
            await thief.retag("other")
        assert retag.value.reason == "Defect" and "tenant_id" in str(retag.value)
        assert [r["tenant_id"] for r in await lines_of(t, thief.id)] == ["default"]


async def test_a_query_reads_rows_and_cannot_write_them(tables: str, akter_test: Make) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        await order.add("a", 1)
        with pytest.raises(akter.ReadOnlyError) as raised:
            await order.sneak()
        assert "read-only" in str(raised.value)
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["a"]


@pytest.mark.parametrize("read_first", [False, True])
async def test_a_declared_error_writes_none_of_its_rows(
    tables: str, akter_test: Make, read_first: bool
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        await order.add("kept", 1)
        with pytest.raises(akter.DeclaredError):
            await order.add_then_refuse("dropped", read_first=read_first)
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["kept"]
        assert await order.add("next", 1) == 2  # the state kept 1 line: line 2 is free


async def test_a_replay_returns_the_stored_outcome_without_touching_rows(
    tables: str, akter_test: Make
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        pinned = await t.runtime.mint_command_id()
        first = await order.with_command_id(pinned).add("a", 1)
        await t.rows(
            f'DELETE FROM "{SCHEMA}".order_lines WHERE actor_id = %(id)s', {"id": order.id}
        )
        assert await order.with_command_id(pinned).add("a", 1) == first
        assert await lines_of(t, order.id) == []  # not written again


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ({"sku": "x" * 21, "cents": 1}, "column 'sku'"),  # too long for varchar(20)
        ({"sku": "neg", "cents": -1}, "constraint 'cents_positive'"),
        ({"sku": None, "cents": 1}, "column 'sku'"),  # NOT NULL
        ({"sku": "s", "cents": "lots"}, "column 'cents'"),  # not a bigint
        ({"sku": "s", "cents": 1, "bogus": 1}, "no column(s) 'bogus'"),  # refused at staging
    ],
)
async def test_a_value_the_column_refuses_is_a_defect_naming_it(
    tables: str, akter_test: Make, line: dict[str, Any], named: str
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        await order.add("ok", 1)
        before = await state_of(t, order.id)
        with pytest.raises(akter.ActorError) as raised:
            await order.put(line)
        assert raised.value.reason == "Defect"
        assert named in str(raised.value) and "order_lines" in str(raised.value)
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["ok"]
        assert await state_of(t, order.id) == before
        assert await order.add("after", 1) == 2  # the actor goes on


async def test_many_rows_in_one_turn(tables: str, akter_test: Make) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        assert await order.add_many(100) == 100
        assert len(await lines_of(t, order.id)) == 100


async def test_one_batch_keeps_each_commands_rows_apart(tables: str, akter_test: Make) -> None:
    """Commands of one batch share its transaction, each keeping its own rows.

    A declared error's sent rows are undone (and nothing else of the flight: the state and the
    receipts commit); a refused value re-runs the batch one command per transaction.
    """
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        await order.add("a", 1)
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(order.add("b", 2))  # line 2
        await pause.wait()
        # queued behind the paused turn: the next batch holds all three
        refused = asyncio.create_task(order.add_then_refuse("x", read_first=True))  # line 3, undone
        third = asyncio.create_task(order.add("c", 3))  # line 3 again: free only if undone
        await until_pending(t.runtime, 3)
        pause.release()
        assert await first == 2
        with pytest.raises(akter.DeclaredError):
            await refused
        assert await third == 3
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["a", "b", "c"]
        state = await state_of(t, order.id)
        assert state is not None and state["state"]["lines"] == 3  # the flight's state kept
        receipts = await t.rows(
            "SELECT count(*) AS n FROM {schema}.receipts WHERE actor_id = %(id)s", {"id": order.id}
        )
        assert receipts[0]["n"] == 4  # the declared error's receipt too
        pause = t.pause_next("before_commit")
        blocker = asyncio.create_task(order.add("d", 4))
        await pause.wait()
        bad = asyncio.create_task(order.add("neg", -1))
        good = asyncio.create_task(order.add("e", 5))
        await until_pending(t.runtime, 3)
        pause.release()
        assert await blocker == 4
        with pytest.raises(akter.ActorError) as raised:
            await bad
        assert raised.value.reason == "Defect" and "cents_positive" in str(raised.value)
        assert await good == 5
        assert [r["sku"] for r in await lines_of(t, order.id)] == ["a", "b", "c", "d", "e"]
        state = await state_of(t, order.id)
        assert state is not None and state["state"]["lines"] == 5


@pytest.mark.parametrize("read", [False, True])
async def test_a_write_that_cannot_be_built_is_a_defect_and_writes_nothing(
    tables: str, akter_test: Make, read: bool
) -> None:
    async with akter_test([Order]) as t:
        order = t.get(Order, oid())
        await order.add("a", 5)
        before = await state_of(t, order.id)
        with pytest.raises(akter.ActorError) as raised:
            await order.bad_where(read=read)
        assert raised.value.reason == "Defect" and "could not be built" in str(raised.value)
        assert [r["cents"] for r in await lines_of(t, order.id)] == [5]
        assert await state_of(t, order.id) == before
