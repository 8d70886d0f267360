#!/usr/bin/env python3
"""Workflow benchmark (issue 15): akter workflows beside DBOS workflows on its Postgres queue.

    python -P bench/workflows.py [--url URL] [--runs 2000] [--callers 16] [--count-runs 200]
                                 [--warmup 50] [--no-peers] [--rotate 1] [--json PATH]
                                 [--step sync|async] [--profile PATH]

One invocation, one server: by default a throwaway embedded PostgreSQL (as ``bench/jobs.py``);
``--url`` names another. Each side gets its own database on it (``bench_wf_akter``,
``bench_wf_dbos``), dropped and recreated for every run. DBOS runs as a subprocess of this
script (``--peer dbos``) in the peers' virtualenv (``bench/workflows_run.sh`` creates it, like
``bench/jobs_run.sh``); that mode imports only the standard library, psycopg, SQLAlchemy and DBOS.

The workflow, the same shape on both sides:

* akter: ``Order.flow(i)``, an ``@akter.workflow`` on actor ``Order o-<i>``: a command step on its
  own actor (``Order.note``, sets a field of the state), a command step on another actor
  (``Ledger l-<i>.add``), then a local step ``wf.step(local_step, i)`` (a plain function, so it
  runs in a worker thread as the README's ``fee_for`` does; ``--step async`` passes a coroutine
  function instead). Every run has its own two actors: no turn waits for another run's turn.
* DBOS 3.4: a ``@DBOS.workflow`` of two transactions and a ``@DBOS.step``. DBOS 3 removed
  ``@DBOS.transaction`` and the application database; its successor is a datasource
  (``SQLAlchemyDatasource.create(url)``), whose ``@ds.transaction()`` functions run the user's
  SQL and the step's checkpoint in one transaction (exactly once, like akter's command steps).
  Each transaction inserts one row (tables ``wf_a`` and ``wf_b``), at the datasource's default
  isolation (SERIALIZABLE). The workflows are enqueued on a ``Queue`` with
  ``polling_interval_sec=--poll`` (0.01) and ``worker_concurrency=--callers`` (16).

``--callers`` (16) callers each start a run and await its result, in a closed loop, until
``--runs`` (2,000) runs are done; ``--warmup`` (50) runs first, untimed. akter's callers are
coroutines: ``await runtime.get(Order, id).flow.start(i)`` then ``await run.result()`` (it polls
the run's row, 5 ms doubling to 0.5 s). DBOS's callers are threads:
``DBOS.enqueue_workflow(...)`` then ``handle.get_result(polling_interval_sec=--dbos-result-poll)``
(0.01 s; DBOS's default, 1 s, would cap 16 callers near 16 runs/s).

Measured per side: runs/s over the timed runs; start→complete latency as the caller sees it
(start call to result returned, p50/p99); the same from the database's own timestamps (akter
``workflows.finished_at_ms - started_at_ms``; DBOS ``workflow_status.updated_at - created_at``),
which leaves out the caller's result polling; transactions per run (``pg_stat_database``); CPU
of the side's process, of the server and of other processes. Then an untimed sample of
``--count-runs`` runs per side goes through ``bench/turns.py``'s ``WireProxy``: statements and
round trips per run on the wire, with akter's caller polls (``wf_locate``, ``wf_get``,
``wf_steps`` of ``run.result()``) shown apart from the engine's own statements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import itertools
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

THIS_FILE = Path(__file__).resolve()
BENCH_DIR = THIS_FILE.parent
REPO_DIR = BENCH_DIR.parent
sys.path.append(str(BENCH_DIR))  # after the standard library: bench/ may shadow a module

from jobs import (  # noqa: E402  (bench/jobs.py: helpers shared by both virtualenvs)
    CpuWindow,
    _f,
    _get,
    _ratio,
    commit_probe,
    emit,
    latency_ms,
    quiet_gate,
    recreate_database,
    server_info,
    settle_database,
    transactions,
)

try:  # absent in the peers' virtualenv, where only --peer dbos runs
    from pydantic import BaseModel

    import akter
    from akter._store.embedded import EmbeddedPostgres
except ImportError:
    akter = None  # type: ignore[assignment]

PEERS_PYTHON = BENCH_DIR / ".venv-peers" / "bin" / "python"
MARK = "/* wf-bench */"  # the bench's own monitoring statements
STATS_SETTLE = 1.5
#: The statements of akter's run.result() polls (WorkflowEngine.status: locate, row, journal).
RESULT_POLLS = ("wf_locate", "wf_get", "wf_steps")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def handshake(a: argparse.Namespace, phase: str) -> None:
    """In a counting run: tell the orchestrator a phase ended and wait until it has counted."""
    if a.handshake:
        print(json.dumps({"handshake": phase}), flush=True)
        sys.stdin.readline()


def _db_latency(samples_ms: Sequence[float]) -> dict[str, Any]:
    got = latency_ms([s / 1000 for s in samples_ms])
    return {f"db_{k}": v for k, v in got.items()}


# --- DBOS (peers' virtualenv) ---------------------------------------------------------------------


def peer_dbos(a: argparse.Namespace) -> None:
    import importlib.metadata
    import logging
    from concurrent.futures import ThreadPoolExecutor

    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

    direct = recreate_database(a.direct_dsn or a.dsn, "bench_wf_dbos")
    info = conninfo_to_dict(make_conninfo(a.dsn, dbname="bench_wf_dbos"))
    host = str(info.get("host") or "127.0.0.1")
    port = info.get("port") or 5432
    user = info.get("user") or "postgres"
    if host.startswith("/"):
        sa_url = f"postgresql://{user}@/bench_wf_dbos?host={host}&port={port}"
    else:
        sa_url = f"postgresql://{user}@{host}:{port}/bench_wf_dbos"
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("CREATE TABLE wf_a (i int PRIMARY KEY, at timestamptz DEFAULT now())")
        conn.execute("CREATE TABLE wf_b (i int PRIMARY KEY, at timestamptz DEFAULT now())")
    base = {"lib": "dbos", "version": importlib.metadata.version("dbos")}

    config: DBOSConfig = {"name": "wfbench", "system_database_url": sa_url, "log_level": "WARNING"}
    DBOS(config=config)
    # the datasource's pool as large as DBOS's system pool (20), not SQLAlchemy's 5 + 10
    ds = SQLAlchemyDatasource.create(
        sa_url, engine_kwargs={"pool_size": 20, "max_overflow": 0}, schema="dbos_app"
    )

    @ds.transaction()
    def write_a(i: int) -> int:
        ds.sql_session().execute(sa.text("INSERT INTO wf_a (i) VALUES (:i)"), {"i": i})
        return i

    @ds.transaction()
    def write_b(i: int) -> int:
        ds.sql_session().execute(sa.text("INSERT INTO wf_b (i) VALUES (:i)"), {"i": i})
        return i

    @DBOS.step()
    def local_step(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def flow(i: int) -> int:
        return write_a(i) + write_b(i) + local_step(i)

    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS.register_queue("wfq", worker_concurrency=a.callers, polling_interval_sec=a.poll)

    def drive(first: int, n: int) -> tuple[float, list[float], list[str]]:
        counter = itertools.count(first)
        lock = threading.Lock()
        samples: list[float] = []
        ids: list[str] = []

        def caller() -> None:
            while True:
                with lock:
                    i = next(counter)
                if i >= first + n:
                    return
                t = time.perf_counter()
                handle = DBOS.enqueue_workflow("wfq", flow, i)
                value = handle.get_result(polling_interval_sec=a.dbos_result_poll)
                took = time.perf_counter() - t
                assert value == 3 * i + 1, value
                with lock:
                    samples.append(took)
                    ids.append(str(handle.workflow_id))

        t = time.perf_counter()
        with ThreadPoolExecutor(a.callers) as pool:
            for f in [pool.submit(caller) for _ in range(a.callers)]:
                f.result()
        return time.perf_counter() - t, samples, ids

    with psycopg.connect(direct, autocommit=True) as mon:
        if a.warmup:
            drive(10_000_000, a.warmup)
        if a.handshake:
            handshake(a, "start")
            seconds, samples, ids = drive(0, a.runs)
            handshake(a, "end")
            emit(**base, metric="count", done=len(samples))
        else:
            settle_database(direct)
            waited = quiet_gate(a.postmaster, a.quiet_wait)
            commit_ms = commit_probe(direct)
            time.sleep(STATS_SETTLE)
            xacts = transactions(direct)
            cpu = CpuWindow(a.postmaster)
            load_before = loadavg()
            seconds, samples, ids = drive(0, a.runs)
            usage = cpu.close()
            load_after = loadavg()
            rows = mon.execute(
                f"{MARK} SELECT (extract(epoch FROM now()) * 1000)::bigint, "
                "updated_at - created_at FROM dbos.workflow_status "
                "WHERE workflow_uuid = ANY(%s) AND status = 'SUCCESS'",
                [ids],
            ).fetchall()
            time.sleep(STATS_SETTLE)
            xacts = transactions(direct) - xacts - 1
            emit(
                **base,
                metric="runs",
                n=a.runs,
                done=len(samples),
                seconds=round(seconds, 3),
                rate=round(len(samples) / seconds, 1),
                quiet_wait_s=waited,
                commit_ms=commit_ms,
                transactions_per_run=round(xacts / len(samples), 3) if samples else None,
                load_before=load_before,
                load_after=load_after,
                poll=a.poll,
                result_poll=a.dbos_result_poll,
                **latency_ms(samples),
                **_db_latency([float(r[1]) for r in rows]),
                **usage,
            )
    DBOS.destroy(destroy_registry=True)


# --- akter ----------------------------------------------------------------------------------------

if akter is not None:

    class Note(BaseModel):
        n: int = 0

    def local_step(i: int) -> int:
        return i + 1

    async def local_step_async(i: int) -> int:
        return i + 1

    STEP: dict[str, Any] = {"fn": local_step}

    class Ledger(akter.Actor[Note]):
        @akter.command
        async def add(self, i: int) -> int:
            self.state.n += i
            return i

    class Order(akter.Actor[Note]):
        @akter.command
        async def note(self, i: int) -> int:
            self.state.n = i
            return i

        @akter.workflow
        async def flow(wf: akter.Workflow, i: int) -> int:
            a = await wf.get(Order, wf.ref.id).note(i)
            b = await wf.get(Ledger, f"l-{i}").add(i)
            c = await wf.step(STEP["fn"], i)
            return int(a + b + c)


class AkterSide:
    """Runs akter's side in this process, on its own database of the server."""

    def __init__(self, url: str, postmaster: int | None, args: argparse.Namespace) -> None:
        self.url = url
        self.postmaster = postmaster
        self.args = args
        self.direct = make_conninfo(url, dbname="bench_wf_akter")

    async def _drive(
        self, runtime: Any, first: int, n: int
    ) -> tuple[float, list[float], list[str]]:
        counter = itertools.count(first)
        samples: list[float] = []
        ids: list[str] = []

        async def caller() -> None:
            while (i := next(counter)) < first + n:
                t = time.perf_counter()
                run = await runtime.get(Order, f"o-{i}").flow.start(i)
                value = await run.result(timeout=120)
                samples.append(time.perf_counter() - t)
                ids.append(run.id)
                assert value == 3 * i + 1, value

        t = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(self.args.callers)))
        return time.perf_counter() - t, samples, ids

    @staticmethod
    async def _lag(samples: list[float], tick: float = 0.01) -> None:
        """Event-loop lag: how late a 10 ms sleep wakes, sampled while the runs go."""
        while True:
            t = time.perf_counter()
            await asyncio.sleep(tick)
            samples.append(time.perf_counter() - t - tick)

    def _runtime(self, dsn: str) -> Any:
        return akter.Runtime(
            actors=[Order, Ledger], database_url=dsn, schema="akter_wf", **self.args.akter_options
        )

    async def timed(self) -> dict[str, Any]:
        a = self.args
        await asyncio.to_thread(recreate_database, self.url, "bench_wf_akter")
        out: dict[str, Any] = {}
        async with self._runtime(self.direct) as runtime:
            if a.warmup:
                await self._drive(runtime, 10_000_000, a.warmup)
            await asyncio.to_thread(settle_database, self.direct)
            out["quiet_wait_s"] = await asyncio.to_thread(quiet_gate, self.postmaster, a.quiet_wait)
            out["commit_ms"] = await asyncio.to_thread(commit_probe, self.direct)
            await asyncio.sleep(STATS_SETTLE)
            xacts = await asyncio.to_thread(transactions, self.direct)
            cpu = CpuWindow(self.postmaster)
            load_before = loadavg()
            profiler = cProfile.Profile() if a.profile else None
            if profiler is not None:
                profiler.enable()
            lags: list[float] = []
            lagger = asyncio.create_task(self._lag(lags))
            seconds, samples, ids = await self._drive(runtime, 0, a.runs)
            lagger.cancel()
            if profiler is not None:
                profiler.disable()
            usage = cpu.close()
            load_after = loadavg()
            async with await psycopg.AsyncConnection.connect(self.direct, autocommit=True) as c:
                cur = await c.execute(
                    f"{MARK} SELECT finished_at_ms - started_at_ms FROM akter_wf.workflows "
                    "WHERE run_id = ANY(%s) AND status = 'completed'",
                    [ids],
                )
                db = [float(r[0]) for r in await cur.fetchall()]
        await asyncio.sleep(STATS_SETTLE)
        xacts = await asyncio.to_thread(transactions, self.direct) - xacts - 1
        if profiler is not None:
            profiler.dump_stats(a.profile)
            stats = pstats.Stats(profiler).sort_stats("tottime")
            stats.print_stats(30)
        return {
            "lib": "akter",
            "version": akter.__version__ if hasattr(akter, "__version__") else "",
            "metric": "runs",
            "n": a.runs,
            "done": len(samples),
            "seconds": round(seconds, 3),
            "rate": round(len(samples) / seconds, 1),
            "transactions_per_run": round(xacts / len(samples), 3) if samples else None,
            "load_before": load_before,
            "load_after": load_after,
            "step": a.step,
            **out,
            **latency_ms(samples),
            **_db_latency(db),
            **{f"loop_lag_{k}": v for k, v in latency_ms(lags).items()},
            **usage,
        }

    async def count(self, proxy: Any) -> dict[str, Any]:
        a = self.args
        await asyncio.to_thread(recreate_database, self.url, "bench_wf_akter")
        dsn = make_conninfo(proxy.url, dbname="bench_wf_akter")
        async with self._runtime(dsn) as runtime:
            proxy.learn(runtime._store.queries)
            if a.warmup:
                await self._drive(runtime, 10_000_000, a.warmup)
            before = proxy.snapshot()
            _, samples, _ = await self._drive(runtime, 0, a.count_runs)
            window = proxy.snapshot().minus(before)
        wire = window.per_turn(len(samples))
        polls = {k: v for k, v in window.statements.items() if k in RESULT_POLLS}
        n = max(len(samples), 1)
        wire["result_poll_statements_per_run"] = sum(polls.values()) / n
        wire["result_polls_per_run"] = polls.get("wf_get", 0) / n
        wire["engine_statements_per_run"] = wire["statements_per_turn"] - sum(polls.values()) / n
        return {"lib": "akter", "counted_runs": len(samples), "wire": wire}


