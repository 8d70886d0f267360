#!/usr/bin/env python3
"""HTTP command benchmark: the same command over HTTP and through the in-process handle, one run.

    python bench/http_bench.py [--url URL] [--duration 8] [--reps 2]
        [--scenario sequential|many|all]
                         [--variants inproc,client,pinned,pool16,raw] [--load-procs 1]
                         [--json bench/results/http.jsonl]

The actor is ``Counter`` (``access=akter.public``, one command ``add(k)`` that increments its
state). For each scenario, these ways of calling it are timed, each on a fresh schema (dropped
afterwards), against one PostgreSQL server:

* ``inproc``: ``await runtime.get(Counter, id).add(1)``. The callers and the runtime share this
  process (the baseline).
* ``client``: ``await akter.client.Client(url).get(Counter, id).add(1)``, as shipped. Every call
  mints its id with ``POST /command-ids`` and then posts the command: 2 HTTP requests.
* ``pinned``: the same client with ``handle.with_command_id(id)``, the ids minted up front on the
  client side (``v1.<issued>.<issued + window>.<uuid4>``, the issued time and the window taken
  from one ``POST /command-ids``): 1 request per call.
* ``pool16`` ("many" only): ``pinned`` with ``Client(url, transport=httpx.AsyncHTTPTransport(
  limits=httpx.Limits(max_connections=16, max_keepalive_connections=16)))``.
* ``raw``: plain ``httpx.AsyncClient.post`` of a pre-encoded body with a pre-minted
  ``Idempotency-Key`` (no binding, no result validation), through one single-connection
  ``AsyncClient`` per concurrent call: 1 request per call, no connection pool to search.
* ``rawpool`` ("many" only, not in the default set): ``raw`` through one shared ``AsyncClient``
  keeping ``--callers`` connections alive.

The HTTP server is what deployments run:
``akter serve bench.http_bench:runtime --http 127.0.0.1:PORT``
(uvicorn, as configured by ``akter serve``), in its own process, started fresh for each HTTP
measurement. The load generator is another process (``bench/http_bench.py --role load``; with
``--load-procs N``, N of them share the callers); it warms up, waits until a ``CHECKPOINT`` is
done, then calls for ``--duration`` s. Scenarios:

* ``sequential``: 1 caller, 1 actor warmed by ``--warmup`` calls.
* ``many``: ``--callers`` callers (64), each call to a random actor out of ``--actors`` (1,000),
  all pre-warmed with one call each (through the variant being measured).

CPU: two ``/proc`` snapshots, 1 s into the timed run and 1 s before its end, summed per process:
the HTTP server, the load generator(s), this process (in ``inproc``: callers and runtime), the
PostgreSQL server (its postmaster and children only) and everything else on the machine. Before
each timed run the orchestrator waits (up to ``--quiet-wait`` s) until everything else uses less
than ``--quiet-below`` cores; runs during which it used more than 0.3 cores are marked with †.
New connections per call are counted in the load generator (httpcore's ``create_connection``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # ``python bench/http_bench.py`` puts bench/ first on sys.path, where this file would shadow the
    # standard library's ``http`` package (which httpx and uvicorn import). Take it off again.
    sys.path[:] = [
        p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
    ]

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx
import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter
from akter._ids import mint_command_id
from akter._store.embedded import EmbeddedPostgres
from akter.client import Client

THIS_FILE = Path(__file__).resolve()
BENCH_DIR = THIS_FILE.parent
REPO_DIR = BENCH_DIR.parent
VARIANTS = ("inproc", "client", "pinned", "pool16", "raw", "rawpool")
DEFAULT_VARIANTS = "inproc,client,pinned,pool16,raw"
MANY_ONLY = frozenset({"pool16", "rawpool"})  # the same as another variant with 1 caller
DISTURBED = 0.3  # cores used by other processes above which a run is marked (†)
PINNED = frozenset({"pinned", "pool16", "raw", "rawpool"})
LABELS = {
    "inproc": "in-process handle",
    "client": "akter Client, as shipped (mint + POST)",
    "pinned": "akter Client, pinned ids",
    "pool16": "akter Client, pinned ids, 16-connection pool",
    "raw": "raw httpx POST, pinned ids, 1 connection per caller",
    "rawpool": "raw httpx POST, pinned ids, one 64-connection pool",
}


# --- the actor, and the runtime `akter serve bench.http_bench:runtime` serves ---------------


class CounterState(BaseModel):
    n: int = 0


class Counter(akter.Actor[CounterState], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


def make_runtime(url: str, schema: str, pool_size: int, actors: int, callers: int) -> akter.Runtime:
    """The runtime both sides use (the same settings as bench/turns.py)."""
    return akter.Runtime(
        actors=[Counter],
        database_url=url,
        schema=schema,
        pool_size=pool_size,
        max_resident_actors=actors + 1000,
        max_pending_commands=max(10_000, callers * 4),
    )


_served: akter.Runtime | None = None


def __getattr__(name: str) -> Any:
    """``bench.http_bench:runtime`` for ``akter serve``, configured by AKTER_BENCH_* variables."""
    global _served
    if name != "runtime":
        raise AttributeError(name)
    if _served is None:
        env = os.environ
        _served = make_runtime(
            env["AKTER_BENCH_URL"],
            env["AKTER_BENCH_SCHEMA"],
            int(env.get("AKTER_BENCH_POOL", "20")),
            int(env.get("AKTER_BENCH_ACTORS", "1000")),
            int(env.get("AKTER_BENCH_CALLERS", "64")),
        )
    return _served


# --- latency and CPU ------------------------------------------------------------------------------


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


def _machine_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return sum(values) - values[3] - values[4], sum(values)


def _processes() -> dict[int, tuple[str, int, int]]:
    """Every process's command name, parent pid and CPU ticks (utime + stime)."""
    found: dict[int, tuple[str, int, int]] = {}
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
        found[int(entry.name)] = (comm, int(fields[1]), int(fields[11]) + int(fields[12]))
    return found


