"""A read model kept by a subscription, rebuilt from the start (the subscriptions spec S8).

A shop sells for a while with no read model at all. Then a deploy adds ``Revenue``, a singleton
that subscribes to every ``Sold`` event with ``start="start"``: the first runner that records
the subscription gives it every shop's retained history, so the totals it computes include the
sales made before it existed, and it keeps up with the sales made after. Each sale is applied
exactly once (S1), in each shop's order (S2).

Run it with ``python -m examples.projection`` (an embedded PostgreSQL when ``AKTER_DATABASE_URL``
is unset); it uses a schema of its own, dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter

#: How long the example waits for the read model to catch up before it gives up.
WITHIN = 30.0


class Sold(akter.Event):
    """One sale of a shop."""

    sku: str
    cents: int


class Till(BaseModel):
    """A shop's own state: how many sales it made."""

    sales: int = 0


class Totals(BaseModel):
    """The read model: revenue per SKU, and how many sales it has applied."""

    cents: dict[str, int] = {}
    applied: int = 0


class Shop(akter.Actor[Till], events=[Sold]):
    """A source: it emits its sales and knows nothing of who reads them."""

    @akter.command
    async def sell(self, sku: str, cents: int) -> None:
        self.state.sales += 1
        self.emit(Sold(sku=sku, cents=cents))


class Revenue(akter.Actor[Totals], singleton=True):
    """The read model: every shop's sales, from the start of the retained history."""

    @akter.subscription(Shop, events=[Sold], route=lambda event, source: "", start="start")
    async def on_sold(self, delivery: akter.Delivery[Sold]) -> None:
        if isinstance(delivery, akter.RetentionGap):
            return  # pruned sales: a real read model would reconcile from the shops here
        sold = delivery.event
        self.state.cents[sold.sku] = self.state.cents.get(sold.sku, 0) + sold.cents
        self.state.applied += 1

    @akter.query
    async def totals(self) -> Totals:
        return self.state


SALES_BEFORE = [("s-1", "tea", 300), ("s-2", "tea", 300), ("s-1", "cake", 450)]
SALES_AFTER = [("s-2", "cake", 450), ("s-3", "tea", 300)]


async def projection_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> Totals:
    """Sell, add the read model to the running system, sell more; the read model's totals."""
    schema = schema or f"projection_{uuid.uuid4().hex[:8]}"
    url = ""
    try:
        async with akter.Runtime([Shop], database_url=database_url, schema=schema) as before:
            url = before.database_url
            for shop, sku, cents in SALES_BEFORE:
                await before.get(Shop, shop).sell(sku, cents)
            echo(f"{len(SALES_BEFORE)} sales made before the read model existed")
        # The deploy that adds the read model: the same schema, code that declares Revenue.
        async with akter.Runtime([Shop, Revenue], database_url=url, schema=schema) as after:
            for shop, sku, cents in SALES_AFTER:
                await after.get(Shop, shop).sell(sku, cents)
            revenue = after.get(Revenue)
            expected = len(SALES_BEFORE) + len(SALES_AFTER)
            deadline = time.monotonic() + WITHIN
            totals = await revenue.totals()
            while totals.applied < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                totals = await revenue.totals()
            echo(f"the read model applied {totals.applied} sales: {totals.cents}")
            return totals
    finally:
        if url:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                await conn.execute(drop)


if __name__ == "__main__":
    asyncio.run(projection_main(os.environ.get("AKTER_DATABASE_URL") or None))
