#!/usr/bin/env python3
"""Actor-turn benchmark: akter beside the raw-PostgreSQL turn script, in one invocation.

    python bench/turns.py [--url URL] [--duration 10] [--scenario sequential|many|all]
                          [--reps 1] [--json bench/results/turns.jsonl]

Scenarios (each on a fresh akter schema, dropped afterwards):

* ``sequential``: 1 caller awaiting ``Counter.add(1)`` on 1 warm actor, for ``--duration`` s.
  Comparator: ``pgbench -n -f bench/sql/actor_turn.sql -D nactors=1 -c 1 -j 1``.
* ``many``: 64 concurrent callers, each picking a random actor out of 10,000 per call. All
  10,000 actors are pre-warmed first (one turn each, so every row exists and every activation is
  cached). Comparator: the same script with ``-D nactors=10000 -c 64 -j 2`` (its 10,000 rows are
  created by ``bench/sql/actor_schema.sql``).

pgbench runs against the same server as akter (its tables live in a throwaway schema selected
with ``PGOPTIONS=-c search_path=...``), for the same duration, with ``-l`` so that its p50/p99
come from per-transaction latencies exactly like akter's.

Statements and round trips per turn are counted on the wire, the same way for both sides: after
each timed run, a short sample is sent through an in-process proxy (a unix socket in front of the
server) that parses every frontend message. A statement is an ``Execute`` or a simple ``Query``
message; a round trip is a message that makes the client wait for the server: ``Sync``,
``Query``, or a ``Flush`` that does not directly follow a ``Sync``/``Flush``. The proxy is never
in the path of the timed runs. For akter, the warm runtime of the timed run is switched to the
proxy (its pool's conninfo is changed and the pool drained), so the counted turns are the same
warm turns that were timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import random
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel

import akter
from akter._engine.turn.engine import TurnEngine
from akter._store.embedded import EmbeddedPostgres, server_bin
from akter._store.queries import Queries

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
SQL_DIR = BENCH_DIR / "sql"
SYSTEM_PGBENCH = Path("/usr/lib/postgresql/15/bin/pgbench")


# --- the actor ----------------------------------------------------------------------------------


class CounterState(BaseModel):
    n: int = 0


class Counter(akter.Actor[CounterState]):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


# --- wire counting --------------------------------------------------------------------------------

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_QUERY_TRAFFIC = frozenset(b"QPBESHDC")


def _psycopg_text(text: str) -> str:
    """The text psycopg sends for a catalogue statement (``%(name)s`` → ``$n``)."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%")


def _normalize(text: str) -> str:
    return " ".join(text.split()).rstrip(";").strip()


@dataclass
class WireCounts:
    """Frontend traffic seen by the proxy."""

    statements: Tally[str] = field(default_factory=Tally)
    messages: Tally[str] = field(default_factory=Tally)
    round_trips: int = 0
    flights: int = 0
    connections: int = 0

    def copy(self) -> WireCounts:
        return WireCounts(
            Tally(self.statements),
            Tally(self.messages),
            self.round_trips,
            self.flights,
            self.connections,
        )

    def minus(self, other: WireCounts) -> WireCounts:
        return WireCounts(
            self.statements - other.statements,
            self.messages - other.messages,
            self.round_trips - other.round_trips,
            self.flights - other.flights,
            self.connections - other.connections,
        )

    def per_turn(self, turns: int) -> dict[str, Any]:
        n = max(turns, 1)
        statements = sum(self.statements.values())
        commits = sum(v for k, v in self.statements.items() if k in ("COMMIT", "END"))
        return {
            "counted_turns": turns,
            "statements_per_turn": statements / n,
            "round_trips_per_turn": self.round_trips / n,
            "commits_per_turn": commits / n,
            "flights_per_turn": self.flights / n,
            "new_connections": self.connections,
            "statement_mix": {k: round(v / n, 3) for k, v in sorted(self.statements.items())},
            "messages_per_turn": {k: round(v / n, 3) for k, v in sorted(self.messages.items())},
        }