class Sampler:
    """Groups processes: named pids, the PostgreSQL server's tree, and everything else."""

    def __init__(self, postmaster: int | None) -> None:
        self.postmaster = postmaster
        self.named: dict[int, str] = {}

    def group(self, pid: int, comm: str, ppid: int) -> str:
        if pid in self.named:
            return self.named[pid]
        if self.postmaster is None:
            return "postgres" if comm.startswith("postgres") else "other"
        return "postgres" if self.postmaster in (pid, ppid) else "other"

    async def wait_quiet(self, below: float, limit: float) -> dict[str, float]:
        """Wait (up to ``limit`` s) until other processes use less than ``below`` cores."""
        started = time.perf_counter()
        while True:
            t0, p0 = time.perf_counter(), _processes()
            await asyncio.sleep(1.0)
            t1, p1 = time.perf_counter(), _processes()
            other = 0.0
            for pid, (comm, ppid, ticks) in p1.items():
                before = p0.get(pid)
                if before is not None and self.group(pid, comm, ppid) == "other":
                    other += (ticks - before[2]) / _TICKS / (t1 - t0)
            waited = time.perf_counter() - started
            if other < below or waited >= limit:
                return {"quiet_wait_s": round(waited, 1), "other_cores_before": round(other, 3)}

    async def sample(self, duration: float) -> dict[str, Any]:
        margin = min(1.0, duration / 10)
        await asyncio.sleep(margin)
        t0, m0, p0 = time.perf_counter(), _machine_jiffies(), _processes()
        await asyncio.sleep(max(duration - 2 * margin, 0.1))
        t1, m1, p1 = time.perf_counter(), _machine_jiffies(), _processes()
        wall = t1 - t0
        groups = dict.fromkeys(("bench", "server", "loadgen", "postgres", "other"), 0.0)
        others: dict[str, float] = {}
        for pid, (comm, ppid, ticks) in p1.items():
            before = p0.get(pid)
            if before is None or before[0] != comm:
                continue
            used = (ticks - before[2]) / _TICKS / wall
            group = self.group(pid, comm, ppid)
            groups[group] += used
            if group == "other" and used > 0.01:
                key = comm if not comm.startswith("postgres") else "postgres (other servers)"
                others[key] = others.get(key, 0.0) + used
        busy = (m1[0] - m0[0]) / max(m1[1] - m0[1], 1) * (os.cpu_count() or 1)
        top = sorted(others.items(), key=lambda kv: -kv[1])[:4]
        return {
            "cpu_window_s": round(wall, 2),
            **{f"{k}_cores": round(v, 3) for k, v in groups.items()},
            "other_top": {k: round(v, 3) for k, v in top},
            "machine_busy_cores": round(busy, 3),
        }


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


