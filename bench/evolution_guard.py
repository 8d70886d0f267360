#!/usr/bin/env python3
"""State decode and the loss guard (issue 12): what a cold turn pays, and that a warm one doesn't.

    .venv/bin/python bench/evolution_guard.py [--url URL] [--turns 2000] [--reps 3]

Two parts, in one run:

* **decode (CPU, no database)**: µs per decode of a stored state, for a small state (the turn
  benchmark's shape) and a large one (200 nested line items). ``plain`` is the decode a turn did
  before issue 12 (validate, dump, ``storable_json``); ``guard`` is ``decode_state`` at the
  code's version (validate, dump, the loss guard's walk) plus ``storable_json``; ``guard + 2
  migrations`` decodes a row stored at version 0 through two dict migrations.
* **turns (PostgreSQL)**: µs per sequential turn (``add(1)`` on one actor, one caller) for a type
  without migrations and one at state version 2, warm (the cache is current: no decode) and cold
  (the activation forgets the row's version before each turn, so the lock ships the state and
  the admission decodes it — the path of a changed or evicted row, without an extra statement).
  Every cold turn of the versioned type decodes a row already at version 2 (a migrated row is
  written on its first turn), so the cold-minus-warm difference is the decode's; decode calls
  are counted to show that warm turns make none. Wall time includes the server's commit; the
  process CPU time per turn is the steadier figure on a shared machine.

The database is ``--url`` (default ``$AKTER_TEST_DATABASE_URL``, else the local test server);
each run uses a fresh schema and drops it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import timeit
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from pydantic import BaseModel

import akter
from akter._json import storable_json
from akter._members import ActorDefinition

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


class Tally(BaseModel):
    n: int = 0
    applied: list[str] = []
    data: str = ""
    tags: dict[str, int] = {}


class Line(BaseModel):
    sku: str = ""
    qty: int = 0
    price: float = 0.0
    notes: list[str] = []


class Cart(BaseModel):
    n: int = 0
    owner: str = ""
    lines: list[Line] = []


SMALL = Tally(n=5, applied=["v1.1.2.abc"] * 3, data="hello", tags={"a": 1, "b": 2})
LARGE = Cart(
    n=1,
    owner="alice",
    lines=[Line(sku=f"sku-{i}", qty=i, price=i / 4, notes=["gift"]) for i in range(200)],
)


def _same(old: dict[str, Any]) -> dict[str, Any]:
    return old


def _touch(old: dict[str, Any]) -> dict[str, Any]:
    return {**old, "n": old.get("n", 0)}


class PlainCounter(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


class VersionedCounter(akter.Actor[Tally], access=akter.public):
    _v0 = akter.migrate_state(from_version=0)(_same)
    _v1 = akter.migrate_state(from_version=1)(_touch)

    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


class PlainCart(akter.Actor[Cart]):
    pass


class VersionedCart(akter.Actor[Cart]):
    _v0 = akter.migrate_state(from_version=0)(_same)
    _v1 = akter.migrate_state(from_version=1)(_touch)


def definition(cls: type[Any]) -> ActorDefinition:
    return akter.actor.definition_of(cls)


# --- part 1: decode CPU -----------------------------------------------------------------------


def _per_call_us(fn: Callable[[], object], number: int, reps: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=reps)) / number * 1e6


def _decoders(
    stored: dict[str, Any], plain: ActorDefinition, versioned: ActorDefinition
) -> list[tuple[str, Callable[[], object]]]:
    model = plain.state_model

    def old() -> None:
        storable_json(model.model_validate(stored).model_dump(mode="json"), "state")

    def guard() -> None:
        storable_json(versioned.decode_state(stored, 2, "X/'x'")[1], "state")

    def migrated() -> None:
        storable_json(versioned.decode_state(stored, 0, "X/'x'")[1], "state")

    return [("plain", old), ("guard", guard), ("guard + 2 migrations", migrated)]


def decode_cpu(reps: int) -> list[tuple[str, str, float]]:
    rows: list[tuple[str, str, float]] = []
    for label, state, plain_cls, versioned_cls, number in (
        ("small", SMALL, PlainCounter, VersionedCounter, 20_000),
        ("large", LARGE, PlainCart, VersionedCart, 500),
    ):
        stored = state.model_dump(mode="json")
        for name, fn in _decoders(stored, definition(plain_cls), definition(versioned_cls)):
            rows.append((label, name, _per_call_us(fn, number, reps)))
    return rows


# --- part 2: turns ----------------------------------------------------------------------------


async def _turns(
    runtime: akter.Runtime, cls: type[Any], turns: int, *, cold: bool
) -> tuple[float, float, int]:
    """µs per sequential turn (wall, and this process's CPU), and how many decodes they made."""
    handle: Any = runtime.get(cls, "bench")
    await handle.add(1)  # the row exists (and a versioned one is migrated and written)
    d = runtime.definition(cls)
    act = runtime._dispatcher.activation(d, handle.ref)
    assert act is not None
    decodes = 0
    original = ActorDefinition.decode_state

    def counting(self: ActorDefinition, *args: Any, **kwargs: Any) -> Any:
        nonlocal decodes
        decodes += 1
        return original(self, *args, **kwargs)

    ActorDefinition.decode_state = counting  # type: ignore[method-assign]
    try:
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(turns):
            if cold:
                act.version = None  # the lock ships the row and the admission decodes it
            await handle.add(1)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        ActorDefinition.decode_state = original  # type: ignore[method-assign]
    return elapsed / turns * 1e6, cpu / turns * 1e6, decodes


Row = tuple[str, str, float, float, int]


async def turn_costs(url: str, turns: int, reps: int) -> list[Row]:
    schema = f"akter_bench_evo_{uuid.uuid4().hex[:8]}"
    rows: list[Row] = []
    runtime = akter.Runtime(
        [PlainCounter, VersionedCounter], database_url=url, schema=schema, relay=False
    )
    try:
        async with runtime:
            for _ in range(2):  # warm-up: pools, prepared statements
                await _turns(runtime, PlainCounter, 200, cold=False)
            samples: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
            for _ in range(reps):
                for cls in (PlainCounter, VersionedCounter):
                    for cold in (False, True):
                        key = (cls.__name__, "cold" if cold else "warm")
                        result = await _turns(runtime, cls, turns, cold=cold)
                        samples.setdefault(key, []).append(result)
            for (name, kind), got in samples.items():
                wall = statistics.median(s[0] for s in got)
                cpu = statistics.median(s[1] for s in got)
                rows.append((name, kind, wall, cpu, got[0][2]))
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("AKTER_TEST_DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--turns", type=int, default=2000, help="turns per sample")
    parser.add_argument("--reps", type=int, default=3, help="samples per figure (median)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print("decode (CPU), µs per decode, best of", args.reps)
    for size, name, us in decode_cpu(args.reps):
        print(f"  {size:5}  {name:22} {us:8.1f}")
    print(f"turns, µs per turn, median of {args.reps} × {args.turns} sequential turns")
    print(f"  {'type':16} {'turn':5} {'wall':>8} {'CPU':>8}   decodes")
    for name, kind, wall, cpu, decodes in asyncio.run(turn_costs(args.url, args.turns, args.reps)):
        print(f"  {name:16} {kind:5} {wall:8.1f} {cpu:8.1f}   {decodes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