# --- orchestration --------------------------------------------------------------------------------


async def run_peer(
    args: argparse.Namespace, url: str, postmaster: int | None, proxy: Any = None
) -> dict[str, Any]:
    """Run DBOS's side in the peers' virtualenv; with ``proxy``, count its wire traffic."""
    dsn = proxy.url if proxy is not None else url
    command = [args.peers_python, "-P", str(THIS_FILE), "--peer", "dbos", "--dsn", dsn]
    command += ["--direct-dsn", url, "--quiet-wait", str(args.quiet_wait)]
    command += ["--callers", str(args.callers), "--warmup", str(args.warmup)]
    command += ["--poll", str(args.poll), "--dbos-result-poll", str(args.dbos_result_poll)]
    command += ["--runs", str(args.count_runs if proxy is not None else args.runs)]
    if postmaster:
        command += ["--postmaster", str(postmaster)]
    if proxy is not None:
        command.append("--handshake")
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
        async with asyncio.timeout(args.limit):
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
        print(f"dbos failed (exit {process.returncode}):\n{tail}", file=sys.stderr, flush=True)
        return {"lib": "dbos", "error": f"exit {process.returncode}", "stderr": tail}
    if proxy is not None and {"start", "end"} <= marks.keys():
        done = int(records[-1].get("done") or 0)
        window = marks["end"].minus(marks["start"])
        return {"lib": "dbos", "counted_runs": done, "wire": window.per_turn(done)}
    return records[-1]


