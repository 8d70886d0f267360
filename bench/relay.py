#!/usr/bin/env python3
"""Relay benchmark (issue 3): akter's intent delivery beside a pgbench SKIP LOCKED queue.

    python bench/relay.py [--url URL] [--duration 10] [--sleeping 1000000] [--drain 20000]
                          [--json bench/results/relay.jsonl]

Everything runs in one invocation against one server (default: a throwaway embedded PostgreSQL).
The raw comparator is ``bench/sql/claim_delete.sql``: one transaction claims the earliest due row
of ``outbox_q`` (a table shaped like akter's outbox, ``relay_claim_schema.sql``) ``FOR UPDATE
SKIP LOCKED`` and deletes it. It runs under pgbench beside each akter measurement.

1. **Latency.** ``Sender.fire`` stages one intent (``self.send``) to one of 1,000 pre-warmed
   receivers; 1 or 16 senders call it back to back for ``--duration`` s. Latency is the
   receiver's handler time minus the sender's commit time, both ``time.monotonic()`` in this
   process: the commit time is taken where the turn engine reports the commit (its
   ``on_commit`` hook, wrapped here), the handler time inside ``Receiver.got``. Two layouts:
   one runtime hosting both types (``notify=False``, the in-process wake), and two runtimes,
   one per type, both ``notify=True`` (delivery across runners via ``NOTIFY``).
   Comparator: ``claim_delete.sql`` at ``-c 1`` and ``-c 16`` for the same duration.
2. **Drain.** 20,000 intents due at once, staged by turns (``later(at=past)``, 100 per turn) in
   a runtime with ``relay=False``; then its relay is started and the time until the relay has
   settled every intent is taken (intents/s). Comparator: the same number of due rows in
   ``outbox_q`` drained by ``claim_delete.sql`` at ``-c 16``.
3. **Sleeping timers.** The latency runs and ``EXPLAIN ANALYZE`` of ``claim_intents`` are repeated
   after 1,000,000 rows due in 30 days were inserted into the outbox with SQL (copied from the
   row a real ``later(after=30 days)`` turn wrote, spread over 1,000 tenants); ``outbox_q`` gets
   the same number of sleeping rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel

import akter
from akter._ids import placement_key, routing_key
from akter._store.embedded import EmbeddedPostgres
from akter._store.queries import Queries

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import (
    SQL_DIR,
    _checkpoint,
    _connect,
    _drop_schema,
    _git_head,
    _group,
    _latency_ms,
    _loadavg,
    _machine_jiffies,
    _pgbench_latencies,
    _pgbench_number,
    _run_pgbench,
    _server_info,
    _split_sql,
    pgbench_binary,
)

REPO_DIR = Path(__file__).resolve().parent.parent
SLEEP_DAYS = 30

# --- the actors -----------------------------------------------------------------------------------

#: command id (= intent id) → time.monotonic() when the receiver's handler first ran it
RECEIVED: dict[str, float] = {}
#: intent id → time.monotonic() when the sender's turn reported its commit
COMMITTED: dict[str, float] = {}


class ReceiverState(BaseModel):
    n: int = 0


class Receiver(akter.Actor[ReceiverState]):
    @akter.command
    async def got(self, n: int) -> None:
        RECEIVED.setdefault(self.command_id, time.monotonic())
        self.state.n += 1


class SenderState(BaseModel):
    sent: int = 0


class Sender(akter.Actor[SenderState]):
    @akter.command
    async def fire(self, rid: str, n: int) -> None:
        self.send(Receiver.got, rid, n)
        self.state.sent += 1

    @akter.command
    async def stage(self, rids: list[str], at_ms: int) -> None:
        at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
        for i, rid in enumerate(rids):
            self.later(at=at).send(Receiver.got, rid, i)
        self.state.sent += len(rids)

    @akter.command
    async def sleep_one(self, rid: str) -> None:
        self.later(after=timedelta(days=SLEEP_DAYS)).send(Receiver.got, rid, -1)


def _rids(n: int) -> list[str]:
    return [f"r-{i:05d}" for i in range(n)]


# --- instrumentation (bench only) -----------------------------------------------------------------


def record_commits(runtime: akter.Runtime) -> None:
    """Note the commit time of every row a turn on ``runtime`` staged."""
    original = runtime._engine.on_commit

    def hook(act: Any, writes: Any, cancelled: Any) -> None:
        now = time.monotonic()
        for row in writes.rows:
            COMMITTED.setdefault(row.intent_id, now)
        original(act, writes, cancelled)

    runtime._engine.on_commit = hook


class ClaimTimer:
    """Times each claim statement of a relay (``Relay._claim_intents``, one round trip)."""

    def __init__(self, runtime: akter.Runtime) -> None:
        self.samples: list[tuple[float, int]] = []
        relay = runtime._relay
        original = relay._claim_intents

        async def timed(*args: Any, **kwargs: Any) -> int:
            start = time.perf_counter()
            claimed = await original(*args, **kwargs)
            self.samples.append((time.perf_counter() - start, claimed))
            return claimed

        setattr(relay, "_claim_intents", timed)  # noqa: B010 (an instance attribute, on purpose)

    def mark(self) -> int:
        return len(self.samples)

    def summary(self, since: int = 0) -> dict[str, Any]:
        chosen = self.samples[since:]
        if not chosen:
            return {"claims": 0}
        times = sorted(s for s, _ in chosen)
        busy = [s for s, n in chosen if n]
        return {
            "claims": len(chosen),
            "claims_empty": sum(1 for _, n in chosen if not n),
            "claim_rows_mean": statistics.fmean(n for _, n in chosen),
            "claim_ms_p50": times[len(times) // 2] * 1000,
            "claim_ms_p99": times[min(len(times) - 1, int(len(times) * 0.99))] * 1000,
            "claim_ms_p50_nonempty": (sorted(busy)[len(busy) // 2] * 1000) if busy else None,
        }


#: Runtime options every runtime of this run gets (``--pool-size``, ``--delivery-concurrency``).
RUNTIME_OPTIONS: dict[str, Any] = {}

#: How long to wait for a quiet machine before each timed run (``--quiet-wait``).
QUIET: dict[str, float] = {"limit_s": 0.0}

#: The server's postmaster pid (set once connected): only its process tree counts as "postgres".
POSTMASTER: dict[str, int] = {}

Snapshot = tuple[float, tuple[int, int], dict[int, tuple[str, int, int]]]


def _proc_ticks() -> dict[int, tuple[str, int, int]]:
    """Every process's command name, parent pid and CPU ticks (utime + stime), from /proc."""
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


