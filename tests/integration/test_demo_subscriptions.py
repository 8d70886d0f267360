"""Part 7 of the demo (``examples/demo_subscriptions.py``) runs and shows what it claims."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from examples.demo_subscriptions import (
    SALES_AFTER,
    SALES_BEFORE,
    render_subscriptions,
    subscriptions_main,
)
from rich.console import Console

pytestmark = pytest.mark.timeout(120)


async def test_the_read_model_added_to_a_running_system_counts_every_sale_once(
    akter_db: str,
) -> None:
    schema = f"subs_{uuid.uuid4().hex[:8]}"
    report = await subscriptions_main(akter_db, schema=schema, echo=print)
    sales = [*SALES_BEFORE, *SALES_AFTER]
    expected: dict[str, int] = {}
    for _, sku, cents in sales:
        expected[sku] = expected.get(sku, 0) + cents
    assert report.recorded == ["DemoRevenue.on_sold (start=start)"]
    # Rebuilt from the start: the sales made before the read model existed are counted.
    assert report.totals.applied == len(sales) and report.totals.cents == expected
    # The rewound feeds were delivered again and acknowledged: nothing applied twice (S1).
    assert report.after_rewind == report.totals
    assert report.handler_runs == len(sales)
    per_till: dict[str, int] = {}
    for till, _, _ in sales:
        per_till[till] = per_till.get(till, 0) + 1
    assert {f.source: (f.head, f.done, f.applied) for f in report.feeds} == {
        till: (n, n, n) for till, n in per_till.items()
    }
    assert any("R1 stopped" in line for line in report.log)
    Console(width=160, record=True).print(render_subscriptions(report))
    with psycopg.connect(akter_db) as conn:  # the part dropped its schema
        left = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchall()
    assert left == []
