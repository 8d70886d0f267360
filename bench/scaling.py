#!/usr/bin/env python3
"""Commands/s from 1 to 2 runner processes on one PostgreSQL (issue 5), beside pgbench.

    python bench/scaling.py [--url URL] [--seconds 10] [--variant state|intent|all]
                            [--layout 1 2-split 2-shared] [--reps 1] [--analyze]
                            [--json bench/results/scaling.jsonl]

Each **runner process** is a separate OS process (``sys.executable bench/scaling.py child``) with
its own ``akter.Runtime`` (pool, relay, maintenance: the defaults) and its own callers, in-process.
The offered load is the same in every layout: ``--callers`` (64) in all, each awaiting one
command at a time on a random actor of ``--actors`` (10,000), all pre-warmed first (one call per
actor in every process that will call it, so every row exists and every activation is cached).

Layouts (each on a fresh schema, dropped afterwards):

* ``1``: one process, 64 callers over all actors.
* ``2-split``: two processes, 32 callers each; process i calls only the actors with index ≡ i
  (mod 2). No actor is shared: no lock contention across processes.
* ``2-shared``: two processes, 32 callers each, both over all actors: the same actor can be
  locked by both processes, and each process's cached activation goes stale when the other one
  commits (the lock statement then ships the state).

Variants:

* ``state``: ``Acct.add(1)``, a pure-state command. Comparator: ``bench/sql/actor_turn.sql``,
  ``pgbench -c 64 -j 2 -D nactors=10000``, as in ``bench/turns.py``.
* ``intent``: ``Acct.add_and_send(1)`` also stages an intent (``self.send(Acct.got, own id)``),
  which the relays deliver as a second turn. Reported commands/s count the callers' commands;
  deliveries/s are reported apart. Comparator: ``bench/sql/scaling_stage.sql`` (the turn plus an
  outbox insert) and ``bench/sql/scaling_deliver.sql`` (claim, delete and the target's turn in
  one transaction), one pgbench run with both scripts at weight 1, 64 clients; its "commands/s"
  is the staging script's rate.

Measured in the timed window: commands/s, p50/p99 latency (around each ``await`` in the callers,
all processes' samples together), transactions per command (a batch runs several queued commands
of one actor in one transaction), CPU seconds of each runner process and of all PostgreSQL
server processes (two ``/proc`` snapshots inside the window), and the ratio to pgbench's rate in
the same invocation, against the same server. The children exit without stopping their runtimes
(the schema is dropped next; see finding 6 of "Runners and schedules" in docs/benchmarks.md).
The machine's cores are shared by the runner processes, PostgreSQL and pgbench: on a 2-core
machine, 2 processes + PostgreSQL compete for them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import sql
from pydantic import BaseModel

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
SELF = Path(__file__).resolve()
sys.path.insert(0, str(BENCH_DIR))

import turns  # noqa: E402  (bench/turns.py: CPU sampling, pgbench helpers, schema helpers)

import akter  # noqa: E402
from akter._store.embedded import EmbeddedPostgres  # noqa: E402

SQL_DIR = BENCH_DIR / "sql"
LAYOUTS = {"1": (1, False), "2-split": (2, True), "2-shared": (2, False)}


# --- the actor ----------------------------------------------------------------------------------


class Tally(BaseModel):
    """A counter and the intents it received."""

    n: int = 0
    got: int = 0


class Acct(akter.Actor[Tally]):
    """A small actor: a pure-state command, and one that also stages an intent."""

    @akter.command
    async def add(self, k: int) -> int:
        """Pure state."""
        self.state.n += k
        return self.state.n

    @akter.command
    async def add_and_send(self, k: int) -> int:
        """State plus one intent to this actor's ``got`` (delivered by a relay after commit)."""
        self.state.n += k
        self.send(Acct.got, self.id, k)
        return self.state.n

    @akter.command
    async def got(self, k: int) -> None:
        """The intent's turn."""
        self.state.got += k


