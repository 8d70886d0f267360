#!/usr/bin/env python3
"""Job output streams (issue 42): chunk throughput of one job and of several, smoke size.

    python bench/job_streams.py --url postgresql://postgres@127.0.0.1:5432/test \
        [--jobs 1,8] [--chunks 20000] [--size 8] [--reps 2]

One ``akter.Runtime`` (relay and executor) in a throwaway schema. Each rep enqueues ``jobs``
jobs at once; each job's executor streams ``chunks`` chunks of ``size`` characters as fast as it
can (``call.stream`` in a loop, yielding to the event loop every 100 chunks) and returns. The
figures: chunks stored per second, from the first enqueue until every job's ``Closed`` item is
committed (so the batched, fenced appends, the settle and the close are all in), the number of
append statements (flushes) that took, and one in-process reader's rate reading a finished job's
whole stream. Nothing here is asserted; see docs/benchmarks.md for the figures and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter
from akter.job_streams import Closed


class Spec(BaseModel):
    """How much one job streams."""

    chunks: int
    size: int


class Nothing(BaseModel):
    """No state."""


class Streamer(akter.Actor[Nothing]):
    """One job that streams as fast as it can."""

    @akter.command
    async def go(self, chunks: int, size: int) -> str:
        """Enqueue the streaming job."""
        return self.enqueue(Streamer.pour, Spec(chunks=chunks, size=size))

    @akter.job(attempts=1, timeout=600)
    async def pour(call: akter.JobCall, spec: Spec) -> int:
        """Stream ``spec.chunks`` chunks."""
        token = "x" * spec.size
        for i in range(spec.chunks):
            call.stream(token)
            if i % 100 == 99:
                await asyncio.sleep(0)
        return spec.chunks


async def rep(runtime: akter.Runtime, jobs: int, chunks: int, size: int) -> dict[str, float]:
    """One measurement: ``jobs`` jobs streaming ``chunks`` chunks each."""
    handles = [runtime.get(Streamer, f"s-{uuid.uuid4().hex[:8]}") for _ in range(jobs)]
    started = time.perf_counter()
    ids = await asyncio.gather(*(h.go(chunks, size) for h in handles))

    async def closed(handle: Streamer, job_id: str) -> int:
        n = 0
        async for item in handle.job_stream(job_id):
            n += 1
            if isinstance(item, Closed):
                return n
        return n

    read = await asyncio.gather(*(closed(h, j) for h, j in zip(handles, ids, strict=True)))
    elapsed = time.perf_counter() - started
    t0 = time.perf_counter()
    again = await closed(handles[0], ids[0])
    reread = time.perf_counter() - t0
    assert all(n == chunks + 2 for n in read) and again == chunks + 2, (read, again)
    return {
        "chunks_per_s": jobs * chunks / elapsed,
        "elapsed_s": elapsed,
        "reader_items_per_s": again / reread,
    }


async def flushes(url: str, schema: str) -> int:
    """How many append statements the schema's streams took (distinct commit instants)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        query = sql.SQL(
            "SELECT count(DISTINCT (job_id, at_ms, attempt)) FROM {}.job_streams"
            " WHERE item <> 'closed'"
        ).format(sql.Identifier(schema))
        cur = await conn.execute(query)
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def main() -> None:
    """Run the reps and print one line per (jobs, rep)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", default="1,8")
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    schema = f"bench_streams_{uuid.uuid4().hex[:8]}"
    try:
        async with akter.Runtime([Streamer], database_url=args.url, schema=schema) as runtime:
            for jobs in (int(n) for n in args.jobs.split(",")):
                for n in range(args.reps):
                    got = await rep(runtime, jobs, args.chunks, args.size)
                    print(
                        f"jobs={jobs} rep={n + 1} chunks={args.chunks}x{args.size}B "
                        f"stored {got['chunks_per_s']:,.0f} chunks/s "
                        f"({got['elapsed_s']:.2f} s to every close), "
                        f"one reader re-reads {got['reader_items_per_s']:,.0f} items/s"
                    )
        print(f"append statements (approx., by commit instant): {await flushes(args.url, schema)}")
    finally:
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


if __name__ == "__main__":
    asyncio.run(main())
