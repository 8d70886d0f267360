"""Owned rows when the connection is cut around ``COMMIT`` (docs/guides/owned-tables.md).

The runtime reaches PostgreSQL through :class:`~tests.faults.pg_proxy.PgProxy`, which cuts the
turn's connection at its commit flight (before ``COMMIT`` reaches the server, after its answer,
or as it is sent). The caller sees ``outcome_unknown``; the rows, the state and the receipt are
all there or none is; the retry with the same id resolves it once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

import akter
from akter.testing import ActorTest
from tests.faults.pg_proxy import Cut, PgProxy
from tests.integration.owned_actors import SCHEMA, Order, owned_schema

pytestmark = pytest.mark.timeout(60)

CUTS: list[Cut] = ["before", "after_reply", "race"]


@pytest.fixture(scope="module")
def tables(akter_db: str) -> Iterator[str]:
    yield from owned_schema(akter_db)


@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_commit_leaves_the_rows_with_the_state_or_neither(
    tables: str, akter_db: str, cut: Cut
) -> None:
    async with PgProxy(akter_db) as proxy, ActorTest([Order], database_url=proxy.url) as t:
        t.database_url = akter_db  # inspection and the schema's drop go direct
        order = t.get(Order, f"cut-{uuid.uuid4().hex[:8]}")
        await order.add("first", 1)
        cid = await t.runtime.mint_command_id()
        proxy.arm(cut, match=cid)
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(
                Order, order.id, "add_many", {"n": 10}, command_id=cid, retry=False
            )
        assert raised.value.reason == "ActorUnavailable" and raised.value.code == "outcome_unknown"
        assert proxy.fired.is_set()
        await asyncio.wait_for(proxy.settled.wait(), 10)
        count = f'SELECT count(*) AS n FROM "{SCHEMA}".order_lines WHERE actor_id = %(id)s'
        receipt = "SELECT count(*) AS n FROM {schema}.receipts WHERE command_id = %(c)s"
        state = "SELECT state FROM {schema}.actors WHERE actor_id = %(id)s"
        committed = (await t.rows(receipt, {"c": cid}))[0]["n"] == 1
        if cut == "before":
            assert not committed
        if cut == "after_reply":
            assert committed
        lines = 11 if committed else 1
        assert (await t.rows(count, {"id": order.id}))[0]["n"] == lines
        assert (await t.rows(state, {"id": order.id}))[0]["state"]["lines"] == lines
        # the retry with the same id: the stored outcome, or the first commit; rows once
        assert await order.with_command_id(cid).add_many(10) == 11
        assert (await t.rows(count, {"id": order.id}))[0]["n"] == 11