def _cpu_snapshot() -> Snapshot:
    return time.perf_counter(), _machine_jiffies(), _proc_ticks()


def _cpu_group(pid: int, comm: str, ppid: int) -> str:
    """This process, its pgbench children, this server's processes, or other.

    Unlike ``turns.py``, PostgreSQL processes of other servers on the machine count as other.
    """
    postmaster = POSTMASTER.get("pid")
    if pid == os.getpid():
        return "bench_process"
    if comm == "pgbench" and ppid == os.getpid():
        return "pgbench"
    if postmaster is None:
        return _group(pid, comm)
    if pid == postmaster or ppid == postmaster:
        return "postgres"
    return "other"


def _cpu_between(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """CPU cores per process group between two snapshots."""
    wall = b[0] - a[0]
    ticks = os.sysconf("SC_CLK_TCK")
    groups = dict.fromkeys(("bench_process", "pgbench", "postgres", "other"), 0.0)
    for pid, (comm, ppid, now) in b[2].items():
        before = a[2].get(pid)
        if before is None or before[0] != comm:
            continue
        groups[_cpu_group(pid, comm, ppid)] += (now - before[2]) / ticks / wall
    busy = (b[1][0] - a[1][0]) / max(b[1][1] - a[1][1], 1) * (os.cpu_count() or 1)
    return {
        "bench_process_cores": round(groups["bench_process"], 3),
        "pgbench_cores": round(groups["pgbench"], 3),
        "postgres_cores": round(groups["postgres"], 3),
        "other_cores": round(groups["other"], 3),
        "machine_busy_cores": round(busy, 3),
    }


async def sample_cpu(duration: float) -> dict[str, float]:
    """CPU over the middle of a run of ``duration`` s (one second trimmed at each end)."""
    margin = min(1.0, duration / 10)
    await asyncio.sleep(margin)
    first = _cpu_snapshot()
    await asyncio.sleep(max(duration - 2 * margin, 0.1))
    return _cpu_between(first, _cpu_snapshot())


async def quiet_gate(limit_s: float, threshold: float = 0.25) -> float:
    """Wait (up to ``limit_s``) until the rest of the machine uses < ``threshold`` cores for 1 s.

    Other work on the machine (not this process, its pgbench, or this server) competes for the
    same 2 cores; the wait is recorded with each run, and each run's "other" CPU is reported.
    """
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        first = _cpu_snapshot()
        await asyncio.sleep(1.0)
        if _rest(_cpu_between(first, _cpu_snapshot())) < threshold:
            break
    return time.perf_counter() - started


async def _find_postmaster(url: str) -> None:
    """The postmaster is the parent of our backend (a local server only; else by name)."""
    async with await _connect(url) as conn:
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        found = _proc_ticks().get(int(row[0])) if row else None
    if found is not None:
        POSTMASTER["pid"] = found[1]
    else:
        POSTMASTER.pop("pid", None)


# --- database helpers -----------------------------------------------------------------------------


async def _vacuum(url: str, schema: str, tables: Sequence[str]) -> None:
    async with await _connect(url) as conn:
        for table in tables:
            await conn.execute(
                sql.SQL("VACUUM ANALYZE {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(table)
                )
            )
    await _checkpoint(url)


async def _scalar(url: str, query: sql.Composable | str, params: Any = None) -> Any:
    async with await _connect(url) as conn:
        cur = await conn.execute(query, params)  # type: ignore[arg-type]
        row = await cur.fetchone()
    return row[0] if row else None


async def _pending(url: str, schema: str) -> int:
    """Outbox intent rows that are not sleeping timers (due, or claimed and leased)."""
    query = sql.SQL(
        "SELECT count(*) FROM {}.outbox WHERE kind = 'intent' "
        "AND due_at_ms < (extract(epoch FROM now()) * 1000)::bigint + 86400000"
    ).format(sql.Identifier(schema))
    return int(await _scalar(url, query))


def _runtime(url: str, schema: str, actors: Sequence[type[Any]], **options: Any) -> akter.Runtime:
    return akter.Runtime(
        actors=list(actors),
        database_url=url,
        schema=schema,
        max_resident_actors=20_000,
        max_pending_commands=50_000,
        **{**RUNTIME_OPTIONS, **options},
    )


async def _prewarm(runtime: akter.Runtime, rids: Sequence[str], callers: int = 16) -> None:
    """One direct call per receiver: its row exists and its activation is cached."""
    todo = iter(rids)

    async def worker() -> None:
        for rid in todo:
            await runtime.get(Receiver, rid).got(-1)

    await asyncio.gather(*(worker() for _ in range(callers)))


# --- latency --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """Senders firing intents: back to back (``rate`` None) or paced to ``rate`` intents/s."""

    senders: int
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"{self.senders} @ {self.rate:g}/s" if self.rate else f"{self.senders}"

    @classmethod
    def parse(cls, text: str) -> Load:
        senders, _, rate = text.partition("@")
        return cls(int(senders), float(rate) if rate else None)


async def latency_run(
    url: str,
    schema: str,
    send_rt: akter.Runtime,
    recv_rt: akter.Runtime,
    load: Load,
    duration: float,
    rids: Sequence[str],
) -> dict[str, Any]:
    """``load.senders`` callers fire intents for ``duration`` s; delivery latencies.

    Unpaced, each sender calls again as soon as its previous call returned (closed loop). Paced,
    sender ``i`` of ``n`` calls at ``start + (k + i / n) * n / rate``, or at once when late.
    """
    senders = load.senders
    handles = [send_rt.get(Sender, f"s-{i:02d}") for i in range(senders)]

    async def loop(i: int, until: float) -> int:
        rng = random.Random(i)
        sent = 0
        interval = senders / load.rate if load.rate else 0.0
        begin = time.perf_counter()
        while (now := time.perf_counter()) < until:
            if interval:
                due = begin + (sent + i / senders) * interval
                if due > now:
                    await asyncio.sleep(due - now)
                    if time.perf_counter() >= until:
                        break
            await handles[i].fire(rids[rng.randrange(len(rids))], sent)
            sent += 1
        return sent

    # Warm-up: one second of the same traffic (statements prepared, senders cached).
    await asyncio.gather(*(loop(i, time.perf_counter() + 1.0) for i in range(senders)))
    await _wait_settled(url, schema, 30)
    waited = await quiet_gate(QUIET["limit_s"])
    RECEIVED.clear()
    COMMITTED.clear()
    claims = _claim_timer_of(recv_rt)
    mark = claims.mark()
    occupancy: list[int] = []
    waits_before = _pool_waits(recv_rt)

    async def watch() -> None:
        while True:
            occupancy.append(_slots_busy(recv_rt))
            await asyncio.sleep(0.01)

    start = time.perf_counter()
    sampler = asyncio.create_task(sample_cpu(duration))
    watcher = asyncio.create_task(watch())
    sent = sum(await asyncio.gather(*(loop(i, start + duration) for i in range(senders))))
    elapsed = time.perf_counter() - start
    watcher.cancel()
    cpu = await sampler
    waits = tuple(a - b for a, b in zip(_pool_waits(recv_rt), waits_before, strict=True))
    received_in_window = len(RECEIVED)
    backlog = await _pending(url, schema)
    committed = dict(COMMITTED)
    settle_started = time.perf_counter()
    await _wait_settled(url, schema, 60, lambda: all(k in RECEIVED for k in committed))
    settle_s = time.perf_counter() - settle_started
    latencies = [RECEIVED[k] - t for k, t in committed.items() if k in RECEIVED]
    return {
        "senders": senders,
        "rate": load.rate,
        "quiet_wait_s": round(waited, 1),
        "seconds": round(elapsed, 3),
        "sent": sent,
        "sent_per_s": sent / elapsed,
        "delivered_in_window_per_s": received_in_window / elapsed,
        "backlog_at_end": backlog,
        "tail_settle_s": round(settle_s, 3),
        "undelivered": len(committed) - len(latencies),
        "delivery_concurrency": recv_rt.config.delivery_concurrency,
        "in_flight_mean": statistics.fmean(occupancy) if occupancy else None,
        "pool_waits": int(waits[0]),
        "pool_wait_ms_mean": waits[1] / waits[0] if waits[0] else None,
        **_latency_ms(latencies),
        "max_ms": max(latencies) * 1000 if latencies else None,
        **claims.summary(mark),
        **cpu,
    }


async def _wait_settled(
    url: str, schema: str, limit_s: float, also: Any = None, step: float = 0.02
) -> None:
    """Wait until no intent is due or claimed (and ``also()``), or ``limit_s`` has passed."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        if (also is None or also()) and await _pending(url, schema) == 0:
            return
        await asyncio.sleep(step)


def _slots_busy(runtime: akter.Runtime) -> int:
    """Delivery slots held: claims not yet delivered, or delivered but not yet settled.

    A claim whose receiver committed and whose delete is under way (``settling``, a relay that
    settles in groups) no longer holds a slot; before that change every claim held one.
    """
    claims = runtime._relay._claims.values()
    return sum(1 for c in claims if not getattr(c, "settling", False))


def _pool_waits(runtime: akter.Runtime) -> tuple[float, float]:
    """Connection acquisitions of the runtime's pool so far: (count, total ms)."""
    histograms = runtime.metrics._histograms.get("akter.pool.wait_ms", {})
    return (
        float(sum(sum(h.counts) for h in histograms.values())),
        sum(h.sum for h in histograms.values()),
    )


def _claim_timer_of(runtime: akter.Runtime) -> ClaimTimer:
    timer = getattr(runtime, "_bench_claims", None)
    if not isinstance(timer, ClaimTimer):
        timer = ClaimTimer(runtime)
        setattr(runtime, "_bench_claims", timer)  # noqa: B010
    return timer


# --- the claim statement, explained ---------------------------------------------------------------


def _numbered(text: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders → ``$n`` (for SQL-level PREPARE); the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%"), names


def _plan_numbers(plan: Any) -> dict[str, float]:
    top = plan[0] if isinstance(plan, list) else plan
    node = top["Plan"]
    return {
        "execution_ms": float(top.get("Execution Time", 0.0)),
        "planning_ms": float(top.get("Planning Time", 0.0)),
        "shared_hit": float(node.get("Shared Hit Blocks", 0)),
        "shared_read": float(node.get("Shared Read Blocks", 0)),
    }


def _plan_nodes(node: dict[str, Any], depth: int = 0) -> list[str]:
    label = node["Node Type"]
    if node.get("Index Name"):
        label += f" using {node['Index Name']}"
    if node.get("Relation Name") and not node.get("Index Name"):
        label += f" on {node['Relation Name']}"
    label += f" (loops {node.get('Actual Loops', '?')}, rows {node.get('Actual Rows', '?')})"
    lines = ["  " * depth + label]
    for child in node.get("Plans", []):
        lines += _plan_nodes(child, depth + 1)
    return lines


def _plan_scans(node: dict[str, Any]) -> list[str]:
    """The plan's scans of tables and indexes, in plan order: ``Index Scan outbox_due ×256``."""
    found: list[str] = []
    kind = node["Node Type"]
    target = node.get("Index Name") or node.get("Relation Name")
    if "Scan" in kind and target and kind not in ("CTE Scan", "Function Scan"):
        loops = node.get("Actual Loops", 0)
        found.append(f"{kind} {target} ×{loops:g}" if loops else f"{kind} {target} (never run)")
    for child in node.get("Plans", []):
        found += _plan_scans(child)
    return found


async def explain_claim(
    url: str, schema: str, runtime_params: dict[str, Any], text: str, reps: int
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of claim_intents as the relay sends it, rolled back.

    ``custom``: the statement with its parameters bound (a custom plan), like the first
    executions on a pooled connection. ``generic``: ``PREPARE`` + ``plan_cache_mode =
    force_generic_plan``, the plan a connection may settle on once the statement is prepared.
    """
    numbered, names = _numbered(text)
    values = [runtime_params[n] for n in names]
    out: dict[str, Any] = {}
    async with await _connect(url) as conn:
        await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        for mode in ("custom", "generic"):
            samples: list[dict[str, float]] = []
            shape: list[str] = []
            scans: list[str] = []
            if mode == "generic":
                await conn.execute(f"PREPARE bench_claim AS {numbered}".encode())
                await conn.execute("SET plan_cache_mode = force_generic_plan")
            for _ in range(reps):
                await conn.execute("BEGIN")
                try:
                    if mode == "custom":
                        cur = await conn.execute(
                            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text,  # type: ignore[operator]
                            runtime_params,
                            prepare=False,
                        )
                    else:
                        execute = sql.SQL(
                            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_claim ({})"
                        ).format(sql.SQL(", ").join(sql.Literal(v) for v in values))
                        cur = await conn.execute(execute)
                    row = await cur.fetchone()
                finally:
                    await conn.execute("ROLLBACK")
                plan = row[0] if row else None
                if isinstance(plan, str):
                    plan = json.loads(plan)
                samples.append(_plan_numbers(plan))
                if not shape:
                    root = (plan[0] if isinstance(plan, list) else plan)["Plan"]
                    shape, scans = _plan_nodes(root), _plan_scans(root)
            if mode == "generic":
                await conn.execute("DEALLOCATE bench_claim")
                await conn.execute("RESET plan_cache_mode")
            out[mode] = {key: statistics.median(s[key] for s in samples) for key in samples[0]} | {
                "plan": shape,
                "scans": scans,
                "reps": reps,
            }
    return out


async def _explain_prepared(conn: Any, values: Sequence[Any]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim(values), rolled back: numbers and scans."""
    execute = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_claim ({})").format(
        sql.SQL(", ").join(sql.Literal(v) for v in values)
    )
    await conn.execute("BEGIN")
    try:
        row = await (await conn.execute(execute)).fetchone()
    finally:
        await conn.execute("ROLLBACK")
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    root = plan[0] if isinstance(plan, list) else plan
    return _plan_numbers(plan) | {"scans": _plan_scans(root["Plan"])}


class HeldPlan:
    """A connection that prepared claim_intents while the outbox was small, as a pooled one does.

    ``plan_cache_mode`` stays ``auto``: after 5 custom plans PostgreSQL may keep a generic plan,
    and keeps it until something invalidates it (an ANALYZE of the table, DDL).
    """

    def __init__(self, conn: Any, values: list[Any]) -> None:
        self.conn = conn
        self.values = values

    @classmethod
    async def open(cls, url: str, schema: str, text: str, params: dict[str, Any]) -> HeldPlan:
        numbered, names = _numbered(text)
        conn = await _connect(url)
        await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        await conn.execute(f"PREPARE bench_claim AS {numbered}".encode())
        return cls(conn, [params[n] for n in names])

    async def run(self, reps: int) -> dict[str, Any]:
        samples = [await _explain_prepared(self.conn, self.values) for _ in range(reps)]
        last = samples[-1]
        return {
            "execution_ms": statistics.median(s["execution_ms"] for s in samples),
            "execution_ms_each": [round(s["execution_ms"], 3) for s in samples],
            "shared_hit": last["shared_hit"],
            "shared_read": last["shared_read"],
            "planning_ms": last["planning_ms"],
            "scans": last["scans"],
            "reps": reps,
        }

    async def close(self) -> None:
        await self.conn.close()


async def _stage_due_rows(url: str, schema: str, template: dict[str, Any], n: int) -> None:
    """``n`` due intents (copies of the template row, due a second ago), for EXPLAIN only."""
    await _copy_template(url, schema, template, n, due_offset_ms=-1000, tenants=1)


async def _copy_template(
    url: str,
    schema: str,
    template: dict[str, Any],
    n: int,
    *,
    due_offset_ms: int,
    tenants: int,
) -> float:
    """Insert ``n`` outbox rows shaped exactly like ``template`` (a row a turn wrote).

    Rows are spread over ``tenants`` tenants (``t0`` … with valid routing keys and buckets; the
    template's own tenant when 1); sender ids, target ids, intent ids and due times vary per row.
    Returns the seconds the insert took.
    """
    keys: list[tuple[str, int]] = []
    for i in range(tenants):
        tenant = template["tenant_id"] if tenants == 1 else f"t{i}"
        rk = routing_key(placement_key("tenant", tenant, "Sender", ""))
        keys.append((tenant, rk))
    prefix = template["intent_id"].rsplit(".", 1)[0]
    caller = json.loads(template["caller"])
    ident = sql.Identifier(schema)
    insert = sql.SQL(
        """
        INSERT INTO {s}.outbox
            (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
             target_id, command, payload, payload_version, caller, due_at_ms, scheduled_at_ms,
             ready_at_ms, timer_key)
        SELECT k.rk, %(prefix)s::text || '.' || gen_random_uuid(), (k.rk >> 56)::smallint, 'intent',
               k.tenant, %(actor_type)s::text, 'sleeper-' || g, %(target_type)s::text,
               'r-' || lpad(mod(g, 1000)::text, 5, '0'), %(command)s::text, %(payload)s::text, 0,
               json_build_object('kind', 'System', 'source', %(source)s::text,
                                 'ref', json_build_object('tenant', k.tenant,
                                                          'type', %(actor_type)s::text,
                                                          'id', 'sleeper-' || g),
                                 'on_behalf_of', NULL)::text,
               d.due, d.due, NULL, NULL
        FROM generate_series(1, %(n)s::int) AS g
        JOIN unnest(%(tenants)s::text[], %(rks)s::bigint[]) WITH ORDINALITY AS k(tenant, rk, i)
          ON k.i = mod(g, %(ntenants)s::int) + 1
        CROSS JOIN LATERAL (
            SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                   + %(offset)s::bigint + g AS due
        ) AS d
        """
    ).format(s=ident)
    started = time.perf_counter()
    async with await _connect(url) as conn:
        await conn.execute(
            insert,
            {
                "prefix": prefix,
                "actor_type": template["actor_type"],
                "target_type": template["target_type"],
                "command": template["command"],
                "payload": template["payload"],
                "source": caller.get("source", "timer"),
                "n": n,
                "tenants": [t for t, _ in keys],
                "rks": [rk for _, rk in keys],
                "ntenants": len(keys),
                "offset": due_offset_ms,
            },
        )
    return time.perf_counter() - started


async def _template_row(runtime: akter.Runtime, url: str, schema: str) -> dict[str, Any]:
    """The row a real ``later(after=30 days)`` turn writes; read back, then deleted."""
    await runtime.get(Sender, "s-template").sleep_one("r-00000")
    async with await _connect(url) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(
            sql.SQL(
                "DELETE FROM {}.outbox WHERE actor_id = 's-template' AND kind = 'intent' "
                "RETURNING *"
            ).format(sql.Identifier(schema))
        )
        row = await cur.fetchone()
    if row is None:
        raise RuntimeError("the template timer row was not written")
    return dict(row)


async def _delete_due(url: str, schema: str, table: str = "outbox") -> None:
    async with await _connect(url) as conn:
        await conn.execute(
            sql.SQL(
                "DELETE FROM {}.{} WHERE due_at_ms < "
                "(extract(epoch FROM now()) * 1000)::bigint + 86400000"
            ).format(sql.Identifier(schema), sql.Identifier(table))
        )


# --- pgbench side ---------------------------------------------------------------------------------


async def _q_setup(url: str, schema: str, *, create: bool, due: int, sleeping: int) -> float:
    """(Re)create and/or fill ``outbox_q`` in ``schema``; seconds spent filling."""
    async with await _connect(url) as conn:
        ident = sql.Identifier(schema)
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(sql.SQL("SET search_path = {}").format(ident))
        if create:
            for statement in _split_sql((SQL_DIR / "relay_claim_schema.sql").read_text()):
                await conn.execute(statement.encode())
        started = time.perf_counter()
        for statement in _split_sql((SQL_DIR / "relay_claim_fill.sql").read_text()):
            params = {"due": due, "sleeping": sleeping} if "%(" in statement else None
            await conn.execute(statement.encode() if params is None else statement, params)  # type: ignore[arg-type]
        filled = time.perf_counter() - started
    await _checkpoint(url)
    return filled


async def _q_due(url: str, schema: str) -> int:
    query = sql.SQL(
        "SELECT count(*) FROM {}.outbox_q WHERE kind = 'intent' "
        "AND due_at_ms <= (extract(epoch FROM now()) * 1000)::bigint"
    ).format(sql.Identifier(schema))
    return int(await _scalar(url, query))


async def pgbench_claims(
    url: str,
    schema: str,
    clients: int,
    *,
    duration: float | None,
    per_client: int | None,
    rate: float | None = None,
) -> dict[str, Any]:
    """Run ``claim_delete.sql`` (``-T duration`` or ``-t per_client``, ``-R rate``) with ``-l``.

    With ``-R``, pgbench's latencies count from each transaction's scheduled start.
    """
    jobs = 1 if clients < 2 else min(2, os.cpu_count() or 1)
    base = ["-n", "-f", str(SQL_DIR / "claim_delete.sql"), "-c", str(clients), "-j", str(jobs)]
    if rate:
        base += ["-R", f"{rate:g}"]
    limit = ["-T", str(int(duration))] if duration else ["-t", str(per_client)]
    before = await _q_due(url, schema)
    logdir = Path(tempfile.mkdtemp(prefix="akter-bench-relay-pgbench-"))
    prefix = logdir / "pgb"
    waited = await quiet_gate(QUIET["limit_s"])
    try:
        sampler = asyncio.create_task(sample_cpu(duration)) if duration else None
        snap = _cpu_snapshot()
        started = time.perf_counter()
        code, out, command = await _run_pgbench(
            url, schema, [*base, *limit, "-l", f"--log-prefix={prefix}"], 600
        )
        wall = time.perf_counter() - started
        cpu = await sampler if sampler else _cpu_between(snap, _cpu_snapshot())
        if code != 0:
            raise RuntimeError(f"pgbench failed ({code}):\n{out}")
        latencies = await asyncio.to_thread(_pgbench_latencies, prefix)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    after = await _q_due(url, schema)
    tps = _pgbench_number(r"^tps = ([\d.]+)", out) or 0.0
    done = int(_pgbench_number(r"actually processed: (\d+)", out) or 0)
    seconds = done / tps if tps else wall
    deleted = before - after
    shown = [Path(command[0]).name, *base, *limit, "-l"]
    shown = [a.replace(str(REPO_DIR) + "/", "") for a in shown]
    return {
        "clients": clients,
        "rate": rate,
        "quiet_wait_s": round(waited, 1),
        "transactions": done,
        "tps": tps,
        "deleted": deleted,
        "deleted_per_s": deleted / seconds if seconds else 0.0,
        "empty_transactions": done - deleted,
        "due_left": after,
        "seconds": round(seconds, 3),
        "wall_s": round(wall, 3),
        **_latency_ms(latencies),
        **cpu,
        "cmd": " ".join(shown) + " <same server>",
    }


# --- scenarios ------------------------------------------------------------------------------------


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def keep(self, **record: Any) -> None:
        self.records.append(record)


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return fmt.format(value)


async def latency_phase(
    url: str, schema: str, q_schema: str, args: argparse.Namespace, report: Report, sleeping: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Latency runs, each beside pgbench at as many clients; then EXPLAIN the claim."""
    rids = _rids(args.receivers)
    runtime = _runtime(url, schema, [Sender, Receiver])
    record_commits(runtime)
    template: dict[str, Any] = {}
    rows: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    async with runtime:
        await _prewarm(runtime, rids)
        template = await _template_row(runtime, url, schema)
        await _vacuum(url, schema, ["outbox", "actors", "receipts"])
        params = {
            "off": runtime._clock.offset_ms,
            "types": sorted(runtime.definitions),
            "probe": 2 * min(runtime.config.delivery_concurrency, runtime.config.pass_limit),
            "free": min(runtime.config.delivery_concurrency, runtime.config.pass_limit),
            "lease": runtime.config.claim_lease_ms,
            "max_backoff": runtime.config.max_backoff_ms,
        }
        claim_text = runtime._store.queries["claim_intents"]
        for load in args.sleeping_loads if sleeping else args.loads:
            ours = await latency_run(url, schema, runtime, runtime, load, args.duration, rids)
            await _delete_due(url, q_schema, "outbox_q")
            await _q_setup(url, q_schema, create=False, due=args.queue_rows, sleeping=0)
            theirs = await pgbench_claims(
                url,
                q_schema,
                load.senders,
                duration=args.duration,
                per_client=None,
                rate=load.rate,
            )
            rows[load.label] = (ours, theirs)
            report.keep(bench="relay", part="latency", sleeping=sleeping, side="akter", **ours)
            report.keep(bench="relay", part="latency", sleeping=sleeping, side="pgbench", **theirs)
            print(
                f"  sleeping={sleeping:,} senders={load.label}: akter p50 {ours['p50_ms']:.2f} ms "
                f"p99 {ours['p99_ms']:.2f} ms, {ours['sent_per_s']:,.0f} intents/s; pgbench "
                f"{theirs['deleted_per_s']:,.0f}/s p50 {theirs['p50_ms']:.2f} ms",
                flush=True,
            )
    # The claim statement, explained with the runtime stopped (so nothing else claims).
    explained: dict[str, Any] = {
        "idle": await explain_claim(url, schema, params, claim_text, args.explain_reps)
    }
    await _stage_due_rows(url, schema, template, 1000)
    await _vacuum(url, schema, ["outbox"])
    explained["backlog_1000"] = await explain_claim(
        url, schema, params, claim_text, args.explain_reps
    )
    await _delete_due(url, schema)
    report.keep(bench="relay", part="explain", sleeping=sleeping, params=params, **explained)
    return {"rows": rows, "explain": explained, "template": template}, params


async def notify_phase(
    url: str, schema: str, args: argparse.Namespace, report: Report
) -> dict[str, dict[str, Any]]:
    """Two runners in this process, one per actor type, both notify=True."""
    rids = _rids(args.receivers)
    send_rt = _runtime(url, schema, [Sender], notify=True)
    recv_rt = _runtime(url, schema, [Receiver], notify=True)
    record_commits(send_rt)
    out: dict[str, dict[str, Any]] = {}
    async with send_rt, recv_rt:
        await _prewarm(recv_rt, rids)
        await _vacuum(url, schema, ["outbox", "actors", "receipts"])
        for load in args.notify_loads:
            ours = await latency_run(url, schema, send_rt, recv_rt, load, args.duration, rids)
            out[load.label] = ours
            report.keep(bench="relay", part="latency_notify", side="akter", **ours)
            print(
                f"  notify, two runners, senders={load.label}: p50 {ours['p50_ms']:.2f} ms "
                f"p99 {ours['p99_ms']:.2f} ms",
                flush=True,
            )
    return out


async def drain_akter(
    url: str, schema: str, args: argparse.Namespace, concurrency: int
) -> dict[str, Any]:
    """Stage ``--drain`` intents due at once with the relay off, then time the relay's drain."""
    rids = _rids(args.receivers)
    runtime = _runtime(
        url, schema, [Sender, Receiver], relay=False, delivery_concurrency=concurrency
    )
    async with runtime:
        await _prewarm(runtime, rids)
        per_turn = 100
        turns = args.drain // per_turn
        past = int(time.time() * 1000) - 60_000
        todo = iter(range(turns))
        staged_started = time.perf_counter()

        async def stager(i: int) -> None:
            handle = runtime.get(Sender, f"stager-{i:02d}")
            rng = random.Random(i)
            for _ in todo:
                await handle.stage([rids[rng.randrange(len(rids))] for _ in range(per_turn)], past)

        await asyncio.gather(*(stager(i) for i in range(16)))
        staged_s = time.perf_counter() - staged_started
        staged = await _pending(url, schema)
        await _vacuum(url, schema, ["outbox", "actors", "receipts"])
        RECEIVED.clear()
        claims = _claim_timer_of(runtime)
        before = runtime._relay.delivered
        waited = await quiet_gate(QUIET["limit_s"])
        snap = _cpu_snapshot()
        started = time.perf_counter()
        await runtime._loop.start()
        runtime._loop.wake()
        deadline = started + 600
        first: float | None = None
        while runtime._relay.delivered - before < staged and time.perf_counter() < deadline:
            if first is None and RECEIVED:
                first = time.perf_counter()
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - started
        cpu = _cpu_between(snap, _cpu_snapshot())
        left = await _pending(url, schema)
        delivered = runtime._relay.delivered - before
    return {
        "delivery_concurrency": concurrency,
        "quiet_wait_s": round(waited, 1),
        "staged": staged,
        "staging_s": round(staged_s, 3),
        "staged_per_s": staged / staged_s if staged_s else None,
        "delivered": delivered,
        "seconds": round(elapsed, 3),
        "intents_per_s": delivered / elapsed if elapsed else 0.0,
        "first_delivery_ms": (first - started) * 1000 if first else None,
        "left_in_outbox": left,
        "retried": runtime._relay.retried,
        **claims.summary(),
        **cpu,
    }


# --- orchestration --------------------------------------------------------------------------------


def _fingerprint(relative: str) -> str:
    path = Path(akter.__file__).parent / relative
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _render_latency(
    report: Report, title: str, rows: dict[str, tuple[dict[str, Any], Any]]
) -> None:
    report.say(f"#### {title}")
    report.say()
    report.say(
        "| senders | akter sent/s | akter delivered/s | akter p50 / p99 / max (ms) | backlog at "
        "end | claims (rows/claim, p50 ms) | pgbench claim+delete /s | pgbench p50 / p99 (ms) "
        "| rate ratio | p50 ratio |"
    )
    report.say("|---|---|---|---|---|---|---|---|---|---|")
    for senders, (a, b) in rows.items():
        ratio = a["delivered_in_window_per_s"] / b["deleted_per_s"] if b["deleted_per_s"] else None
        report.say(
            f"| {senders} | {a['sent_per_s']:,.0f} | {a['delivered_in_window_per_s']:,.0f} | "
            f"{_f(a['p50_ms'])} / {_f(a['p99_ms'])} / "
            f"{_f(a['max_ms'], '{:.1f}')} | {a['backlog_at_end']} | {a['claims']:,} "
            f"({_f(a.get('claim_rows_mean'))}, {_f(a.get('claim_ms_p50'))}) | "
            f"{b['deleted_per_s']:,.0f} | {_f(b['p50_ms'])} / {_f(b['p99_ms'])} | "
            f"{_f(ratio)} | {_f(a['p50_ms'] / b['p50_ms'] if b['p50_ms'] else None, '{:.1f}')} |"
        )
    report.say()
    for senders, (a, b) in rows.items():
        report.say(
            f"{senders} sender(s): relay slots busy {_f(a.get('in_flight_mean'), '{:.1f}')} of "
            f"{a.get('delivery_concurrency')} on average; pool waits "
            f"{a.get('pool_waits', 0):,}, mean {_f(a.get('pool_wait_ms_mean'))} ms. "
            f"CPU: akter process {a['bench_process_cores']:.2f} cores, "
            f"postgres {a['postgres_cores']:.2f}, rest of machine {_rest(a):.2f}, machine "
            f"{a['machine_busy_cores']:.2f}; pgbench client {b['pgbench_cores']:.2f}, postgres "
            f"{b['postgres_cores']:.2f}, rest of machine {_rest(b):.2f}, machine "
            f"{b['machine_busy_cores']:.2f}. pgbench: {b['transactions']:,} transactions, "
            f"{b['empty_transactions']:,} found no row, {b['due_left']:,} due rows left"
        )
    report.say()


def _rest(r: dict[str, Any]) -> float:
    """Busy cores not used by this process, its pgbench or this server (other work, kernel)."""
    ours = r["bench_process_cores"] + r["pgbench_cores"] + r["postgres_cores"]
    return max(0.0, r["machine_busy_cores"] - ours)


def _render_explain(report: Report, by_sleeping: dict[int, dict[str, Any]]) -> None:
    report.say("#### claim_intents, EXPLAIN (ANALYZE, BUFFERS), median of reps, rolled back")
    report.say()
    report.say(
        "| sleeping rows | due rows | plan | execution (ms) | planning (ms) | buffers hit / read "
        "| scans |"
    )
    report.say("|---|---|---|---|---|---|---|")
    for sleeping, explained in by_sleeping.items():
        for state, label in (("idle", "0"), ("backlog_1000", "1,000 (claims 16)")):
            for mode in ("custom", "generic"):
                e = explained[state][mode]
                report.say(
                    f"| {sleeping:,} | {label} | {mode} | {e['execution_ms']:.3f} | "
                    f"{e['planning_ms']:.3f} | {e['shared_hit']:.0f} / {e['shared_read']:.0f} "
                    f"| {'; '.join(e['scans'])} |"
                )
    report.say()


async def run(args: argparse.Namespace) -> int:
    embedded: EmbeddedPostgres | None = None
    data_dir: Path | None = None
    url: str = args.url or ""
    wall_started = time.perf_counter()
    QUIET["limit_s"] = args.quiet_wait
    if args.pool_size:
        RUNTIME_OPTIONS["pool_size"] = args.pool_size
    if args.delivery_concurrency:
        RUNTIME_OPTIONS["delivery_concurrency"] = args.delivery_concurrency
    if not url:
        data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-pg-"))
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    tag = f"{os.getpid()}"
    lat_schema, q_schema = f"akter_relay_{tag}_lat", f"akter_relay_{tag}_q"
    notify_schema, drain_schema = f"akter_relay_{tag}_ntf", f"akter_relay_{tag}_drn"
    schemas = [lat_schema, q_schema, notify_schema, drain_schema]
    report = Report()
    out_path = Path(args.json) if args.json else None
    try:
        info = await _server_info(url)
        await _find_postmaster(url)
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
            "relay_py_sha256": _fingerprint("_engine/relay/intents.py"),
            "queries_sql_sha256": _fingerprint("_store/queries.sql"),
            "duration_s": args.duration,
            "loadavg_before": _loadavg(),
        }
        report.say(f"# akter relay benchmark — {env['date_utc']}")
        report.say(
            f"server: {'embedded ' if embedded else ''}PostgreSQL {env['server_version']} "
            f"(fsync={info.get('fsync')}, synchronous_commit={info.get('synchronous_commit')}); "
            f"{env['cpus']} CPUs; load {' '.join(env['loadavg_before'])}; HEAD {env['git_head']}, "
            f"relay.py {env['relay_py_sha256']}, queries.sql {env['queries_sql_sha256']}"
        )
        report.say()

        # 1 + 3: latency at 0 sleeping rows, then at --sleeping rows.
        await _q_setup(url, q_schema, create=True, due=0, sleeping=0)
        phases: dict[int, dict[str, Any]] = {}
        params: dict[str, Any] = {}
        inserted_s = q_filled_s = 0.0
        sizes: Any = None
        stale: dict[str, Any] = {}
        if args.loads:
            phases[0], params = await latency_phase(url, lat_schema, q_schema, args, report, 0)
        if args.loads and args.sleeping:
            # A connection that cached the claim's plan while the outbox was small (20 due rows,
            # analyzed), then runs it again right after the sleeping rows arrive (no ANALYZE yet).
            template = phases[0]["template"]
            claim_text = Queries(lat_schema)["claim_intents"]
            await _stage_due_rows(url, lat_schema, template, 20)
            await _vacuum(url, lat_schema, ["outbox"])
            held = await HeldPlan.open(url, lat_schema, claim_text, params)
            try:
                stale["small"] = await held.run(7)
                await _delete_due(url, lat_schema)
                inserted_s = await _copy_template(
                    url,
                    lat_schema,
                    template,
                    args.sleeping,
                    due_offset_ms=SLEEP_DAYS * 86_400_000,
                    tenants=1000,
                )
                await _stage_due_rows(url, lat_schema, template, 1000)
                stale["grown"] = await held.run(3)
            finally:
                await held.close()
            await _delete_due(url, lat_schema)
            report.keep(bench="relay", part="explain_held_plan", **stale)
            q_filled_s = await _q_setup(url, q_schema, create=False, due=0, sleeping=args.sleeping)
            await _vacuum(url, lat_schema, ["outbox"])
            print(
                f"  inserted {args.sleeping:,} sleeping rows: outbox {inserted_s:.1f} s, "
                f"outbox_q {q_filled_s:.1f} s",
                flush=True,
            )
            phases[args.sleeping], _ = await latency_phase(
                url, lat_schema, q_schema, args, report, args.sleeping
            )
            sizes = await _scalar(
                url,
                sql.SQL(
                    "SELECT json_build_object('outbox_rows', (SELECT count(*) FROM {}.outbox), "
                    "'outbox_bytes', pg_total_relation_size({})) "
                ).format(sql.Identifier(lat_schema), sql.Literal(f"{lat_schema}.outbox")),
            )
            report.keep(
                bench="relay",
                part="sleeping_insert",
                seconds=inserted_s,
                q_seconds=q_filled_s,
                sizes=sizes,
            )
        await _drop_schema(url, lat_schema)

        # 1, across runners with notify=True.
        notify = await notify_phase(url, notify_schema, args, report) if args.notify_loads else {}
        await _drop_schema(url, notify_schema)

        # 2: drain.
        drains: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for concurrency in args.drain_concurrency if args.drain else []:
            ours = await drain_akter(url, drain_schema, args, concurrency)
            await _drop_schema(url, drain_schema)
            await _q_setup(url, q_schema, create=True, due=args.drain, sleeping=0)
            theirs = await pgbench_claims(
                url,
                q_schema,
                concurrency,
                duration=None,
                per_client=-(-args.drain // concurrency),
            )
            drains.append((ours, theirs))
            report.keep(bench="relay", part="drain", side="akter", **ours)
            report.keep(bench="relay", part="drain", side="pgbench", **theirs)
            print(
                f"  drain {args.drain:,} at {concurrency}: akter {ours['intents_per_s']:,.0f}/s "
                f"({ours['seconds']:.1f} s), pgbench {theirs['deleted_per_s']:,.0f}/s",
                flush=True,
            )

        # --- tables ---
        report.say()
        for sleeping, phase in phases.items():
            _render_latency(
                report,
                f"Delivery latency, one runner (notify=False), {sleeping:,} sleeping rows, "
                f"{args.duration:g} s per run",
                phase["rows"],
            )
        if notify:
            report.say("#### Delivery latency, two runners (one per type), notify=True")
            report.say()
            report.say(
                "| senders | sent/s | delivered/s | p50 / p99 / max (ms) | backlog at end | claims "
                "| CPU: process / postgres / rest of machine |"
            )
            report.say("|---|---|---|---|---|---|---|")
            for senders, a in notify.items():
                report.say(
                    f"| {senders} | {a['sent_per_s']:,.0f} | {a['delivered_in_window_per_s']:,.0f} "
                    f"| {_f(a['p50_ms'])} / {_f(a['p99_ms'])} / {_f(a['max_ms'], '{:.1f}')} | "
                    f"{a['backlog_at_end']} | {a['claims']:,} ({_f(a.get('claim_rows_mean'))} rows "
                    f"each) | {a['bench_process_cores']:.2f} / {a['postgres_cores']:.2f} / "
                    f"{_rest(a):.2f} |"
                )
            report.say()
        if drains:
            report.say(f"#### Drain: {args.drain:,} intents due at once")
            report.say()
            report.say(
                "| delivery_concurrency / pgbench -c | akter intents/s (s) | first delivery "
                "(ms) | claims (rows each) | pgbench rows/s (s) | ratio | akter run CPU: process / "
                "postgres / rest of machine |"
            )
            report.say("|---|---|---|---|---|---|---|")
        for a, b in drains:
            ratio = a["intents_per_s"] / b["deleted_per_s"] if b["deleted_per_s"] else None
            report.say(
                f"| {a['delivery_concurrency']} | {a['intents_per_s']:,.0f} ({a['seconds']:.1f}) "
                f"| {_f(a['first_delivery_ms'], '{:.0f}')} | {a['claims']:,} "
                f"({_f(a.get('claim_rows_mean'), '{:.1f}')}) | {b['deleted_per_s']:,.0f} "
                f"({b['seconds']:.1f}) | {_f(ratio)} | {a['bench_process_cores']:.2f} / "
                f"{a['postgres_cores']:.2f} / {_rest(a):.2f} |"
            )
        report.say()
        for a, b in drains:
            report.say(
                f"staging: {a['staged']:,} intents in {a['staging_s']:.1f} s "
                f"({_f(a['staged_per_s'], '{:,.0f}')}/s, 100 per turn); left after drain: "
                f"{a['left_in_outbox']}; retried {a['retried']}; pgbench empty transactions "
                f"{b['empty_transactions']}, due left {b['due_left']}"
            )
        report.say()
        if phases:
            _render_explain(report, {s: p["explain"] for s, p in phases.items()})
        if stale:
            report.say(
                "#### claim_intents on a connection that prepared it while the outbox was small "
                "(plan_cache_mode auto)"
            )
            report.say()
            report.say(
                "| outbox | executions | execution (ms), each | buffers hit | scans (last) |"
            )
            report.say("|---|---|---|---|---|")
            for key, label in (
                ("small", "20 due rows, analyzed"),
                ("grown", f"then + {args.sleeping:,} sleeping + 1,000 due, not re-analyzed"),
            ):
                e = stale[key]
                each = ", ".join(f"{v:.2f}" for v in e["execution_ms_each"])
                report.say(
                    f"| {label} | {e['reps']} | {each} | {e['shared_hit']:.0f} | "
                    f"{'; '.join(e['scans'])} |"
                )
            report.say()
        if sizes:
            report.say(
                f"sleeping rows: {args.sleeping:,} inserted in {inserted_s:.1f} s (outbox_q: "
                f"{q_filled_s:.1f} s); outbox then {sizes}"
            )
        report.say(f"claim parameters: {params}")
        report.say(
            f"wall time: {time.perf_counter() - wall_started:.0f} s; load after: "
            f"{' '.join(_loadavg())}"
        )
    finally:
        for schema in schemas:
            with contextlib.suppress(Exception):
                await _drop_schema(url, schema)
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
            if data_dir is not None:
                shutil.rmtree(data_dir, ignore_errors=True)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with out_path.open("a") as f:
            for record in report.records:
                f.write(json.dumps({**env, **record}, default=str) + "\n")
        print(f"JSON lines appended to {out_path}")
    return 0


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _loads(text: str) -> list[Load]:
    return [Load.parse(v.strip()) for v in text.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per latency run")
    parser.add_argument(
        "--loads",
        type=_loads,
        default=_loads("1,16@200,16"),
        help="latency runs: senders, optionally @ a total rate in intents/s (closed loop if not)",
    )
    parser.add_argument(
        "--sleeping-loads",
        type=_loads,
        default=_loads("1,16@200"),
        help="latency runs repeated beside the sleeping rows",
    )
    parser.add_argument(
        "--notify-loads",
        type=_loads,
        default=_loads("1,16@200"),
        help="loads for the two-runner notify=True runs ('' to skip)",
    )
    parser.add_argument("--receivers", type=int, default=1000)
    parser.add_argument("--sleeping", type=int, default=1_000_000, help="sleeping timer rows")
    parser.add_argument("--drain", type=int, default=20_000, help="intents due at once")
    parser.add_argument(
        "--drain-concurrency",
        type=_ints,
        default=[16],
        help="delivery_concurrency values for the drain (pgbench -c the same)",
    )
    parser.add_argument(
        "--queue-rows",
        type=int,
        default=150_000,
        help="due rows in outbox_q before each timed pgbench run",
    )
    parser.add_argument("--explain-reps", type=int, default=15)
    parser.add_argument("--pool-size", type=int, help="akter pool size (default: akter's, 20)")
    parser.add_argument(
        "--delivery-concurrency",
        type=int,
        help="delivery_concurrency of the latency runs' runtimes (default: akter's, 16)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=10.0,
        help="before each timed run, wait up to this many s for the rest of the machine to idle",
    )
    parser.add_argument("--json", help="append JSON lines here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