# --- the load generator (a separate process) ------------------------------------------------------


class IdBank:
    """Command ids minted up front against the server's clock and window."""

    def __init__(self, issued_ms: int, window_ms: int, count: int) -> None:
        self.issued_ms, self.window_ms = issued_ms, window_ms
        self.ids = [mint_command_id(issued_ms, window_ms) for _ in range(count)]
        self.extra = 0

    def take(self) -> str:
        if self.ids:
            return self.ids.pop()
        self.extra += 1
        return mint_command_id(self.issued_ms, self.window_ms)


async def _first_id(base_url: str) -> tuple[int, int]:
    async with httpx.AsyncClient(base_url=base_url) as http:
        response = await http.post("/command-ids")
        response.raise_for_status()
    _, issued, expires, _ = str(response.json()["command_id"]).split(".")
    return int(issued), int(expires) - int(issued)


def _caller_factory(
    variant: str, base_url: str, callers: int, bank: IdBank | None, statuses: Tally[int]
) -> tuple[Callable[[str], Callable[[], Any]], Callable[[], Any]]:
    """``make(actor_id)`` → a zero-argument coroutine function making one call; and a closer.

    Every HTTP response's status is counted in ``statuses`` (an httpx response hook).
    """

    async def count(response: httpx.Response) -> None:
        statuses[response.status_code] += 1

    if variant in ("raw", "rawpool"):
        # raw: one single-connection httpx client per concurrent call (a free list of them), so
        # httpx's pool never holds more than one connection. rawpool: one shared client whose
        # pool keeps a connection per caller.
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        shared = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
        clients = [
            httpx.AsyncClient(
                base_url=base_url,
                limits=one if variant == "raw" else shared,
                timeout=30.0,
                event_hooks={"response": [count]},
            )
            for _ in range(callers if variant == "raw" else 1)
        ]
        idle = deque(clients)  # first in, first out: every client stays warm
        body = b'{"k":1}'
        assert bank is not None

        def make_raw(actor_id: str) -> Callable[[], Any]:
            path = f"/actors/Counter/{actor_id}/add"

            async def call() -> Any:
                http = idle.popleft() if len(clients) > 1 else clients[0]
                try:
                    response = await http.post(
                        path,
                        content=body,
                        headers={
                            "Idempotency-Key": bank.take(),
                            "Content-Type": "application/json",
                        },
                    )
                finally:
                    if len(clients) > 1:
                        idle.append(http)
                if response.status_code != 200:
                    raise akter.ActorError(
                        response.json().get("reason", "Defect"), f"HTTP {response.status_code}"
                    )
                return response.json()

            return call

        async def close_all() -> None:
            for http in clients:
                await http.aclose()

        return make_raw, close_all

    if variant == "pool16":
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        client = Client(base_url, transport=httpx.AsyncHTTPTransport(limits=limits))
    else:
        client = Client(base_url)  # as shipped: httpx's default pool (keep-alive for 20)
    client._http.event_hooks["response"].append(count)

    def make_client(actor_id: str) -> Callable[[], Any]:
        handle = client.get(Counter, actor_id)
        if variant == "client":
            return lambda: handle.add(1)
        assert bank is not None
        return lambda: handle.with_command_id(bank.take()).add(1)

    return make_client, client.aclose


