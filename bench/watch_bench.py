#!/usr/bin/env python3
"""Query watches vs event feeds under a commit load (issue 42, docs/guides/live.md).

    python bench/watch_bench.py --url URL [--watchers 1000] [--actors 100] [--duration 10]
                                [--rate 200] [--runners 1] [--json FILE]

On a fresh schema (dropped afterwards), ``--watchers`` in-process watches of a watchable query
are spread evenly over ``--actors`` actors; a writer commits ``--rate`` deposits per second on
random actors for ``--duration`` s. Then the same with as many live event feeds
(``handle.events()``) in place of the watches. With ``--runners 2`` the writes go through a
second runtime on the same schema (``notify=True``), so every update crosses the live channel.

Each line: readers, updates delivered per second (all readers), lag from the writer's
return to delivery (p50/p99 ms; an upper bound of commit → delivery), and the memory the readers
hold (tracemalloc's growth after they opened, per reader). A watch coalesces: with
``watch_min_interval`` (0.1 s) and a per-actor commit rate above 10/s it delivers fewer values
than there are commits, by design; a feed delivers every event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

SELF = Path(__file__).resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != SELF.parent]
sys.path.insert(0, str(SELF.parent.parent / "src"))

import psycopg  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import akter  # noqa: E402

#: When each actor's latest commit returned, by (actor id, balance): the lag's start.
COMMITTED: dict[tuple[str, int], float] = {}


class Tally(BaseModel):
    n: int = 0


class Added(akter.Event, tag="bench.watch.added"):
    n: int


class Meter(akter.Actor[Tally], access=akter.public, events=[Added]):
    @akter.command
    async def add(self) -> int:
        self.state.n += 1
        self.emit(Added(n=self.state.n))
        return self.state.n

    @akter.query(watch=True)
    async def total(self) -> int:
        return self.state.n


async def _writer(runtime: akter.Runtime, actors: list[str], rate: int, until: float) -> int:
    commits = 0
    interval = 1 / rate
    next_at = time.monotonic()
    while time.monotonic() < until:
        actor_id = random.choice(actors)
        n = await runtime.get(Meter, actor_id).add()
        COMMITTED[(actor_id, n)] = time.monotonic()
        commits += 1
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return commits


async def _read(kind: str, handle: Any, actor_id: str, lags: list[float], opened: Any) -> None:
    try:
        await _follow(kind, handle, actor_id, lags, opened)
    except Exception as exc:
        print(f"a {kind} reader of {actor_id} failed: {exc!r}", file=sys.stderr)
        opened()


async def _follow(kind: str, handle: Any, actor_id: str, lags: list[float], opened: Any) -> None:
    if kind == "watch":
        stream = handle.total.watch()
        await anext(stream)
        opened()
        async for n in stream:
            _lag(actor_id, n, lags)
    else:
        stream = aiter(handle.events(after=None))
        opened()
        async for record in stream:
            _lag(actor_id, record.event.n, lags)


def _lag(actor_id: str, n: int, lags: list[float]) -> None:
    at = COMMITTED.get((actor_id, n))
    if at is not None:
        lags.append(time.monotonic() - at)


async def _round(
    kind: str, reader: akter.Runtime, writer: akter.Runtime, args: Any
) -> dict[str, Any]:
    actors = [f"m{i}" for i in range(args.actors)]
    COMMITTED.clear()
    lags: list[float] = []
    ready = asyncio.Semaphore(0)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    tasks = []
    for i in range(args.watchers):
        actor_id = actors[i % len(actors)]
        reader_handle = reader.get(Meter, actor_id)
        read = _read(kind, reader_handle, actor_id, lags, ready.release)
        tasks.append(asyncio.create_task(read))
    for _ in tasks:
        await ready.acquire()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    started = time.monotonic()
    commits = await _writer(writer, actors, args.rate, started + args.duration)
    await asyncio.sleep(0.5)  # the last deliveries
    elapsed = time.monotonic() - started
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    ordered = sorted(lags) or [0.0]
    return {
        "kind": kind,
        "readers": args.watchers,
        "actors": args.actors,
        "commits": commits,
        "updates_per_s": round(len(lags) / elapsed, 1),
        "lag_p50_ms": round(statistics.median(ordered) * 1000, 1),
        "lag_p99_ms": round(
            ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0] * 1000, 1
        ),
        "bytes_per_reader": int(grown / max(1, args.watchers)),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--actors", type=int, default=100)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--runners", type=int, choices=(1, 2), default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    schema = f"watch_bench_{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {
        "database_url": args.url,
        "schema": schema,
        "notify": args.runners == 2,
        "pool_size": 20,
        "max_watchers": max(10_000, args.watchers),
    }
    results = []
    try:
        async with akter.Runtime([Meter], **options) as reader:
            writer = reader
            if args.runners == 2:
                writer = akter.Runtime([Meter], **options)
                await writer.start()
            try:
                for kind in ("watch", "events"):
                    result = await _round(kind, reader, writer, args)
                    results.append(result)
                    print(json.dumps(result))
            finally:
                if writer is not reader:
                    await writer.stop()
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]
    if args.json:
        line = json.dumps({"runners": args.runners, "results": results}) + "\n"
        await asyncio.to_thread(_append, args.json, line)


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line)


if __name__ == "__main__":
    asyncio.run(main())
