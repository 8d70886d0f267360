#!/usr/bin/env python3
"""Runner and schedule drills (issue 5): singleton takeover under SIGKILL, and a cron boundary.

    python bench/drills.py [--url URL] [--only singleton|cron] [--kills 20] [--timing scaled]
                           [--actors 10000] [--runners 1 2] [--json bench/results/drills.jsonl]

Everything runs against one server (default: a throwaway embedded PostgreSQL in a temp dir).

1. **Singleton drill.** Three runner processes (``tests.faults.runner_child``) host the ``Beacon``
   singleton; its loop writes a beat stamped with the database clock every 50 ms, and a trigger
   logs every write of the lease row. The runner whose loop beats is SIGKILLed ``--kills`` times
   (each dead runner is replaced once the takeover happened). Takeover = the successor's first
   beat minus the database clock read just before the kill. From the database alone the drill
   checks that no two loops' beat intervals overlap, that every beat happened under an unexpired
   lease of its own runner, and that each kill had exactly one successor, started after the dead
   owner's lease (``tests.faults.runner_drill``). ``--timing scaled`` runs production's timings
   divided by ten (lease 3.5 s, refresh 1 s, stop margin 0.5 s); ``production`` runs 35 s / 10 s
   / 5 s.
2. **Cron drill.** ``--actors`` actors with one ``@akter.schedule(every=P)`` entry each are
   created by a first command each (``--create-callers`` concurrent callers) in a runtime with
   ``relay=False`` whose clock offset puts "now" P − 1 s before a period boundary B, so every tick
   row is due at B. P is ``--period``: by default 1 minute (``Minutely``) up to 20,000 actors and
   10 minutes (``TenMinutely``) above, so that both the creation and the drain fit in one period
   (at ~1,000 first calls/s and ~640 ticks/s on 2 cores, 100,000 actors take ~100 s and ~160 s).
   Then ``--runners`` runner processes start with a clock offset that makes the database instant
   S (a few seconds ahead) read as B: all ticks fall due together at S. Each handler records its
   command id and its turn's clock (``self.now_ms``) in durable state and counts its runs in its
   process. Reported: duplicates (receipts per tick id, handler runs per tick id, ticks per
   actor), ticks/s and lateness = the handler's turn clock − the scheduled time B, p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field

SELF = Path(__file__).resolve()
REPO_DIR = SELF.parent.parent
sys.path.insert(0, str(REPO_DIR))

from tests.faults.runner_drill import (  # noqa: E402
    PRODUCTION,
    SCALED,
    Analysis,
    freeze_drill,
    percentile,
    singleton_drill,
)

import akter  # noqa: E402
from akter._store.embedded import EmbeddedPostgres  # noqa: E402

MINUTE_MS = 60_000
#: Above this many actors the cron drill's default period is 10 minutes instead of 1.
MINUTELY_UP_TO = 20_000

#: Handler runs per command id in this process (a cron runner child reports it).
RUNS: Counter[str] = Counter()


class Fired(BaseModel):
    """The ticks an actor committed: ``[command id, turn clock ms]`` each."""

    n: int = 0
    ticks: list[list[Any]] = Field(default_factory=list)


def _fire(actor: Minutely | TenMinutely) -> int:
    """A tick's work, the same for both periods: count the run here and in the state."""
    RUNS[actor.command_id] += 1
    actor.state.n += 1
    actor.state.ticks.append([actor.command_id, actor.now_ms])
    return actor.state.n


class Minutely(akter.Actor[Fired]):
    """An actor with a minutely schedule."""

    @akter.command
    async def start(self) -> None:
        """The first command: its commit creates the actor and inserts its tick row."""

    @akter.schedule(every=timedelta(minutes=1))
    @akter.command
    async def tick(self) -> int:
        """One scheduled run: count it here and durably."""
        return _fire(self)


class TenMinutely(akter.Actor[Fired]):
    """The same with a 10-minute schedule: creating or draining 100,000 takes over a minute."""

    @akter.command
    async def start(self) -> None:
        """The first command: its commit creates the actor and inserts its tick row."""

    @akter.schedule(every=timedelta(minutes=10))
    @akter.command
    async def tick(self) -> int:
        """One scheduled run: count it here and durably."""
        return _fire(self)


