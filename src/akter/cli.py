"""The ``akter`` command line (typer).

One sub-app per area, each registered on :data:`app` with ``app.add_typer``: ``db`` here;
``serve``, ``worker``, ``migrate``, ``inspect`` and ``outbox`` in ``_cli_runner``, ``jobs`` and
``dead-letters`` in ``_cli_jobs``, ``dev`` and ``bench`` in ``_cli_dev``. Commands print results
on stdout (plain, so that ``$(akter db url)`` works) and progress and errors on stderr through
rich: a long operation shows a progress bar (:class:`Steps`) only when stderr is a terminal, and
plain lines otherwise, so ``--json`` output is never corrupted. A refusal
(:class:`~akter.errors.AkterError`) exits with code 1 and its one-sentence message, without a
traceback.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

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


class Steps:
    """The progress of a long operation on stderr: a rich bar on a terminal, else plain lines.

    Use it as a context manager; :meth:`update` sets the position (``done`` of ``total``, with a
    short message). On a terminal the bar redraws in place; elsewhere (a pipe, a CI log) an
    update prints one line, ``<description>: <done>/<total> <message>``, at most once per
    ``plain_every`` seconds besides the first and the last step. Nothing goes to stdout.

    Args:
        description: What the operation does ("retrying dead letters").
        total: How many steps, or ``None`` while unknown.
        console: Where to draw (default: the CLI's stderr console).
        plain_every: Least interval between plain lines, in seconds.
    """

    def __init__(
        self,
        description: str,
        total: float | None,
        *,
        console: Console | None = None,
        plain_every: float = 1.0,
    ) -> None:
        self.description = description
        self.total = total
        self.done = 0.0
        self.console = console or _stderr
        self.plain_every = plain_every
        self._printed: tuple[str, float] | None = None
        self._bar: Progress | None = None
        if self.console.is_terminal:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[message]}"),
                TimeElapsedColumn(),
                console=self.console,
                redirect_stdout=False,  # stdout carries results (--json): never reroute it
                redirect_stderr=False,
            )
            self._task = self._bar.add_task(escape(description), total=total, message="")

    def __enter__(self) -> Steps:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(
        self, done: float | None = None, total: float | None = None, message: str = ""
    ) -> None:
        """Move to ``done`` (default: one more step) of ``total`` (default: unchanged)."""
        self.done = self.done + 1 if done is None else done
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(
                self._task, completed=self.done, total=self.total, message=escape(message)
            )
            return
        count = _number(self.done) + (f"/{_number(self.total)}" if self.total is not None else "")
        line = f"{self.description}: {count}" + (f" {message}" if message else "")
        now = time.monotonic()
        last = self._printed
        final = self.total is not None and self.done >= self.total
        if last is not None and (
            line == last[0] or (now - last[1] < self.plain_every and not final)
        ):
            return
        self._printed = (line, now)
        self.console.print(escape(line))

    def note(self, text: str) -> None:
        """Print one line on stderr above the bar (or as a plain line)."""
        self.console.print(escape(text))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


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
    # Importing the command modules registers their commands on ``app``.
    import akter._cli_dev  # dev, bench
    import akter._cli_jobs  # jobs, dead-letters
    import akter._cli_runner  # noqa: F401 - serve, worker, migrate, inspect, outbox

    app()


__all__ = ["Steps", "app", "db_app", "main"]