async def _timed_calls(
    callers: Sequence[Callable[[], Awaitable[Any]]], duration: float
) -> tuple[list[float], list[str], float]:
    """Each of ``callers`` (one call per invocation) calls in a loop for ``duration`` s."""
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    until = start + duration

    async def loop(call: Callable[[], Awaitable[Any]]) -> None:
        while (t := time.perf_counter()) < until:
            try:
                await call()
            except akter.ActorError as exc:
                errors.append(exc.reason)
                continue
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(loop(c) for c in callers))
    return latencies, errors, time.perf_counter() - start


def _random_caller(
    calls: Sequence[Callable[[], Awaitable[Any]]], seed: int
) -> Callable[[], Awaitable[Any]]:
    """One caller of 'many': each call goes to a random actor."""
    rng = random.Random(seed)
    return lambda: calls[rng.randrange(len(calls))]()


async def _prewarm(calls: Sequence[Callable[[], Any]], callers: int) -> float:
    todo = iter(calls)
    started = time.perf_counter()

    async def worker() -> None:
        for call in todo:
            await call()

    await asyncio.gather(*(worker() for _ in range(callers)))
    return len(calls) / (time.perf_counter() - started)


class ConnectionCount:
    """Counts the connections httpx opens (wraps httpcore's pool factory; this process only)."""

    def __init__(self) -> None:
        self.opened = 0
        original = httpcore.AsyncConnectionPool.create_connection

        def counted(pool: Any, origin: Any) -> Any:
            self.opened += 1
            return original(pool, origin)

        setattr(httpcore.AsyncConnectionPool, "create_connection", counted)  # noqa: B010