#: The cron drill's actor type per period in minutes.
CRON_TYPES: dict[int, type[Minutely] | type[TenMinutely]] = {1: Minutely, 10: TenMinutely}


# --- helpers -------------------------------------------------------------------------------------


async def _connect(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def _db_ms(url: str) -> int:
    async with await _connect(url) as conn:
        cur = await conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _drop_schema(url: str, schema: str) -> None:
    async with await _connect(url) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def _scalar(url: str, query: sql.SQL | sql.Composed, params: Sequence[Any] = ()) -> Any:
    async with await _connect(url) as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        return None if row is None else row[0]


def _git_head() -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO_DIR), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _ms(values: Sequence[float]) -> str:
    return " / ".join(f"{percentile(values, q):,.0f}" for q in (0.5, 0.99)) + (
        f" / {max(values):,.0f}" if values else ""
    )


# --- singleton drill -----------------------------------------------------------------------------


async def run_singleton(url: str, kills: int, timing_name: str) -> dict[str, Any]:
    """The kill drill on a fresh schema; returns a JSON-able record and prints a table."""
    timing = PRODUCTION if timing_name == "production" else SCALED
    schema = f"akter_drill_{uuid.uuid4().hex[:10]}"
    async with akter.Runtime([], database_url=url, schema=schema, maintenance=False):
        pass  # migrates the schema
    started = time.monotonic()
    try:
        analysis = await singleton_drill(
            url, schema, kills=kills, timing=timing, log=lambda s: print(f"  {s}", flush=True)
        )
    finally:
        await _drop_schema(url, schema)
    wall = time.monotonic() - started
    record = _singleton_record(analysis, timing_name, timing.__dict__, kills, wall)
    record["loadavg_after"] = _loadavg()
    _print_singleton(record)
    return record


def _singleton_record(
    analysis: Analysis, timing_name: str, timing: dict[str, int], kills: int, wall: float
) -> dict[str, Any]:
    takeovers = analysis.takeovers()
    left = [k.lease_left_ms for k in analysis.kills if k.lease_left_ms is not None]
    acquire = [k.acquire_ms for k in analysis.kills if k.acquire_ms is not None]
    after = [k.after_lease_ms for k in analysis.kills if k.after_lease_ms is not None]
    before_first = [
        r for r in analysis.runs if analysis.kills and r.first_ms < analysis.kills[0].kill_ms
    ]
    return {
        "drill": "singleton",
        "timing": timing_name,
        **timing,
        "kills": kills,
        "wall_s": round(wall, 1),
        "runs": len(analysis.runs),
        "runs_before_first_kill": len(before_first),
        "successor_runners_per_kill": sorted(
            Counter(k.new_runners for k in analysis.kills).items()
        ),
        "runs_per_kill": sorted(Counter(k.new_runs for k in analysis.kills).items()),
        "overlaps": len(analysis.overlaps),
        "unleased_beats": len(analysis.unleased),
        "min_gap_ms": analysis.min_gap_ms,
        "min_lease_slack_ms": analysis.min_slack_ms,
        "takeover_ms": takeovers,
        "takeover_p50_ms": percentile(takeovers, 0.5),
        "takeover_p99_ms": percentile(takeovers, 0.99),
        "lease_left_ms": left,
        "acquire_ms": acquire,
        "after_lease_ms": after,
        "problems": analysis.problems(),
    }


