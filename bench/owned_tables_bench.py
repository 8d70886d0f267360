#!/usr/bin/env python3
"""Owned tables (issue 44): a turn writing state plus 1, 10, 100 owned rows, beside the same
writes by a plain psycopg transaction; and a cross-actor query through an index.

    python bench/owned_tables_bench.py --url URL [--turns 200] [--rows 20000] [--cross-only]

Turns: one runtime, one actor per size, ``--turns`` sequential commands each bumping the state
and inserting N rows (``self.rows(t).insert([...])``: one multi-row INSERT in the commit flight).
The plain transaction does what a hand-written service would: ``BEGIN``, ``SELECT … FOR UPDATE``
of a state row, ``UPDATE`` it, one multi-row ``INSERT`` of N rows, ``COMMIT`` — pipelined in one
flight after the lock, on one connection, no runtime. The ratio is akter's median over the
plain one's (akter also writes a receipt and checks the version fence).

Cross-actor: ``--rows`` rows in a state index (``akter.state_index``, an indexed column) across
``--rows`` actors of one tenant, loaded with one ``INSERT … SELECT`` (the index's row layout
as the turns write it, from ``generate_series``), then ``runtime.rows(index, tenant=…)``
selecting the top 100 over a threshold, ordered by the indexed column, beside the same SQL by
plain psycopg; prints both medians and the plan (``EXPLAIN``). The issue's 1,000,000 rows:
``--rows 1000000 --cross-only``. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import akter

SIZES = (1, 10, 100)


class Tally(BaseModel):
    n: int = 0
    total_cents: int = 0


def declare(schema: str) -> tuple[sa.Table, sa.Table, type[akter.Actor[Tally]]]:
    md = sa.MetaData(schema=schema)
    lines = sa.Table(
        "bench_lines",
        md,
        *akter.owner_columns(),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("j", sa.Integer, primary_key=True),
        sa.Column("cents", sa.BigInteger, nullable=False),
    )
    index = sa.Table(
        "bench_index",
        md,
        *akter.owner_columns(),
        sa.Column("total_cents", sa.BigInteger, nullable=False, index=True),
    )

    class Bench(
        akter.Actor[Tally],
        tables=[lines, akter.state_index(index, lambda s: {"total_cents": s.total_cents})],
        access=akter.public,
    ):
        @akter.command
        async def write(self, rows: int) -> int:
            self.state.n += 1
            self.state.total_cents += rows
            self.rows(lines).insert([{"n": self.state.n, "j": j, "cents": j} for j in range(rows)])
            return self.state.n

    return lines, index, Bench


async def plain(url: str, schema: str, rows: int, turns: int) -> list[float]:
    """The same writes by hand: lock, update, one multi-row insert, commit (one connection)."""
    values = ", ".join(f"(%(n)s, {j}, {j})" for j in range(rows))
    insert = f'INSERT INTO "{schema}".plain_lines (n, j, cents) VALUES {values}'
    took: list[float] = []
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for n in range(1, turns + 1):
            started = time.perf_counter()
            async with conn.pipeline():
                await conn.execute(f'SELECT v FROM "{schema}".plain_state WHERE id = 1 FOR UPDATE')
                await conn.execute(f'UPDATE "{schema}".plain_state SET v = v + 1 WHERE id = 1')
                await conn.execute(insert.encode(), {"n": n + rows * 1_000_000})
            await conn.commit()
            took.append(time.perf_counter() - started)
    return took


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--cross-only", action="store_true", help="skip the turns")
    args = parser.parse_args()
    url, tag = args.url, uuid.uuid4().hex[:8]
    user_schema, akter_schema = f"bench_owned_{tag}", f"bench_akter_{tag}"
    lines, index, bench = declare(user_schema)
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(url))
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(user_schema))
        lines.metadata.create_all(conn)
        conn.exec_driver_sql(
            f'CREATE TABLE "{user_schema}".plain_state (id int PRIMARY KEY, v bigint);'
            f'INSERT INTO "{user_schema}".plain_state VALUES (1, 0);'
            f'CREATE TABLE "{user_schema}".plain_lines (n bigint, j int, cents bigint,'
            " PRIMARY KEY (n, j))"
        )
    engine.dispose()
    try:
        async with akter.Runtime([bench], database_url=url, schema=akter_schema) as runtime:
            if not args.cross_only:
                print(f"turns: {args.turns} per size, sequential; medians in ms")
            for size in () if args.cross_only else SIZES:
                handle: Any = runtime.get(bench, f"size-{size}")
                await handle.write(size)  # warm: the row exists
                took = []
                for _ in range(args.turns):
                    started = time.perf_counter()
                    await handle.write(size)
                    took.append(time.perf_counter() - started)
                base = await plain(url, user_schema, size, args.turns)
                a, p = statistics.median(took) * 1000, statistics.median(base) * 1000
                print(
                    f"  {size:>3} rows: akter {a:7.3f}  plain psycopg {p:7.3f}  ratio {a / p:5.2f}"
                )
            await cross_actor(runtime, url, user_schema, index, args.rows)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{user_schema}" CASCADE')
            conn.execute(f'DROP SCHEMA IF EXISTS "{akter_schema}" CASCADE')


async def cross_actor(
    runtime: akter.Runtime, url: str, schema: str, index: sa.Table, rows: int
) -> None:
    """Load ``rows`` index rows of one tenant, then the top 100 over a threshold, indexed.

    The load is one ``INSERT … SELECT`` from ``generate_series`` (no turns). The query runs
    through ``runtime.rows`` and, as the same SQL text and parameters, by plain psycopg in a
    ``READ ONLY`` transaction on one connection; ``EXPLAIN`` shows the plan it gets.
    """
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".bench_index (routing_key, tenant_id, actor_id, total_cents)'
            " SELECT i, 'acme', 'a-' || i, (i::bigint * 7919) %% 1000000"
            " FROM generate_series(1, %s) i",
            (rows,),
        )
        conn.execute(f'ANALYZE "{schema}".bench_index')
    loaded = time.perf_counter() - started
    tenant = runtime.rows(index, tenant="acme")
    top = tenant.select.where(index.c.total_cents > 990_000)
    top = top.order_by(index.c.total_cents.desc()).limit(100)
    took = []
    for _ in range(50):
        started = time.perf_counter()
        found = await tenant.all(top)
        took.append(time.perf_counter() - started)
    from akter._row_sql import compile_statement

    # The statement as runtime.rows sends it (its tenant filter ANDed once more).
    text, params = compile_statement(top.where(index.c.tenant_id == "acme"))
    base = []
    with psycopg.connect(url) as conn:
        plan = [str(r[0]) for r in conn.execute(("EXPLAIN " + text).encode(), params)]
        conn.rollback()
        for _ in range(50):
            started = time.perf_counter()
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                same = conn.execute(text.encode(), params).fetchall()
            base.append(time.perf_counter() - started)
    assert len(same) == len(found)
    asynchronous = []  # the same, by psycopg's async connection: what asyncio itself costs
    async with await psycopg.AsyncConnection.connect(url) as aconn:
        for _ in range(50):
            started = time.perf_counter()
            async with aconn.transaction():
                await aconn.execute("SET TRANSACTION READ ONLY")
                await (await aconn.execute(text.encode(), params)).fetchall()
            asynchronous.append(time.perf_counter() - started)
    a, p = statistics.median(took) * 1000, statistics.median(base) * 1000
    aa = statistics.median(asynchronous) * 1000
    indexed = any("Index" in line for line in plan)
    print(
        f"cross-actor: {rows:,} rows loaded in {loaded:.1f} s; top {len(found)} over a threshold, "
        f"median of 50: runtime.rows {a:.3f} ms, plain psycopg {p:.3f} ms (async {aa:.3f} ms), "
        f"ratio {a / p:.2f}; "
        f"index used: {'yes' if indexed else 'NO'}"
    )
    print("  plan: " + " / ".join(line.strip().split("  (")[0] for line in plan))


if __name__ == "__main__":
    asyncio.run(main())
