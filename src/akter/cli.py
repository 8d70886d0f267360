"""The ``akter`` command line (typer).

One sub-app per area, each registered on :data:`app` with ``app.add_typer``: ``db`` today;
``serve``, ``worker``, ``migrate``, ``inspect``, ``jobs``, ``dead-letters`` and ``outbox`` join it
the same way. Commands print results on stdout (plain, so that ``$(akter db url)`` works) and
progress and errors on stderr through rich. A refusal (:class:`~akter.errors.AkterError`) exits
with code 1 and its one-sentence message, without a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from akter._store.embedded import (
    EmbeddedPostgres,
    default_data_dir,
    running_url,
    server_bin,
    shutdown,
)
from akter.errors import AkterError

app = typer.Typer(
    name="akter",
    help="Durable actors on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def _refusals_exit() -> Iterator[None]:
    """Turn an :class:`AkterError` into its message on stderr and exit code 1."""
    try:
        yield
    except AkterError as exc:
        _stderr.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
        raise typer.Exit(1) from None


# --- akter db ---------------------------------------------------------------------------------

db_app = typer.Typer(
    name="db",
    help="Run the embedded PostgreSQL server (data in $AKTER_DATA_DIR or ./.akter).",
    no_args_is_help=True,
)
app.add_typer(db_app)

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory of the embedded server [default: $AKTER_DATA_DIR or ./.akter].",
        show_default=False,
        file_okay=False,
    ),
]


@db_app.command("start")
def db_start(data_dir: DataDirOption = None) -> None:
    """Start the embedded PostgreSQL, leave it running in the background and print its URL."""
    directory = data_dir or default_data_dir()
    with _refusals_exit(), _stderr.status(f"Starting the embedded PostgreSQL in {directory} ..."):
        server = EmbeddedPostgres(directory)
        url = server.start()
        server.detach()
    typer.echo(url)
    _stderr.print(
        f"[green]Embedded PostgreSQL running[/green] for {escape(str(server.data_dir))}; "
        "stop it with [bold]akter db stop[/bold]."
    )


@db_app.command("stop")
def db_stop(data_dir: DataDirOption = None) -> None:
    """Stop the embedded PostgreSQL of the data directory."""
    directory = data_dir or default_data_dir()
    with _refusals_exit(), _stderr.status("Stopping the embedded PostgreSQL ..."):
        stopped = shutdown(directory)
    if stopped:
        _stderr.print(
            f"[green]Stopped[/green] the embedded PostgreSQL for {escape(str(directory))}."
        )
    else:
        _stderr.print(f"No embedded PostgreSQL was running for {escape(str(directory))}.")


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
    with _refusals_exit():
        psql = server_bin("psql")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(psql, [str(psql), f"--dbname={url}", *ctx.args])


def _require_running(directory: Path) -> str:
    url = running_url(directory)
    if url is None:
        _stderr.print(
            f"[bold red]error:[/bold red] No embedded PostgreSQL is running for "
            f"{escape(str(directory))}; start it with [bold]akter db start[/bold]."
        )
        raise typer.Exit(1)
    return url


def main() -> None:
    """Run the ``akter`` command line (the console script's entry point)."""
    import akter._cli_runner  # noqa: F401 - registers serve, worker, migrate, inspect, outbox

    app()


__all__ = ["app", "db_app", "main"]
