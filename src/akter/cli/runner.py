"""``akter serve`` and ``akter worker``: run a user's runtime until SIGTERM/SIGINT.

``TARGET`` names the user's runtime as ``module:attribute`` (``app:runtime``), imported with the
current directory on ``sys.path``. ``serve`` runs a runner (with ``--http`` also the ASGI app under
uvicorn, behind the auth provider of ``--auth module:provider``) until SIGTERM/SIGINT, then
drains gracefully; ``--workers N`` runs N such runner processes behind one port
(``akter.cli._workers``); ``worker`` runs executors only.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from akter.cli._common import (
    AuthOption,
    LogLevelOption,
    TargetArg,
    load_auth,
    load_runtime,
    refusals_exit,
    setup_logging,
)
from akter.cli._serving import run_until_signalled
from akter.cli._workers import Workers, adopt, bind
from akter.errors import ConfigurationError
from akter.http.timeouts import BODY_TIMEOUT, HEADERS_TIMEOUT, check_timeout

runner_app = typer.Typer()


@runner_app.command("serve")
def serve(
    target: TargetArg,
    http: Annotated[
        str | None, typer.Option("--http", help="Also serve HTTP on HOST:PORT.")
    ] = None,
    auth: AuthOption = None,
    workers: Annotated[
        int,
        typer.Option("--workers", min=1, help="Run N runner processes behind the one HTTP port."),
    ] = 1,
    worker_fd: Annotated[int | None, typer.Option("--worker-fd", hidden=True)] = None,
    headers_timeout: Annotated[
        float,
        typer.Option(
            "--headers-timeout",
            help="Seconds a request's head (line and headers) may take to arrive; then 408.",
        ),
    ] = HEADERS_TIMEOUT,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout", help="Seconds a request's body may take to arrive; then 408."
        ),
    ] = BODY_TIMEOUT,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a runner: turns, the relay, executors (and HTTP with --http) until SIGTERM."""
    with refusals_exit():
        setup_logging(log_level)
        runtime = load_runtime(target)
        if auth is not None and not http:
            raise ConfigurationError("--auth needs --http (it is the HTTP auth provider).")
        check_timeout(headers_timeout, "--headers-timeout")
        options: dict[str, Any] = {"body_timeout": check_timeout(body_timeout, "--body-timeout")}
        if auth is not None:
            options["auth"] = load_auth(auth)
        if workers > 1:
            argv = [
                target,
                *(["--http", http] if http else []),
                *(["--auth", auth] if auth else []),
                *(["--headers-timeout", str(headers_timeout), "--body-timeout", str(body_timeout)]),
                *(["--log-level", log_level]),
            ]
            sock = bind(http) if http else None
            raise typer.Exit(asyncio.run(Workers(argv, workers, sock).run()))
        sock = adopt(worker_fd) if worker_fd is not None else None
        asyncio.run(
            run_until_signalled(
                runtime, http, app_options=options, sock=sock, headers_timeout=headers_timeout
            )
        )


@runner_app.command("worker")
def worker(
    target: TargetArg,
    jobs: Annotated[
        str,
        typer.Option("--jobs", help="Comma-separated jobs to execute, as Type.job (default: all)."),
    ] = "",
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run executors only: no actor types, no turns; claims only the listed jobs."""
    with refusals_exit():
        setup_logging(log_level)
        runtime = load_runtime(target)
        known = {f"{t}.{j}" for t, j in runtime.config.executes}
        wanted = {j.strip() for j in jobs.split(",") if j.strip()} or known
        unknown = wanted - known
        if unknown:
            raise ConfigurationError(f"Unknown jobs {sorted(unknown)}; known: {sorted(known)}.")
        chosen = [
            runtime.definition(t).jobs[j]
            for t, j in runtime.config.executes
            if f"{t}.{j}" in wanted
        ]
        runtime.reconfigure(host_actors=False, jobs=chosen)
        asyncio.run(run_until_signalled(runtime, None))


__all__ = ["runner_app"]
