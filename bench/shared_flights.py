#!/usr/bin/env python3
"""Probe: many callers' one-flight turns, one write per turn or several turns per write.

    python -P bench/shared_flights.py --url URL [--duration 8] [--callers 64] [--nactors 10000]
                                      [--connections 8] [--most 16] [--loop asyncio|uvloop]

Issue 45's 64-caller goal (≥ 0.5× pgbench) is bound by the runner's CPU, and a profile put a
quarter of a turn's instructions at 64 callers in switching between actors: a pool checkout,
the socket's registration with the loop and one loop wake per turn (docs/benchmarks.md, "Where a
warm turn's CPU goes"). The design named next is a *shared flight*: the warm turns ready at one
moment, of different actors, sent on one connection in one write, each its own transaction
ended by its own Sync (an error aborts only its turn), their answers read in one pass.

This probe measures that design's ceiling with no runtime on top, on pgbench's turn tables
(``bench/sql/actor_turn.sql``: lock, update, receipt, commit), each turn one flight (``BEGIN``,
the lock, the writes, ``COMMIT``, Sync), through ``psycopg.pq`` with prepared statements, as
akter's ``TurnPipeline`` sends it:

* ``one flight per write``: each caller checks a connection out of a pool of ``--connections``
  (handed to waiters in order, as ``psycopg_pool`` does), sends its turn, reads it, gives the
  connection back;
* ``shared flights``: each caller queues its turn; a sender per connection takes every queued
  turn (up to ``--most``), sends them in one write, reads every answer, wakes each caller;
* ``pgbench``: the same script, ``-c callers``, on the same server, in the same run.

Not a test; nothing of akter's runtime runs here. The figures are recorded in
docs/benchmarks.md ("Shared flights: the ceiling").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq, sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import (
    CpuWindow,
    _drop_schema,
    _latency_ms,
    _pgbench_schema,
    _run_pgbench,
    run_on_loop,
    sample_cpu,
)

SCHEMA = "akter_bench_shared"

#: The turn's statements, prepared once per connection (``$1`` is the actor id).
STATEMENTS: dict[bytes, bytes] = {
    b"lock": b"SELECT generation FROM generations WHERE actor_id = $1 FOR UPDATE",
    b"update": (
        b"UPDATE actor_state SET state = jsonb_set(state, '{n}', "
        b"to_jsonb((state->>'n')::bigint + 1)), updated_at = now() WHERE actor_id = $1"
    ),
    b"insert": (
        b"INSERT INTO receipts (actor_id, generation, result) VALUES ($1, 1, '{\"ok\": true}')"
    ),
}
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_FATAL = pq.ExecStatus.FATAL_ERROR


class Wire:
    """One connection in pipeline mode for good: turns are queued, flushed, read by Sync."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.pg = conn.pgconn
        self.fd = self.pg.socket
        self.pg.enter_pipeline_mode()
        self.waiter: asyncio.Future[None] | None = None

    async def prepare(self) -> None:
        for name, text in STATEMENTS.items():
            self.pg.send_prepare(name, text)
        self.pg.pipeline_sync()
        if not all(await self.flight(1)):
            raise RuntimeError("preparing the turn's statements failed")

    def queue(self, aid: int) -> None:
        """One turn: BEGIN, lock, update, receipt, COMMIT, Sync (5 results and the Sync's)."""
        pg = self.pg
        arg = [str(aid).encode()]
        pg.send_query_params(b"BEGIN", None)
        pg.send_query_prepared(b"lock", arg)
        pg.send_query_prepared(b"update", arg)
        pg.send_query_prepared(b"insert", arg)
        pg.send_query_params(b"COMMIT", None)
        pg.pipeline_sync()

    async def flight(self, turns: int) -> list[bool]:
        """Flush what is queued and read ``turns`` Syncs' worth; each turn's success."""
        pg = self.pg
        loop = asyncio.get_running_loop()
        while pg.flush():
            await self._readable(loop, writable=True)
            pg.consume_input()
        done: list[bool] = []
        ok = True
        while len(done) < turns:
            last_none = False
            while not pg.is_busy():
                result = pg.get_result()
                if result is None:
                    if last_none:
                        break  # two in a row: nothing more is in libpq's buffer
                    last_none = True  # the end of one statement's results
                    continue
                last_none = False
                if result.status == _SYNC:
                    done.append(ok)
                    ok = True
                    if len(done) == turns:
                        return done
                elif result.status == _FATAL:
                    ok = False
            await self._readable(loop)
            pg.consume_input()
        return done

    async def _readable(self, loop: asyncio.AbstractEventLoop, *, writable: bool = False) -> None:
        waiter = loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        loop.add_reader(self.fd, wake)
        if writable:
            loop.add_writer(self.fd, wake)
        try:
            await waiter
        finally:
            loop.remove_reader(self.fd)
            if writable:
                loop.remove_writer(self.fd)


