#!/usr/bin/env python3
"""Idle cost (issue 13, goal 5): statements per second of one idle runner, counted on the wire.

    python bench/idle.py [--url URL] [--seconds 60] [--warmup 5] [--notify] [--json FILE]

One ``akter.Runtime`` with the relay, the job executor (an uncapped and a capped job), the
``$maintenance`` singleton (retention, sampled gauges), a singleton type with a ``run()`` loop and
an hourly schedule, all at their default cadences, connects through ``turns.WireProxy`` (a
unix-socket proxy that parses the frontend protocol). Every connection goes through it: both
pools, the relay's own claim and settle connections and the wake listener. After ``--warmup``
seconds (start-up statements: migrations, seeding, first leases), nothing is called for
``--seconds``; the proxy's statements in that window are reported by catalogue name, per second.

``--sleeping-runs N`` (issue 15) adds an actor type with a workflow, ``Sleeper.nap``, that only
``await wf.sleep(timedelta(hours=...))``, and before the warm-up starts N runs of it (16 callers,
one actor per run) and waits until all N are suspended (waking the relay every 20 ms meanwhile:
see ``start_sleepers``), so the idle window has N sleeping runs whose wake times lie hours ahead.
``--sleeping-runs 0`` is the same runtime without runs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql
from pydantic import BaseModel

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import turns  # noqa: E402  (bench/turns.py: the wire proxy and helpers)

import akter  # noqa: E402
from akter._store.embedded import EmbeddedPostgres  # noqa: E402


class Box(BaseModel):
    """Nothing much."""

    n: int = 0


class Parcel(BaseModel):
    """A job's payload."""

    n: int


class Shop(akter.Actor[Box]):
    """An actor type with an uncapped and a capped job (the executor claims both kinds)."""

    @akter.command
    async def touch(self) -> int:
        """One turn."""
        self.state.n += 1
        return self.state.n

    @akter.job(attempts=2, timeout=5.0)
    async def ship(call: akter.JobCall, req: Parcel) -> int:
        """An uncapped job."""
        return req.n

    @akter.job(attempts=2, timeout=5.0, per_actor=1)
    async def bill(call: akter.JobCall, req: Parcel) -> int:
        """A capped job."""
        return req.n


class Clock(akter.Actor[Box], singleton=True):
    """A singleton with a background loop and an hourly schedule."""

    @akter.schedule(every=3600)
    @akter.command
    async def hourly(self) -> None:
        """An hourly tick (it does not fire within a run)."""
        self.state.n += 1

    async def run(self) -> None:
        """Sleep: the loop's lease is renewed meanwhile."""
        await asyncio.Event().wait()


class Sleeper(akter.Actor[Box]):
    """An actor type whose workflow only sleeps (``--sleeping-runs``)."""

    @akter.workflow
    async def nap(wf: akter.Workflow, hours: float) -> str:
        """One durable timer, hours long: the run stays suspended through the window."""
        await wf.sleep(timedelta(hours=hours))
        return "woke"


