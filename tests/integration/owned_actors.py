"""Actors with owned tables, shared by tests/integration/test_owned_tables_*.py.

The tables live in a schema of this module's own (``SCHEMA``), created by :func:`owned_schema`
for a test module and dropped after it; each test uses its own actor ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import sqlalchemy as sa
from pydantic import BaseModel

import akter

SCHEMA = f"owned_{uuid.uuid4().hex[:10]}"
metadata = sa.MetaData(schema=SCHEMA)

lines = sa.Table(
    "order_lines",
    metadata,
    *akter.owner_columns(),
    sa.Column("line_no", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(20), nullable=False),
    sa.Column("cents", sa.BigInteger, sa.CheckConstraint("cents >= 0", name="cents_positive")),
)


class OrderState(BaseModel):
    lines: int = 0
    total: int = 0


class Refused(akter.DeclaredError, tag="owned.Refused"):
    why: str


class Order(akter.Actor[OrderState], tables=[lines], access=akter.public):
    @akter.command
    async def add(self, sku: str, cents: int) -> int:
        self.state.lines += 1
        self.state.total += cents
        self.rows(lines).insert({"line_no": self.state.lines, "sku": sku, "cents": cents})
        return self.state.lines

    @akter.command
    async def put(self, line: dict[str, Any]) -> int:
        self.state.lines += 1
        self.rows(lines).insert({"line_no": self.state.lines, **line})
        return self.state.lines

    @akter.command
    async def add_many(self, n: int, cents: int = 1) -> int:
        first = self.state.lines + 1
        self.rows(lines).insert(
            [{"line_no": first + i, "sku": f"s{first + i}", "cents": cents} for i in range(n)]
        )
        self.state.lines += n
        return self.state.lines

    @akter.command(errors=[Refused])
    async def add_then_refuse(self, sku: str, read_first: bool = False) -> int:
        self.state.lines += 1
        self.rows(lines).insert({"line_no": self.state.lines, "sku": sku, "cents": 1})
        if read_first:
            await self.rows(lines).count()  # sends the insert into the transaction
        raise Refused(why="no")

    @akter.command
    async def reprice(self, sku: str, cents: int) -> int:
        self.rows(lines).update({"cents": cents}).where(lines.c.sku == sku)
        rows = await self.rows(lines).all()
        self.state.total = sum(r["cents"] for r in rows)
        return self.state.total

    @akter.command
    async def upsert(self, line_no: int, sku: str) -> int:
        self.rows(lines).upsert({"line_no": line_no, "sku": sku, "cents": 5})
        return await self.rows(lines).count()

    @akter.command
    async def remove(self, sku: str) -> int:
        self.rows(lines).delete().where(lines.c.sku == sku)
        return await self.rows(lines).count()

    @akter.command
    async def steal(self, other: str, catch: bool = False) -> str:
        try:
            self.rows(lines).insert({"actor_id": other, "line_no": 1, "sku": "x", "cents": 1})
        except akter.RowScopeError:
            if not catch:
                raise
        self.state.lines += 1
        return "caught"

    @akter.command
    async def reach(self, other: str) -> list[int]:
        """Every way a handler can name another actor's rows: each finds none of them."""
        t = lines.c
        self.rows(lines).update({"sku": "mine"}).where(t.actor_id == other)
        self.rows(lines).delete().where(t.tenant_id != self.tenant)
        return [
            await self.rows(lines).where(t.actor_id == other).count(),
            len(await self.rows(lines).where(t.tenant_id == "other").all()),
            await self.rows(lines).count(),
        ]

    @akter.command
    async def bad_where(self, read: bool = False) -> int:
        self.state.lines += 1
        self.rows(lines).update({"cents": 0}).where("cents > 0")  # not a clause: unbuildable
        if read:
            return await self.rows(lines).count()
        return 0

    @akter.command
    async def retag(self, tenant: str) -> int:
        self.rows(lines).update({"tenant_id": tenant})
        return 0

    @akter.query
    async def skus(self) -> list[str]:
        found = await self.rows(lines).order_by(lines.c.line_no).all()
        return [r["sku"] for r in found]

    @akter.query
    async def sneak(self) -> None:
        self.rows(lines).insert({"line_no": 99, "sku": "q", "cents": 1})


def create_owned(url: str, tables: sa.MetaData) -> None:
    """``tables.create_all``, then on Citus each table distributed (:func:`distribute_owned`)."""
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url))
    with engine.begin() as conn:
        tables.create_all(conn)
    engine.dispose()
    distribute_owned(url, *tables.sorted_tables)


def distribute_owned(url: str, *tables: sa.Table) -> None:
    """On Citus, distribute each owned table as the guide's migration does; else nothing.

    By its routing key column, in the co-location group of akter's ``actors``: the test harness
    distributes each test schema's ``actors`` in the ``default`` group, so that is the one.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone()
        if found is None:
            return
        for table in tables:
            declared = table.info.get("akter_owned")
            key = declared.routing_key if declared is not None else "routing_key"
            conn.execute(
                "SELECT create_distributed_table(%s::regclass, %s, colocate_with => 'default')",
                (f'"{table.schema}"."{table.name}"', key),
            )


def owned_schema(url: str) -> Iterator[str]:
    """Create ``SCHEMA`` and its tables (as the application's migrations would); drop them after."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{SCHEMA}"')
    create_owned(url, metadata)
    try:
        yield SCHEMA
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
