"""What a SyncRuntime adds to a call: the thread hop, beside the same turn awaited in asyncio.

    PYTHONPATH=src .venv/bin/python bench/sync_bridge.py --url postgresql://postgres@127.0.0.1/test

Four figures, each the median of ``--reps`` rounds on a fresh schema (dropped at the end):

- ``bridge``: ``rt.run(noop())`` — the hop alone (no database), µs per call;
- ``async turn`` / ``sync turn``: one command turn at a time, awaited in the runtime's loop vs
  called from a thread through the SyncRuntime, µs per call;
- ``16 threads``: 16 threads calling one SyncRuntime (one actor each), calls/s, beside 16 tasks
  awaiting the async handle.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid

import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter


class Count(BaseModel):
    n: int = 0


class Counter(akter.Actor[Count], access=akter.public):
    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


async def noop() -> None:
    return None


def per_call_us(fn: object, calls: int) -> float:
    assert callable(fn)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def threads_rate(rt: akter.SyncRuntime, threads: int, calls: int) -> float:
    barrier = threading.Barrier(threads + 1)

    def work(n: int) -> None:
        barrier.wait()
        for _ in range(calls):
            rt.get(Counter, f"t-{n}").call(Counter.bump)

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    return threads * calls / (time.perf_counter() - started)


async def async_figures(
    rt: akter.SyncRuntime, calls: int, threads: int, each: int
) -> tuple[float, float]:
    handle = rt.runtime.get(Counter, "async")
    started = time.perf_counter()
    for _ in range(calls):
        await handle.bump()
    sequential = (time.perf_counter() - started) / calls * 1e6

    async def work(n: int) -> None:
        h = rt.runtime.get(Counter, f"a-{n}")
        for _ in range(each):
            await h.bump()

    started = time.perf_counter()
    await asyncio.gather(*(work(n) for n in range(threads)))
    return sequential, threads * each / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    schema = f"bench_sync_{uuid.uuid4().hex[:8]}"
    rows: dict[str, list[float]] = {}
    try:
        with akter.SyncRuntime(actors=[Counter], database_url=args.url, schema=schema) as rt:
            rt.get(Counter, "warm").call(Counter.bump)
            sync = rt.get(Counter, "sync")
            for _ in range(args.reps):
                rows.setdefault("bridge (µs/call)", []).append(
                    per_call_us(lambda: rt.run(noop()), args.calls * 10)
                )
                rows.setdefault("sync turn (µs/call)", []).append(
                    per_call_us(lambda: sync.call(Counter.bump), args.calls)
                )
                sequential, concurrent = rt.run(async_figures(rt, args.calls, 16, args.calls // 4))
                rows.setdefault("async turn (µs/call)", []).append(sequential)
                rows.setdefault("16 threads, sync (calls/s)", []).append(
                    threads_rate(rt, 16, args.calls // 4)
                )
                rows.setdefault("16 tasks, async (calls/s)", []).append(concurrent)
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    for name, values in rows.items():
        print(f"{name:32} median {statistics.median(values):10.1f}   rounds {values}")


if __name__ == "__main__":
    main()