class _ClientStream:
    """Parses one connection's frontend byte stream."""

    def __init__(self, proxy: WireProxy) -> None:
        self.proxy = proxy
        self.buf = bytearray()
        self.startup = True
        self.statements: dict[str, str] = {}
        self.portals: dict[str, str] = {}
        self.last = ""

    def feed(self, data: bytes) -> bool:
        """Account for a chunk; whether it carried query traffic."""
        self.buf += data
        traffic = False
        while True:
            if self.startup:
                if len(self.buf) < 8:
                    return traffic
                (length, code) = struct.unpack_from("!ii", self.buf)
                if len(self.buf) < length:
                    return traffic
                del self.buf[:length]
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST, _CANCEL_REQUEST):
                    self.startup = False
                continue
            if len(self.buf) < 5:
                return traffic
            kind = self.buf[0]
            (length,) = struct.unpack_from("!i", self.buf, 1)
            if len(self.buf) < 1 + length:
                return traffic
            body = bytes(self.buf[5 : 1 + length])
            del self.buf[: 1 + length]
            traffic = traffic or kind in _QUERY_TRAFFIC
            self._message(chr(kind), body)

    def _message(self, kind: str, body: bytes) -> None:
        counts = self.proxy.counts
        counts.messages[kind] += 1
        if kind == "P":
            name, rest = _cstring(body)
            text, _ = _cstring(rest)
            self.statements[name] = text
        elif kind == "B":
            portal, rest = _cstring(body)
            name, _ = _cstring(rest)
            self.portals[portal] = self.statements.get(name, f"<statement {name}>")
        elif kind == "E":
            portal, _ = _cstring(body)
            counts.statements[self.proxy.label(self.portals.get(portal, "<unknown portal>"))] += 1
        elif kind == "Q":
            text, _ = _cstring(body)
            counts.statements[self.proxy.label(text)] += 1
            counts.round_trips += 1
        elif kind == "S":
            counts.round_trips += 1
        elif kind == "H" and self.last not in ("S", "H"):
            counts.round_trips += 1
        self.last = kind


def _cstring(data: bytes) -> tuple[str, bytes]:
    end = data.index(0)
    return data[:end].decode("utf-8", "replace"), data[end + 1 :]


class WireProxy:
    """A unix-socket proxy in front of PostgreSQL that counts frontend protocol messages."""

    PORT = 5432

    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "/var/run/postgresql").split(",")[0]
        port = int(str(params.get("port") or 5432).split(",")[0])
        self.upstream_path = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self.upstream_addr = (host, port)
        self.sockdir = Path(tempfile.mkdtemp(prefix="akter-bench-proxy-"))
        self.url = make_conninfo(url, host=str(self.sockdir), port=str(self.PORT))
        self.counts = WireCounts()
        self.labels: dict[str, str] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def learn(self, queries: Queries) -> None:
        """Name akter's statements after its query catalogue."""
        for name in queries.names():
            self.labels[_normalize(_psycopg_text(queries[name]))] = name

    def label(self, text: str) -> str:
        normal = _normalize(text)
        if normal in self.labels:
            return self.labels[normal]
        return normal.upper() if len(normal) < 12 else normal[:60]

    async def start(self) -> None:
        path = self.sockdir / f".s.PGSQL.{self.PORT}"
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
        shutil.rmtree(self.sockdir, ignore_errors=True)

    def snapshot(self) -> WireCounts:
        return self.counts.copy()

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.upstream_path is not None:
                sreader, swriter = await asyncio.open_unix_connection(self.upstream_path)
            else:
                sreader, swriter = await asyncio.open_connection(*self.upstream_addr)
        except OSError:
            cwriter.close()
            self._tasks.discard(task)
            return
        self.counts.connections += 1
        stream = _ClientStream(self)
        server_spoke = True

        async def upstream() -> None:
            nonlocal server_spoke
            try:
                while data := await creader.read(1 << 16):
                    if stream.feed(data) and server_spoke:
                        self.counts.flights += 1
                        server_spoke = False
                    swriter.write(data)
                    await swriter.drain()
            finally:
                swriter.close()

        async def downstream() -> None:
            nonlocal server_spoke
            try:
                while data := await sreader.read(1 << 16):
                    server_spoke = True
                    cwriter.write(data)
                    await cwriter.drain()
            finally:
                cwriter.close()

        try:
            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        finally:
            self._tasks.discard(task)


