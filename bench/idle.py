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
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One idle window through the proxy."""
    proxy = turns.WireProxy(url)
    await proxy.start()
    schema = f"akter_idle_{uuid.uuid4().hex[:10]}"
    try:
        runtime = akter.Runtime(
            [Shop, Clock], database_url=proxy.url, schema=schema, notify=args.notify
        )
        async with runtime:
            proxy.learn(runtime.store.queries)
            await runtime.get(Shop, "s-1").touch()
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
    lines = [
        f"idle runner, notify={result['notify']}: {result['statements']} statements in "
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


async def run(args: argparse.Namespace) -> int:
    """Start a throwaway server unless ``--url``; measure; print."""
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
    parser.add_argument("--json", help="append a JSON line here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args())))
