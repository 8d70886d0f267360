"""Part 7 of the demo: a read model added to a running system (``make demo``; subscriptions spec).

Three tills sell tea and cake on R1, a runner whose code has no read model. Then a deploy adds
``Revenue``, a singleton that subscribes to every ``Sold`` event with ``start="start"``: R2, a
runner with the new code, starts beside the running R1 and records the subscription. Because
it is new and declared ``start="start"``, R2 gives it a feed for every till with events (S8),
so the read model is rebuilt from the start of the retained history: the sales made before it
existed are counted. R1 then stops (the rolling deploy ends) and the tills sell on R2; the read
model keeps up, each sale applied once (S1), in each till's order (S2).

Last, the feeds are rewound to the start, as a runner killed before it recorded its progress
would leave them: the lane delivers every sale again, and the read model's applied cursors,
committed in its own turns, acknowledge them without running its handler (S1). The totals do
not move. This part uses a schema of its own, dropped at the end.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel
from rich.console import Group
from rich.table import Table

import akter

#: The pass loop's poll of this part's runners (the subscriptions lane runs in each pass).
POLL = 0.1
WITHIN = 30.0
HERE = Path(__file__).resolve()


class Sold(akter.Event, tag="demo.sold"):
    """One sale of a till."""

    sku: str
    cents: int


class TillState(BaseModel):
    """A till's own state: how many sales it made."""

    sales: int = 0


class Totals(BaseModel):
    """The read model: revenue per SKU, and how many sales it applied."""

    cents: dict[str, int] = {}
    applied: int = 0


class Till(akter.Actor[TillState], name="DemoTill", events=[Sold]):
    """A source: it emits its sales and knows nothing of who reads them."""

    @akter.command
    async def sell(self, sku: str, cents: int) -> int:
        self.state.sales += 1
        self.emit(Sold(sku=sku, cents=cents))
        return self.state.sales


class Revenue(akter.Actor[Totals], name="DemoRevenue", singleton=True):
    """The read model, added by the deploy: every till's sales, from the start."""

    @akter.subscription(Till, events=[Sold], route=lambda event, source: "", start="start")
    async def on_sold(self, delivery: akter.Delivery[Sold]) -> None:
        if isinstance(delivery, akter.RetentionGap):
            return  # pruned sales: a real read model would reconcile from the tills here
        sold = delivery.event
        self.state.cents[sold.sku] = self.state.cents.get(sold.sku, 0) + sold.cents
        self.state.applied += 1

    @akter.query
    async def totals(self) -> Totals:
        return self.state


#: Sales on R1, before the read model exists, and on R2, after the deploy.
SALES_BEFORE = [
    ("t-1", "tea", 300),
    ("t-2", "tea", 300),
    ("t-1", "cake", 450),
    ("t-3", "tea", 300),
    ("t-2", "cake", 450),
]
SALES_AFTER = [("t-3", "cake", 450), ("t-1", "tea", 300), ("t-2", "tea", 300)]


@dataclass
class FeedRow:
    """One subscription feed (one per till): its newest cursor and what was delivered."""

    source: str
    head: int
    done: int
    applied: int


@dataclass
class SubscriptionsReport:
    """What part 7 observed."""

    recorded: list[str] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)
    after_rewind: Totals = field(default_factory=Totals)
    feeds: list[FeedRow] = field(default_factory=list)
    handler_runs: int = 0
    log: list[str] = field(default_factory=list)


def _runtime(url: str | None, schema: str, actors: list[Any], **options: Any) -> akter.Runtime:
    return akter.Runtime(actors=actors, database_url=url, schema=schema, poll=POLL, **options)


async def _rows(url: str, query: sql.Composed, *params: Any) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def _until(what: str, check: Callable[[], Awaitable[bool]], within: float = WITHIN) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {within} s.")
        await asyncio.sleep(0.05)


async def _feeds(url: str, schema: str) -> list[FeedRow]:
    rows = await _rows(
        url,
        sql.SQL(
            "SELECT f.actor_id, f.head, f.done, coalesce(c.applied, 0) AS applied"
            " FROM {s}.subscription_feeds f LEFT JOIN {s}.subscription_cursors c"
            " ON c.subscription = f.subscription AND c.source_type = f.actor_type"
            " AND c.source_id = f.actor_id ORDER BY f.actor_id"
        ).format(s=sql.Identifier(schema)),
    )
    return [FeedRow(r["actor_id"], r["head"], r["done"], r["applied"]) for r in rows]