# --- CPU and latency ------------------------------------------------------------------------------


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat (idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return sum(values) - values[3] - values[4], sum(values)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuWindow:
    """CPU used over a wall-clock window: this process, reaped children, the whole machine."""

    wall: float = field(default_factory=time.perf_counter)
    own: float = field(default_factory=time.process_time)
    children: float = field(default_factory=_children_cpu)
    machine: tuple[int, int] = field(default_factory=_machine_jiffies)

    def close(self) -> dict[str, float]:
        wall = time.perf_counter() - self.wall
        busy, total = _machine_jiffies()
        busy_share = (busy - self.machine[0]) / max(total - self.machine[1], 1)
        return {
            "bench_process_cores": (time.process_time() - self.own) / wall,
            "pgbench_process_cores": (_children_cpu() - self.children) / wall,
            "machine_busy_cores": busy_share * (os.cpu_count() or 1),
        }


def _latency_ms(samples_s: Sequence[float]) -> dict[str, float]:
    if len(samples_s) < 2:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "mean_ms": float("nan")}
    cuts = statistics.quantiles(samples_s, n=100, method="inclusive")
    return {
        "p50_ms": cuts[49] * 1000,
        "p99_ms": cuts[98] * 1000,
        "mean_ms": statistics.fmean(samples_s) * 1000,
    }


_TICKS = os.sysconf("SC_CLK_TCK")


def _process_ticks() -> dict[int, tuple[str, int]]:
    """Every process's command name and CPU ticks (utime + stime), from /proc."""
    found: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm, _, rest = text.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        found[int(entry.name)] = (comm, int(fields[11]) + int(fields[12]))
    return found


def _group(pid: int, comm: str) -> str:
    if pid == os.getpid():
        return "bench_process"
    if comm == "pgbench":
        return "pgbench"
    if comm.startswith("postgres"):
        return "postgres"
    return "other"


async def sample_cpu(duration: float) -> dict[str, Any]:
    """CPU cores used per process group over the middle of a run that lasts ``duration`` s.

    Two /proc snapshots, taken ``margin`` after the start and ``margin`` before the end, so that
    the server's backends and pgbench are alive at both; processes that start or exit in between
    are missed (there are none in a steady run).
    """
    margin = min(1.0, duration / 10)
    await asyncio.sleep(margin)
    t0, m0, p0 = time.perf_counter(), _machine_jiffies(), _process_ticks()
    await asyncio.sleep(max(duration - 2 * margin, 0.1))
    t1, m1, p1 = time.perf_counter(), _machine_jiffies(), _process_ticks()
    wall = t1 - t0
    groups: dict[str, float] = dict.fromkeys(("bench_process", "pgbench", "postgres", "other"), 0.0)
    others: dict[str, float] = {}
    for pid, (comm, ticks) in p1.items():
        before = p0.get(pid)
        if before is None or before[0] != comm:
            continue
        used = (ticks - before[1]) / _TICKS / wall
        group = _group(pid, comm)
        groups[group] += used
        if group == "other" and used > 0.01:
            others[comm] = others.get(comm, 0.0) + used
    busy = (m1[0] - m0[0]) / max(m1[1] - m0[1], 1) * (os.cpu_count() or 1)
    return {
        "cpu_window_s": round(wall, 2),
        "bench_process_cores": round(groups["bench_process"], 3),
        "pgbench_cores": round(groups["pgbench"], 3),
        "postgres_cores": round(groups["postgres"], 3),
        "other_cores": round(groups["other"], 3),
        "other_top": {k: round(v, 3) for k, v in sorted(others.items(), key=lambda kv: -kv[1])[:3]},
        "machine_busy_cores": round(busy, 3),
    }


# --- database helpers -----------------------------------------------------------------------------


async def _connect(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def _checkpoint(url: str) -> None:
    async with await _connect(url) as conn:
        with contextlib.suppress(psycopg.Error):  # CHECKPOINT needs superuser or pg_checkpoint
            await conn.execute("CHECKPOINT")


async def _settle(url: str, schema: str, analyze: bool) -> None:
    """Before a timed akter run: optionally VACUUM ANALYZE akter's turn tables, then CHECKPOINT.

    pgbench's ``actor_schema.sql`` ends with ``VACUUM ANALYZE`` of its tables; ``--analyze``
    gives akter's tables the same treatment (otherwise they have no statistics until autovacuum
    gets to them, and plans cached by the pool's connections were made on empty tables).
    """
    if analyze:
        async with await _connect(url) as conn:
            for table in ("actors", "receipts"):
                await conn.execute(
                    sql.SQL("VACUUM ANALYZE {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(table)
                    )
                )
    await _checkpoint(url)


_T = TypeVar("_T")


async def on_a_server(url: str | None, body: Callable[[str], Awaitable[_T]]) -> _T:
    """``body(url)``; without ``url``, on a throwaway embedded server (started, then removed)."""
    if url:
        return await body(url)
    data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-pg-"))
    embedded = EmbeddedPostgres(data_dir)
    try:
        return await body(await asyncio.to_thread(embedded.start))
    finally:
        await asyncio.to_thread(embedded.stop)
        shutil.rmtree(data_dir, ignore_errors=True)


async def _drop_schema(url: str, schema: str) -> None:
    async with await _connect(url) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def _server_info(url: str) -> dict[str, str]:
    names = [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "wal_sync_method",
        "max_connections",
        "shared_preload_libraries",
    ]
    async with await _connect(url) as conn:
        cur = await conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", [names]
        )
        rows = await cur.fetchall()
        version = await (await conn.execute("SELECT version()")).fetchone()
    info = {str(r[0]): str(r[1]) for r in rows}
    info["version"] = str(version[0]) if version else ""
    return info


