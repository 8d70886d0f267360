"""``akter dev``: the embedded PostgreSQL, the runtime and its web console on a developer's machine.

``akter dev app:runtime`` starts the embedded PostgreSQL of ``--data-dir`` (default
``$AKTER_DATA_DIR`` or ``./.akter``), points the runtime at it, serves it over HTTP (default
``127.0.0.1:8000``) with the web console on for this machine (``Console.local()``: loopback
requests to a loopback host name, as the anonymous caller, with a per-process token) and prints
the URLs of the docs page and the console (the token in its ``#token=`` fragment);
``--auth module:provider`` puts the API (not the local console) behind that auth provider; SIGINT or
SIGTERM drains the runner, then stops the server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from akter.cli._common import (
    AuthOption,
    DataDirOption,
    TargetArg,
    load_auth,
    load_runtime,
    refusals_exit,
    stderr,
)
from akter.cli._serving import run_until_signalled, stop_on_signals
from akter.http.auth import AuthProvider
from akter.http.console import Console
from akter.operators.database import EmbeddedPostgres, default_data_dir
from akter.runtime import Runtime

dev_app = typer.Typer()


@dev_app.command("dev")
def dev(
    target: TargetArg,
    http: Annotated[str, typer.Option("--http", help="Serve HTTP on HOST:PORT.")] = (
        "127.0.0.1:8000"
    ),
    data_dir: DataDirOption = None,
    auth: AuthOption = None,
) -> None:
    """Run the embedded PostgreSQL and serve the runtime over HTTP until SIGINT/SIGTERM."""
    with refusals_exit():
        runtime = load_runtime(target)
        provider = load_auth(auth) if auth is not None else None
        asyncio.run(_dev(runtime, http, data_dir or default_data_dir(), provider))


async def _dev(
    runtime: Runtime, http: str, data_dir: Path, auth: AuthProvider | None = None
) -> None:
    stop = stop_on_signals()  # from the start: a signal during startup still stops both
    if runtime.config.database_url:
        stderr.print(
            "note: akter dev uses the embedded PostgreSQL; the runtime's database URL is ignored."
        )
    server = EmbeddedPostgres(data_dir)
    with stderr.status(f"Starting the embedded PostgreSQL in {escape(str(data_dir))} ..."):
        url = await asyncio.to_thread(server.start)
    try:
        runtime.use_database(url)
        if not stop.is_set():
            await _serve_dev(runtime, http, stop, auth)
    finally:
        await asyncio.to_thread(server.stop)
        stderr.print(f"Stopped the embedded PostgreSQL for {escape(str(server.data_dir))}.")


async def _serve_dev(
    runtime: Runtime, http: str, stop: asyncio.Event, auth: AuthProvider | None = None
) -> None:
    """``akter serve --http`` with the local console, until ``stop``; then drain."""
    host, _, port = http.rpartition(":")
    docs = f"http://{host or '127.0.0.1'}:{port}/docs"
    local = host if host in ("localhost", "127.0.0.1", "[::1]") else "127.0.0.1"
    local_console = Console.local()
    # The token rides in the fragment: browsers never send it to a server or write it to a log.
    console = f"http://{local}:{port}/console/#token={local_console.token}"
    await run_until_signalled(
        runtime,
        http,
        stop=stop,
        banner=f"; docs at {docs}; console at {console} (this machine only)",
        app_options={"console": local_console, "auth": auth},
    )


__all__ = ["dev_app"]
