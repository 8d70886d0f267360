"""CLI commands for a developer's machine: ``dev`` and ``bench``.

``akter dev app:runtime`` starts the embedded PostgreSQL of ``--data-dir`` (default
``$AKTER_DATA_DIR`` or ``./.akter``), points the runtime at it, serves it over HTTP (default
``127.0.0.1:8000``) with the web console on for this machine (``Console.local()``: loopback
requests to a loopback host name, as the anonymous caller, with a per-process token) and prints
the URLs of the docs page and the console (the token in its ``#token=`` fragment); SIGINT or
SIGTERM drains the runner, then stops the server.

``akter bench`` runs a tiny built-in actor on the configured database (``--database-url``,
``$AKTER_DATABASE_URL``, else the embedded server) in its own schema (``--schema``, default
``akter_bench``, kept between runs): ``--callers`` tasks call ``--actors`` actors for
``--seconds``, then it prints turns per second and the p50/p99 latency of a call. It checks that
the actors' committed counters grew by exactly the number of successful calls.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.markup import escape

import akter
from akter._cli_runner import JsonOption, TargetArg, _run_until_signalled, _stdout, load_runtime
from akter._cli_runner import stop_on_signals as _stop_on_signals
from akter._store.embedded import EmbeddedPostgres, default_data_dir
from akter.cli import DataDirOption, Steps, _refusals_exit, _stderr, app
from akter.errors import ActorError, ConfigurationError
from akter.http.console import Console
from akter.runtime import Runtime

# --- akter dev --------------------------------------------------------------------------------


@app.command("dev")
def dev(
    target: TargetArg,
    http: Annotated[str, typer.Option("--http", help="Serve HTTP on HOST:PORT.")] = (
        "127.0.0.1:8000"
    ),
    data_dir: DataDirOption = None,
) -> None:
    """Run the embedded PostgreSQL and serve the runtime over HTTP until SIGINT/SIGTERM."""
    with _refusals_exit():
        runtime = load_runtime(target)
        asyncio.run(_dev(runtime, http, data_dir or default_data_dir()))


async def _dev(runtime: Runtime, http: str, data_dir: Path) -> None:
    stop = _stop_on_signals()  # from the start: a signal during startup still stops both
    if runtime.config.database_url:
        _stderr.print(
            "note: akter dev uses the embedded PostgreSQL; the runtime's database URL is ignored."
        )
    server = EmbeddedPostgres(data_dir)
    with _stderr.status(f"Starting the embedded PostgreSQL in {escape(str(data_dir))} ..."):
        url = await asyncio.to_thread(server.start)
    try:
        runtime.use_database(url)
        if not stop.is_set():
            await _serve_dev(runtime, http, stop)
    finally:
        await asyncio.to_thread(server.stop)
        _stderr.print(f"Stopped the embedded PostgreSQL for {escape(str(server.data_dir))}.")


async def _serve_dev(runtime: Runtime, http: str, stop: asyncio.Event) -> None:
    """``akter serve --http`` with the local console, until ``stop``; then drain."""
    host, _, port = http.rpartition(":")
    docs = f"http://{host or '127.0.0.1'}:{port}/docs"
    local = host if host in ("localhost", "127.0.0.1", "[::1]") else "127.0.0.1"
    local_console = Console.local()
    # The token rides in the fragment: browsers never send it to a server or write it to a log.
    console = f"http://{local}:{port}/console/#token={local_console.token}"
    await _run_until_signalled(
        runtime,
        http,
        stop=stop,
        banner=f"; docs at {docs}; console at {console} (this machine only)",
        app_options={"console": local_console},
    )


# --- akter bench ------------------------------------------------------------------------------


class _Tally(BaseModel):
    n: int = 0


class BenchCounter(akter.Actor[_Tally]):
    """The benchmark's actor: one integer, one command."""

    @akter.command
    async def add(self, k: int) -> int:
        """Add ``k``; return the new total."""
        self.state.n += k
        return self.state.n


@app.command("bench")
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
    with _refusals_exit():
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
    _stdout.print(
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
    total = 0
    async with runtime.store.pool.connection() as conn:
        for a in range(actors):
            ref = runtime.ref(BenchCounter, f"b{a}")
            key = {"rk": runtime.routing_key(ref), "tenant": ref.tenant, "type": ref.type}
            cur = await conn.execute(runtime.store.queries["query_actor"], {**key, "id": ref.id})
            row = await cur.fetchone()
            if row is not None:
                total += int(row[3]["n"])  # type: ignore[index]
    return total


__all__ = ["BenchCounter"]
