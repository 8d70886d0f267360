#!/usr/bin/env python3
"""What staging a command adds to the application's transaction (issue 41), beside a plain INSERT.

    python bench/stage_bench.py --url URL [--n 500] [--bulk 10000] [--rounds 3]

Creates a fresh schema (a runtime starts once to migrate it, then stops: nothing delivers, so
the outbox only grows), then times, on one sync psycopg connection, transactions that each do
the application's own ``INSERT`` and then:

- ``app only``: nothing more (the baseline transaction);
- ``+ plain INSERT``: one ``INSERT INTO outbox`` of the same row shape, its values computed in
  Python (what a hand-written outbox row costs: the floor);
- ``+ akter.stage``: ``akter.stage(conn, Account, id).deposit(cents=1)``;
- ``+ akter.stage pinned``: the same with a pinned command id (a probe, then the insert).

Per variant: statements sent (counted by a cursor class) and round trips (the same here: no
pipeline), the transaction's median and p99 latency, and the client's µs inside the staging call
(validation, the row, the driver) beside the statement's own time. Then bulk: ``stage_many`` of
``--bulk`` commands in one transaction, against one ``INSERT … SELECT FROM unnest`` of the same
rows built by hand. Not a test: numbers vary with the machine (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from pydantic import BaseModel

import akter
from akter._ids import canonical_json, mint_command_id, placement_key, routing_key


class Balance(BaseModel):
    cents: int = 0


class Account(akter.Actor[Balance]):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents


class Counting(psycopg.Cursor[Any]):
    """Counts the statements sent through it."""

    sent = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        Counting.sent += 1
        return super().execute(*args, **kwargs)


PLAIN = (
    "INSERT INTO {s}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type,"
    " actor_id, target_type, target_id, command, payload, payload_version, caller, due_at_ms,"
    " scheduled_at_ms) VALUES (%s, %s, %s, 'intent', 'default', '$transaction', '', 'Account',"
    " %s, 'deposit', %s, 0, %s, %s, %s)"
)
PLAIN_BULK = (
    "INSERT INTO {s}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type,"
    " actor_id, target_type, target_id, command, payload, payload_version, caller, due_at_ms,"
    " scheduled_at_ms) SELECT u.rk, u.id, (u.rk >> 56)::smallint, 'intent', 'default',"
    " '$transaction', '', 'Account', u.aid, 'deposit', u.payload, 0, u.caller, u.due, u.due"
    " FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[])"
    " AS u(rk, id, aid, payload, caller, due)"
)
CALLER = '{"kind":"System","source":"transaction","ref":null,"on_behalf_of":null}'


def plain_row(i: int, now_ms: int) -> tuple[Any, ...]:
    rk = routing_key(placement_key("tenant", "default", "Account", f"a-{i}"))
    cid = mint_command_id(now_ms, 86_400_000)
    return (rk, cid, rk >> 56, f"a-{i}", canonical_json({"cents": 1}), CALLER, now_ms, now_ms)


def run(
    conn: psycopg.Connection[Any], schema: str, n: int, extra: Callable[[int], None]
) -> tuple[list[float], list[float], float]:
    """``n`` transactions; per transaction its latency and the time inside ``extra`` (µs)."""
    latencies: list[float] = []
    inside: list[float] = []
    Counting.sent = 0
    for i in range(n):
        start = time.perf_counter()
        with conn.transaction():
            conn.execute(f"INSERT INTO {schema}.app_orders VALUES (%s)", (i,))
            before = time.perf_counter()
            extra(i)
            inside.append((time.perf_counter() - before) * 1e6)
        latencies.append((time.perf_counter() - start) * 1e6)
    # BEGIN and COMMIT go through the connection, not a cursor: only the statements count.
    return latencies, inside, Counting.sent / n


def line(name: str, base: float, result: tuple[list[float], list[float], float]) -> str:
    latencies, inside, statements = result
    median = statistics.median(latencies)
    p99 = statistics.quantiles(latencies, n=100)[98]
    return (
        f"{name:<24} statements/tx {statements:4.1f}  tx median {median:8.0f} µs"
        f"  p99 {p99:8.0f} µs  added {median - base:+7.0f} µs"
        f"  in call {statistics.median(inside):6.0f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("AKTER_TEST_DATABASE_URL"))
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--bulk", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    schema = f"akter_stage_bench_{uuid.uuid4().hex[:8]}"

    async def migrate() -> None:
        runtime = akter.Runtime([Account], database_url=args.url, schema=schema, relay=False)
        async with runtime:
            pass

    asyncio.run(migrate())
    try:
        with psycopg.connect(args.url, cursor_factory=Counting) as conn:
            conn.execute(f"CREATE TABLE {schema}.app_orders (n int)")
            conn.commit()
            now_ms = int(time.time() * 1000)
            pinned = [mint_command_id(now_ms, 86_400_000) for _ in range(args.n * args.rounds)]
            plain_rows = [plain_row(i, now_ms) for i in range(args.n)]
            sql = PLAIN.format(s=schema)

            def plain(i: int) -> None:
                rk, _, *rest = plain_rows[i]
                conn.execute(sql, (rk, str(uuid.uuid4()), *rest))

            def staged(i: int) -> None:
                akter.stage(conn, Account, f"a-{i}", schema=schema).deposit(cents=1)

            def staged_pinned(i: int) -> None:
                stager = akter.stage(
                    conn, Account, f"a-{i}", command_id=pinned.pop(), schema=schema
                )
                stager.deposit(cents=1)

            variants: dict[str, Callable[[int], None]] = {
                "app only": lambda i: None,
                "+ plain INSERT": plain,
                "+ akter.stage": staged,
                "+ akter.stage pinned": staged_pinned,
            }
            print(f"{args.n} transactions per variant, {args.rounds} alternating rounds")
            for round_no in range(args.rounds):
                base = statistics.median(run(conn, schema, args.n, variants["app only"])[0])
                print(f"round {round_no + 1}")
                for name, extra in variants.items():
                    print("  " + line(name, base, run(conn, schema, args.n, extra)))
            bulk(conn, schema, args.bulk)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def bulk(conn: psycopg.Connection[Any], schema: str, count: int) -> None:
    """``stage_many`` of ``count`` commands against one hand-built ``INSERT … unnest``."""
    start = time.perf_counter()
    commands = [akter.staged(Account, f"b-{i}").deposit(cents=1) for i in range(count)]
    built = time.perf_counter()
    Counting.sent = 0
    with conn.transaction():
        akter.stage_many(conn, commands, schema=schema)
    staged_at = time.perf_counter()
    sent = Counting.sent
    now_ms = int(time.time() * 1000)
    rows = [plain_row(i, now_ms) for i in range(count)]
    hand_built = time.perf_counter()
    with conn.transaction():
        conn.execute(
            PLAIN_BULK.format(s=schema),
            (
                [r[0] for r in rows],
                [str(uuid.uuid4()) for _ in rows],
                [r[3] for r in rows],
                [r[4] for r in rows],
                [r[5] for r in rows],
                [r[6] for r in rows],
            ),
        )
    done = time.perf_counter()
    total = staged_at - start
    print(
        f"bulk {count}: stage_many {count / total:,.0f} commands/s ({sent} statement; "
        f"build {built - start:.3f} s, statement {staged_at - built:.3f} s); "
        f"hand-built unnest INSERT {count / (done - hand_built + hand_built - staged_at):,.0f} "
        f"rows/s (build {hand_built - staged_at:.3f} s, statement {done - hand_built:.3f} s)"
    )


if __name__ == "__main__":
    main()
