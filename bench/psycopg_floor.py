#!/usr/bin/env python3
"""Probe: the pgbench turn script driven from Python (psycopg async), without akter.

    python bench/psycopg_floor.py --url URL [--duration 5] [--clients 1] [--nactors 1]
                                  [--driver psycopg|asyncpg|all] [--loop asyncio|uvloop]

It runs ``bench/sql/actor_turn.sql``'s transaction (lock, update, insert receipt, commit) two
ways on one connection per client: ``serial`` (one statement per round trip, as pgbench sends
it: 5 round trips) and ``pipelined`` (BEGIN + lock in one flight, update + insert + COMMIT in a
second: 2 round trips). It shows what the same driver costs per turn with no runtime on top, so
that akter's numbers in ``turns.py`` can be split into driver and runtime time. Not a test.

A third row sends ``pipelined``'s two flights through ``akter._store.pipeline.TurnPipeline``
(what akter's turns use since issue 13's fifth round: libpq's pipeline through ``psycopg.pq``,
prepared statements, one Sync per flight, no psycopg cursor): the driver layer's own floor.

``--driver asyncpg`` (issue 13, goal 7) runs the same SQL through asyncpg (``pip install
'akter[bench]'``), with its statement cache: asyncpg has no pipeline mode for different
statements (only ``executemany`` pipelines, one statement), so its ``serial`` turn is 5 round
trips and its shortest is 3: ``BEGIN``, the prepared lock, then update + insert + ``COMMIT`` as
one simple-query script (parameters inlined, so those three are parsed on every turn).
``--loop uvloop`` runs everything on uvloop's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from akter._store.embedded import EmbeddedPostgres
from akter._store.pipeline import TurnPipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import CpuWindow, _drop_schema, _latency_ms, _pgbench_schema, run_on_loop

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

LOCK = "SELECT generation FROM generations WHERE actor_id = %s FOR UPDATE"
UPDATE = (
    "UPDATE actor_state SET state = jsonb_set(state, '{n}', to_jsonb((state->>'n')::bigint + 1)),"
    " updated_at = now() WHERE actor_id = %s"
)
INSERT = "INSERT INTO receipts (actor_id, generation, result) VALUES (%s, 1, '{\"ok\": true}')"


async def serial(conn: Conn, aid: int) -> None:
    await conn.execute("BEGIN")
    await conn.execute(LOCK, (aid,))
    await conn.execute(UPDATE, (aid,))
    await conn.execute(INSERT, (aid,))
    await conn.execute("COMMIT")


async def pipelined(conn: Conn, aid: int) -> None:
    async with conn.pipeline():
        await conn.execute("BEGIN")
        cur = await conn.execute(LOCK, (aid,))
    await cur.fetchone()
    async with conn.pipeline():
        await conn.execute(UPDATE, (aid,))
        await conn.execute(INSERT, (aid,))
        await conn.execute("COMMIT")


_APG_LOCK = LOCK.replace("%s", "$1")
_APG_UPDATE = UPDATE.replace("%s", "$1")
_APG_INSERT = INSERT.replace("%s", "$1")


async def apg_serial(conn: Any, aid: int) -> None:
    await conn.execute("BEGIN")
    await conn.fetchrow(_APG_LOCK, aid)
    await conn.execute(_APG_UPDATE, aid)
    await conn.execute(_APG_INSERT, aid)
    await conn.execute("COMMIT")


async def apg_script(conn: Any, aid: int) -> None:
    await conn.execute("BEGIN")
    await conn.fetchrow(_APG_LOCK, aid)
    n = int(aid)  # inlined: an int, never text
    await conn.execute(f"{UPDATE % n}; {INSERT % n}; COMMIT")


_PIPES: dict[int, TurnPipeline] = {}


async def pq_pipelined(conn: Conn, aid: int) -> None:
    """``pipelined``'s two flights through akter's ``TurnPipeline`` (psycopg.pq, prepared)."""
    pipe = _PIPES.get(id(conn))
    if pipe is None:
        pipe = _PIPES[id(conn)] = TurnPipeline(conn)
    params = {"aid": aid}
    pipe.enter()
    await pipe.execute("BEGIN")
    lock = await pipe.execute(_NAMED[LOCK], params)
    await pipe.sync()
    await lock.fetchone()
    await pipe.execute(_NAMED[UPDATE], params)
    await pipe.execute(_NAMED[INSERT], params)
    await pipe.execute("COMMIT")
    await pipe.sync()
    pipe.leave()


_NAMED = {text: text.replace("%s", "%(aid)s") for text in (LOCK, UPDATE, INSERT)}


async def _psycopg_connect(url: str, schema: str) -> Conn:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=2)
    await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
    return conn


async def _asyncpg_connect(url: str, schema: str) -> Any:
    import asyncpg  # a bench-only dependency (the "bench" extra)

    return await asyncpg.connect(url, server_settings={"search_path": schema})


async def measure(
    url: str,
    schema: str,
    turn: Callable[[Any, int], Awaitable[None]],
    args: argparse.Namespace,
    connect: Callable[[str, str], Awaitable[Any]] = _psycopg_connect,
) -> dict[str, float]:
    conns: list[Any] = [await connect(url, schema) for _ in range(args.clients)]
    latencies: list[float] = []

    async def client(conn: Any, seed: int, until: float) -> None:
        rng = random.Random(seed)
        while (start := time.perf_counter()) < until:
            await turn(conn, rng.randint(1, args.nactors))
            latencies.append(time.perf_counter() - start)

    try:
        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(client(c, i, warm) for i, c in enumerate(conns)))
        latencies.clear()
        cpu = CpuWindow()
        start = time.perf_counter()
        until = start + args.duration
        await asyncio.gather(*(client(c, 100 + i, until) for i, c in enumerate(conns)))
        seconds = time.perf_counter() - start
        usage = cpu.close()
    finally:
        for conn in conns:
            await conn.close()
    return {
        "turns_per_s": len(latencies) / seconds,
        **_latency_ms(latencies),
        "client_cores": usage["bench_process_cores"],
        "client_cpu_us_per_turn": usage["bench_process_cores"] * seconds / len(latencies) * 1e6,
        "machine_busy_cores": usage["machine_busy_cores"],
    }


async def run(args: argparse.Namespace) -> None:
    embedded: EmbeddedPostgres | None = None
    data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-pg-"))
    url: str = args.url or ""
    if not url:
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    schema = "akter_bench_floor"
    variants: list[tuple[str, Callable[[Any, int], Awaitable[None]], Any]] = []
    if args.driver in ("psycopg", "all"):
        variants += [
            (f"psycopg {psycopg.__version__} serial (5 round trips)", serial, _psycopg_connect),
            (f"psycopg {psycopg.__version__} pipelined (2)", pipelined, _psycopg_connect),
            ("psycopg.pq via akter's TurnPipeline (2, prepared)", pq_pipelined, _psycopg_connect),
        ]
    if args.driver in ("asyncpg", "all"):
        import asyncpg

        version = asyncpg.__version__
        variants += [
            (f"asyncpg {version} serial (5 round trips)", apg_serial, _asyncpg_connect),
            (f"asyncpg {version} script (3)", apg_script, _asyncpg_connect),
        ]
    try:
        print(
            f"| {args.clients} client(s), nactors={args.nactors}, loop {args.loop} "
            "| turns/s | p50 ms | p99 ms | client CPU µs/turn | client cores | machine busy |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, turn, connect in variants:
            await _pgbench_schema(url, schema)
            r = await measure(url, schema, turn, args, connect)
            print(
                f"| {name} | {r['turns_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                f"| {r['client_cpu_us_per_turn']:.0f} | {r['client_cores']:.2f} "
                f"| {r['machine_busy_cores']:.2f} |",
                flush=True,
            )
    finally:
        await _drop_schema(url, schema)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--nactors", type=int, default=1)
    parser.add_argument("--driver", choices=["psycopg", "asyncpg", "all"], default="psycopg")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    run_on_loop(args.loop, run(args))


if __name__ == "__main__":
    main()