def actor_id(i: int) -> str:
    """The id of actor ``i``."""
    return f"acct-{i:05d}"


# --- child: one runner process --------------------------------------------------------------------


async def child(config: dict[str, Any]) -> int:
    """A runner process: pre-warm its actors, say READY, run its callers on GO, report, exit.

    SIGUSR1 prints every asyncio task's stack to stderr (for a process that seems stuck).
    """
    ids = [actor_id(i) for i in range(config["first"], config["actors"], config["step"])]
    runtime = akter.Runtime(
        [Acct],
        database_url=config["url"],
        schema=config["schema"],
        pool_size=config["pool_size"],
        max_resident_actors=config["actors"] + 1000,
        max_pending_commands=max(10_000, config["callers"] * 4),
        delivery_concurrency=config["delivery_concurrency"],
        max_outbox_backlog=config["max_outbox_backlog"],
    )
    lines = asyncio.Queue[str]()

    async def read_stdin() -> None:
        while line := await asyncio.to_thread(sys.stdin.readline):
            await lines.put(line.strip())
        await lines.put("")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
    async with runtime:
        tasks = [asyncio.create_task(read_stdin())]  # noqa: F841 (kept alive until the exit)
        handles = [runtime.get(Acct, i) for i in ids]
        todo = iter(handles)
        started = time.perf_counter()

        async def prewarm() -> None:
            for handle in todo:
                await handle.add(1)

        await asyncio.gather(*(prewarm() for _ in range(config["callers"])))
        prewarm_s = time.perf_counter() - started
        batches = turns.BatchCounter(runtime)
        print("READY", flush=True)
        if await lines.get() != "GO":
            os._exit(1)
        send = config["variant"] == "intent"
        latencies: list[float] = []
        errors: list[str] = []
        refused = [0]

        async def caller(seed: int, until: float) -> None:
            rng = random.Random(seed)
            while (start := time.perf_counter()) < until:
                handle = handles[rng.randrange(len(handles))]
                try:
                    await (handle.add_and_send(1) if send else handle.add(1))
                except akter.ActorError as exc:
                    if exc.reason == "RunnerAtCapacity":
                        # Backpressure (max_outbox_backlog): wait as told, as a client should.
                        refused[0] += 1
                        await asyncio.sleep(exc.retry_after or 0.1)
                        continue
                    errors.append(exc.reason)
                    continue
                latencies.append(time.perf_counter() - start)

        cpu0, delivered0 = time.process_time(), runtime._relay.delivered
        b0, c0 = batches.batches, batches.commands
        start = time.perf_counter()
        until = start + config["seconds"]
        seed = config["seed"]
        series: list[tuple[float, int, int]] = []

        async def record_series() -> None:
            # (seconds in, commands done, intents delivered) every second: the steady state.
            while (at := time.perf_counter()) < until:
                series.append((round(at - start, 2), len(latencies), runtime._relay.delivered))
                await asyncio.sleep(1.0)

        recorder = asyncio.create_task(record_series())
        await asyncio.gather(*(caller(seed + i, until) for i in range(config["callers"])))
        await recorder
        series.append(
            (round(time.perf_counter() - start, 2), len(latencies), runtime._relay.delivered)
        )
        seconds = time.perf_counter() - start
        report = {
            "pid": os.getpid(),
            "actors_called": len(ids),
            "prewarm_s": round(prewarm_s, 2),
            "seconds": seconds,
            "commands": len(latencies),
            "errors": len(errors),
            "refused": refused[0] + runtime._loop.backlog.refused,
            "series": series,
            "error_reasons": sorted(set(errors)),
            "cpu_s": time.process_time() - cpu0,
            "delivered": runtime._relay.delivered - delivered0,
            "transactions": batches.batches - b0,
            "batched_commands": batches.commands - c0,
            "latencies_us": [round(x * 1e6) for x in latencies],
        }
        await asyncio.to_thread(Path(config["report"]).write_text, json.dumps(report))
        print("DONE", flush=True)
        await lines.get()  # end of input
        # Exit without stopping the runtime: the schema is dropped next, and a graceful stop
        # under a relay backlog can hang (the relay loop's cancellation gets lost in
        # ``asyncio.wait_for`` on Python 3.11; see docs/benchmarks.md).
        os._exit(0)
    return 0


