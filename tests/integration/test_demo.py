"""The demo (``examples/demo.py``) runs end to end on a real PostgreSQL and shows what it claims."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from examples.demo import (
    ANSWERED,
    CONCURRENT_DEPOSITS,
    PLACED,
    REMIND_AFTER,
    REMINDED,
    SHORT_REMIND_AFTER,
    OrdersReport,
    Row,
    main,
    orders_main,
    render,
    render_orders,
)
from rich.console import Console

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def rows(akter_db: str) -> AsyncIterator[list[Row]]:
    schema = f"demo_{uuid.uuid4().hex[:12]}"
    try:
        yield await main(akter_db, schema=schema)
    finally:
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def by_command(rows: list[Row], command: str) -> list[Row]:
    return [row for row in rows if row.command == command]


async def test_steps_are_numbered_and_rendered(rows: list[Row]) -> None:
    assert [row.step for row in rows] == list(range(1, len(rows) + 1))
    assert render(rows).row_count == len(rows)


async def test_idempotent_retry_replays_once(rows: list[Row]) -> None:
    first, retry = by_command(rows, "alice.deposit(500)")
    assert first.command_id == retry.command_id
    assert (first.replayed, retry.replayed) == (False, True)
    assert first.result == retry.result
    assert first.balance == retry.balance == 10_500  # 10,000 + 500, once


async def test_declared_error_replays_with_equal_fields(rows: list[Row]) -> None:
    refused, replayed, fresh = by_command(rows, "bob.withdraw(5_000)")
    assert refused.error == replayed.error == "InsufficientFunds"
    assert refused.result == replayed.result == "InsufficientFunds(balance=2500, requested=5000)"
    assert refused.command_id == replayed.command_id != fresh.command_id
    assert (refused.replayed, replayed.replayed) == (False, True)
    assert replayed.balance == 7_500  # a fresh execution would have succeeded
    assert fresh.error is None and fresh.balance == 2_500


async def test_not_created_and_command_conflict(rows: list[Row]) -> None:
    (ghost,) = by_command(rows, "ghost.deposit(100)")
    assert ghost.error == "NotCreated" and ghost.balance is None
    (used,) = by_command(rows, "alice.deposit(700)")
    (conflict,) = by_command(rows, "alice.deposit(900)")
    assert used.error is None and used.command_id == conflict.command_id
    assert conflict.error == "CommandConflict"
    assert conflict.balance == used.balance == 11_200  # the conflicting call changed nothing


async def test_concurrent_deposits_are_exact(rows: list[Row]) -> None:
    (row,) = [row for row in rows if row.command.startswith("gather(")]
    assert row.error is None
    assert row.balance == CONCURRENT_DEPOSITS * 100
    # One version bump per committed transaction: at least one, at most one per deposit.
    match = re.search(r"row version 1 → (\d+)", row.result)
    assert match is not None, row.result
    assert 2 <= int(match.group(1)) <= 1 + CONCURRENT_DEPOSITS


async def test_tenants_are_separate(rows: list[Row]) -> None:
    acme, globex = by_command(rows, "shared.open('Shared')")
    assert acme.error is None and globex.error is None  # both opened: two different actors
    assert by_command(rows, "shared.deposit(1_000)")[0].balance == 1_000
    assert by_command(rows, "shared.deposit(7_000)")[0].balance == 7_000


# --- part 2: orders, intents, timers and live feeds --------------------------------------------


@pytest.fixture(scope="module")
def orders(akter_db: str) -> Iterator[tuple[OrdersReport, float]]:
    """One run of the orders part (it waits for a real timer), shared by the tests below."""
    schema = f"demo_{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    try:
        report = asyncio.run(orders_main(akter_db, schema=schema, echo=lambda line: None))
        yield report, time.perf_counter() - started
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_orders_part_is_quick(orders: tuple[OrdersReport, float]) -> None:
    _, elapsed = orders
    assert elapsed < 20


def test_orders_reserve_stock_by_intent(orders: tuple[OrdersReport, float]) -> None:
    report, _ = orders
    stock = {sku: (level.on_hand, level.held) for sku, level in report.stock.items()}
    assert stock == {
        "apple": (8, {"A-1": 2}),
        "pear": (4, {"A-1": 1}),
        "plum": (2, {}),  # five wanted, two in stock: nothing held
    }
    a1, b2 = report.orders["A-1"], report.orders["B-2"]
    assert (a1.status, a1.held, a1.reminders) == ("confirmed", {"apple": 2, "pear": 1}, 0)
    assert (b2.status, b2.short, b2.reminders) == ("waiting", {"plum": 2}, 1)


def test_outbox_before_and_after_delivery(orders: tuple[OrdersReport, float]) -> None:
    report, _ = orders
    assert list(report.outbox) == [PLACED, ANSWERED, REMINDED]
    placed = report.outbox[PLACED]
    intents = {(r.sender, r.target) for r in placed if r.kind == "intent"}
    assert intents == {
        ("Order/A-1", "Inventory/apple.reserve"),
        ("Order/A-1", "Inventory/pear.reserve"),
        ("Order/B-2", "Inventory/plum.reserve"),
    }
    assert all(r.due_in <= 0 for r in placed if r.kind == "intent")  # due at once
    timers = {r.sender: r for r in placed if r.kind == "timer"}
    assert set(timers) == {"Order/A-1", "Order/B-2"}
    assert all(r.timer_key == "remind" for r in timers.values())
    assert all(REMIND_AFTER - 60 < r.due_in <= REMIND_AFTER for r in timers.values())
    # Delivered: the intents are gone, A-1's reminder was cancelled, and B-2's was replaced:
    # still one row for the key, a new row id, due in seconds instead of an hour.
    (replaced,) = report.outbox[ANSWERED]
    assert (replaced.sender, replaced.kind, replaced.timer_key) == ("Order/B-2", "timer", "remind")
    assert replaced.target == "Order/B-2.remind"
    assert replaced.intent_id != timers["Order/B-2"].intent_id
    assert replaced.due_in <= SHORT_REMIND_AFTER
    assert report.outbox[REMINDED] == []  # the replacement fired and was deleted


def test_live_feeds_show_each_event_once_as_it_commits(
    orders: tuple[OrdersReport, float],
) -> None:
    report, _ = orders
    by_order = {order: [e for e in report.events if e.order == order] for order in report.orders}
    for events in by_order.values():
        assert [e.cursor for e in events] == [str(i) for i in range(1, len(events) + 1)]
    a1 = [e.tag for e in by_order["A-1"]]
    assert a1 == ["OrderPlaced", "LineReserved", "LineReserved", "OrderConfirmed"]
    held = sorted(e.summary for e in by_order["A-1"] if e.tag == "LineReserved")
    assert held == ["apple × 2 held", "pear × 1 held"]
    assert [e.tag for e in by_order["B-2"]] == ["OrderPlaced", "LineShort", "ReminderSent"]
    # Printed live, one line per event, in arrival order: the reminder line came a timer's
    # delay after the shortage line, not at the end of the run.
    assert len(report.printed) == len(report.events)
    assert all(
        f"#{e.cursor}  {e.tag}" in line
        for e, line in zip(report.events, report.printed, strict=True)
    )
    short, reminded = by_order["B-2"][1:]
    assert reminded.at - short.at >= SHORT_REMIND_AFTER - 0.5


def test_orders_render(orders: tuple[OrdersReport, float]) -> None:
    report, _ = orders
    console = Console(record=True, width=160)
    console.print(render_orders(report))
    text = console.export_text()
    for phrase in (
        "cancelled (cancel_timer)",
        "replaced by …",
        "fired, then deleted",
        "no pending rows",
        "ReminderSent",
        "A-1 × 2",
    ):
        assert phrase in text, phrase
