"""A runner writing owned rows in a child process, for the owned-tables kill drill.

Usage (from the repository root)::

    python -m tests.faults.owned_child URL SCHEMA TABLE_SCHEMA TAG

Starts a runtime hosting :func:`ledger_actor` on ``SCHEMA`` (its table in ``TABLE_SCHEMA``),
prints ``READY <pid>``, then runs ``WORKERS`` concurrent loops of ``Ledger.post`` on ``ACTORS``
accounts until it is killed. Before each call a loop prints ``SENT <tag>``, after an answer
``ACK <tag> <n>`` (the post's number in its account); a tag is ``TAG-<loop>-<i>``, its command id
minted for it and retried, with the same id, on an error.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

import akter

WORKERS = 4
ACTORS = 3
#: Rows per post: each post writes this many lines in its turn.
ROWS = 5


class Books(BaseModel):
    n: int = 0


def ledger_table(schema: str) -> sa.Table:
    """The drill's owned table: one row per (post, j), tagged with the post's tag."""
    return sa.Table(
        "ledger_lines",
        sa.MetaData(schema=schema),
        *akter.owner_columns(),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("j", sa.Integer, primary_key=True),
        sa.Column("tag", sa.Text, nullable=False),
    )


def ledger_actor(table: sa.Table) -> type[akter.Actor[Books]]:
    """The drill's actor: ``post`` numbers the post in its state and writes ``ROWS`` lines."""

    class Ledger(akter.Actor[Books], tables=[table], access=akter.public):
        @akter.command
        async def post(self, tag: str) -> int:
            self.state.n += 1
            self.rows(table).insert([{"n": self.state.n, "j": j, "tag": tag} for j in range(ROWS)])
            return self.state.n

    return Ledger


def say(line: str) -> None:
    """One protocol line to the parent, flushed at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def work(url: str, schema: str, table_schema: str, tag: str) -> None:
    """Post until killed (module docstring)."""
    ledger = ledger_actor(ledger_table(table_schema))
    async with akter.Runtime([ledger], database_url=url, schema=schema) as runtime:

        async def loop(w: int) -> None:
            i = 0
            while True:
                i += 1
                name = f"{tag}-{w}-{i}"
                handle: Any = runtime.get(ledger, f"acct-{(w + i) % ACTORS}")
                cid = await runtime.mint_command_id()
                say(f"SENT {name}")
                while True:
                    try:
                        n = await handle.with_command_id(cid).post(name)
                        break
                    except akter.ActorError as exc:
                        if exc.reason == "Defect":
                            raise
                say(f"ACK {name} {n}")

        import os

        say(f"READY {os.getpid()}")
        await asyncio.gather(*(loop(w) for w in range(WORKERS)))


if __name__ == "__main__":
    url, schema, table_schema, tag = sys.argv[1:5]
    asyncio.run(work(url, schema, table_schema, tag))