def _dump_tasks() -> None:
    """SIGUSR1: print every asyncio task's stack to stderr (to diagnose a stuck process)."""
    for task in asyncio.all_tasks():
        print(f"--- {task.get_name()}", file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


# --- parent: one layout -------------------------------------------------------------------------


class Proc:
    """A child runner process, spoken to over stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process, report: Path) -> None:
        self.proc = proc
        self.report = report

    async def line(self, within: float) -> str:
        """The next stdout line."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        if not raw:
            raise RuntimeError(f"runner process {self.proc.pid} ended ({await self.proc.wait()})")
        return raw.decode().strip()

    async def say(self, text: str) -> None:
        """One line to its stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def stop(self) -> None:
        """End of input; wait for the exit."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.stdout.read(), 60)
        await self.proc.wait()

    async def kill(self) -> None:
        """Make sure it is gone."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def _count(url: str, query: sql.Composable) -> int:
    async with await turns._connect(url) as conn:
        row = await (await conn.execute(query)).fetchone()
        return int(row[0]) if row else 0


async def _wal_lsn(url: str) -> int:
    """The server's current WAL position, in bytes."""
    return await _count(url, sql.SQL("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def _second_half(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Commands/s and deliveries/s over the second half of the window (all processes)."""
    commands = delivered = 0.0
    span = 0.0
    for r in reports:
        points = r.get("series") or []
        if len(points) < 2:
            continue
        end = points[-1]
        mid = min(points, key=lambda p: abs(p[0] - end[0] / 2))
        span = max(span, end[0] - mid[0])
        commands += end[1] - mid[1]
        delivered += end[2] - mid[2]
    if not span:
        return {}
    return {"half2_commands_per_s": commands / span, "half2_delivered_per_s": delivered / span}


async def _backlog_series(url: str, schema: str, seconds: float) -> list[tuple[float, int]]:
    """Intent rows in the outbox every ``seconds / 6`` of the window: (seconds in, rows)."""
    query = sql.SQL("SELECT count(*) FROM {}.outbox WHERE kind = 'intent'").format(
        sql.Identifier(schema)
    )
    step = max(seconds / 6, 1.0)
    start = time.perf_counter()
    points: list[tuple[float, int]] = []
    while (at := time.perf_counter() - start) < seconds:
        points.append((round(at, 1), await _count(url, query)))
        await asyncio.sleep(step)
    return points


async def _cpu_window(seconds: float, pids: dict[int, str]) -> dict[str, Any]:
    """CPU cores per runner process, PostgreSQL and the rest, between two /proc snapshots."""
    margin = min(1.0, seconds / 10)
    await asyncio.sleep(margin)
    t0, p0 = time.perf_counter(), turns._process_ticks()
    m0 = turns._machine_jiffies()
    await asyncio.sleep(max(seconds - 2 * margin, 0.1))
    t1, p1 = time.perf_counter(), turns._process_ticks()
    m1 = turns._machine_jiffies()
    wall = t1 - t0
    cores: dict[str, float] = dict.fromkeys(pids.values(), 0.0)
    cores |= {"postgres": 0.0, "other": 0.0}
    for pid, (comm, ticks) in p1.items():
        before = p0.get(pid)
        if before is None or before[0] != comm:
            continue
        used = (ticks - before[1]) / turns._TICKS / wall
        group = pids.get(pid) or ("postgres" if comm.startswith("postgres") else "other")
        cores[group] += used
    busy = (m1[0] - m0[0]) / max(m1[1] - m0[1], 1) * (os.cpu_count() or 1)
    return {
        "cpu_window_s": round(wall, 2),
        "cores": {k: round(v, 3) for k, v in cores.items()},
        "machine_busy_cores": round(busy, 3),
    }


async def run_layout(
    url: str, variant: str, layout: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """One layout of one variant on a fresh schema."""
    nprocs, split = LAYOUTS[layout]
    schema = f"akter_scaling_{uuid.uuid4().hex[:10]}"
    async with akter.Runtime([Acct], database_url=url, schema=schema, relay=False):
        pass  # migrates the schema before the children start
    procs: list[Proc] = []
    try:
        for i in range(nprocs):
            report = tmp / f"{schema}-{i}.json"
            config = {
                "url": url,
                "schema": schema,
                "variant": variant,
                "actors": args.actors,
                "first": i if split else 0,
                "step": nprocs if split else 1,
                "callers": args.callers // nprocs,
                "seconds": args.seconds,
                "seed": 1000 * (i + 1),
                "pool_size": args.pool_size,
                "delivery_concurrency": args.delivery_concurrency,
                "max_outbox_backlog": args.max_outbox_backlog or None,
                "report": str(report),
            }
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SELF),
                "child",
                json.dumps(config),
                cwd=REPO_DIR,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            procs.append(Proc(process, report))
        for proc in procs:
            if (line := await proc.line(600)) != "READY":
                raise RuntimeError(f"runner process: {line!r}")
        await turns._settle(url, schema, args.analyze)
        names = {p.proc.pid: f"runner {i + 1}" for i, p in enumerate(procs)}
        sampler = asyncio.create_task(_cpu_window(args.seconds, names))
        series = asyncio.create_task(_backlog_series(url, schema, args.seconds))
        wal0 = await _wal_lsn(url)
        for proc in procs:
            await proc.say("GO")
        for proc in procs:
            if (line := await proc.line(args.seconds + 120)) != "DONE":
                raise RuntimeError(f"runner process: {line!r}")
        wal_bytes = await _wal_lsn(url) - wal0
        usage = await sampler
        backlog_series = await series
        backlog = await _count(
            url, sql.SQL("SELECT count(*) FROM {}.outbox").format(sql.Identifier(schema))
        )
        for proc in procs:
            await proc.stop()
        reports = [json.loads(p.report.read_text()) for p in procs]
    finally:
        for proc in procs:
            await proc.kill()
        await turns._drop_schema(url, schema)
    latencies = [us / 1e6 for r in reports for us in r.pop("latencies_us")]
    seconds = max(r["seconds"] for r in reports)
    commands = sum(r["commands"] for r in reports)
    cores = usage["cores"]
    rate = commands / seconds
    return {
        "side": "akter",
        "variant": variant,
        "layout": layout,
        "processes": nprocs,
        "callers": args.callers // nprocs * nprocs,
        "actors": args.actors,
        "commands": commands,
        "seconds": round(seconds, 3),
        "commands_per_s": rate,
        **turns._latency_ms(latencies),
        "errors": sum(r["errors"] for r in reports),
        "delivered_per_s": sum(r["delivered"] for r in reports) / seconds,
        "outbox_backlog_after": backlog,
        "backlog_series": backlog_series,
        "refused": sum(r.get("refused", 0) for r in reports),
        **_second_half(reports),
        # WAL of the whole server over the window (the callers' and the deliveries' turns, and
        # anything else writing meanwhile), per committed caller command and per transaction.
        "wal_bytes": wal_bytes,
        "wal_bytes_per_command": wal_bytes / max(1, commands),
        "wal_bytes_per_transaction": wal_bytes / max(1, sum(r["transactions"] for r in reports)),
        "transactions_per_command": (
            sum(r["transactions"] for r in reports)
            / max(1, sum(r["batched_commands"] for r in reports))
        ),
        "runner_cpu_s": [round(r["cpu_s"], 2) for r in reports],
        "runner_cores": [cores[f"runner {i + 1}"] for i in range(nprocs)],
        "postgres_cores": cores["postgres"],
        "other_cores": cores["other"],
        "machine_busy_cores": usage["machine_busy_cores"],
        "postgres_us_per_command": cores["postgres"] / rate * 1e6 if rate else None,
        "runner_us_per_command": sum(cores[f"runner {i + 1}"] for i in range(nprocs)) / rate * 1e6
        if rate
        else None,
        "prewarm_s": [r["prewarm_s"] for r in reports],
        "per_process": reports,
    }


# --- pgbench --------------------------------------------------------------------------------------


async def _pgbench_tables(url: str, schema: str, variant: str) -> None:
    await turns._pgbench_schema(url, schema)
    if variant == "intent":
        statements = turns._split_sql((SQL_DIR / "relay_claim_schema.sql").read_text())
        async with await turns._connect(url) as conn:
            await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
            for statement in statements:
                await conn.execute(statement.encode())


async def run_pgbench(url: str, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """The raw-SQL comparator of ``variant``: 64 clients, 10,000 actors, ``--seconds``."""
    schema = f"akter_scaling_pgbench_{os.getpid()}"
    await _pgbench_tables(url, schema, variant)
    await turns._checkpoint(url)
    if variant == "intent":
        scripts = ["-f", f"{SQL_DIR / 'scaling_stage.sql'}@1"]
        scripts += ["-f", f"{SQL_DIR / 'scaling_deliver.sql'}@1"]
    else:
        scripts = ["-f", str(SQL_DIR / "actor_turn.sql")]
    jobs = min(2, os.cpu_count() or 1)
    base = [
        "-n",
        *scripts,
        "-D",
        f"nactors={args.actors}",
        "-c",
        str(args.callers),
        "-j",
        str(jobs),
    ]
    logdir = Path(tempfile.mkdtemp(prefix="akter-bench-scaling-"))
    prefix = logdir / "pgb"
    try:
        sampler = asyncio.create_task(turns.sample_cpu(args.seconds))
        code, out, command = await turns._run_pgbench(
            url,
            schema,
            [*base, "-T", str(int(args.seconds)), "-l", f"--log-prefix={prefix}"],
            args.seconds + 120,
        )
        usage = await sampler
        if code != 0:
            raise RuntimeError(f"pgbench failed ({code}):\n{out}")
        latencies = await asyncio.to_thread(_script_latencies, prefix, 0)
        backlog = 0
        if variant == "intent":
            backlog = await _count(
                url, sql.SQL("SELECT count(*) FROM {}.outbox_q").format(sql.Identifier(schema))
            )
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
        await turns._drop_schema(url, schema)
    total = turns._pgbench_number(r"^tps = ([\d.]+)", out) or 0.0
    per_script = [
        float(x) for x in re.findall(r"transactions \([\d.]+% of total, tps = ([\d.]+)\)", out)
    ]
    rate = per_script[0] if variant == "intent" and per_script else total
    shown = [Path(command[0]).name, *command[1:-1]]
    shown = [a.replace(str(REPO_DIR) + "/", "") for a in shown if not a.startswith("--log-prefix")]
    return {
        "side": "pgbench",
        "variant": variant,
        "layout": "pgbench",
        "clients": args.callers,
        "actors": args.actors,
        "commands_per_s": rate,
        "tps_all_scripts": total,
        "delivered_per_s": per_script[1] if variant == "intent" and len(per_script) > 1 else None,
        "outbox_backlog_after": backlog,
        **turns._latency_ms(latencies),
        "client_cores": usage["pgbench_cores"],
        "postgres_cores": usage["postgres_cores"],
        "other_cores": usage["other_cores"],
        "machine_busy_cores": usage["machine_busy_cores"],
        "postgres_us_per_command": usage["postgres_cores"] / total * 1e6 if total else None,
        "cmd": " ".join(shown) + " <same server>",
    }


def _no_reference(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """A placeholder reference row when ``--skip-pgbench`` (ratios to pgbench show as –)."""
    return {
        "side": "pgbench",
        "variant": variant,
        "layout": "pgbench",
        "clients": args.callers,
        "actors": args.actors,
        "commands_per_s": float("nan"),
        "delivered_per_s": None,
        "outbox_backlog_after": 0,
        "p50_ms": None,
        "p99_ms": None,
        "client_cores": 0.0,
        "postgres_cores": 0.0,
        "postgres_us_per_command": None,
        "machine_busy_cores": 0.0,
        "cmd": "skipped (--skip-pgbench)",
    }


def _script_latencies(prefix: Path, script: int) -> list[float]:
    """Latencies (s) of one script's transactions from ``pgbench -l`` (columns 3 and 4)."""
    samples: list[float] = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        with path.open() as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2].isdigit() and parts[3] == str(script):
                    samples.append(int(parts[2]) / 1e6)
    return samples


# --- output ---------------------------------------------------------------------------------------


def _f(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return fmt.format(value)


def render(variant: str, rows: list[dict[str, Any]], reference: dict[str, Any]) -> str:
    """The markdown table of one variant."""
    ref = reference["commands_per_s"]
    one = next((r["commands_per_s"] for r in rows if r["layout"] == "1"), None)
    lines = [
        f"#### {variant}: {rows[0]['callers'] if rows else '?'} callers over "
        f"{reference['actors']:,} pre-warmed actors",
        "",
        "| layout | commands/s | vs 1 process | vs pgbench | p50 / p99 (ms) "
        "| transactions / command | intents delivered/s (backlog after) "
        "| runner cores (CPU s in window) | postgres cores (µs / command) | machine busy (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        runners = " + ".join(
            f"{c:.2f} ({s:.1f})" for c, s in zip(r["runner_cores"], r["runner_cpu_s"], strict=True)
        )
        delivered = (
            f"{r['delivered_per_s']:,.0f} ({r['outbox_backlog_after']:,})"
            if variant == "intent"
            else "–"
        )
        lines.append(
            f"| {r['layout']} | {r['commands_per_s']:,.0f} "
            f"| {_f(r['commands_per_s'] / one if one else None, '{:.2f}')} "
            f"| **{_f(r['commands_per_s'] / ref if ref else None, '{:.2f}')}** "
            f"| {_f(r['p50_ms'], '{:.1f}')} / {_f(r['p99_ms'], '{:.1f}')} "
            f"| {r['transactions_per_command']:.3f} | {delivered} | {runners} "
            f"| {r['postgres_cores']:.2f} ({_f(r['postgres_us_per_command'], '{:,.0f}')}) "
            f"| {r['machine_busy_cores']:.2f} |"
        )
        if r["errors"]:
            lines.append(f"|  | errors: {r['errors']} |  |  |  |  |  |  |  |  |")
    delivered = (
        f"{_f(reference['delivered_per_s'], '{:,.0f}')} ({reference['outbox_backlog_after']:,})"
        if variant == "intent"
        else "–"
    )
    lines.append(
        f"| pgbench, {reference['clients']} clients | {ref:,.0f} |  | 1.00 "
        f"| {_f(reference['p50_ms'], '{:.1f}')} / {_f(reference['p99_ms'], '{:.1f}')} | 1.000 "
        f"| {delivered} | pgbench {reference['client_cores']:.2f} "
        f"| {reference['postgres_cores']:.2f} "
        f"({_f(reference['postgres_us_per_command'], '{:,.0f}')}) "
        f"| {reference['machine_busy_cores']:.2f} |"
    )
    lines += ["", f"pgbench: `{reference['cmd']}`"]
    for r in rows:
        note = f"layout {r['layout']}: WAL {r['wal_bytes_per_transaction']:,.0f} bytes/transaction"
        if variant == "intent":
            points = ", ".join(f"{t:g} s: {n:,}" for t, n in r.get("backlog_series", []))
            note += (
                f"; intent rows over the window: {points}; refusals (RunnerAtCapacity): "
                f"{r.get('refused', 0):,}; second half: "
                f"{_f(r.get('half2_commands_per_s'), '{:,.0f}')} commands/s, "
                f"{_f(r.get('half2_delivered_per_s'), '{:,.0f}')} delivered/s"
            )
        lines += ["", note]
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    """Every variant and layout, then the pgbench reference, ``--reps`` times."""
    embedded: EmbeddedPostgres | None = None
    data_dir: Path | None = None
    url: str = args.url or ""
    if not url:
        data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-scaling-pg-"))
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    tmp = Path(tempfile.mkdtemp(prefix="akter-bench-scaling-"))
    variants = ["state", "intent"] if args.variant == "all" else [args.variant]
    records: list[dict[str, Any]] = []
    try:
        info = await turns._server_info(url)
        env = {
            "bench": "scaling",
            "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git_head": turns._git_head(),
            "server": "embedded" if embedded else "url",
            "server_version": info.get("server_version", ""),
            "cpus": os.cpu_count(),
            "seconds": args.seconds,
            "loadavg_before": turns._loadavg(),
            "analyzed": args.analyze,
        }
        print(f"# akter scaling benchmark — {env['date_utc']}")
        print(
            f"server: {'embedded ' if embedded else ''}PostgreSQL {env['server_version']}; "
            f"HEAD {env['git_head']}; {env['cpus']} CPUs, shared by the runner processes, "
            f"PostgreSQL and pgbench (on 2 cores, 2 runner processes + PostgreSQL compete for "
            f"them); load {' '.join(env['loadavg_before'])}",
            flush=True,
        )
        for rep in range(1, args.reps + 1):
            for variant in variants:
                rows: list[dict[str, Any]] = []
                reference: dict[str, Any] | None = None
                # Even reps run pgbench first, so drift does not favour one side.
                if rep % 2 == 0 and not args.skip_pgbench:
                    reference = await run_pgbench(url, variant, args)
                for layout in args.layout:
                    rows.append(await run_layout(url, variant, layout, args, tmp))
                    print(
                        f"  {variant} {layout}: {rows[-1]['commands_per_s']:,.0f} commands/s",
                        flush=True,
                    )
                if reference is None and args.skip_pgbench:
                    reference = _no_reference(variant, args)
                if reference is None:
                    reference = await run_pgbench(url, variant, args)
                print(f"  {variant} pgbench: {reference['commands_per_s']:,.0f}/s", flush=True)
                print(
                    f"\n(rep {rep}, {args.seconds:g} s per run)\n"
                    + render(variant, rows, reference)
                )
                print(flush=True)
                for row in rows:
                    row["over_pgbench"] = row["commands_per_s"] / reference["commands_per_s"]
                records += [{**env, "rep": rep, **r} for r in [*rows, reference]]
        print(f"load average after: {' '.join(turns._loadavg())}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.json:
        turns._append_json(Path(args.json), records)
        print(f"JSON lines appended to {args.json}")
    return 1 if any(r.get("errors") for r in records) else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed window per run")
    parser.add_argument("--variant", choices=["state", "intent", "all"], default="all")
    parser.add_argument("--layout", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--callers", type=int, default=64, help="callers in all (and pgbench -c)")
    parser.add_argument("--actors", type=int, default=10_000)
    parser.add_argument("--pool-size", type=int, default=20, help="per runner process")
    parser.add_argument(
        "--analyze", action="store_true", help="VACUUM ANALYZE akter's tables after the warm-up"
    )
    parser.add_argument(
        "--delivery-concurrency", type=int, default=16, help="the runners' delivery_concurrency"
    )
    parser.add_argument(
        "--max-outbox-backlog",
        type=int,
        default=1_000,
        help="the runners' max_outbox_backlog (default akter's 1,000; 0: no bound)",
    )
    parser.add_argument("--skip-pgbench", action="store_true", help="no pgbench comparator")
    parser.add_argument("--json", help="append JSON lines here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``child`` is the mode of one runner process)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        return asyncio.run(child(json.loads(argv[1])))
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