ROWS: list[tuple[str, str, str, bool]] = [
    ("**runs/s**", "rate", "{:,.1f}", True),
    ("time for the timed runs (s)", "seconds", "{:.1f}", False),
    ("runs done", "done", "{:,}", False),
    ("start→complete p50, caller (ms)", "p50_ms", "{:.1f}", True),
    ("start→complete p99, caller (ms)", "p99_ms", "{:.1f}", True),
    ("start→complete mean, caller (ms)", "mean_ms", "{:.1f}", True),
    ("start→end p50, database timestamps (ms)", "db_p50_ms", "{:.1f}", True),
    ("start→end p99, database timestamps (ms)", "db_p99_ms", "{:.1f}", True),
    ("akter: event-loop lag p50 / p99 (ms)", "loop_lag", "{}", False),
    ("transactions / run", "transactions_per_run", "{:.2f}", True),
    ("statements / run (wire sample)", "count.wire.statements_per_turn", "{:.1f}", True),
    ("round trips / run (wire sample)", "count.wire.round_trips_per_turn", "{:.1f}", True),
    ("commits / run (wire sample)", "count.wire.commits_per_turn", "{:.1f}", True),
    (
        "akter: of which the caller's result polls",
        "count.wire.result_poll_statements_per_run",
        "{:.1f}",
        False,
    ),
    (
        "akter: engine statements / run (without polls)",
        "count.wire.engine_statements_per_run",
        "{:.1f}",
        False,
    ),
    ("client CPU (cores)", "client_cores", "{:.2f}", False),
    ("postgres CPU (cores)", "postgres_cores", "{:.2f}", False),
    ("other processes (cores)", "other_cores", "{:.2f}", False),
    ("client CPU per run (µs)", "client_us_per_run", "{:,.0f}", True),
    ("postgres CPU per run (µs)", "postgres_us_per_run", "{:,.0f}", True),
    ("commit latency before the run (ms)", "commit_ms", "{:.2f}", False),
    ("load average before → after", "load", "{}", False),
]