def _print_singleton(r: dict[str, Any]) -> None:
    print(
        f"\n### Singleton drill: {r['kills']} SIGKILLs of the owner, 3 runners, "
        f"{r['timing']} timing (lease {r['lease_ms']} ms, refresh {r['refresh_ms']} ms, "
        f"stop margin {r['margin_ms']} ms), {r['wall_s']} s\n"
    )
    print("| measure | p50 / p99 / max (ms) |")
    print("|---|---|")
    print(f"| takeover: kill → successor's first beat | {_ms(r['takeover_ms'])} |")
    print(f"| lease left at the kill (dead owner's lease end − kill) | {_ms(r['lease_left_ms'])} |")
    print(f"| kill → successor's lease acquisition | {_ms(r['acquire_ms'])} |")
    print(f"| successor's first beat − dead owner's lease end | {_ms(r['after_lease_ms'])} |")
    print()
    print("| check | result |")
    print("|---|---|")
    print(f"| loop runs before the first kill (3 runners) | {r['runs_before_first_kill']} |")
    successors = r["successor_runners_per_kill"]
    print(f"| runners starting the loop after a kill (value, kills) | {successors} |")
    print(f"| loop runs started after a kill (value, kills) | {r['runs_per_kill']} |")
    print(f"| overlapping loop runs | {r['overlaps']} |")
    print(f"| beats outside the runner's own unexpired lease | {r['unleased_beats']} |")
    print(f"| smallest gap between two runs (ms) | {r['min_gap_ms']} |")
    print(f"| smallest lease end − beat (ms) | {r['min_lease_slack_ms']} |")
    print(f"| problems | {r['problems'] or 'none'} |")


