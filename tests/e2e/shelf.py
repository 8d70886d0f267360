"""``Shelf``: a public e2e actor owning a table (``GET /tables/{SHELF_SCHEMA}.shelf_items``).

The ``shelf`` fixture creates the table (distributed on Citus) in a schema of its own for the
test and drops it after; tests/e2e/conftest.py makes it a fixture of every e2e test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

import akter
from tests.integration.owned_actors import create_owned

SHELF_SCHEMA = f"e2e_shelf_{uuid.uuid4().hex[:10]}"
shelf_metadata = sa.MetaData(schema=SHELF_SCHEMA)
shelf_items = sa.Table(
    "shelf_items",
    shelf_metadata,
    *akter.owner_columns(),
    sa.Column("slot", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(40), nullable=False),
    sa.Column("ok", sa.Boolean),
)


class Stock(BaseModel):
    slots: int = 0


class Shelf(akter.Actor[Stock], tables=[shelf_items], access=akter.public):
    """A public actor with an owned table: ``GET /tables/{SHELF_SCHEMA}.shelf_items``."""

    @akter.command
    async def stock(self, sku: str) -> int:
        self.state.slots += 1
        self.rows(shelf_items).insert({"slot": self.state.slots, "sku": sku, "ok": True})
        return self.state.slots


@pytest.fixture
def shelf(akter_db: str) -> Iterator[None]:
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{SHELF_SCHEMA}"')
    create_owned(akter_db, shelf_metadata)  # distributed on Citus
    try:
        yield
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SHELF_SCHEMA}" CASCADE')