def _per_run(record: dict[str, Any]) -> dict[str, Any]:
    rate = record.get("rate") or 0
    for side in ("client", "postgres"):
        cores = record.get(f"{side}_cores")
        record[f"{side}_us_per_run"] = cores / rate * 1e6 if rate and cores is not None else None
    if record.get("loop_lag_p50_ms") is not None:
        record["loop_lag"] = f"{record['loop_lag_p50_ms']:.1f} / {record['loop_lag_p99_ms']:.1f}"
    if record.get("load_before"):
        record["load"] = f"{record['load_before']} → {record.get('load_after')}"
    return record


def _mix(wire: dict[str, Any] | None, top: int = 20) -> str:
    if not wire:
        return ""
    mix = sorted(wire.get("statement_mix", {}).items(), key=lambda kv: -kv[1])
    shown = [f"`{k[:48] or '(empty query)'}` {v:.2f}" for k, v in mix if v >= 0.005]
    return ", ".join(shown[:top])


def render(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    ak, db = rows.get("akter", {}), rows.get("dbos", {})
    lines = [
        f"#### {args.runs:,} runs (2 command/transaction steps + 1 local step), "
        f"{args.callers} closed-loop callers",
        "",
        "| measure | akter | DBOS | akter / DBOS |",
        "|---|---|---|---|",
    ]
    for label, key, fmt, ratio in ROWS:
        a, d = _get(ak, key), _get(db, key)
        if a is None and d is None:
            continue
        lines.append(f"| {label} | {_f(a, fmt)} | {_f(d, fmt)} | {_ratio(a, d) if ratio else ''} |")
    for lib, record in (("akter", ak), ("DBOS", db)):
        mix = _mix(_get(record, "count.wire"))
        if mix:
            lines.append(f"\n{lib} statements per run (wire sample): {mix}")
        for part in (record, record.get("count") or {}):
            if part.get("error"):
                lines.append(f"\n{lib} FAILED: {part['error']} {part.get('stderr', '')[-400:]}")
    return "\n".join(lines)


def _git_head() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def _append_json(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def _quiet_proxy_cancels(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The proxy's connection tasks end cancelled at its stop: not worth a traceback."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


async def orchestrate(args: argparse.Namespace) -> int:
    from turns import WireProxy

    asyncio.get_running_loop().set_exception_handler(_quiet_proxy_cancels)
    if args.step == "async":
        STEP["fn"] = local_step_async
    server = data_dir = None
    url = args.url or ""
    if not url:
        data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="akter-bench-wf-pg-"))
        server = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(server.start)
    order = ["akter"] if args.no_peers else ["akter", "dbos"]
    if args.rotate % len(order):
        order.reverse()
    proxy = WireProxy(url)
    await proxy.start()
    rows: dict[str, dict[str, Any]] = {}
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
            "runs": args.runs,
            "callers": args.callers,
            "warmup": args.warmup,
            "count_runs": args.count_runs,
            "order": order,
            "akter_options": args.akter_options,
        }
        print(f"# akter workflow benchmark — {env['date_utc']}")
        print(
            f"server: {'embedded ' if server else ''}PostgreSQL {info.get('server_version')} "
            f"(fsync={info.get('fsync')}, synchronous_commit={info.get('synchronous_commit')}, "
            f"shared_buffers={info.get('shared_buffers')}, "
            f"max_connections={info.get('max_connections')}); {env['cpus']} CPUs; "
            f"HEAD {env['git_head']}; {args.runs:,} runs by {args.callers} callers after "
            f"{args.warmup} warm-up runs; wire samples of {args.count_runs} runs; order {order}; "
            f"akter local step {args.step}; akter options {args.akter_options or 'default'}",
            flush=True,
        )
        ours = AkterSide(url, postmaster, args)
        for lib in order:
            t = time.perf_counter()
            if lib == "akter":
                record = await ours.timed()
            else:
                record = await run_peer(args, url, postmaster)
            record["wall_s"] = round(time.perf_counter() - t, 1)
            rows[lib] = _per_run(record)
            print(f"  {lib}: {json.dumps(record, default=str)[:400]}", file=sys.stderr, flush=True)
        if args.count_runs:
            for lib in order:
                if lib == "akter":
                    rows[lib]["count"] = await ours.count(proxy)
                else:
                    rows[lib]["count"] = await run_peer(args, url, postmaster, proxy)
        print("\n" + render(rows, args), flush=True)
        if args.json:
            path = Path(args.json)
            _append_json(path, [{**env, **record, "lib": lib} for lib, record in rows.items()])
            print(f"\nJSON lines appended to {path}")
    finally:
        await proxy.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)
            if not args.data_dir and data_dir is not None:
                shutil.rmtree(data_dir, ignore_errors=True)
    failed = [r for r in rows.values() if "error" in r or "error" in (r.get("count") or {})]
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    p.add_argument("--data-dir", help="embedded server directory (default: a temp dir)")
    p.add_argument("--runs", type=int, default=2000, help="timed runs per side")
    p.add_argument("--callers", type=int, default=16, help="closed-loop callers (and DBOS workers)")
    p.add_argument("--warmup", type=int, default=50, help="untimed runs first, per side")
    p.add_argument("--count-runs", type=int, default=200, help="runs per wire sample (0: none)")
    p.add_argument("--poll", type=float, default=0.01, help="DBOS queue polling_interval_sec")
    p.add_argument(
        "--dbos-result-poll",
        type=float,
        default=0.01,
        help="DBOS handle.get_result(polling_interval_sec=...)",
    )
    p.add_argument(
        "--step", choices=["sync", "async"], default="sync", help="akter's local step function"
    )
    p.add_argument(
        "--akter-option",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="an akter Runtime(...) option, e.g. framework_pool_size=16 (repeatable)",
    )
    p.add_argument("--profile", help="cProfile akter's timed runs into this file (and print)")
    p.add_argument("--quiet-wait", type=float, default=5.0, help="longest wait for a quiet machine")
    p.add_argument("--limit", type=float, default=600.0, help="longest run of the DBOS process (s)")
    p.add_argument("--peers-python", default=str(PEERS_PYTHON))
    p.add_argument("--no-peers", action="store_true", help="akter only")
    p.add_argument("--rotate", type=int, default=0, help="1: DBOS goes first")
    p.add_argument("--json", help="append JSON lines here")
    # --peer mode (run by the orchestrator under the peers' virtualenv)
    p.add_argument("--peer", choices=["dbos"], help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    p.add_argument("--direct-dsn", help=argparse.SUPPRESS)
    p.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--postmaster", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.akter_options = {}
    for option in a.akter_option:
        name, _, value = option.partition("=")
        a.akter_options[name] = float(value) if "." in value else int(value)
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer == "dbos":
        peer_dbos(args)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the embedded server on TERM
    if akter is None:
        print("akter is not importable: run with akter's .venv", file=sys.stderr)
        return 2
    if not args.no_peers and not os.path.exists(args.peers_python):
        print(
            f"no peers' python at {args.peers_python}: run bench/workflows_run.sh", file=sys.stderr
        )
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(orchestrate(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