async def _wires(url: str, n: int) -> list[Wire]:
    wires = []
    for _ in range(n):
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(SCHEMA)))
        wire = Wire(conn)
        await wire.prepare()
        wires.append(wire)
    return wires


class Pooled:
    """One flight per write: a caller checks a connection out, sends its turn, reads it."""

    def __init__(self, wires: list[Wire]) -> None:
        self.free: deque[Wire] = deque(wires)
        #: Callers waiting for a connection, served in order (as psycopg_pool hands a returned
        #: connection to its first waiter: a caller that just gave one back cannot barge).
        self.waiting: deque[asyncio.Future[Wire]] = deque()
        self.writes = 0

    async def turn(self, aid: int) -> bool:
        if self.free and not self.waiting:
            wire = self.free.popleft()
        else:
            handed: asyncio.Future[Wire] = asyncio.get_running_loop().create_future()
            self.waiting.append(handed)
            wire = await handed
        try:
            wire.queue(aid)
            self.writes += 1
            (ok,) = await wire.flight(1)
            return ok
        finally:
            if self.waiting:
                self.waiting.popleft().set_result(wire)
            else:
                self.free.append(wire)

    async def close(self) -> None:
        return None


class Shared:
    """Shared flights: a sender per connection sends every queued turn in one write."""

    def __init__(self, wires: list[Wire], most: int) -> None:
        self.most = most
        self.connections = len(wires)
        self.queue: deque[tuple[int, asyncio.Future[bool]]] = deque()
        self.ready = asyncio.Event()
        self.writes = 0
        self.senders = [asyncio.create_task(self._send(w)) for w in wires]

    async def turn(self, aid: int) -> bool:
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.queue.append((aid, answer))
        self.ready.set()
        return await answer

    async def _send(self, wire: Wire) -> None:
        while True:
            if not self.queue:
                self.ready.clear()
                await self.ready.wait()
                continue
            # A fair share of what waits: turns on one connection run one after the other on
            # the server, each commit waiting for its own flush, so one write must not take
            # the work of idle connections.
            share = -(-len(self.queue) // self.connections)
            batch = [self.queue.popleft() for _ in range(min(self.most, share))]
            for aid, _ in batch:
                wire.queue(aid)
            self.writes += 1
            answers = await wire.flight(len(batch))
            for (_, answer), ok in zip(batch, answers, strict=True):
                answer.set_result(ok)

    async def close(self) -> None:
        for task in self.senders:
            task.cancel()
        await asyncio.gather(*self.senders, return_exceptions=True)


async def measure(way: Pooled | Shared, args: argparse.Namespace) -> dict[str, float]:
    latencies: list[float] = []
    failed = 0

    async def caller(seed: int, until: float) -> None:
        nonlocal failed
        rng = random.Random(seed)
        while (start := time.perf_counter()) < until:
            if not await way.turn(rng.randint(1, args.nactors)):
                failed += 1
            latencies.append(time.perf_counter() - start)

    warm = time.perf_counter() + 1.0
    await asyncio.gather(*(caller(i, warm) for i in range(args.callers)))
    latencies.clear()
    writes = way.writes
    cpu = CpuWindow()
    sampler = asyncio.create_task(sample_cpu(args.duration))
    start = time.perf_counter()
    until = start + args.duration
    await asyncio.gather(*(caller(100 + i, until) for i in range(args.callers)))
    seconds = time.perf_counter() - start
    usage = cpu.close()
    server = await sampler
    turns = len(latencies)
    return {
        "turns_per_s": turns / seconds,
        **_latency_ms(latencies),
        "failed": failed,
        "turns_per_write": turns / max(1, way.writes - writes),
        "client_cpu_us_per_turn": usage["bench_process_cores"] * seconds / turns * 1e6,
        "server_cpu_us_per_turn": server["postgres_cores"] / (turns / seconds) * 1e6,
        "machine_busy_cores": usage["machine_busy_cores"],
    }


async def pgbench(url: str, args: argparse.Namespace) -> dict[str, float]:
    jobs = min(2, args.callers)
    base = ["-n", "-f", str(Path(__file__).parent / "sql" / "actor_turn.sql")]
    base += ["-D", f"nactors={args.nactors}", "-c", str(args.callers), "-j", str(jobs)]
    sampler = asyncio.create_task(sample_cpu(args.duration))
    code, out, _ = await _run_pgbench(
        url, SCHEMA, [*base, "-T", str(int(args.duration))], args.duration + 120
    )
    usage = await sampler
    if code != 0:
        raise RuntimeError(f"pgbench failed ({code}):\n{out}")
    tps = next(float(line.split()[2]) for line in out.splitlines() if line.startswith("tps = "))
    return {
        "turns_per_s": tps,
        "client_cpu_us_per_turn": usage["pgbench_cores"] / tps * 1e6,
        "server_cpu_us_per_turn": usage["postgres_cores"] / tps * 1e6,
        "machine_busy_cores": usage["machine_busy_cores"],
    }


async def run(args: argparse.Namespace) -> None:
    print(
        f"| {args.callers} callers over {args.nactors} actors, {args.connections} connections, "
        f"loop {args.loop} | turns/s | × pgbench | p50 ms | p99 ms | turns per write "
        "| client CPU µs/turn | server CPU µs/turn | machine busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for rep in range(args.reps):
            await _pgbench_schema(args.url, SCHEMA)
            base = await pgbench(args.url, args)
            print(
                f"| pgbench `actor_turn.sql` (rep {rep + 1}) | {base['turns_per_s']:,.0f} | 1.00 "
                f"| | | 1.00 | {base['client_cpu_us_per_turn']:.0f} "
                f"| {base['server_cpu_us_per_turn']:.0f} | {base['machine_busy_cores']:.2f} |",
                flush=True,
            )
            for name in ("one flight per write", "shared flights"):
                await _pgbench_schema(args.url, SCHEMA)
                wires = await _wires(args.url, args.connections)
                way: Pooled | Shared = (
                    Pooled(wires) if name == "one flight per write" else Shared(wires, args.most)
                )
                try:
                    r = await measure(way, args)
                finally:
                    await way.close()
                    for wire in wires:
                        await wire.conn.close()
                ratio = r["turns_per_s"] / base["turns_per_s"]
                print(
                    f"| {name} (rep {rep + 1}) | {r['turns_per_s']:,.0f} | {ratio:.2f} "
                    f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['turns_per_write']:.2f} "
                    f"| {r['client_cpu_us_per_turn']:.0f} | {r['server_cpu_us_per_turn']:.0f} "
                    f"| {r['machine_busy_cores']:.2f} |"
                    + (f" {r['failed']} failed" if r["failed"] else ""),
                    flush=True,
                )
    finally:
        await _drop_schema(args.url, SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--nactors", type=int, default=10000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--most", type=int, default=16, help="most turns in one shared write")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args()
    run_on_loop(args.loop, run(args))


if __name__ == "__main__":
    main()