def _split_sql(text: str) -> list[str]:
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


async def _pgbench_schema(url: str, schema: str) -> None:
    """(Re)create the pgbench turn tables (10,000 actors, empty receipts) in ``schema``."""
    statements = _split_sql((SQL_DIR / "actor_schema.sql").read_text())
    async with await _connect(url) as conn:
        ident = sql.Identifier(schema)
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(sql.SQL("SET search_path = {}").format(ident))
        for statement in statements:
            await conn.execute(statement.encode())


# --- akter side -----------------------------------------------------------------------------------


@dataclass
class Timed:
    turns: int
    errors: int
    seconds: float
    latencies: list[float]
    cpu: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "turns_per_s": self.turns / self.seconds if self.seconds else 0.0,
            **_latency_ms(self.latencies),
            **self.cpu,
            **self.extra,
        }


async def _call_loop(
    pick: Callable[[], Any], until: float, latencies: list[float], errors: list[str]
) -> None:
    while (start := time.perf_counter()) < until:
        try:
            await pick().add(1)
        except akter.ActorError as exc:
            errors.append(exc.reason)
            continue
        latencies.append(time.perf_counter() - start)


class BatchCounter:
    """Counts the engine's transactions (batches) by wrapping ``TurnEngine.run`` (bench only)."""

    def __init__(self, runtime: akter.Runtime) -> None:
        self.batches = 0
        self.commands = 0
        original = runtime._engine.run

        async def counted(act: Any, batch: Sequence[Any]) -> Any:
            self.batches += 1
            self.commands += len(batch)
            return await original(act, batch)

        setattr(runtime._engine, "run", counted)  # noqa: B010 (an instance attribute, on purpose)


class GcWatch:
    """The cyclic garbage collector's passes while it is on: count and seconds per generation."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += took
        self.longest = max(self.longest, took)

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        return {
            "gc_passes": list(self.passes),
            "gc_ms": [round(s * 1000, 1) for s in self.seconds],
            "gc_longest_ms": round(self.longest * 1000, 2),
        }


async def _timed_akter(
    runtime: akter.Runtime, callers: Sequence[Callable[[], Any]], duration: float
) -> Timed:
    latencies: list[float] = []
    errors: list[str] = []
    batches = getattr(runtime, "_bench_batches", None)
    if not isinstance(batches, BatchCounter):
        batches = BatchCounter(runtime)
        setattr(runtime, "_bench_batches", batches)  # noqa: B010
    batches_before, commands_before = batches.batches, batches.commands
    start = time.perf_counter()
    until = start + duration
    sampler = asyncio.create_task(sample_cpu(duration))
    with GcWatch() as collector:
        await asyncio.gather(*(_call_loop(pick, until, latencies, errors) for pick in callers))
    seconds = time.perf_counter() - start
    cpu = await sampler
    extra: dict[str, Any] = {"error_reasons": dict(Tally(errors))} if errors else {}
    extra.update(collector.summary())
    n_batches = batches.batches - batches_before
    n_commands = batches.commands - commands_before
    extra["transactions_per_turn"] = n_batches / n_commands if n_commands else None
    return Timed(len(latencies), len(errors), seconds, latencies, cpu, extra)


async def _fixed_calls(picks: Sequence[Callable[[], Any]], calls: int) -> int:
    """Each of ``picks`` makes ``calls`` calls; returns the successful ones."""
    done = 0

    async def one(pick: Callable[[], Any]) -> None:
        nonlocal done
        for _ in range(calls):
            with contextlib.suppress(akter.ActorError):
                await pick().add(1)
                done += 1

    await asyncio.gather(*(one(p) for p in picks))
    return done


async def _count_through_proxy(
    runtime: akter.Runtime,
    url: str,
    proxy: WireProxy,
    warm: Callable[[], Awaitable[int]],
    work: Callable[[], Awaitable[int]],
) -> dict[str, Any]:
    """Route the runtime's pool through the proxy, run ``work`` and count its traffic."""
    pool = runtime._store.pool
    pool.conninfo = proxy.url
    await pool.drain()
    try:
        await warm()
        before = proxy.snapshot()
        turns = await work()
        return proxy.snapshot().minus(before).per_turn(turns)
    finally:
        pool.conninfo = url
        await pool.drain()


