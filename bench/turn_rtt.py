#!/usr/bin/env python3
"""Sequential warm turns over loopback and over an injected network round trip (issue 45).

    python -P bench/turn_rtt.py --url postgresql://postgres@127.0.0.1:5432/test \
        [--rtt-ms 1.0] [--duration 10] [--reps 2] [--no-dbos] [--no-loopback] [--loop uvloop]

One caller, one warm actor, one side after another on the same server, each for ``--duration``
seconds after a warm-up, on two paths: straight to the server (loopback) and through
``bench/delay_proxy.c`` (compiled on first use to ``bench/.delay_proxy``), a TCP proxy that holds
every chunk a fixed time in each direction. Its hold is calibrated so that a plain
``SELECT 1`` round trip through it has a p50 of ``--rtt-ms`` (the proxy's own hops included, as a
network's would be); the calibrated figure is printed. The kernel here has no ``netem``.

Sides (every one a durable write of one actor's state, committed before the call returns):

* ``akter one flight``: ``handle.add(1)`` with ``TurnEngine.one_flight`` on (the default);
* ``akter two flights``: the same with it off (the turn before issue 45);
* ``pgbench``: ``pgbench -n -f bench/sql/actor_turn.sql -D nactors=1 -c 1 -j 1`` (lock, update,
  receipt, commit: one statement per round trip), latencies from ``-l``;
* ``psycopg serial``: the same transaction from psycopg async, one statement per round trip;
* ``psycopg one flight``: the same five statements in one pipeline with one Sync (the floor:
  what a driver alone pays for one flight; its CPU per turn is the issue's "pipelined psycopg
  floor");
* ``DBOS step``: a DBOS Transact workflow of one step called inline, sequentially (in
  ``bench/.venv-peers``, as ``bench/jobs_run.sh`` makes it; skipped with ``--no-dbos`` or when
  that virtualenv is missing).

CPU per turn is the process's CPU time (``time.process_time``, all threads) over the timed run
divided by its turns: akter's includes its runtime's background loops. ``--loop uvloop`` runs
every Python side (akter's and psycopg's) on uvloop's event loop instead of asyncio's. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel

import akter
from akter._engine.turn.engine import TurnEngine

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import turns as turns_bench  # noqa: E402  (bench/turns.py: pgbench's schema and log parsing)

PROXY_SOURCE = BENCH_DIR / "delay_proxy.c"
PROXY_BINARY = BENCH_DIR / ".delay_proxy"
PEERS_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"


class Tally(BaseModel):
    n: int = 0


class Bench(akter.Actor[Tally]):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


# --- the proxy ------------------------------------------------------------------------------------


def _proxy_binary() -> Path:
    if not PROXY_BINARY.exists() or PROXY_BINARY.stat().st_mtime < PROXY_SOURCE.stat().st_mtime:
        subprocess.run(
            ["cc", "-O2", "-pthread", "-o", str(PROXY_BINARY), str(PROXY_SOURCE)], check=True
        )
    return PROXY_BINARY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def delay_proxy(upstream: str, delay_us: int) -> Iterator[str]:
    """Run the proxy in front of ``upstream``; yield the URL that goes through it."""
    params = conninfo_to_dict(upstream)
    host = socket.gethostbyname(str(params.get("host") or "127.0.0.1"))
    port = _free_port()
    process = subprocess.Popen(
        [str(_proxy_binary()), str(port), host, str(params.get("port") or 5432), str(delay_us)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()  # "listening on ..."
        yield make_conninfo(upstream, host="127.0.0.1", port=str(port), hostaddr=None)
    finally:
        process.kill()
        process.wait()


async def select1_p50(url: str, n: int = 600) -> float:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        laps = []
        for _ in range(n):
            started = time.perf_counter()
            await (await conn.execute("SELECT 1")).fetchone()
            laps.append((time.perf_counter() - started) * 1000)
    return statistics.median(laps)


async def calibrate(url: str, target_ms: float) -> tuple[int, float]:
    """The hold (µs each way) whose ``SELECT 1`` round trip is ``target_ms`` at p50."""
    with delay_proxy(url, 0) as through:
        overhead = await select1_p50(through)
    delay = max(0, round((target_ms - overhead) * 500))
    for _ in range(3):
        with delay_proxy(url, delay) as through:
            got = await select1_p50(through)
        if abs(got - target_ms) < 0.02:
            break
        delay = max(0, delay + round((target_ms - got) * 500))
    return delay, got


# --- sides ----------------------------------------------------------------------------------------


async def _timed(call: Callable[[], Awaitable[object]], duration: float) -> dict[str, float]:
    laps: list[float] = []
    cpu = time.process_time()
    started = time.perf_counter()
    while time.perf_counter() - started < duration:
        t = time.perf_counter()
        await call()
        laps.append((time.perf_counter() - t) * 1000)
    wall = time.perf_counter() - started
    return _summary(laps, wall, (time.process_time() - cpu) * 1e6 / len(laps))


def _summary(laps: list[float], wall: float, cpu_us: float | None) -> dict[str, float]:
    cuts = statistics.quantiles(laps, n=100)
    return {
        "turns": len(laps),
        "rate": len(laps) / wall,
        "p50": statistics.median(laps),
        "p90": cuts[89],
        "p99": cuts[98],
        "cpu_us": cpu_us if cpu_us is not None else float("nan"),
    }


async def akter_side(url: str, direct: str, one_flight: bool, duration: float) -> dict[str, float]:
    TurnEngine.one_flight = one_flight
    schema = f"akter_rtt_{uuid.uuid4().hex[:10]}"
    runtime = akter.Runtime([Bench], database_url=url, schema=schema)
    await runtime.start()
    try:
        handle = runtime.get(Bench, "one")
        for _ in range(200):  # cold, then warm; every pooled connection prepared
            await handle.add(1)
        return await _timed(lambda: handle.add(1), duration)
    finally:
        await runtime.stop()
        TurnEngine.one_flight = True
        async with await psycopg.AsyncConnection.connect(direct, autocommit=True) as conn:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            await conn.execute(drop)


TURN = [
    "BEGIN",
    "SELECT generation FROM generations WHERE actor_id = 1 FOR UPDATE",
    "UPDATE actor_state SET state = jsonb_set(state, '{n}', to_jsonb((state->>'n')::bigint + 1)),"
    " updated_at = now() WHERE actor_id = 1",
    "INSERT INTO receipts (actor_id, generation, result) VALUES (1, 1, '{\"ok\": true}')",
    "COMMIT",
]


async def psycopg_side(url: str, schema: str, pipelined: bool, duration: float) -> dict[str, float]:
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, prepare_threshold=0, options=f"-c search_path={schema}"
    ) as conn:

        async def serial() -> None:
            for statement in TURN:
                await conn.execute(statement.encode())

        async def one_flight() -> None:
            async with conn.pipeline():
                for statement in TURN:
                    await conn.execute(statement.encode())

        call = one_flight if pipelined else serial
        for _ in range(200):
            await call()
        return await _timed(call, duration)


async def pgbench_side(url: str, schema: str, duration: float) -> dict[str, float]:
    logdir = Path(tempfile.mkdtemp(prefix="akter-rtt-pgbench-"))
    prefix = logdir / "pgb"
    args = [*turns_bench._pgbench_args(1, 1), "-T", str(int(duration)), "-l"]
    args.append(f"--log-prefix={prefix}")
    code, out, _ = await turns_bench._run_pgbench(url, schema, args, duration + 120)
    if code != 0:
        raise RuntimeError(f"pgbench failed ({code}):\n{out}")
    laps = [s * 1000 for s in turns_bench._pgbench_latencies(prefix)]
    rate = turns_bench._pgbench_number(r"^tps = ([\d.]+)", out) or 0.0
    summary = _summary(laps, len(laps) / rate if rate else duration, None)
    summary["rate"] = rate
    return summary


DBOS_SCRIPT = r"""
import json, logging, sys, time, statistics
import psycopg
from dbos import DBOS, DBOSConfig
dsn, duration = sys.argv[1], float(sys.argv[2])
admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
with psycopg.connect(admin, autocommit=True) as c:
    c.execute('DROP DATABASE IF EXISTS "bench_dbos_rtt" WITH (FORCE)')
    c.execute('CREATE DATABASE "bench_dbos_rtt"')
