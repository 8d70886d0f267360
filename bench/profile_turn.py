#!/usr/bin/env python3
"""Profile of warm turns: the top functions by self time per turn (cProfile), and CPU per turn.

    python bench/profile_turn.py --url URL [--turns 3000] [--top 30] [--no-profile]
                                 [--loop asyncio|uvloop]

One caller awaits ``Counter.add(1)`` on one warm actor (``turns.py``'s sequential scenario).
With ``--floor psycopg`` (or ``pq``) the same loop runs ``psycopg_floor.py``'s ``pipelined`` turn
(or its ``TurnPipeline`` row) instead, on the pgbench tables, with no akter runtime: under
callgrind, the floor's instructions per turn are counted exactly as akter's.
Without ``--no-profile`` the turns run under cProfile, whose own overhead inflates every figure
(use the ranking, not the absolute numbers); with it, only process CPU per turn is printed. Not
a test.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import Counter, _drop_schema, run_on_loop

import akter


async def run(args: argparse.Namespace) -> None:
    schema = f"akter_profile_{uuid.uuid4().hex[:8]}"
    if args.floor is not None:
        await run_floor(args, schema)
        return
    try:
        async with akter.Runtime(actors=[Counter], database_url=args.url, schema=schema) as rt:
            handle = rt.get(Counter, "profile-0")
            for _ in range(300):
                await handle.add(1)
            profile = cProfile.Profile() if args.profile else None
            cpu, wall, t0 = time.process_time(), time.perf_counter(), os.times()
            if profile is not None:
                profile.enable()
            for _ in range(args.turns):
                await handle.add(1)
            if profile is not None:
                profile.disable()
            cpu, wall, t1 = time.process_time() - cpu, time.perf_counter() - wall, os.times()
    finally:
        await _drop_schema(args.url, schema)
    if not args.turns:
        return  # N=0: the baseline of a callgrind count (startup and shutdown only)
    print(
        f"{args.turns} warm turns: {cpu / args.turns * 1e6:.0f} µs client CPU per turn "
        f"(user {(t1.user - t0.user) / args.turns * 1e6:.0f}, "
        f"system {(t1.system - t0.system) / args.turns * 1e6:.0f}), "
        f"{args.turns / wall:.0f} turns/s{' (under cProfile)' if profile else ''}"
    )
    if profile is not None:
        stats = pstats.Stats(profile)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
        total = sum(v[2] for _, v in rows)
        per_turn = total / args.turns * 1e6
        calls = stats.total_calls / args.turns  # type: ignore[attr-defined]
        print(f"{calls:.0f} Python function calls per turn (deterministic, unlike the times)")
        print(f"| self µs/turn | calls/turn | function (total self {per_turn:.0f} µs/turn) |")
        print("|---|---|---|")
        for (path, line, name), (_cc, nc, tt, _ct, _callers) in rows[: args.top]:
            where = f"{Path(path).name}:{line}" if line else path
            print(f"| {tt / args.turns * 1e6:.1f} | {nc / args.turns:.1f} | {name} ({where}) |")


async def run_floor(args: argparse.Namespace, schema: str) -> None:
    """The psycopg floor's pipelined turn (``--floor``) in the same loop, without akter."""
    from psycopg_floor import _psycopg_connect, pipelined, pq_pipelined
    from turns import _pgbench_schema

    turn = pipelined if args.floor == "psycopg" else pq_pipelined
    await _pgbench_schema(args.url, schema)
    try:
        conn = await _psycopg_connect(args.url, schema)
        try:
            for _ in range(300):
                await turn(conn, 1)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.turns):
                await turn(conn, 1)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            await conn.close()
    finally:
        await _drop_schema(args.url, schema)
    if args.turns:
        print(
            f"{args.turns} floor turns ({args.floor}): "
            f"{cpu / args.turns * 1e6:.0f} µs client CPU per turn, {args.turns / wall:.0f} turns/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument(
        "--floor", choices=["psycopg", "pq"], help="run the psycopg floor's turn, not akter's"
    )
    args = parser.parse_args()
    run_on_loop(args.loop, run(args))


if __name__ == "__main__":
    main()