def _runtime(url: str, schema: str, args: argparse.Namespace) -> akter.Runtime:
    return akter.Runtime(
        actors=[Counter],
        database_url=url,
        schema=schema,
        pool_size=args.pool_size,
        max_resident_actors=args.actors + 1000,
        max_pending_commands=max(10_000, args.callers * 4),
    )


async def akter_sequential(
    url: str, schema: str, proxy: WireProxy, args: argparse.Namespace
) -> dict[str, Any]:
    async with _runtime(url, schema, args) as runtime:
        proxy.learn(runtime._store.queries)
        handle = runtime.get(Counter, "seq-0")
        for _ in range(args.warmup):
            await handle.add(1)
        await _settle(url, schema, args.analyze)
        timed = await _timed_akter(runtime, [lambda: handle], args.duration)
        picks = [lambda: handle]
        counted = await _count_through_proxy(
            runtime,
            url,
            proxy,
            lambda: _fixed_calls(picks, 20),
            lambda: _fixed_calls(picks, args.count_turns),
        )
        # Cold turns: the first call to an actor this runtime has never seen (ensure_actor).
        fresh = iter(f"cold-{i}" for i in range(10 * args.count_turns))
        cold_picks = [lambda: runtime.get(Counter, next(fresh))]
        cold = await _count_through_proxy(
            runtime,
            url,
            proxy,
            lambda: _fixed_calls(cold_picks, 20),
            lambda: _fixed_calls(cold_picks, args.count_turns),
        )
    return {
        **timed.summary(),
        "callers": 1,
        "actors": 1,
        "prewarmed": True,
        "analyzed": args.analyze,
        "pool_size": args.pool_size,
        "wire": counted,
        "wire_cold_first_call": cold,
    }


async def akter_many(
    url: str, schema: str, proxy: WireProxy, args: argparse.Namespace
) -> dict[str, Any]:
    async with _runtime(url, schema, args) as runtime:
        proxy.learn(runtime._store.queries)
        handles = [runtime.get(Counter, f"actor-{i:05d}") for i in range(args.actors)]
        # Pre-warm: one turn per actor, spread over the callers (rows exist, caches are warm).
        todo: Iterator[Any] = iter(handles)
        started = time.perf_counter()

        async def prewarm() -> None:
            for handle in todo:
                await handle.add(1)

        await asyncio.gather(*(prewarm() for _ in range(args.callers)))
        prewarm_s = time.perf_counter() - started
        await _settle(url, schema, args.analyze)
        if args.gc == "freeze":  # what an application may do once warm (the operating guide)
            gc.collect()
            gc.freeze()

        def picker(seed: int) -> Callable[[], Any]:
            rng = random.Random(seed)
            return lambda: handles[rng.randrange(len(handles))]

        timed = await _timed_akter(runtime, [picker(i) for i in range(args.callers)], args.duration)
        per_caller = max(1, args.count_turns // args.callers)
        picks = [picker(1000 + i) for i in range(args.callers)]
        counted = await _count_through_proxy(
            runtime,
            url,
            proxy,
            lambda: _fixed_calls(picks, 3),
            lambda: _fixed_calls(picks, per_caller),
        )
        shared = runtime.metrics.histogram("akter.turn.shared_write")
        fallbacks = dict(runtime._engine.fallbacks)
    return {
        **timed.summary(),
        "shared_writes": shared.count,
        "turns_per_shared_write": shared.sum / shared.count if shared.count else None,
        "one_flight_fallbacks": fallbacks,
        "callers": args.callers,
        "actors": args.actors,
        "prewarmed": True,
        "analyzed": args.analyze,
        "prewarm_turns_per_s": args.actors / prewarm_s,
        "pool_size": args.pool_size,
        "wire": counted,
    }


# --- pgbench side ---------------------------------------------------------------------------------


def pgbench_binary() -> Path:
    return SYSTEM_PGBENCH if SYSTEM_PGBENCH.exists() else server_bin("pgbench")


def _pgbench_args(nactors: int, clients: int) -> list[str]:
    jobs = 1 if clients < 2 else min(2, os.cpu_count() or 1)
    return [
        "-n",
        "-f",
        str(SQL_DIR / "actor_turn.sql"),
        "-D",
        f"nactors={nactors}",
        "-c",
        str(clients),
        "-j",
        str(jobs),
    ]


async def _run_pgbench(
    target: str, schema: str, args: list[str], limit_s: float
) -> tuple[int, str, list[str]]:
    command = [str(pgbench_binary()), *args, target]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGOPTIONS"] = f"-c search_path={schema}"
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), limit_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, out.decode(errors="replace"), command


