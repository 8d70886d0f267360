#!/usr/bin/env python3
"""Instructions (callgrind) or CPU per turn with many callers on many warm actors (issue 45).

    python bench/profile_many.py --url URL [--turns 2000] [--callers 64] [--actors 500]
                                 [--loop asyncio|uvloop]
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python bench/profile_many.py --url URL --turns N      # (N − N=0) / N per turn

``bench/turns.py``'s ``many`` scenario as a fixed count of turns instead of a duration: every
actor is warmed first (one turn each), then ``--callers`` callers share ``--turns`` calls of
``Counter.add(1)`` on actors drawn from a seeded generator, so two runs make the same calls and
a callgrind count over N turns minus one over none is the instructions of the N turns alone
(``pool_wait`` is long: under callgrind 64 callers wait for 20 connections far beyond 2 s).
That count does not drift with the machine's load (the shared 2-core machine of these rounds),
which the CPU time does. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import Counter, _drop_schema, run_on_loop

import akter


async def run(args: argparse.Namespace) -> None:
    schema = f"akter_many_{uuid.uuid4().hex[:8]}"
    picks = random.Random(7)
    try:
        async with akter.Runtime(
            actors=[Counter],
            database_url=args.url,
            schema=schema,
            pool_size=args.pool_size,
            pool_wait=600,  # under callgrind every turn is ~50× slower: no pool timeouts
        ) as rt:
            handles = [rt.get(Counter, f"a{i}") for i in range(args.actors)]
            for i in range(0, args.actors, args.callers):
                await asyncio.gather(*(h.add(1) for h in handles[i : i + args.callers]))
            left = args.turns

            async def caller() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    await picks.choice(handles).add(1)

            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(args.callers)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await _drop_schema(args.url, schema)
    if args.turns:
        print(
            f"{args.turns} turns, {args.callers} callers over {args.actors} warm actors: "
            f"{cpu / args.turns * 1e6:.0f} µs client CPU per turn, {args.turns / wall:.0f} turns/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--actors", type=int, default=500)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    run_on_loop(args.loop, run(args))


if __name__ == "__main__":
    main()
