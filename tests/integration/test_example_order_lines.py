"""The owned-tables example (``examples/order_lines.py``) runs and shows what it claims."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from examples.order_lines import AKTER_SCHEMA, SCHEMA, Report, main

from tests._support.citus import ON_CITUS

pytestmark = [
    pytest.mark.timeout(120),
    # The example is one server's flow: on Citus the application's migration must also distribute
    # the table co-located with akter's actors (docs/guides/owned-tables.md, "On Citus"), which
    # the owned-tables suites do (owned_actors.py) and the start check enforces.
    pytest.mark.skipif(ON_CITUS, reason="the example creates its owned table for one server"),
]


@pytest.fixture(scope="module")
def report(akter_db: str) -> Iterator[Report]:
    try:
        yield asyncio.run(main(akter_db, echo=lambda line: None))
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            conn.execute(f"DROP SCHEMA IF EXISTS {AKTER_SCHEMA} CASCADE")


def test_the_report_is_the_tenants_only(report: Report) -> None:
    assert report.big_lines == [("o-1", "apple", 120), ("o-2", "gift-plum", 300)]


def test_lines_written_before_and_during_the_migration_keep_the_default(report: Report) -> None:
    assert report.gifts == [
        ("o-1", "apple", False),
        ("o-1", "pear", False),
        ("o-2", "gift-plum", True),
    ]