info = psycopg.conninfo.conninfo_to_dict(dsn)
url = f"postgresql://{info.get('user', 'postgres')}@{info['host']}:{info['port']}/bench_dbos_rtt"

@DBOS.step()
def step(i):
    return i + 1

@DBOS.workflow()
def wf(i):
    return step(i)

DBOS(config={"name": "rtt", "system_database_url": url, "log_level": "WARNING"})
DBOS.launch()
logging.getLogger("dbos").setLevel(logging.WARNING)
for i in range(200):
    wf(i)
laps = []
cpu = time.process_time()
start = time.perf_counter()
i = 1000
while time.perf_counter() - start < duration:
    t = time.perf_counter(); wf(i); laps.append((time.perf_counter() - t) * 1000); i += 1
wall = time.perf_counter() - start
cpu_us = (time.process_time() - cpu) * 1e6 / len(laps)
print(json.dumps({"laps": laps, "wall": wall, "cpu_us": cpu_us}))
DBOS.destroy()
"""


async def dbos_side(url: str, duration: float) -> dict[str, float]:
    params = conninfo_to_dict(url)
    dsn = make_conninfo(url, host=socket.gethostbyname(str(params.get("host") or "127.0.0.1")))
    process = await asyncio.create_subprocess_exec(
        str(PEERS_PYTHON),
        "-P",
        "-c",
        DBOS_SCRIPT,
        dsn,
        str(duration),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode:
        raise RuntimeError(f"DBOS side failed:\n{err.decode()[-2000:]}")
    got = json.loads(out.decode().strip().splitlines()[-1])
    return _summary(got["laps"], got["wall"], got["cpu_us"])


# --- orchestration --------------------------------------------------------------------------------


async def run_path(url: str, direct: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    schema = f"pgbench_rtt_{uuid.uuid4().hex[:8]}"
    await turns_bench._pgbench_schema(direct, schema)
    try:
        sides: dict[str, dict[str, float]] = {}
        sides["akter one flight"] = await akter_side(url, direct, True, args.duration)
        sides["akter two flights"] = await akter_side(url, direct, False, args.duration)
        sides["pgbench actor_turn.sql"] = await pgbench_side(url, schema, args.duration)
        sides["psycopg serial"] = await psycopg_side(url, schema, False, args.duration)
        sides["psycopg one flight"] = await psycopg_side(url, schema, True, args.duration)
        if not args.no_dbos and PEERS_PYTHON.exists():
            sides["DBOS step (inline workflow)"] = await dbos_side(url, args.duration)
        return sides
    finally:
        await turns_bench._drop_schema(direct, schema)


def show(title: str, sides: dict[str, dict[str, float]]) -> None:
    base = sides["pgbench actor_turn.sql"]["rate"]
    floor = sides["psycopg one flight"]["cpu_us"]
    print(f"\n{title}")
    print("| side | turns/s | × pgbench | p50 ms | p90 ms | p99 ms | CPU µs/turn | × floor CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for name, s in sides.items():
        ratio = s["cpu_us"] / floor if s["cpu_us"] == s["cpu_us"] else float("nan")
        print(
            f"| {name} | {s['rate']:,.0f} | {s['rate'] / base:.2f} | {s['p50']:.3f} | "
            f"{s['p90']:.3f} | {s['p99']:.3f} | {s['cpu_us']:.0f} | {ratio:.2f} |"
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--url", required=True, help="PostgreSQL URL (TCP)")
    parser.add_argument("--rtt-ms", type=float, default=1.0, help="injected round trip (p50)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per side")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--no-dbos", action="store_true")
    parser.add_argument("--no-loopback", action="store_true")
    parser.add_argument("--json", help="append one JSON line per path and rep here")
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop of every Python side (uvloop: the bench or dev extra)",
    )
    return parser.parse_args()


async def main(args: argparse.Namespace) -> None:
    print(f"server: {args.url}; loopback SELECT 1 p50 {await select1_p50(args.url):.3f} ms")
    delay, measured = await calibrate(args.url, args.rtt_ms)
    print(f"proxy: {delay} µs each way; SELECT 1 through it p50 {measured:.3f} ms")
    for rep in range(1, args.reps + 1):
        paths = [] if args.no_loopback else [("loopback", args.url)]
        for title, url in [*paths, ("rtt", "")]:
            if title == "rtt":
                with delay_proxy(args.url, delay) as through:
                    sides = await run_path(through, args.url, args)
                title = f"injected round trip: SELECT 1 p50 {measured:.3f} ms ({delay} µs each way)"
            else:
                sides = await run_path(url, args.url, args)
            show(f"rep {rep}, {title}", sides)
            if args.json:
                line = {"rep": rep, "path": title, "sides": sides, "pid": os.getpid()}
                with Path(args.json).open("a") as f:  # noqa: ASYNC230 (after the timed runs)
                    f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    options = parse()
    turns_bench.run_on_loop(options.loop, main(options))
