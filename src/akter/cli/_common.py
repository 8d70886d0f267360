"""What every command module shares: the output consoles, refusals, progress, options, targets.

Results go to stdout (:data:`stdout`, or plain ``print`` for JSON); progress and errors go to
stderr (:data:`stderr`). A refusal (:class:`~akter.errors.AkterError`) inside
:func:`refusals_exit` becomes its one-sentence message and exit code 1, without a traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any

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

from akter.errors import AkterError, ConfigurationError
from akter.http.auth import AuthProvider
from akter.operators.database import default_data_dir, running_url
from akter.runtime import Runtime

stderr = Console(stderr=True, highlight=False, soft_wrap=True)
stdout = Console(highlight=False, soft_wrap=True)

TargetArg = Annotated[str, typer.Argument(help="The runtime to use, as module:attribute.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory of the embedded server [default: $AKTER_DATA_DIR or ./.akter].",
        show_default=False,
        file_okay=False,
    ),
]


@contextmanager
def refusals_exit() -> Iterator[None]:
    """Turn an :class:`AkterError` into its message on stderr and exit code 1."""
    try:
        yield
    except AkterError as exc:
        stderr.print(f"[bold red]error:[/bold red] {escape(str(exc))}")
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
        self.console = console or stderr
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


# --- the user's runtime -----------------------------------------------------------------------


def load_object(target: str, example: str = "app:runtime") -> Any:
    """Import ``module:attribute`` (the current directory first on ``sys.path``) and return it."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"Target {target!r} must look like module:attribute ({example}).")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"Cannot import {module_name!r}: {exc}.") from None
    if not hasattr(module, attribute):
        raise ConfigurationError(f"Module {module_name!r} has no attribute {attribute!r}.")
    return getattr(module, attribute)


def load_runtime(target: str) -> Runtime:
    """Import ``module:attribute`` and check it is an :class:`akter.Runtime`."""
    runtime = load_object(target)
    if not isinstance(runtime, Runtime):
        raise ConfigurationError(f"{target!r} is not an akter.Runtime (found {type(runtime)!r}).")
    return runtime


def load_auth(target: str) -> AuthProvider:
    """Import the auth provider ``module:attribute``, calling it first if it is a factory.

    It is a provider (``ApiKeys``, ``BearerJWT`` or any async ``(request) -> Identity``), or a
    callable taking no arguments that returns one.
    """
    found = load_object(target, "app:auth")
    if callable(found) and _takes_no_arguments(found):
        found = found()
    if not callable(found) or _takes_no_arguments(found):
        raise ConfigurationError(
            f"{target!r} is not an auth provider (an async callable taking the request) nor a "
            f"zero-argument factory of one (found {type(found)!r})."
        )
    provider: AuthProvider = found
    return provider


def _takes_no_arguments(fn: Any) -> bool:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


AuthOption = Annotated[
    str | None,
    typer.Option(
        "--auth",
        help="The HTTP auth provider as module:attribute: an akter.http auth provider "
        "(ApiKeys, BearerJWT, your own) or a zero-argument factory of one. Without it every "
        "caller is anonymous.",
        show_default=False,
    ),
]


def quiet(runtime: Runtime) -> Runtime:
    """``runtime`` set to start without its relay, maintenance and executors (operations only)."""
    runtime.reconfigure(relay=False, maintenance=False, jobs=[])
    return runtime


def operate(target: str | Runtime, work: Any) -> Any:
    """Start the runtime quietly (no relay, no maintenance), run ``work(runtime)``, stop."""
    runtime = quiet(load_runtime(target) if isinstance(target, str) else target)

    async def run() -> Any:
        async with runtime:
            return await work(runtime)

    return asyncio.run(run())


def database_url(runtime: Runtime) -> str:
    """The runtime's database URL, else the running embedded server's, for a read-only command."""
    url = runtime.config.database_url
    if url:
        return url
    found = running_url(default_data_dir())
    if found is None:
        raise ConfigurationError(
            "No database URL and no running embedded server; set AKTER_DATABASE_URL or run "
            "'akter db start'."
        )
    return found
