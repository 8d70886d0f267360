"""akter.stage_many: ten thousand commands in one statement (issue 41, part 1).

Statements are counted on the application's own connection (a psycopg cursor class that
counts ``execute`` calls), not estimated: fan-out costs one statement without pinned ids, and
two with them (the probe, then the insert), whatever the count.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import akter
from akter.testing import ActorTest
from tests.integration.stage_actors import ALL, Account, Tally

pytestmark = pytest.mark.timeout(120)


class Counting(psycopg.Cursor[Any]):
    """A cursor that counts the statements sent through it."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        Counting.sent += 1
        return super().execute(*args, **kwargs)


async def totals(t: ActorTest) -> dict[str, int]:
    rows = await t.rows(
        "SELECT actor_id, (state->>'cents')::int AS cents FROM {schema}.actors"
        " WHERE actor_type = 'Tally'"
    )
    return {r["actor_id"]: r["cents"] for r in rows}


async def test_ten_thousand_commands_in_one_statement(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        commands = [akter.staged(Tally, f"a-{i % 100}").add(cents=1) for i in range(10_000)]
        with psycopg.connect(akter_db, cursor_factory=Counting) as conn, conn.transaction():
            Counting.sent = 0
            ids = akter.stage_many(conn, commands, schema=t.schema)
            assert Counting.sent == 1
        assert len(set(ids)) == 10_000
        rows = await t.rows("SELECT count(*) AS n FROM {schema}.outbox")
        assert rows[0]["n"] == 10_000
        await t.drain(rounds=100_000)
        assert await totals(t) == {f"a-{i}": 100 for i in range(100)}


async def test_bulk_with_pinned_ids_is_two_statements(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        pinned = [await t.runtime.mint_command_id() for _ in range(3)]
        commands = [
            akter.staged(Tally, "a-1", command_id=pinned[i % 3]).add(cents=1) for i in range(3)
        ] + [akter.staged(Tally, "a-2").add(cents=2) for _ in range(100)]
        with psycopg.connect(akter_db, cursor_factory=Counting) as conn:
            with conn.transaction():
                Counting.sent = 0
                ids = akter.stage_many(conn, commands, schema=t.schema)
                assert Counting.sent == 2
            assert ids[:3] == pinned
            # Again: the pinned three are no-ops (same payloads), the rest new.
            with conn.transaction():
                again = akter.stage_many(conn, commands, schema=t.schema)
            assert again[:3] == pinned and set(again[3:]).isdisjoint(ids[3:])
        await t.drain(rounds=10_000)
        assert await totals(t) == {"a-1": 3, "a-2": 400}


async def test_bulk_refuses_before_writing(akter_test: Any, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        with pytest.raises(akter.ActorError) as caught:
            [akter.staged(Account, "a-1").deposit(cents=1), akter.staged(Account, "a-1").deposit()]
        assert caught.value.reason == "InvalidInput"
        with psycopg.connect(akter_db) as conn, conn.transaction():
            with pytest.raises(TypeError, match="staged"):
                akter.stage_many(conn, [object()], schema=t.schema)  # type: ignore[list-item]
            assert akter.stage_many(conn, [], schema=t.schema) == []
        rows = await t.rows("SELECT count(*) AS n FROM {schema}.outbox")
        assert rows[0]["n"] == 0
