#!/usr/bin/env python3
"""Probe: where a sequential warm turn's wall time goes, from the caller's ``await`` to its return.

    python bench/turn_segments.py [--url URL] [--turns 3000] [--reps 3]

One caller awaits ``Counter.add(1)`` on one warm actor (``turns.py``'s sequential scenario). Each
turn is cut at its two flights' ``TurnPipeline.sync`` (wrapped in this process only: the Sync is
sent at its start, every answer is in at its end) into five segments:

* ``before admission``: the caller's call (validation, id, hash, access), the mailbox, the
  engine and the connection, up to the admission flight's Sync;
* ``admission flight``: from that Sync until its answers are read (the server's time, the wire,
  and libpq's reading);
* ``handler``: the answers' decoding, the handler and its checks, and the commit flight built;
* ``commit flight``: from the commit flight's Sync until its answers are read;
* ``after commit``: the cache, the pool, telemetry, and the caller woken.

With one caller nothing overlaps: the three segments outside the flights are the client's
alone, so they bound what a sequential turn gains from any client work made cheaper, and the
flights bound what it gains from the server. Medians per segment over ``--turns`` turns, per
rep. Without ``--url``, a throwaway embedded server. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turns import Counter, _drop_schema, on_a_server

import akter
from akter._store.pipeline import TurnPipeline

SEGMENTS = ("before admission", "admission flight", "handler", "commit flight", "after commit")

#: ``perf_counter_ns`` at each flight's Sync and once its answers are read, in order.
_MARKS: list[int] = []


def _timed(sync: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    async def timed(self: TurnPipeline, *args: Any, **kwargs: Any) -> None:
        _MARKS.append(time.perf_counter_ns())
        try:
            await sync(self, *args, **kwargs)
        finally:
            _MARKS.append(time.perf_counter_ns())

    return timed


async def measure(url: str, turns: int) -> list[tuple[int, ...]]:
    """Segments in ns, one tuple per turn with exactly two flights."""
    schema = f"akter_segments_{uuid.uuid4().hex[:8]}"
    rows: list[tuple[int, ...]] = []
    try:
        async with akter.Runtime(actors=[Counter], database_url=url, schema=schema) as runtime:
            counter = runtime.get(Counter, "segments-0")
            for _ in range(300):
                await counter.add(1)
            for _ in range(turns):
                _MARKS.clear()
                start = time.perf_counter_ns()
                await counter.add(1)
                end = time.perf_counter_ns()
                if len(_MARKS) == 4:
                    marks = [start, *_MARKS, end]
                    rows.append(tuple(b - a for a, b in itertools.pairwise(marks)))
    finally:
        await _drop_schema(url, schema)
    return rows


async def run(args: argparse.Namespace, url: str) -> list[list[tuple[int, ...]]]:
    sync = TurnPipeline.sync
    TurnPipeline.sync = _timed(sync)  # type: ignore[method-assign,assignment]
    try:
        return [await measure(url, args.turns) for _ in range(args.reps)]
    finally:
        TurnPipeline.sync = sync  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", help="PostgreSQL URL (default: start an embedded server)")
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    reps = asyncio.run(on_a_server(args.url, lambda url: run(args, url)))
    print(f"sequential warm turns, {args.turns} per rep x {args.reps} reps: median µs per turn")
    print("| segment | " + " | ".join(f"rep {i + 1}" for i in range(len(reps))) + " |")
    print("|---|" + "---|" * len(reps))
    for index, name in enumerate((*SEGMENTS, "whole turn")):
        cells = []
        for rows in reps:
            if index < len(SEGMENTS):
                values = [row[index] for row in rows]
            else:
                values = [sum(row) for row in rows]
            cells.append(f"{statistics.median(values) / 1000:.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    client = [statistics.median(row[0] + row[2] + row[4] for row in rows) / 1000 for rows in reps]
    print(f"client alone (before + handler + after): {', '.join(f'{c:.0f}' for c in client)} µs")


if __name__ == "__main__":
    main()