async def subscriptions_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> SubscriptionsReport:
    """Run part 7 and return what it observed (the schema is dropped at the end)."""
    schema = schema or f"subs_{uuid.uuid4().hex[:8]}"
    report = SubscriptionsReport()

    def say(text: str) -> None:
        report.log.append(text)
        echo(text)

    r1 = _runtime(database_url, schema, [Till])
    url = ""
    try:
        await r1.start()
        url = r1.database_url
        try:
            await _scenario(r1, url, schema, report, say)
        finally:
            await r1.stop()  # stopped already in the scenario, unless it failed early
    finally:
        if url:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            await _rows(url, drop)
    return report


async def _scenario(
    r1: akter.Runtime,
    url: str,
    schema: str,
    report: SubscriptionsReport,
    say: Callable[[str], None],
) -> None:
    for till, sku, cents in SALES_BEFORE:
        await r1.get(Till, till).sell(sku, cents)
    say(f"R1 (code without a read model) rang up {len(SALES_BEFORE)} sales on three tills.")
    async with _runtime(url, schema, [Till, Revenue]) as r2:
        query = sql.SQL("SELECT name, start FROM {}.subscriptions").format(sql.Identifier(schema))

        async def recorded() -> bool:
            rows = await _rows(url, query)
            report.recorded = [f"{r['name']} (start={r['start']})" for r in rows]
            return bool(rows)

        await _until("R2 recording the subscription", recorded)
        say(
            "R2 (code with the read model DemoRevenue) started beside R1 and recorded "
            f"{', '.join(report.recorded)}: a feed for every till with events."
        )
        await r1.stop()
        say("R1 stopped: the rolling deploy is over. The tills sell on R2.")
        for till, sku, cents in SALES_AFTER:
            await r2.get(Till, till).sell(sku, cents)
        revenue = r2.get(Revenue)
        expected = len(SALES_BEFORE) + len(SALES_AFTER)

        async def caught_up() -> bool:
            return (await revenue.totals()).applied >= expected

        await _until("the read model catching up", caught_up)
        report.totals = await revenue.totals()
        say(f"The read model applied {report.totals.applied} sales: {report.totals.cents}.")
        await _rows(
            url,
            sql.SQL("UPDATE {}.subscription_feeds SET done = 0").format(sql.Identifier(schema)),
        )
        say("Every feed rewound to 0, as a runner killed before recording its progress leaves it.")

        async def redelivered() -> bool:
            return all(f.done == f.head for f in await _feeds(url, schema))

        await _until("the feeds delivered again", redelivered)
        report.after_rewind = await revenue.totals()
        report.feeds = await _feeds(url, schema)
        receipts = await _rows(
            url,
            sql.SQL(
                "SELECT count(*) AS n FROM {}.receipts WHERE actor_type = 'DemoRevenue'"
            ).format(sql.Identifier(schema)),
        )
        report.handler_runs = int(receipts[0]["n"])
        say(
            f"Delivered again, acknowledged by the applied cursors: still "
            f"{report.after_rewind.applied} sales, {report.after_rewind.cents}."
        )


def render_subscriptions(report: SubscriptionsReport) -> Group:
    """The part's tables: the read model, and each till's feed beside its applied cursor."""
    model = Table(title="The read model (DemoRevenue)", title_justify="left")
    for column in ("", "after the catch-up", "after the rewind"):
        model.add_column(column)
    for sku in sorted(report.totals.cents):
        after = str(report.after_rewind.cents.get(sku, 0))
        model.add_row(f"{sku} (cents)", str(report.totals.cents[sku]), after)
    model.add_row("sales applied", str(report.totals.applied), str(report.after_rewind.applied))
    feeds = Table(
        title=f"Feeds of {', '.join(report.recorded)} (handler turns: {report.handler_runs})",
        title_justify="left",
    )
    for column in ("till", "head (newest sale)", "done (delivered)", "applied (its cursor)"):
        feeds.add_column(column)
    for f in report.feeds:
        feeds.add_row(f.source, str(f.head), str(f.done), str(f.applied))
    return Group(model, feeds)


if __name__ == "__main__":
    import os

    sys.path.insert(0, str(HERE.parents[1]))  # as a script, examples/ is not a package
    found = asyncio.run(subscriptions_main(os.environ.get("AKTER_DATABASE_URL") or None))
    from rich.console import Console

    Console().print(render_subscriptions(found))
