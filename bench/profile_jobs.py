#!/usr/bin/env python3
"""Profile of a job drain: the top functions by self time (cProfile), and client CPU per job.

    python bench/profile_jobs.py --url URL [--jobs 5000] [--plain] [--top 30] [--no-profile]

``bench/jobs.py``'s drain in one process, without the peers: ``--jobs`` no-op jobs over actors of
20 (``Worker.noop``, each with its ``on_success`` route; ``--plain``: ``Worker.plain``, none) are
enqueued with the relay off, then the runtime's pass loop starts and the drain runs until every
route turn ran (``--plain``: every attempt ended) and the outbox is empty. Only the drain is
profiled. cProfile's own overhead inflates every figure: use the ranking, not the absolute
numbers; with ``--no-profile`` only the drain's rate and process CPU per job are printed. Not a
test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))

import psycopg
from jobs import ROUTED, Worker, wait_until

import akter


async def run(args: argparse.Namespace) -> None:
    schema = f"akter_profile_jobs_{uuid.uuid4().hex[:8]}"
    job = Worker.plain if args.plain else Worker.noop
    runtime = akter.Runtime(
        actors=[Worker],
        database_url=args.url,
        schema=schema,
        relay=False,
        jobs=[job],
        max_pending_commands=50_000,
        max_resident_actors=args.jobs // 20 + 1000,
        **({"delivery_concurrency": args.delivery} if args.delivery else {}),
    )
    n = args.jobs
    ROUTED.clear()
    try:
        async with runtime:
            handles = [runtime.get(Worker, f"w-{i:05d}") for i in range(n // 20)]
            groups = iter(range(n // 20))

            async def enqueuer() -> None:
                for g in groups:
                    await handles[g].stage("plain" if args.plain else "noop", g * 20, 20, 0)

            await asyncio.gather(*(enqueuer() for _ in range(16)))
            profile = cProfile.Profile() if not args.no_profile else None
            cpu, t = time.process_time(), time.perf_counter()
            if profile is not None:
                profile.enable()
            await runtime._loop.start()
            runtime._loop.wake()
            await wait_until(
                lambda: (runtime._jobs.finished if args.plain else len(ROUTED)) >= n, 600
            )
            if profile is not None:
                profile.disable()
            seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        print(
            f"{n} jobs ({'plain' if args.plain else 'routed'}) in {seconds:.2f} s: "
            f"{n / seconds:,.0f} jobs/s, client CPU {cpu / n * 1e6:,.0f} µs/job"
            f"{' (under cProfile)' if profile is not None else ''}"
        )
        if profile is not None:
            stats = pstats.Stats(profile)
            stats.sort_stats(args.sort).print_stats(args.top)
    finally:
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--url", default=os.environ.get("AKTER_TEST_DATABASE_URL"))
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--plain", action="store_true", help="jobs without an on_success route")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--delivery", type=int, help="delivery_concurrency (default: akter's)")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