async def run_freeze(url: str, rounds: int, timing_name: str) -> dict[str, Any]:
    """The SIGSTOP/SIGCONT drill on a fresh schema (a process stall, not a refresh stall)."""
    timing = PRODUCTION if timing_name == "production" else SCALED
    schema = f"akter_freeze_{uuid.uuid4().hex[:10]}"
    async with akter.Runtime([], database_url=url, schema=schema, maintenance=False):
        pass
    try:
        analysis, freezes = await freeze_drill(
            url, schema, rounds=rounds, timing=timing, log=lambda s: print(f"  {s}", flush=True)
        )
    finally:
        await _drop_schema(url, schema)
    record = {
        "drill": "freeze",
        "timing": timing_name,
        **timing.__dict__,
        "rounds": rounds,
        "rounds_with_stale_beats": sum(1 for f in freezes if f.stale_beats_ms),
        "stale_beats_ms": [f.stale_beats_ms for f in freezes],
        "overlaps": len(analysis.overlaps),
        "unleased_beats": len(analysis.unleased),
        "problems": analysis.problems(),
        "loadavg_after": _loadavg(),
    }
    print(
        f"\n### Freeze drill: SIGSTOP of the owner until a successor runs, then SIGCONT "
        f"({rounds} rounds, {timing_name} timing)\n"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| rounds where the resumed loop beat again | {record['rounds_with_stale_beats']} |")
    print(f"| its beats after SIGCONT (ms after resuming) | {record['stale_beats_ms']} |")
    print(
        f"| overlapping runs / beats outside an own unexpired lease | "
        f"{record['overlaps']} / {record['unleased_beats']} |"
    )
    return record


# --- cron drill ----------------------------------------------------------------------------------


async def cron_runner(
    url: str, schema: str, offset_ms: int, report: Path, concurrency: int, period: int, actors: int
) -> int:
    """Child: a runner with its relay on and a clock offset; reports its handler runs at exit."""
    runtime = akter.Runtime(
        [CRON_TYPES[period]],
        database_url=url,
        schema=schema,
        maintenance=False,
        delivery_concurrency=concurrency,
        max_resident_actors=actors + 1_000,
    )
    runtime._clock.offset_ms = offset_ms
    # Instrument (this process only): how many claim statements, and how many rows each got.
    claims: list[int] = []
    claim_intents = runtime._relay._claim_intents

    async def counted_claims(*args: Any, **kwargs: Any) -> int:
        n = await claim_intents(*args, **kwargs)
        if n:
            claims.append(n)
        return n

    runtime._relay._claim_intents = counted_claims  # type: ignore[method-assign]
    async with runtime:
        print("READY", flush=True)
        while await asyncio.to_thread(sys.stdin.readline):
            pass
    summary = json.dumps(
        {
            "runs": dict(RUNS),
            "delivered": runtime._relay.delivered,
            "cpu_s": time.process_time(),
            "claims": len(claims),
            "claimed": sum(claims),
        }
    )
    await asyncio.to_thread(report.write_text, summary)
    print("STOPPED", flush=True)
    return 0


async def _create(
    url: str, schema: str, actors: int, boundary: int, period: int, callers: int
) -> float:
    """Create the actors with the relay off, 'now' P − 1 s before ``boundary``; returns seconds.

    Each actor is created honestly, by its first command (the commit inserts its row and its
    tick row), ``callers`` at a time.
    """
    cron = CRON_TYPES[period]
    runtime = akter.Runtime(
        [cron],
        database_url=url,
        schema=schema,
        relay=False,
        max_resident_actors=actors + 1_000,
        max_pending_commands=max(10_000, 4 * callers),
    )
    runtime._clock.offset_ms = boundary - (period * MINUTE_MS - 1_000) - await _db_ms(url)
    started = time.monotonic()
    async with runtime:
        queue = iter(range(actors))

        async def creator() -> None:
            for i in queue:
                await runtime.get(cron, f"m{i:06d}").start()

        await asyncio.gather(*(creator() for _ in range(callers)))
        if await runtime._clock.read() >= boundary:
            raise SystemExit(
                f"creating {actors:,} actors outlasted the {period}-minute period, so their "
                "ticks are not all due at one boundary (try --period 10 or fewer actors)"
            )
    return time.monotonic() - started


async def run_cron(
    url: str, actors: int, runners: int, concurrency: int, period: int, create_callers: int
) -> dict[str, Any]:
    """One cron drill on a fresh schema: create, jump to the boundary, drain, check."""
    period_ms = period * MINUTE_MS
    cron = CRON_TYPES[period].__name__
    schema = f"akter_cron_{uuid.uuid4().hex[:10]}"
    tmp = Path(tempfile.mkdtemp(prefix="akter-cron-"))
    procs: list[asyncio.subprocess.Process] = []
    load_before = _loadavg()
    try:
        now = await _db_ms(url)
        boundary = (now // period_ms + 10) * period_ms  # any boundary: offsets move the clock
        create_s = await _create(url, schema, actors, boundary, period, create_callers)
        t = sql.Identifier(schema)
        cur_rows = await _rows(
            url,
            sql.SQL(
                "SELECT intent_id, actor_id, due_at_ms FROM {}.outbox"
                " WHERE timer_key LIKE '$cron:%%'"
            ).format(t),
        )
        ticks = {str(r[0]): str(r[1]) for r in cur_rows}
        dues = Counter(int(r[2]) for r in cur_rows)
        if len(ticks) != actors or list(dues) != [boundary]:
            raise SystemExit(f"setup: {len(ticks)} ticks, due times {dues} (want {boundary})")

        # The ticks fall due at database instant S: the runners' clock reads B there.
        start_at = await _db_ms(url) + 5_000 + 1_000 * runners
        offset = boundary - start_at
        reports = [tmp / f"runner-{i}.json" for i in range(runners)]
        for report in reports:
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(SELF),
                    "cron-runner",
                    url,
                    schema,
                    str(offset),
                    str(report),
                    str(concurrency),
                    str(period),
                    str(actors),
                    cwd=REPO_DIR,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if line.strip() != b"READY":
                raise SystemExit(f"cron runner: {line!r}")
        if await _db_ms(url) >= start_at:
            raise SystemExit("the runners started after the boundary; raise the lead time")

        # Wait until every tick is rewritten to the next boundary (its delivery is settled).
        # Each poll scans the outbox, so polls get rarer with more actors (1 s at 100,000) so as
        # not to load the server they measure; the drain's figures come from the handlers.
        limit_s = 300 + actors // 200
        deadline = time.monotonic() + (start_at - await _db_ms(url)) / 1000 + limit_s
        poll_s = max(0.1, actors / 100_000)
        count_rewritten = sql.SQL(
            "SELECT count(*) FROM {}.outbox WHERE timer_key LIKE '$cron:%%' AND due_at_ms > %s"
        ).format(t)
        while (await _scalar(url, count_rewritten, (boundary,))) < actors:
            if time.monotonic() > deadline:
                raise SystemExit(f"the ticks were not drained within {limit_s} s of the boundary")
            await asyncio.sleep(poll_s)
        for proc in procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            await asyncio.wait_for(proc.stdout.read(), 60)
            await proc.wait()
        runs: Counter[str] = Counter()
        per_runner = []
        cpu_s = []
        claim_stats: list[tuple[int, int]] = []
        for report in reports:
            data = json.loads(report.read_text())
            runs.update(data["runs"])
            per_runner.append(sum(data["runs"].values()))
            cpu_s.append(round(float(data["cpu_s"]), 1))
            claim_stats.append((int(data["claims"]), int(data["claimed"])))

        receipts = await _rows(
            url,
            sql.SQL(
                "SELECT command_id, count(*) FROM {}.receipts WHERE actor_type = %s"
                " AND command = 'tick' GROUP BY command_id"
            ).format(t),
            (cron,),
        )
        states = await _rows(
            url,
            sql.SQL("SELECT actor_id, state FROM {}.actors WHERE actor_type = %s").format(t),
            (cron,),
        )
        after = await _rows(
            url,
            sql.SQL(
                "SELECT intent_id, due_at_ms, attempts FROM {}.outbox"
                " WHERE timer_key LIKE '$cron:%%'"
            ).format(t),
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        await _drop_schema(url, schema)

    per_tick = Counter({str(cid): int(n) for cid, n in receipts})
    # Only the boundary's own ticks count; should a drain outlast the minute, the next
    # boundary's ticks (new ids) are legitimate and reported apart.
    all_fired = [
        (str(tick[0]), int(tick[1]), str(actor))
        for actor, state in states
        for tick in (state or {}).get("ticks", [])
    ]
    fired = [(cid, at) for cid, at, actor in all_fired if ticks.get(cid) == actor]
    fired_ids = Counter(cid for cid, _ in fired)
    lateness = [at - boundary for _, at in fired]
    first, last = min(at for _, at in fired), max(at for _, at in fired)
    record = {
        "drill": "cron",
        "actors": actors,
        "period_min": period,
        "actor_type": cron,
        "create_callers": create_callers,
        "runners": runners,
        "delivery_concurrency": concurrency,
        "create_s": round(create_s, 1),
        "ticks_fired": len(fired),
        "missing_ticks": len(set(ticks) - set(fired_ids)),
        "later_ticks": len(all_fired) - len(fired),
        "duplicate_receipts": sum(per_tick[cid] - 1 for cid in ticks if per_tick[cid] > 1),
        "duplicate_handler_runs": sum(runs[cid] - 1 for cid in ticks if runs[cid] > 1),
        "handler_runs": sum(runs[cid] for cid in ticks),
        "handler_runs_per_runner": per_runner,
        "runner_cpu_s": cpu_s,
        "claims_and_rows_per_runner": claim_stats,
        "actors_not_fired_once": sum(1 for cid in ticks if fired_ids[cid] != 1),
        "rows_rewritten_with_new_id": sum(
            1 for r in after if int(r[1]) >= boundary + period_ms and str(r[0]) not in ticks
        ),
        "drain_ms": last - boundary,
        "first_delivery_ms": first - boundary,
        "ticks_per_s_from_due": len(fired) / max(1, last - boundary) * 1000,
        "ticks_per_s_first_to_last": len(fired) / max(1, last - first) * 1000,
        "lateness_p50_ms": percentile(lateness, 0.5),
        "lateness_p99_ms": percentile(lateness, 0.99),
        "lateness_max_ms": max(lateness),
        "lateness_mean_ms": statistics.fmean(lateness),
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
    }
    _print_cron(record)
    return record


async def _rows(url: str, query: sql.Composed, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async with await _connect(url) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


def _print_cron(r: dict[str, Any]) -> None:
    print(
        f"\n### Cron drill: {r['actors']:,} actors every {r['period_min']} min "
        f"({r['actor_type']}) due at one boundary, "
        f"{r['runners']} runner(s), delivery_concurrency {r['delivery_concurrency']} "
        f"(creation {r['create_s']} s by {r['create_callers']} callers; "
        f"load average {r['loadavg_before']} → {r['loadavg_after']})\n"
    )
    lateness = (r["lateness_p50_ms"], r["lateness_p99_ms"], r["lateness_max_ms"])
    rows = [
        (
            "boundary ticks fired / missing; next-boundary ticks (drain > 1 period)",
            f"{r['ticks_fired']:,} / {r['missing_ticks']} / {r['later_ticks']}",
        ),
        (
            "duplicates: extra receipts per tick id / extra handler runs / actors not fired once",
            f"{r['duplicate_receipts']} / {r['duplicate_handler_runs']} / "
            f"{r['actors_not_fired_once']}",
        ),
        ("handler runs per runner", str(r["handler_runs_per_runner"])),
        ("CPU seconds per runner process (whole life)", str(r["runner_cpu_s"])),
        (
            "claim statements that claimed rows / rows, per runner",
            str(r["claims_and_rows_per_runner"]),
        ),
        (
            "tick rows rewritten to a later boundary with a new id",
            f"{r['rows_rewritten_with_new_id']:,}",
        ),
        ("ticks/s (boundary → last delivery)", f"{r['ticks_per_s_from_due']:,.0f}"),
        ("ticks/s (first → last delivery)", f"{r['ticks_per_s_first_to_last']:,.0f}"),
        ("first delivery after the boundary (ms)", f"{r['first_delivery_ms']:,}"),
        ("lateness p50 / p99 / max (ms)", " / ".join(f"{v:,.0f}" for v in lateness)),
    ]
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    parser.add_argument("--only", choices=["singleton", "freeze", "cron"])
    parser.add_argument("--freeze-rounds", type=int, default=5)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--timing", choices=["scaled", "production"], default="scaled")
    parser.add_argument("--actors", type=int, default=10_000)
    parser.add_argument(
        "--period",
        type=int,
        choices=sorted(CRON_TYPES),
        help=f"cron period in minutes (default: 1 up to {MINUTELY_UP_TO:,} actors, else 10)",
    )
    parser.add_argument(
        "--create-callers", type=int, default=64, help="concurrent first calls (default 64)"
    )
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--delivery-concurrency", type=int, default=16, help="per cron runner (default 16)"
    )
    parser.add_argument("--json", type=Path, help="append one JSON line per drill here")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    """Run the drills."""
    embedded: EmbeddedPostgres | None = None
    data_dir: Path | None = None
    url: str = args.url or ""
    if not url:
        data_dir = Path(tempfile.mkdtemp(prefix="akter-bench-drills-"))
        embedded = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(embedded.start)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": _git_head(),
        "server": "embedded" if embedded else url,
        "server_version": await _scalar(url, sql.SQL("SHOW server_version")),
        "cpus": os.cpu_count(),
    }
    print(
        f"date {meta['date']}, git {meta['git']}, server {meta['server']} "
        f"{meta['server_version']}, {meta['cpus']} CPUs"
    )
    records: list[dict[str, Any]] = []
    try:
        if args.only in (None, "singleton"):
            records.append(await run_singleton(url, args.kills, args.timing))
        if args.only in (None, "freeze"):
            records.append(await run_freeze(url, args.freeze_rounds, args.timing))
        if args.only in (None, "cron"):
            period = args.period or (1 if args.actors <= MINUTELY_UP_TO else 10)
            for runners in args.runners:
                records.append(
                    await run_cron(
                        url,
                        args.actors,
                        runners,
                        args.delivery_concurrency,
                        period,
                        args.create_callers,
                    )
                )
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with args.json.open("a") as f:
            for record in records:
                f.write(json.dumps({**meta, **record}, default=str) + "\n")
    return 1 if any(r.get("problems") for r in records if r["drill"] != "freeze") else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (``cron-runner`` is the child mode of the cron drill)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["cron-runner"]:
        url, schema, offset, report, concurrency, period, actors = argv[1:8]
        return asyncio.run(
            cron_runner(
                url, schema, int(offset), Path(report), int(concurrency), int(period), int(actors)
            )
        )
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