def _pgbench_number(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


def _pgbench_latencies(prefix: Path) -> list[float]:
    """Per-transaction latencies (s) from ``pgbench -l`` files (column 3 is µs)."""
    samples: list[float] = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        with path.open() as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    samples.append(int(parts[2]) / 1e6)
    return samples


async def pgbench_timed(
    url: str, schema: str, proxy: WireProxy, nactors: int, clients: int, args: argparse.Namespace
) -> dict[str, Any]:
    await _pgbench_schema(url, schema)
    await _checkpoint(url)
    logdir = Path(tempfile.mkdtemp(prefix="akter-bench-pgbench-"))
    prefix = logdir / "pgb"
    try:
        base = _pgbench_args(nactors, clients)
        sampler = asyncio.create_task(sample_cpu(args.duration))
        code, out, command = await _run_pgbench(
            url,
            schema,
            [*base, "-T", str(int(args.duration)), "-l", f"--log-prefix={prefix}"],
            args.duration + 120,
        )
        usage = await sampler
        if code != 0:
            raise RuntimeError(f"pgbench failed ({code}):\n{out}")
        latencies = await asyncio.to_thread(_pgbench_latencies, prefix)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    tps = _pgbench_number(r"^tps = ([\d.]+)", out) or 0.0
    turns = int(_pgbench_number(r"actually processed: (\d+)", out) or 0)
    failed = int(_pgbench_number(r"number of failed transactions: (\d+)", out) or 0)
    # Wire sample through the proxy: the same script, a fixed number of transactions.
    per_client = max(1, args.count_turns // clients)
    before = proxy.snapshot()
    code, out_count, _ = await _run_pgbench(proxy.url, schema, [*base, "-t", str(per_client)], 300)
    if code != 0:
        raise RuntimeError(f"pgbench (counting) failed ({code}):\n{out_count}")
    wire = proxy.snapshot().minus(before).per_turn(per_client * clients)
    shown = [Path(command[0]).name, *command[1:-1]]
    shown = [a.replace(str(REPO_DIR) + "/", "") for a in shown if not a.startswith("--log-prefix")]
    return {
        "turns": turns,
        "errors": failed,
        "seconds": args.duration,
        "turns_per_s": tps,
        "pgbench_latency_average_ms": _pgbench_number(r"^latency average = ([\d.]+) ms", out),
        **_latency_ms(latencies),
        **usage,
        "transactions_per_turn": 1.0,  # the script is one transaction
        "clients": clients,
        "actors": nactors,
        "wire": wire,
        "cmd": " ".join(shown) + " <same server>",
    }


# --- orchestration --------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = [
    # label, key, format
    ("turns/s", "turns_per_s", "{:,.0f}"),
    ("p50 latency (ms)", "p50_ms", "{:.2f}"),
    ("p99 latency (ms)", "p99_ms", "{:.2f}"),
    ("statements / turn", "wire.statements_per_turn", "{:.2f}"),
    ("round trips / turn", "wire.round_trips_per_turn", "{:.2f}"),
    ("transactions / turn (timed run)", "transactions_per_turn", "{:.3f}"),
    ("commits / turn (wire sample)", "wire.commits_per_turn", "{:.3f}"),
    ("client CPU (cores)", "client_cores", "{:.2f}"),
    ("postgres CPU (cores)", "postgres_cores", "{:.2f}"),
    ("other processes CPU (cores)", "other_cores", "{:.2f}"),
    ("machine busy (cores)", "machine_busy_cores", "{:.2f}"),
    ("client CPU per turn (µs)", "client_us_per_turn", "{:,.0f}"),
    ("postgres CPU per turn (µs)", "postgres_us_per_turn", "{:,.0f}"),
]
RATIO_KEYS = {"turns_per_s", "p50_ms", "p99_ms", "wire.statements_per_turn"}
RATIO_KEYS |= {"wire.round_trips_per_turn", "client_us_per_turn", "postgres_us_per_turn"}


def _get(record: dict[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _fmt(fmt: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return fmt.format(value)


def render(title: str, ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    lines = [
        f"#### {title}",
        "",
        "| measure | akter | pgbench | akter / pgbench |",
        "|---|---|---|---|",
    ]
    for label, key, fmt in ROWS:
        a, b = _get(ours, key), _get(theirs, key)
        ratio = "" if key not in RATIO_KEYS or not a or not b else f"{a / b:.2f}"
        lines.append(f"| {label} | {_fmt(fmt, a)} | {_fmt(fmt, b)} | {ratio} |")
    mix = ours.get("wire", {}).get("statement_mix", {})
    lines += ["", "akter statements per turn: " + ", ".join(f"{k} {v}" for k, v in mix.items())]
    cold = ours.get("wire_cold_first_call")
    if cold:
        lines.append(
            f"akter first call to a new actor: {cold['statements_per_turn']:.2f} statements, "
            f"{cold['round_trips_per_turn']:.2f} round trips"
        )
    if ours.get("shared_writes"):
        lines.append(
            f"akter shared writes: {ours['shared_writes']:,}, "
            f"{ours['turns_per_shared_write']:.2f} turns per write"
        )
    if ours.get("one_flight_fallbacks"):
        lines.append(f"akter one-flight fallbacks: {ours['one_flight_fallbacks']}")
    if ours.get("gc_passes"):
        lines.append(
            f"akter's garbage collector in the timed run: passes per generation "
            f"{ours['gc_passes']}, ms {ours['gc_ms']}, longest {ours['gc_longest_ms']} ms"
        )
    if ours.get("prewarm_turns_per_s"):
        lines.append(
            f"akter pre-warm (one first call per actor, {ours.get('callers')} callers): "
            f"{ours['prewarm_turns_per_s']:,.0f} turns/s"
        )
    for side, record in (("akter", ours), ("pgbench", theirs)):
        if record.get("other_top"):
            lines.append(f"other CPU during the {side} run: {record['other_top']}")
    if ours.get("errors") or theirs.get("errors"):
        lines.append(f"errors: akter {ours.get('errors')}, pgbench {theirs.get('errors')}")
    return "\n".join(lines)


def _git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return ""
    return out.stdout.strip()


def _per_turn_cpu(result: dict[str, Any]) -> dict[str, Any]:
    rate = result.get("turns_per_s") or 0.0
    for key in ("client", "postgres"):
        cores = result.get(f"{key}_cores")
        result[f"{key}_us_per_turn"] = cores / rate * 1e6 if rate and cores is not None else None
    return result


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def _append_json(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def _turn_fingerprint() -> str:
    """A short hash of the turn engine's source (a module before issue 11, a package after)."""
    root = Path(akter.__file__).parent / "_engine"
    files = sorted((root / "turn").glob("*.py")) if (root / "turn").is_dir() else [root / "turn.py"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


async def run(args: argparse.Namespace) -> int:
    embedded: EmbeddedPostgres | None = None
    data_dir: Path | None = None
    url: str = args.url or ""
    if not url:
        data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="akter-bench-pg-"))
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    proxy = WireProxy(url)
    await proxy.start()
    tag = f"{os.getpid()}"
    pg_schema = f"akter_bench_pgbench_{tag}"
    scenarios = ["sequential", "many"] if args.scenario == "all" else [args.scenario]
    out_path = Path(args.json) if args.json else None
    failures = 0
    TurnEngine.shared_writes = args.shared_writes == "on"
    try:
        info = await _server_info(url)
        load_before = _loadavg()
        env = {
            "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "server": "embedded" if embedded else "url",
            "server_version": info.get("server_version", ""),
            "settings": info,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "psycopg": psycopg.__version__,
            "pgbench": str(pgbench_binary()),
            "git_head": _git_head(),
            "turn_py_sha256": _turn_fingerprint(),
            "duration_s": args.duration,
            "loadavg_before": load_before,
            "shared_writes": args.shared_writes,
        }
        print(f"# akter turn benchmark — {env['date_utc']}")
        print(
            f"server: {'embedded ' if embedded else ''}PostgreSQL {env['server_version']} "
            f"(fsync={info.get('fsync')}, synchronous_commit={info.get('synchronous_commit')}, "
            f"shared_buffers={info.get('shared_buffers')}); {env['cpus']} CPUs; "
            f"load {' '.join(load_before)}; pgbench {env['pgbench']}; HEAD {env['git_head']}, "
            f"turn.py {env['turn_py_sha256']}; shared writes {args.shared_writes}",
            flush=True,
        )
        for rep in range(1, args.reps + 1):
            for scenario in scenarios:
                schema = f"akter_bench_{tag}_{scenario[:3]}{rep}"
                if scenario == "sequential":
                    nactors, clients = 1, 1
                    title = "sequential: 1 caller, 1 warm actor vs pgbench -c 1 -D nactors=1"
                else:
                    nactors, clients = args.actors, args.pgbench_clients
                    title = (
                        f"many: {args.callers} callers over {args.actors:,} pre-warmed actors "
                        f"vs pgbench -c {clients} -D nactors={nactors}"
                    )
                title += f" ({args.duration:g} s, rep {rep}"
                title += ", akter tables analyzed)" if args.analyze else ")"

                async def ours(scenario: str = scenario, schema: str = schema) -> dict[str, Any]:
                    try:
                        if scenario == "sequential":
                            result = await akter_sequential(url, schema, proxy, args)
                        else:
                            result = await akter_many(url, schema, proxy, args)
                    finally:
                        await _drop_schema(url, schema)
                    result["client_cores"] = result["bench_process_cores"]
                    return _per_turn_cpu(result)

                async def theirs(nactors: int = nactors, clients: int = clients) -> dict[str, Any]:
                    result = await pgbench_timed(url, pg_schema, proxy, nactors, clients, args)
                    result["client_cores"] = result["pgbench_cores"]
                    return _per_turn_cpu(result)

                # Alternate which side goes first, so drift does not favour one side.
                try:
                    if rep % 2:
                        a = await ours()
                        b = await theirs()
                    else:
                        b = await theirs()
                        a = await ours()
                except Exception as exc:
                    failures += 1
                    print(f"\n{title}: FAILED: {exc!r}", file=sys.stderr, flush=True)
                    continue
                print("\n" + render(title, a, b), flush=True)
                ratio = {
                    key: (_get(a, key) / _get(b, key)) if _get(a, key) and _get(b, key) else None
                    for key in sorted(RATIO_KEYS)
                }
                lines = [
                    {"bench": "turns", "side": "akter", "scenario": scenario, "rep": rep, **a},
                    {"bench": "turns", "side": "pgbench", "scenario": scenario, "rep": rep, **b},
                    {
                        "bench": "turns",
                        "side": "ratio",
                        "scenario": scenario,
                        "rep": rep,
                        **{f"akter_over_pgbench.{k}": v for k, v in ratio.items()},
                    },
                ]
                if out_path is not None:
                    _append_json(out_path, [{**env, **line} for line in lines])
        print(f"\nload average after: {' '.join(_loadavg())}")
    finally:
        with contextlib.suppress(Exception):
            await _drop_schema(url, pg_schema)
        await proxy.stop()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
            if not args.data_dir and data_dir is not None:
                shutil.rmtree(data_dir, ignore_errors=True)
    if out_path is not None:
        print(f"JSON lines appended to {out_path}")
    return 1 if failures else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--data-dir", help="embedded server directory (default: a temp dir)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per timed run")
    parser.add_argument("--scenario", choices=["sequential", "many", "all"], default="all")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of the whole matrix")
    parser.add_argument("--json", help="append JSON lines here")
    parser.add_argument("--callers", type=int, default=64, help="akter callers in 'many'")
    parser.add_argument("--actors", type=int, default=10_000, help="actors in 'many'")
    parser.add_argument("--pgbench-clients", type=int, default=64, help="pgbench -c in 'many'")
    parser.add_argument("--pool-size", type=int, default=20, help="akter pool size")
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="VACUUM ANALYZE akter's tables after the warm-up (as pgbench's schema does)",
    )
    parser.add_argument("--warmup", type=int, default=200, help="warm-up calls in 'sequential'")
    parser.add_argument("--count-turns", type=int, default=640, help="turns per wire-count sample")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument(
        "--shared-writes",
        choices=["on", "off"],
        default="on",
        help="several actors' warm turns per write (the default) or one write per turn",
    )
    parser.add_argument(
        "--gc",
        choices=["default", "freeze"],
        default="default",
        help="'freeze': gc.freeze() once the many scenario's actors are warm",
    )
    return parser.parse_args(argv)


def run_on_loop(loop: str, main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` on the event loop a bench's ``--loop`` names (``asyncio`` or ``uvloop``)."""
    if loop == "uvloop":
        import uvloop  # a bench-only dependency (the "bench" extra)

        return uvloop.run(main)
    return asyncio.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_on_loop(args.loop, run(args))


if __name__ == "__main__":
    sys.exit(main())
