"""``akter db start|stop|url|psql``: the embedded PostgreSQL of a data directory.

``start`` leaves the server running detached and prints its URL on stdout (so that
``$(akter db url)`` works); ``stop`` stops it; ``psql`` replaces the process with the wheel's
``psql`` connected to it, passing extra arguments on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape

from akter.cli._common import DataDirOption, refusals_exit, stderr
from akter.operators.database import (
    EmbeddedPostgres,
    default_data_dir,
    running_url,
    server_bin,
    shutdown,
)

db_app = typer.Typer(
    name="db",
    help="Run the embedded PostgreSQL server (data in $AKTER_DATA_DIR or ./.akter).",
    no_args_is_help=True,
)


@db_app.command("start")
def db_start(data_dir: DataDirOption = None) -> None:
    """Start the embedded PostgreSQL, leave it running in the background and print its URL."""
    directory = data_dir or default_data_dir()
    with refusals_exit(), stderr.status(f"Starting the embedded PostgreSQL in {directory} ..."):
        server = EmbeddedPostgres(directory)
        url = server.start()
        server.detach()
    typer.echo(url)
    stderr.print(
        f"[green]Embedded PostgreSQL running[/green] for {escape(str(server.data_dir))}; "
        "stop it with [bold]akter db stop[/bold]."
    )


@db_app.command("stop")
def db_stop(data_dir: DataDirOption = None) -> None:
    """Stop the embedded PostgreSQL of the data directory."""
    directory = data_dir or default_data_dir()
    with refusals_exit(), stderr.status("Stopping the embedded PostgreSQL ..."):
        stopped = shutdown(directory)
    if stopped:
        stderr.print(
            f"[green]Stopped[/green] the embedded PostgreSQL for {escape(str(directory))}."
        )
    else:
        stderr.print(f"No embedded PostgreSQL was running for {escape(str(directory))}.")


@db_app.command("url")
def db_url(data_dir: DataDirOption = None) -> None:
    """Print the URL of the running embedded PostgreSQL; exit code 1 if none runs."""
    typer.echo(_require_running(data_dir or default_data_dir()))


@db_app.command(
    "psql",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def db_psql(ctx: typer.Context, data_dir: DataDirOption = None) -> None:
    """Run psql against the running embedded PostgreSQL; extra arguments go to psql."""
    url = _require_running(data_dir or default_data_dir())
    with refusals_exit():
        psql = server_bin("psql")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(psql, [str(psql), f"--dbname={url}", *ctx.args])


def _require_running(directory: Path) -> str:
    url = running_url(directory)
    if url is None:
        stderr.print(
            f"[bold red]error:[/bold red] No embedded PostgreSQL is running for "
            f"{escape(str(directory))}; start it with [bold]akter db start[/bold]."
        )
        raise typer.Exit(1)
    return url


__all__ = ["db_app"]
