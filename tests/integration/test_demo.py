"""The demo (``examples/demo.py``) runs end to end on a real PostgreSQL and shows what it claims."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from examples.demo import CONCURRENT_DEPOSITS, Row, main, render

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
