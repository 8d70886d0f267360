#!/usr/bin/env python3
"""Subscriptions benchmark (issue 40): fan-out, fan-in and intents, in one run.

    python -P bench/subscriptions_bench.py --url URL [--subscribers 1000] [--sources 1000]
                                          [--events 10] [--json bench/results/subscriptions.jsonl]

Each scenario gets a schema of its own on the server at ``--url`` (dropped at the end) and one
runtime hosting every type (``notify=False``: the in-process wake).

1. **Fan-out.** ``--subscribers`` inboxes follow one source (dynamic subscriptions, from "now");
   the source then emits ``--events`` events, one per command.
2. **Fan-in.** ``--sources`` sources emit one event each, routed to one singleton subscriber.
3. **Intents** (the comparator, same run): ``--sources`` senders each ``send`` one intent to one
   receiver.

For each: deliveries per second (first source commit to last delivery applied), the lag from the
source's commit (its call returning, ``time.monotonic()``) to the subscriber's handler, p50 and
p99, and per delivered event the server's committed transactions and written rows
(``pg_stat_database`` deltas over the scenario: every runner statement counts, the polls too).
Statements are not counted: that needs ``pg_stat_statements``, absent from the test server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter

#: When each source commit returned, by (source id, cursor); when each delivery ran.
COMMITTED: dict[tuple[str, int], float] = {}
LAGS: list[float] = []
DONE = asyncio.Event()
EXPECTED = {"n": 0}


def applied(key: tuple[str, int]) -> None:
    LAGS.append(time.monotonic() - COMMITTED.get(key, time.monotonic()))
    if len(LAGS) >= EXPECTED["n"]:
        DONE.set()


class Tick(akter.Event):
    n: int


class Count(BaseModel):
    n: int = 0


class Source(akter.Actor[Count], events=[Tick]):
    @akter.command
    async def tick(self) -> int:
        self.state.n += 1
        self.emit(Tick(n=self.state.n))
        return self.state.n


class Follower(akter.Actor[Count]):
    @akter.subscription(Source, events=[Tick])
    async def on_tick(self, delivery: akter.Delivery[Tick]) -> None:
        self.state.n += 1
        applied((delivery.source.id, delivery.cursor))

    @akter.command
    async def follow(self, source: str) -> None:
        self.subscribe(Follower.on_tick, source_id=source)


class Sink(akter.Actor[Count], singleton=True):
    @akter.subscription(Source, events=[Tick], route=lambda event, source: "")
    async def on_tick(self, delivery: akter.Delivery[Tick]) -> None:
        self.state.n += 1
        applied((delivery.source.id, delivery.cursor))


class Receiver(akter.Actor[Count]):
    @akter.command
    async def take(self, sender: str) -> None:
        self.state.n += 1
        applied((sender, 1))


class Sender(akter.Actor[Count]):
    @akter.command
    async def fire(self) -> None:
        self.send(Receiver.take, "r", self.id)


async def stats(url: str) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted"
            " FROM pg_stat_database WHERE datname = current_database()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def scenario(
    url: str,
    name: str,
    actors: Sequence[type[Any]],
    setup: Callable[[akter.Runtime], Awaitable[None]],
    produce: Callable[[akter.Runtime], Awaitable[None]],
    expected: int,
) -> dict[str, Any]:
    schema = f"bench_sub_{uuid.uuid4().hex[:8]}"
    COMMITTED.clear()
    LAGS.clear()
    DONE.clear()
    EXPECTED["n"] = expected
    try:
        async with akter.Runtime(actors, database_url=url, schema=schema, notify=False) as rt:
            await setup(rt)
            LAGS.clear()
            DONE.clear()
            before = await stats(url)
            started = time.monotonic()
            await produce(rt)
            await asyncio.wait_for(DONE.wait(), 600)
            elapsed = time.monotonic() - started
            after = await stats(url)
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
    lags = sorted(LAGS)
    return {
        "scenario": name,
        "deliveries": len(lags),
        "deliveries_per_s": round(len(lags) / elapsed, 1),
        "lag_p50_ms": round(1000 * statistics.median(lags), 1),
        "lag_p99_ms": round(1000 * lags[min(len(lags) - 1, int(len(lags) * 0.99))], 1),
        "xacts_per_delivery": round((after[0] - before[0]) / len(lags), 2),
        "rows_written_per_delivery": round((after[1] - before[1]) / len(lags), 2),
    }


async def main(a: argparse.Namespace) -> list[dict[str, Any]]:
    async def follow_all(rt: akter.Runtime) -> None:
        await asyncio.gather(*(rt.get(Follower, f"f{i}").follow("s") for i in range(a.subscribers)))

    async def tick_one(rt: akter.Runtime) -> None:
        for _ in range(a.events):
            n = await rt.get(Source, "s").tick()
            COMMITTED[("s", n)] = time.monotonic()

    async def nothing(rt: akter.Runtime) -> None:
        return None

    async def tick_many(rt: akter.Runtime) -> None:
        async def one(i: int) -> None:
            n = await rt.get(Source, f"s{i}").tick()
            COMMITTED[(f"s{i}", n)] = time.monotonic()

        await asyncio.gather(*(one(i) for i in range(a.sources)))

    async def fire_many(rt: akter.Runtime) -> None:
        async def one(i: int) -> None:
            await rt.get(Sender, f"x{i}").fire()
            COMMITTED[(f"x{i}", 1)] = time.monotonic()

        await asyncio.gather(*(one(i) for i in range(a.sources)))

    # Per delivery a follower's commit timestamp is looked up by (source, cursor); the fan-out
    # shares one key per event across its followers.
    return [
        await scenario(
            a.url,
            f"fan-out 1 -> {a.subscribers} dynamic",
            [Source, Follower],
            follow_all,
            tick_one,
            a.subscribers * a.events,
        ),
        await scenario(
            a.url, f"fan-in {a.sources} -> 1 routed", [Source, Sink], nothing, tick_many, a.sources
        ),
        await scenario(
            a.url, f"intents {a.sources} -> 1", [Sender, Receiver], nothing, fire_many, a.sources
        ),
    ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/subscriptions_bench.py")
    parser.add_argument("--url", required=True)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    rows = asyncio.run(main(args))
    for row in rows:
        print(json.dumps(row))
    if args.json is not None:
        with args.json.open("a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    sys.exit(0)
