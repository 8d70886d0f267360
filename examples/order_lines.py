"""Owned tables: order lines written with each order's state, migrated by Alembic.

Run it with ``AKTER_DATABASE_URL=postgresql://… python -m examples.order_lines``: it creates the
schema ``order_lines_example`` for its own table (akter's tables live in ``akter_order_lines``),
applies the application's two Alembic migrations in the documented order, and prints a
cross-actor report. Its test is ``tests/integration/test_example_order_lines.py``; the rules are
docs/guides/owned-tables.md.

1. Migration 1 creates ``order_lines`` (what ``alembic revision --autogenerate`` writes from
   ``metadata``); the v1 runner writes lines with each order's state.
2. Migration 2 adds the ``gift`` column while the v1 runner runs: v1 neither names nor needs it.
3. The v2 code, which declares and writes ``gift``, starts only after migration 2 (a runner of
   it started before would be refused with ``akter.OwnedTableError`` naming the column).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations
from pydantic import BaseModel

import akter

SCHEMA = "order_lines_example"
AKTER_SCHEMA = "akter_order_lines"


def lines_table(*, with_gift: bool) -> sa.Table:
    """The ``order_lines`` table as the v1 (``with_gift=False``) or v2 code declares it."""
    return sa.Table(
        "order_lines",
        sa.MetaData(schema=SCHEMA),
        *akter.owner_columns(),
        sa.Column("line_no", sa.Integer, primary_key=True),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("cents", sa.BigInteger, sa.CheckConstraint("cents >= 0"), nullable=False),
        *([sa.Column("gift", sa.Boolean, server_default=sa.false())] if with_gift else []),
    )


def migration_1(op: Operations) -> None:
    """Create ``order_lines`` (the ownership columns lead the primary key)."""
    op.create_table(
        "order_lines",
        sa.Column("routing_key", sa.BigInteger, nullable=False),
        sa.Column("tenant_id", sa.Text, nullable=False),
        sa.Column("actor_id", sa.Text, nullable=False),
        sa.Column("line_no", sa.Integer, nullable=False),
        sa.Column("sku", sa.Text, nullable=False),
        sa.Column("cents", sa.BigInteger, sa.CheckConstraint("cents >= 0"), nullable=False),
        sa.PrimaryKeyConstraint("routing_key", "tenant_id", "actor_id", "line_no"),
        schema=SCHEMA,
    )


def migration_2(op: Operations) -> None:
    """Add ``gift`` (nullable with a default: runners of the old code keep inserting)."""
    op.add_column(
        "order_lines", sa.Column("gift", sa.Boolean, server_default=sa.false()), schema=SCHEMA
    )


def migrate(url: str, step: Callable[[Operations], None]) -> None:
    """Run one migration the way Alembic's ``upgrade`` runs a revision: in one transaction."""
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url))
    with engine.begin() as conn:
        step(Operations(MigrationContext.configure(conn)))
    engine.dispose()


class OrderState(BaseModel):
    lines: int = 0
    total_cents: int = 0


LINES_V1 = lines_table(with_gift=False)
LINES_V2 = lines_table(with_gift=True)


class OrderV1(akter.Actor[OrderState], name="Order", tables=[LINES_V1], access=akter.public):
    """The v1 code's ``Order``: it knows nothing of ``gift``."""

    @akter.command
    async def add_line(self, sku: str, cents: int) -> int:
        self.state.lines += 1
        self.state.total_cents += cents
        self.rows(LINES_V1).insert({"line_no": self.state.lines, "sku": sku, "cents": cents})
        return self.state.lines


class OrderV2(akter.Actor[OrderState], name="Order", tables=[LINES_V2], access=akter.public):
    """The v2 code's ``Order``: it writes ``gift`` (deployed after migration 2)."""

    @akter.command
    async def add_line(self, sku: str, cents: int) -> int:
        self.state.lines += 1
        self.state.total_cents += cents
        line = {"line_no": self.state.lines, "sku": sku, "cents": cents}
        self.rows(LINES_V2).insert({**line, "gift": sku.startswith("gift-")})
        return self.state.lines

    @akter.query
    async def skus(self) -> list[str]:
        return [r["sku"] for r in await self.rows(LINES_V2).order_by(LINES_V2.c.line_no).all()]


@dataclass
class Report:
    """What the example printed: the big lines of the tenant, and each line's gift flag."""

    big_lines: list[tuple[str, str, int]] = field(default_factory=list)
    gifts: list[tuple[str, str, bool | None]] = field(default_factory=list)


async def main(url: str, echo: Callable[[str], None] = print) -> Report:
    """The three steps of the module docstring, then a cross-actor report."""
    report = Report()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {AKTER_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
    migrate(url, migration_1)
    async with akter.Runtime([OrderV1], database_url=url, schema=AKTER_SCHEMA) as runtime:
        await runtime.get(OrderV1, "o-1", tenant="acme").add_line("apple", 120)
        migrate(url, migration_2)  # while v1 runs
        await runtime.get(OrderV1, "o-1", tenant="acme").add_line("pear", 80)
        echo("v1 wrote 2 lines; migration 2 applied while it ran")
    async with akter.Runtime([OrderV2], database_url=url, schema=AKTER_SCHEMA) as runtime:
        await runtime.get(OrderV2, "o-2", tenant="acme").add_line("gift-plum", 300)
        await runtime.get(OrderV2, "o-3", tenant="other").add_line("kiwi", 999)
        assert await runtime.get(OrderV2, "o-1", tenant="acme").skus() == ["apple", "pear"]
        t = LINES_V2
        rows = runtime.rows(t, tenant="acme")
        big = rows.select.where(t.c.cents > 100).order_by(t.c.actor_id)
        report.big_lines = [(r["actor_id"], r["sku"], r["cents"]) for r in await rows.all(big)]
        everything = rows.select.order_by(t.c.actor_id, t.c.line_no)
        report.gifts = [(r["actor_id"], r["sku"], r["gift"]) for r in await rows.all(everything)]
    for actor_id, sku, cents in report.big_lines:
        echo(f"acme: {actor_id} {sku} {cents}")
    return report


if __name__ == "__main__":
    asyncio.run(main(os.environ["AKTER_DATABASE_URL"]))
