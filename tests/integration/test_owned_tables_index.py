"""Indexed state fields (``akter.state_index``), as docs/guides/owned-tables.md states them.

Mirrored in the turn, found across actors, and following a state migration that renames the
field.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests.integration.owned_actors import create_owned

Make = Callable[..., ActorTest]


@pytest.fixture
def schema(akter_db: str) -> Iterator[str]:
    name = f"owned_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def index_table(schema: str) -> sa.Table:
    return sa.Table(
        "cart_index",
        sa.MetaData(schema=schema),
        *akter.owner_columns(),
        sa.Column("total_cents", sa.BigInteger, nullable=False, index=True),
    )


class CartV1(BaseModel):
    total: int = 0


class CartV2(BaseModel):
    total_cents: int = 0
    items: int = 0


def cart_v1(table: sa.Table) -> type[akter.Actor[CartV1]]:
    index = akter.state_index(table, lambda s: {"total_cents": s.total})

    class Cart(akter.Actor[CartV1], tables=[index], access=akter.public):
        @akter.command
        async def add(self, cents: int) -> int:
            self.state.total += cents
            return self.state.total

        @akter.command
        async def noop(self) -> int:
            return self.state.total

    return Cart


def cart_v2(table: sa.Table) -> type[akter.Actor[CartV2]]:
    index = akter.state_index(table, lambda s: {"total_cents": s.total_cents})

    class Cart(akter.Actor[CartV2], tables=[index], access=akter.public):
        @akter.migrate_state(from_version=0)
        def _rename(old: dict[str, Any]) -> dict[str, Any]:
            old["total_cents"] = old.pop("total", 0)
            return old

        @akter.command
        async def add(self, cents: int) -> int:
            self.state.total_cents += cents
            self.state.items += 1
            return self.state.total_cents

    return Cart


async def test_state_index_is_kept_in_the_turn_and_follows_a_rename(
    akter_db: str, akter_test: Make, schema: str
) -> None:
    table = index_table(schema)
    create_owned(akter_db, table.metadata)
    idx = f'SELECT actor_id, total_cents FROM "{schema}".cart_index ORDER BY actor_id'
    async with akter_test([cart_v1(table)], keep_schema=True) as t:
        cart = t.runtime.definitions["Cart"].cls
        assert await t.get(cart, "c-1", tenant="acme").add(500) == 500
        assert await t.get(cart, "c-2", tenant="acme").add(50) == 50
        assert await t.get(cart, "c-3", tenant="acme").noop() == 0  # first turn: indexed too
        assert await t.get(cart, "c-1", tenant="acme").add(100) == 600
        assert await t.get(cart, "c-9", tenant="zeta").add(9999) == 9999
        assert [(r["actor_id"], r["total_cents"]) for r in await t.rows(idx)] == [
            ("c-1", 600),
            ("c-2", 50),
            ("c-3", 0),
            ("c-9", 9999),
        ]
        rows = t.runtime.rows(table, tenant="acme")
        big = await rows.all(rows.select.where(table.c.total_cents > 100))
        assert [r["actor_id"] for r in big] == ["c-1"]
        schema_name = t.runtime.schema
    # v2 renames the field with a state migration: only the projection changes
    async with akter_test([cart_v2(table)], schema=schema_name) as t2:
        cart = t2.runtime.definitions["Cart"].cls
        assert await t2.get(cart, "c-2", tenant="acme").add(200) == 250
        assert [(r["actor_id"], r["total_cents"]) for r in await t2.rows(idx)][:2] == [
            ("c-1", 600),
            ("c-2", 250),
        ]


def test_a_state_index_has_one_row_per_actor() -> None:
    per_line = sa.Table(
        "per_line",
        sa.MetaData(),
        *akter.owner_columns(),
        sa.Column("n", sa.Integer, primary_key=True),
    )
    with pytest.raises(akter.DefinitionError, match="one row per actor"):
        akter.state_index(per_line, lambda s: {})
