#!/usr/bin/env python3
"""Probe (issue 45): a one-flight turn whose lock is sent before its handler runs.

    python bench/early_guard.py --url URL [--duration 5] [--work-us 0,100,200] [--reps 2]

A warm one-flight turn runs its handlers first and then sends ``BEGIN``, the guard, the writes
and ``COMMIT`` together: the server is idle while the client works, and the client while the
server works. But the guard needs nothing the handlers make (the cached version, the batch's
ids, the handlers' ``now`` are known before they run), so it could be sent first and the
server could lock and check while the handlers run; the writes and ``COMMIT`` follow, and the
answers of both parts are read once, after ``COMMIT``: still one round trip of waiting.

This probe measures the overlap alone, without akter: one connection, one actor, the pgbench
turn's statements (``psycopg_floor.py``'s), and a stand-in for the handler's work (a busy loop
of ``--work-us``) between the two sends, two ways:

- ``after``: work, then ``BEGIN``, lock, update, insert, ``COMMIT`` in one flight (today);
- ``early``: ``BEGIN`` and the lock sent and flushed, work, then update, insert, ``COMMIT``.

Prints turns/s, p50 and the client's CPU per turn for each. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

LOCK = "SELECT n FROM turns WHERE id = 1 FOR UPDATE"
UPDATE = "UPDATE turns SET n = n + 1 WHERE id = 1"
INSERT = "INSERT INTO receipts (id, result) VALUES (%s, '{\"ok\": true}')"

Conn = psycopg.AsyncConnection[tuple[Any, ...]]


def _busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


async def turn(conn: Conn, shape: str, work_us: float) -> None:
    receipt = uuid.uuid4().hex
    async with conn.pipeline() as pipe:
        if shape == "early":
            await conn.execute("BEGIN")
            await conn.execute(LOCK)
            conn.pgconn.flush()  # on the wire before the work (the socket takes it at once)
            _busy(work_us)
        else:
            _busy(work_us)
            await conn.execute("BEGIN")
            await conn.execute(LOCK)
        await conn.execute(UPDATE)
        await conn.execute(INSERT, (receipt,))
        await conn.execute("COMMIT")
        await pipe.sync()


async def measure(conn: Conn, shape: str, work_us: float, duration: float) -> dict[str, float]:
    for _ in range(200):
        await turn(conn, shape, work_us)
    laps: list[float] = []
    cpu = time.process_time()
    stop = time.monotonic() + duration
    began = time.monotonic()
    while time.monotonic() < stop:
        t = time.perf_counter()
        await turn(conn, shape, work_us)
        laps.append(time.perf_counter() - t)
    wall = time.monotonic() - began
    laps.sort()
    return {
        "turns_s": len(laps) / wall,
        "p50_ms": 1000 * laps[len(laps) // 2],
        "cpu_us": 1e6 * (time.process_time() - cpu) / len(laps),
    }


async def run(args: argparse.Namespace) -> None:
    schema = f"akter_early_{uuid.uuid4().hex[:8]}"
    conn = await psycopg.AsyncConnection.connect(args.url, autocommit=True)
    ident = sql.Identifier(schema)
    try:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        await conn.execute(sql.SQL("SET search_path TO {}").format(ident))
        await conn.execute("CREATE TABLE turns (id int PRIMARY KEY, n bigint NOT NULL)")
        await conn.execute("CREATE TABLE receipts (id text PRIMARY KEY, result jsonb)")
        await conn.execute("INSERT INTO turns VALUES (1, 0)")
        print("| rep | handler work µs | shape | turns/s | p50 ms | client CPU µs/turn |")
        print("|---|---|---|---|---|---|")
        for rep in range(1, args.reps + 1):
            for work in (float(w) for w in args.work_us.split(",")):
                for shape in ("after", "early"):
                    r = await measure(conn, shape, work, args.duration)
                    print(
                        f"| {rep} | {work:.0f} | {shape} | {r['turns_s']:,.0f} | "
                        f"{r['p50_ms']:.3f} | {r['cpu_us']:.0f} |",
                        flush=True,
                    )
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--work-us", default="0,100,200")
    parser.add_argument("--reps", type=int, default=2)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