async def start_sleepers(
    runtime: akter.Runtime, url: str, schema: str, n: int, hours: float
) -> float:
    """Start ``n`` runs of ``Sleeper.nap`` (16 callers); wait until all are suspended."""
    started = time.monotonic()
    counter = itertools.count()

    async def caller() -> None:
        while (i := next(counter)) < n:
            await runtime.get(Sleeper, f"z-{i:06d}").nap.start(hours)

    await asyncio.gather(*(caller() for _ in range(16)))
    query = sql.SQL(
        "SELECT count(*) FROM {}.workflows WHERE status = 'suspended' AND wake_at_ms IS NOT NULL"
    ).format(sql.Identifier(schema))
    # A run's first attempt that suspends does not ask the relay for another pass, so a backlog
    # of new runs is claimed delivery_concurrency (16) per poll (1 s): 10,000 runs would take
    # over 10 minutes. The setup wakes the relay itself every 20 ms until all are suspended.
    async with await turns._connect(url) as conn:
        checked = 0.0
        while True:
            runtime._relay.wake()
            await asyncio.sleep(0.02)
            if time.monotonic() - checked < 0.5:
                continue
            checked = time.monotonic()
            row = await (await conn.execute(query)).fetchone()
            if row is not None and int(row[0]) >= n:
                break
            if time.monotonic() - started > 600:
                raise RuntimeError(f"only {row[0] if row else 0} of {n} runs suspended in 600 s")
    return time.monotonic() - started


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One idle window through the proxy."""
    proxy = turns.WireProxy(url)
    await proxy.start()
    schema = f"akter_idle_{uuid.uuid4().hex[:10]}"
    sleepers = args.sleeping_runs is not None
    setup_s = 0.0
    try:
        runtime = akter.Runtime(
            [Shop, Clock, *([Sleeper] if sleepers else [])],
            database_url=proxy.url,
            schema=schema,
            notify=args.notify,
        )
        async with runtime:
            proxy.learn(runtime._store.queries)
            await runtime.get(Shop, "s-1").touch()
            if sleepers and args.sleeping_runs:
                setup_s = await start_sleepers(
                    runtime, url, schema, args.sleeping_runs, args.sleep_hours
                )
            await asyncio.sleep(args.warmup)
            before = proxy.snapshot()
            started = time.monotonic()
            await asyncio.sleep(args.seconds)
            window = proxy.snapshot().minus(before)
            elapsed = time.monotonic() - started
    finally:
        await proxy.stop()
        await turns._drop_schema(url, schema)
    by_name = sorted(window.statements.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(window.statements.values())
    return {
        "bench": "idle",
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_head": turns._git_head(),
        "loadavg": turns._loadavg(),
        "notify": args.notify,
        "sleeping_runs": args.sleeping_runs,
        "sleepers_setup_s": round(setup_s, 1),
        "seconds": round(elapsed, 2),
        "statements": total,
        "statements_per_s": total / elapsed,
        "round_trips_per_s": window.round_trips / elapsed,
        "new_connections": window.connections,
        "by_name": dict(by_name),
    }


def render(result: dict[str, Any]) -> str:
    """The markdown table of one run."""
    seconds = result["seconds"]
    runs = result.get("sleeping_runs")
    lines = [
        f"idle runner, notify={result['notify']}"
        + (f", {runs:,} sleeping workflow runs" if runs is not None else "")
        + f": {result['statements']} statements in "
        f"{seconds:g} s = **{result['statements_per_s']:.2f}/s** "
        f"({result['round_trips_per_s']:.2f} round trips/s, "
        f"{result['new_connections']} new connections); load {' '.join(result['loadavg'])}",
        "",
        "| statement | count | per second |",
        "|---|---|---|",
    ]
    for name, count in result["by_name"].items():
        lines.append(f"| `{name}` | {count} | {count / seconds:.3f} |")
    return "\n".join(lines)


def _quiet_proxy_cancels(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The proxy's connection tasks end cancelled at its stop: not worth a traceback."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


async def run(args: argparse.Namespace) -> int:
    """Start a throwaway server unless ``--url``; measure; print."""
    asyncio.get_running_loop().set_exception_handler(_quiet_proxy_cancels)
    embedded: EmbeddedPostgres | None = None
    url: str = args.url or ""
    if not url:
        import tempfile

        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="akter-bench-idle-pg-")))
        url = await asyncio.to_thread(embedded.start)
    try:
        result = await measure(url, args)
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
    print(render(result))
    if args.json:
        turns._append_json(Path(args.json), [result])
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: a throwaway embedded server)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the idle window")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the window")
    parser.add_argument("--notify", action="store_true", help="the runtime's notify=True")
    parser.add_argument(
        "--sleeping-runs",
        type=int,
        help="declare a workflow type and start this many sleeping runs before the window",
    )
    parser.add_argument(
        "--sleep-hours", type=float, default=6.0, help="how long each sleeping run sleeps"
    )
    parser.add_argument("--json", help="append a JSON line here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