async def load_main(args: argparse.Namespace) -> int:
    """The load generator: warm up, report WARM, wait for GO, run, print RESULT json."""
    connections = ConnectionCount()
    base_url = args.base_url
    bank: IdBank | None = None
    if args.variant in PINNED:
        issued, window = await _first_id(base_url)
        bank = IdBank(issued, window, int(args.duration * 6000) + args.actors + args.warmup)
    statuses: Tally[int] = Tally()
    make, close = _caller_factory(args.variant, base_url, args.callers, bank, statuses)
    extra: dict[str, Any] = {}
    try:
        if args.scenario == "sequential":
            one = make("seq-0")
            for _ in range(args.warmup):
                await one()
            callers: list[Callable[[], Awaitable[Any]]] = [one]
        else:
            # With several load generators, each pre-warms its share of the actors.
            calls = [make(f"actor-{i:05d}") for i in range(args.actors)]
            mine = calls[args.proc_index :: args.procs]
            extra["prewarm_turns_per_s"] = await _prewarm(mine, args.callers) * args.procs
            seeds = range(args.proc_index * 1000, args.proc_index * 1000 + args.callers)
            callers = [_random_caller(calls, seed) for seed in seeds]
        print("WARM", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        cpu0, statuses0, opened0 = time.process_time(), Tally(statuses), connections.opened
        print("TIMED", flush=True)
        latencies, errors, seconds = await _timed_calls(callers, args.duration)
        cpu = time.process_time() - cpu0
        timed_statuses = statuses - statuses0
        extra["connections_opened"] = connections.opened - opened0
    finally:
        await close()
    result = {
        "turns": len(latencies),
        "errors": len(errors),
        "error_reasons": dict(Tally(errors)),
        "seconds": round(seconds, 3),
        "turns_per_s": len(latencies) / seconds,
        "latencies_us": [round(x * 1e6) for x in latencies],
        "loadgen_self_cores": cpu / seconds,
        "ids_minted_late": bank.extra if bank else 0,
        "http_statuses": {str(k): v for k, v in sorted(timed_statuses.items())},
        **extra,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- the orchestrator -----------------------------------------------------------------------------


async def _connect(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def _checkpoint(url: str) -> None:
    async with await _connect(url) as conn:
        with contextlib.suppress(psycopg.Error):
            await conn.execute("CHECKPOINT")


async def _drop_schema(url: str, schema: str) -> None:
    async with await _connect(url) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def _server_info(url: str) -> dict[str, str]:
    names = ["server_version", "fsync", "synchronous_commit", "shared_buffers"]
    async with await _connect(url) as conn:
        cur = await conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", [names]
        )
        return {str(r[0]): str(r[1]) for r in await cur.fetchall()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _git_head() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


async def inproc_run(
    url: str, schema: str, scenario: str, args: argparse.Namespace, sampler: Sampler
) -> dict[str, Any]:
    """Callers and runtime in this process."""
    sampler.named = {os.getpid(): "bench"}
    extra: dict[str, Any] = {}
    async with make_runtime(url, schema, args.pool_size, args.actors, args.callers) as runtime:
        if scenario == "sequential":
            handle = runtime.get(Counter, "seq-0")
            for _ in range(args.warmup):
                await handle.add(1)
            callers: list[Callable[[], Awaitable[Any]]] = [lambda: handle.add(1)]
        else:
            handles = [runtime.get(Counter, f"actor-{i:05d}") for i in range(args.actors)]
            calls = [(lambda h=h: h.add(1)) for h in handles]
            extra["prewarm_turns_per_s"] = await _prewarm(calls, args.callers)
            callers = [_random_caller(calls, seed) for seed in range(args.callers)]
        await _checkpoint(url)
        extra.update(await sampler.wait_quiet(args.quiet_below, args.quiet_wait))
        cpu = asyncio.create_task(sampler.sample(args.duration))
        latencies, errors, seconds = await _timed_calls(callers, args.duration)
        usage = await cpu
    return {
        "turns": len(latencies),
        "errors": len(errors),
        "error_reasons": dict(Tally(errors)),
        "seconds": round(seconds, 3),
        "turns_per_s": len(latencies) / seconds,
        **_latency_ms(latencies),
        **usage,
        **extra,
    }


async def _wait_ready(base_url: str, server: asyncio.subprocess.Process, limit: float) -> None:
    deadline = time.monotonic() + limit
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as http:
        while time.monotonic() < deadline:
            if server.returncode is not None:
                raise RuntimeError(f"akter serve exited with {server.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get("/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError("akter serve did not become ready")


async def _stop(process: asyncio.subprocess.Process, limit: float = 30.0) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), limit)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def http_run(
    url: str, schema: str, scenario: str, variant: str, args: argparse.Namespace, sampler: Sampler
) -> dict[str, Any]:
    """A fresh ``akter serve`` process, a load generator process, and this one sampling."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    akter_bin = Path(sys.executable).parent / "akter"
    env = {
        **os.environ,
        "AKTER_BENCH_URL": url,
        "AKTER_BENCH_SCHEMA": schema,
        "AKTER_BENCH_POOL": str(args.pool_size),
        "AKTER_BENCH_ACTORS": str(args.actors),
        "AKTER_BENCH_CALLERS": str(args.callers),
    }
    log = tempfile.TemporaryFile()
    server = await asyncio.create_subprocess_exec(
        str(akter_bin),
        "serve",
        "bench.http_bench:runtime",
        "--http",
        f"127.0.0.1:{port}",
        cwd=str(REPO_DIR),
        env=env,
        stdout=log,
        stderr=log,
    )
    loads: list[asyncio.subprocess.Process] = []
    procs = 1 if scenario == "sequential" else args.load_procs
    callers = 1 if scenario == "sequential" else args.callers
    try:
        await _wait_ready(base_url, server, 90.0)
        for k in range(procs):
            share = callers // procs + (1 if k < callers % procs else 0)
            loads.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(THIS_FILE),
                    *("--role", "load", "--base-url", base_url, "--variant", variant),
                    *("--scenario", scenario, "--duration", str(args.duration)),
                    *("--callers", str(share), "--actors", str(args.actors)),
                    *("--warmup", str(args.warmup), "--procs", str(procs), "--proc-index", str(k)),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    cwd=str(REPO_DIR),
                    limit=1 << 24,  # the RESULT line carries every latency
                )
            )
        sampler.named = {server.pid: "server", os.getpid(): "bench"}
        sampler.named.update((load.pid, "loadgen") for load in loads)

        async def expect(load: asyncio.subprocess.Process, word: str) -> str:
            assert load.stdout is not None
            while line := (await asyncio.wait_for(load.stdout.readline(), 300)).decode():
                if line.startswith(word):
                    return line
            raise RuntimeError(f"load generator exited ({await load.wait()}) before {word}")

        await asyncio.gather(*(expect(load, "WARM") for load in loads))
        await _checkpoint(url)
        quiet = await sampler.wait_quiet(args.quiet_below, args.quiet_wait)
        for load in loads:
            assert load.stdin is not None
            load.stdin.write(b"GO\n")
            await load.stdin.drain()
        await asyncio.gather(*(expect(load, "TIMED") for load in loads))
        usage = await sampler.sample(args.duration)
        results = [json.loads((await expect(load, "RESULT "))[len("RESULT ") :]) for load in loads]
        for load in loads:
            await load.wait()
    except BaseException:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        for load in loads:
            if load.returncode is None:
                load.kill()
                await load.wait()
        await _stop(server)
        log.close()
    latencies = [us / 1e6 for r in results for us in r.pop("latencies_us")]
    statuses: Tally[str] = Tally()
    errors: Tally[str] = Tally()
    for r in results:
        statuses.update(r["http_statuses"])
        errors.update(r["error_reasons"])
    rate = sum(r["turns_per_s"] for r in results)
    merged = {
        "turns": len(latencies),
        "errors": sum(errors.values()),
        "error_reasons": dict(errors),
        "seconds": max(r["seconds"] for r in results),
        "turns_per_s": rate,
        **_latency_ms(latencies),
        "load_procs": procs,
        "loadgen_self_cores": sum(r["loadgen_self_cores"] for r in results),
        "ids_minted_late": sum(r["ids_minted_late"] for r in results),
        "http_statuses": dict(sorted(statuses.items())),
        "http_requests_per_turn": statuses.total() / max(len(latencies), 1),
        "new_connections_per_turn": sum(r["connections_opened"] for r in results)
        / max(len(latencies), 1),
        **quiet,
    }
    if results[0].get("prewarm_turns_per_s"):
        merged["prewarm_turns_per_s"] = min(r["prewarm_turns_per_s"] for r in results)
    return {**merged, **usage}


def _per_turn(result: dict[str, Any]) -> dict[str, Any]:
    rate = result.get("turns_per_s") or 0.0
    for key in ("bench", "server", "loadgen", "postgres"):
        cores = result.get(f"{key}_cores")
        result[f"{key}_us_per_turn"] = cores / rate * 1e6 if rate and cores else None
    if result["variant"] == "inproc":
        result["akter_us_per_turn"] = result["bench_us_per_turn"]
    else:
        result["akter_us_per_turn"] = (result["server_us_per_turn"] or 0) + (
            result["loadgen_us_per_turn"] or 0
        )
    return result


def _f(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return fmt.format(value)


def render(title: str, rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["variant"] == "inproc"), None)
    lines = [
        f"#### {title}",
        "",
        "| variant | HTTP req / call | turns/s | ÷ in-process | p50 / p99 (ms) | mean (ms) "
        "| overhead p50 / mean (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = over = ""
        if base and r is not base:
            ratio = _f(r["turns_per_s"] / base["turns_per_s"], "{:.2f}")
            over = f"{r['p50_ms'] - base['p50_ms']:+.2f} / {r['mean_ms'] - base['mean_ms']:+.2f}"
        lines.append(
            f"| {LABELS[r['variant']]} | {_f(r.get('http_requests_per_turn', 0), '{:.2f}')} "
            f"| {_f(r['turns_per_s'], '{:,.0f}')} | {ratio} "
            f"| {_f(r['p50_ms'], '{:.2f}')} / {_f(r['p99_ms'], '{:.2f}')} "
            f"| {_f(r['mean_ms'], '{:.2f}')} | {over} |"
        )
    lines += [
        "",
        "| variant | cores: caller proc / server proc / postgres / other / machine "
        "| µs CPU per turn: caller / server / postgres | akter µs/turn (Δ in-process) "
        "| new TCP conns / call |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        inproc = r["variant"] == "inproc"
        busy = " †" if (r.get("other_cores") or 0) > DISTURBED else ""
        caller = r["bench_cores"] if inproc else r["loadgen_cores"]
        server = None if inproc else r["server_cores"]
        caller_us = r["bench_us_per_turn"] if inproc else r["loadgen_us_per_turn"]
        server_us = None if inproc else r["server_us_per_turn"]
        delta = ""
        if base and r is not base and base.get("akter_us_per_turn"):
            delta = f" ({r['akter_us_per_turn'] - base['akter_us_per_turn']:+,.0f})"
        lines.append(
            f"| {LABELS[r['variant']]}{busy} "
            f"| {_f(caller, '{:.2f}')} / {_f(server, '{:.2f}')} "
            f"/ {_f(r['postgres_cores'], '{:.2f}')} / {_f(r['other_cores'], '{:.2f}')} "
            f"/ {_f(r['machine_busy_cores'], '{:.2f}')} "
            f"| {_f(caller_us, '{:,.0f}')} / {_f(server_us, '{:,.0f}')} "
            f"/ {_f(r['postgres_us_per_turn'], '{:,.0f}')} "
            f"| {_f(r['akter_us_per_turn'], '{:,.0f}')}{delta} "
            f"| {_f(r.get('new_connections_per_turn'), '{:.2f}')} |"
        )
    notes = []
    for r in rows:
        if r.get("errors"):
            notes.append(f"{r['variant']}: {r['errors']} errors {r.get('error_reasons')}")
        refused = {k: v for k, v in (r.get("http_statuses") or {}).items() if k != "200"}
        if refused:
            notes.append(f"{r['variant']}: HTTP responses other than 200: {refused}")
        if (r.get("quiet_wait_s") or 0) > 1.5:
            notes.append(
                f"{r['variant']}: waited {r['quiet_wait_s']} s for a quiet machine "
                f"(other processes then at {r['other_cores_before']} cores)"
            )
        if r.get("prewarm_turns_per_s"):
            notes.append(f"{r['variant']} pre-warm {r['prewarm_turns_per_s']:,.0f}/s")
        if r.get("other_top"):
            notes.append(f"{r['variant']} other CPU {r['other_top']}")
    if any((r.get("other_cores") or 0) > DISTURBED for r in rows):
        notes.insert(0, f"†: other processes used more than {DISTURBED} cores during the run")
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    return "\n".join(lines)


def _postmaster_pid(embedded: EmbeddedPostgres | None) -> int | None:
    if embedded is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        return int((embedded.pgdata / "postmaster.pid").read_text().split()[0])
    return None


async def run(args: argparse.Namespace) -> int:
    embedded: EmbeddedPostgres | None = None
    data_dir: Path | None = None
    url: str = args.url or ""
    if not url:
        data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-http-pg-"))
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    sampler = Sampler(_postmaster_pid(embedded))
    scenarios = ["sequential", "many"] if args.scenario == "all" else [args.scenario]
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    out_path = Path(args.json) if args.json else None
    tag = str(os.getpid())
    failures = 0
    started = time.monotonic()
    try:
        info = await _server_info(url)
        env = {
            "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "server": "embedded" if embedded else "url",
            "server_version": info.get("server_version", ""),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "httpx": httpx.__version__,
            "git_head": _git_head(),
            "duration_s": args.duration,
            "loadavg_before": _loadavg(),
        }
        print(f"# akter HTTP benchmark — {env['date_utc']}")
        print(
            f"server: {'embedded ' if embedded else ''}PostgreSQL {env['server_version']} "
            f"(fsync={info.get('fsync')}, synchronous_commit={info.get('synchronous_commit')}); "
            f"{env['cpus']} CPUs; load {' '.join(env['loadavg_before'])}; HEAD {env['git_head']}",
            flush=True,
        )
        for rep in range(1, args.reps + 1):
            order = variants if rep % 2 else list(reversed(variants))
            for scenario in scenarios:
                rows: list[dict[str, Any]] = []
                for variant in order:
                    if scenario == "sequential" and variant in MANY_ONLY:
                        continue
                    schema = f"akter_bench_http_{tag}_{scenario[:3]}{rep}_{variant}"
                    try:
                        if variant == "inproc":
                            r = await inproc_run(url, schema, scenario, args, sampler)
                        else:
                            r = await http_run(url, schema, scenario, variant, args, sampler)
                    except Exception as exc:
                        failures += 1
                        print(f"{scenario}/{variant}: FAILED: {exc!r}", file=sys.stderr)
                        continue
                    finally:
                        with contextlib.suppress(Exception):
                            await _drop_schema(url, schema)
                    r.update(variant=variant, scenario=scenario, rep=rep)
                    rows.append(_per_turn(r))
                    print(
                        f"  {scenario}/{variant}: {r['turns_per_s']:,.0f}/s, "
                        f"p50 {r['p50_ms']:.2f} ms, load {' '.join(_loadavg())}",
                        flush=True,
                    )
                rows_in_order = list(rows)
                rows.sort(key=lambda r: VARIANTS.index(r["variant"]))
                callers = 1 if scenario == "sequential" else args.callers
                actors = 1 if scenario == "sequential" else args.actors
                title = (
                    f"{scenario}: {callers} caller(s) over {actors:,} actor(s), "
                    f"{args.duration:g} s, rep {rep}"
                    + (f", {args.load_procs} load generators" if args.load_procs > 1 else "")
                    + f" (order: {', '.join(r['variant'] for r in rows_in_order)})"
                )
                print("\n" + render(title, rows) + "\n", flush=True)
                if out_path is not None:
                    out_path.parent.mkdir(parents=True, exist_ok=True)
                    with out_path.open("a") as f:
                        for r in rows:
                            f.write(json.dumps({"bench": "http", **env, **r}, default=str) + "\n")
        print(
            f"load average after: {' '.join(_loadavg())}; "
            f"{time.monotonic() - started:.0f} s of wall time"
        )
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
            if data_dir is not None:
                import shutil

                shutil.rmtree(data_dir, ignore_errors=True)
    return 1 if failures else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per timed run")
    parser.add_argument("--scenario", choices=["sequential", "many", "all"], default="all")
    parser.add_argument(
        "--variants",
        default=DEFAULT_VARIANTS,
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: {DEFAULT_VARIANTS})",
    )
    parser.add_argument(
        "--load-procs", type=int, default=1, help="load generator processes in 'many'"
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.3,
        help="before each timed run, wait until other processes use fewer cores than this",
    )
    parser.add_argument("--quiet-wait", type=float, default=10.0, help="... for at most this (s)")
    parser.add_argument("--reps", type=int, default=2, help="repetitions (even reps reversed)")
    parser.add_argument("--json", help="append JSON lines here")
    parser.add_argument("--callers", type=int, default=64, help="callers in 'many'")
    parser.add_argument("--actors", type=int, default=1000, help="actors in 'many'")
    parser.add_argument("--pool-size", type=int, default=20, help="akter pool size")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up calls in 'sequential'")
    parser.add_argument("--role", choices=["run", "load"], default="run", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--proc-index", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "load":
        return asyncio.run(load_main(args))
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
