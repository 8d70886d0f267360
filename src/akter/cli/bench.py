"""``akter bench``: turns per second and call latency of a tiny built-in actor.

It runs on the configured database (``--database-url``, ``$AKTER_DATABASE_URL``, else the
embedded server) in its own schema (``--schema``, default ``akter_bench``, kept between runs):
``--callers`` tasks call ``--actors`` actors for ``--seconds``, then it prints turns per second
and the p50/p99 latency of a call. It checks that the actors' committed counters grew by exactly
the number of successful calls.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from akter.actor import Actor, command
from akter.cli._common import JsonOption, Steps, refusals_exit, stdout
from akter.errors import ActorError, ConfigurationError
from akter.runtime import Runtime

bench_app = typer.Typer()


class _Tally(BaseModel):
    n: int = 0


class BenchCounter(Actor[_Tally]):
    """The benchmark's actor: one integer, one command."""

    @command
    async def add(self, k: int) -> int:
        """Add ``k``; return the new total."""
        self.state.n += k
        return self.state.n


@bench_app.command("bench")
def bench(
    callers: Annotated[int, typer.Option(min=1, max=4096, help="Concurrent callers.")] = 16,
    actors: Annotated[int, typer.Option(min=1, max=100_000, help="Actors called.")] = 64,
    seconds: Annotated[float, typer.Option(min=0.1, max=3600, help="How long to run.")] = 10.0,
    schema: Annotated[str, typer.Option(help="The schema of the bench's rows.")] = "akter_bench",
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            help="PostgreSQL URL [default: $AKTER_DATABASE_URL, else the embedded server].",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Measure turns per second and call latency of a tiny built-in actor on the database."""
    with refusals_exit():
        runtime = Runtime(
            [BenchCounter],
            database_url=database_url,
            schema=schema,
            pool_size=max(4, min(callers + 4, 100)),
            relay=False,
            maintenance=False,
        )
        report = asyncio.run(_bench(runtime, callers, actors, seconds))
    if as_json:
        print(json.dumps(report))
        return
    stdout.print(
        f"{report['turns']} turns in {report['seconds']:.2f} s: "
        f"[bold]{report['turns_per_second']:.0f} turns/s[/bold], "
        f"p50 {report['p50_ms']:.2f} ms, p99 {report['p99_ms']:.2f} ms "
        f"({report['callers']} callers over {report['actors']} actors, "
        f"{report['errors']} errors)"
    )


async def _bench(runtime: Runtime, callers: int, actors: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0

    async def caller(index: int, deadline: float) -> None:
        nonlocal errors
        # Caller i takes actors i, i + callers, ...: no two callers queue on one actor unless
        # there are fewer actors than callers.
        mine = [f"b{a}" for a in range(index % actors, actors, callers)] or [f"b{index % actors}"]
        turn = 0
        while time.monotonic() < deadline:
            handle = runtime.get(BenchCounter, mine[turn % len(mine)])
            turn += 1
            began = time.perf_counter()
            try:
                await handle.add(1)
            except ActorError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - began)

    async with runtime:
        before = await _total(runtime, actors)
        began = time.monotonic()
        deadline = began + seconds
        tasks = [
            asyncio.create_task(caller(i, deadline), name=f"akter.bench.caller.{i}")
            for i in range(callers)
        ]
        with Steps("benchmark (s)", round(seconds, 1)) as steps:
            while not all(t.done() for t in tasks):
                await asyncio.wait(tasks, timeout=0.25)
                steps.update(round(min(time.monotonic() - began, seconds), 1))
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - began
        grown = await _total(runtime, actors) - before
    if grown != len(latencies):
        raise ConfigurationError(
            f"The benchmark's actors gained {grown} increments for {len(latencies)} successful "
            "calls; turns were lost or applied twice."
        )
    ordered = sorted(latencies) or [0.0]
    cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else None
    return {
        "callers": callers,
        "actors": actors,
        "seconds": round(elapsed, 3),
        "turns": len(latencies),
        "errors": errors,
        "turns_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": round((cuts[49] if cuts else ordered[0]) * 1000, 3),
        "p99_ms": round((cuts[98] if cuts else ordered[0]) * 1000, 3),
    }


async def _total(runtime: Runtime, actors: int) -> int:
    """The sum of the bench actors' committed counters."""
    refs = [runtime.ref(BenchCounter, f"b{a}") for a in range(actors)]
    states = await runtime.operators.actors.states(refs)
    return sum(int(state["n"]) for state in states if state is not None)


__all__ = ["BenchCounter", "bench_app"]
