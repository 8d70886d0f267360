"""Owned-row writes under SIGKILLed runners: nothing lost, nothing doubled, all or nothing.

Child runners (``tests.faults.owned_child``) post to a few accounts, each post writing its state
and ``ROWS`` owned rows in one turn, and are SIGKILLed mid-stream, round after round. The check
reads the database alone: every acknowledged post is there with all its rows; every post that
is there at all (acknowledged or in flight at a kill) has all ``ROWS`` rows under one number;
each account's state counts exactly its posts, numbered 1..n without a gap.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from akter.testing import ActorTest
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.owned_child import ROWS, ledger_table
from tests.integration.owned_actors import create_owned

pytestmark = [pytest.mark.kill, pytest.mark.timeout(300)]

Make = Callable[..., ActorTest]
ROUNDS = 4
#: Acknowledgements a child gets before it is killed (its loops are then mid-post).
ACKS_PER_ROUND = 40


@pytest.fixture
def table_schema(akter_db: str) -> Iterator[str]:
    name = f"owned_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    create_owned(akter_db, ledger_table(name).metadata)
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


async def test_sigkilled_runners_lose_and_double_no_owned_row(
    akter_test: Make, table_schema: str
) -> None:
    acked: set[str] = set()
    sent: set[str] = set()
    async with akter_test([]) as t:
        for round_no in range(ROUNDS):
            proc = await start_module(
                "tests.faults.owned_child", t.database_url, t.schema, table_schema, f"r{round_no}"
            )
            async with ChildProcess(proc, f"owned runner {round_no}") as child:
                await child.ready()
                got = 0
                while got < ACKS_PER_ROUND:
                    word, tag, *_ = (await child.line()).split()
                    if word == "SENT":
                        sent.add(tag)
                    elif word == "ACK":
                        acked.add(tag)
                        got += 1
                await child.kill()  # loops are mid-post: some turns die holding their rows
                assert child.proc.stdout is not None
                for line in (await child.proc.stdout.read()).decode().splitlines():
                    word, tag, *_ = line.split()  # printed before the kill, read after it
                    (sent if word == "SENT" else acked).add(tag)
        # One snapshot for every read: a killed runner's backend may still finish a COMMIT it
        # had received, and two reads around it would see its state without its rows.
        async with await psycopg.AsyncConnection.connect(t.database_url) as conn:
            await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f'SELECT actor_id, n, j, tag FROM "{table_schema}".ledger_lines')
            lines = await cur.fetchall()
            await cur.execute(t.substitute("SELECT actor_id, state FROM {schema}.actors"))
            states = await cur.fetchall()
    per_tag = Counter(r["tag"] for r in lines)
    numbers = {(r["actor_id"], r["n"]) for r in lines}
    tag_numbers = {r["tag"]: (r["actor_id"], r["n"]) for r in lines}
    assert sent - acked, "no post was in flight at a kill: the drill tested nothing"
    assert acked and acked <= set(per_tag), "an acknowledged post lost its rows"
    assert set(per_tag) <= sent
    assert all(count == ROWS for count in per_tag.values()), "a post's rows are partial/doubled"
    assert len(tag_numbers) == len(numbers), "a post committed twice under two numbers"
    for state in states:
        n = state["state"]["n"]
        mine = sorted(k for a, k in numbers if a == state["actor_id"])
        assert mine == list(range(1, n + 1)), f"{state}: posts numbered {mine[-3:]}"
