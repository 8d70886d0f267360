"""CLI commands that run or inspect a user's runtime: serve, worker, migrate, inspect, outbox.

``TARGET`` names the user's runtime as ``module:attribute`` (``app:runtime``), imported with the
current directory on ``sys.path``. ``serve`` runs a runner (with ``--http`` also the ASGI app under
uvicorn) until SIGTERM/SIGINT, then drains gracefully; ``worker`` runs executors only;
``migrate`` shows a progress bar over the pending migrations.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from typing import Annotated, Any

import psycopg
import typer
from psycopg.rows import dict_row
from rich.console import Console
from rich.table import Table

from akter.callers import ActorRef
from akter.cli import Steps, _refusals_exit, _stderr, app
from akter.errors import ConfigurationError
from akter.runtime import Runtime

_stdout = Console(highlight=False, soft_wrap=True)

TargetArg = Annotated[str, typer.Argument(help="The runtime to use, as module:attribute.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def load_runtime(target: str) -> Runtime:
    """Import ``module:attribute`` and check it is an :class:`akter.Runtime`."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"Target {target!r} must look like module:attribute (app:runtime)."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"Cannot import {module_name!r}: {exc}.") from None
    runtime = getattr(module, attribute, None)
    if not isinstance(runtime, Runtime):
        raise ConfigurationError(f"{target!r} is not an akter.Runtime (found {type(runtime)!r}).")
    return runtime


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _run_until_signalled(
    runtime: Runtime,
    http: str | None,
    *,
    stop: asyncio.Event | None = None,
    banner: str = "",
    app_options: dict[str, Any] | None = None,
) -> None:
    """Run the runtime (and uvicorn with ``http``) until ``stop`` is set; then drain.

    ``app_options`` go to :func:`akter.http.app` (``akter dev`` passes its local console).
    """
    stop = stop or stop_on_signals()
    server = None
    if http:
        import uvicorn

        from akter.http import app as http_app

        host, _, port = http.rpartition(":")
        runtime.runners.http_address = http
        config = uvicorn.Config(
            http_app(runtime, **(app_options or {})),
            host=host or "127.0.0.1",
            port=int(port),
            log_level="warning",
            lifespan="off",
        )
        server = uvicorn.Server(config)
    async with runtime:
        serving = asyncio.create_task(server.serve()) if server else None
        _stderr.print(
            f"akter runner {runtime.runners.runner_id} ready"
            + (f", HTTP on {http}" if http else "")
            + banner,
            markup=False,
        )
        await stop.wait()
        _stderr.print("draining…")
        if server is not None and serving is not None:
            server.should_exit = True
            await serving
    _stderr.print("drained")


@app.command("serve")
def serve(
    target: TargetArg,
    http: Annotated[
        str | None, typer.Option("--http", help="Also serve HTTP on HOST:PORT.")
    ] = None,
) -> None:
    """Run a runner: turns, the relay, executors (and HTTP with --http) until SIGTERM."""
    with _refusals_exit():
        runtime = load_runtime(target)
        asyncio.run(_run_until_signalled(runtime, http))


@app.command("worker")
def worker(
    target: TargetArg,
    jobs: Annotated[
        str,
        typer.Option("--jobs", help="Comma-separated jobs to execute, as Type.job (default: all)."),
    ] = "",
) -> None:
    """Run executors only: no actor types, no turns; claims only the listed jobs."""
    with _refusals_exit():
        runtime = load_runtime(target)
        known = {f"{t}.{j}" for t, j in runtime.executes}
        wanted = {j.strip() for j in jobs.split(",") if j.strip()} or known
        unknown = wanted - known
        if unknown:
            raise ConfigurationError(f"Unknown jobs {sorted(unknown)}; known: {sorted(known)}.")
        runtime.hosts_actors = False
        runtime.executes = {(t, j) for t, j in runtime.executes if f"{t}.{j}" in wanted}
        asyncio.run(_run_until_signalled(runtime, None))


@app.command("migrate")
def migrate_command(target: TargetArg, as_json: JsonOption = False) -> None:
    """Apply pending migrations for the runtime's database and schema, then exit."""
    with _refusals_exit():
        runtime = load_runtime(target)
        runtime.relay_enabled = False
        runtime.maintenance = False
        runtime.executes = set()
        applied: list[str] = []

        async def run() -> None:
            pending = await _pending_migrations(runtime)
            total = None if pending is None else len(pending)
            with Steps("migrating", total) as steps, _MigrationSteps(steps, applied):
                async with runtime:
                    pass

        asyncio.run(run())
        if as_json:
            print(json.dumps({"schema": runtime.schema, "applied": applied}))
            return
        _stdout.print(f"schema {runtime.schema!r} is up to date")


async def _pending_migrations(runtime: Runtime) -> list[str] | None:
    """The ids of the migrations not yet applied; ``None`` when the database is not up yet."""
    from akter._store.migrate import known_migrations

    known = [m.id for m in known_migrations()]
    url = runtime.config.database_url
    if not url:
        return None  # an embedded server the runtime starts itself: counted while applied
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(runtime.store.queries["migrations_applied"])
            applied = {str(row[0]) for row in await cur.fetchall()}
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        applied = set()
    return [m for m in known if m not in applied]


class _MigrationSteps(logging.Handler):
    """Advances a progress bar on each "Applied migration" record of the migrator."""

    def __init__(self, steps: Steps, applied: list[str]) -> None:
        super().__init__(logging.INFO)
        self.steps = steps
        self.applied = applied
        self._logger = logging.getLogger("akter._store.migrate")
        self._level = self._logger.level

    def __enter__(self) -> _MigrationSteps:
        self._logger.addHandler(self)
        if not self._logger.isEnabledFor(logging.INFO):
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def emit(self, record: logging.LogRecord) -> None:
        migration = getattr(record, "migration", None)
        if migration is not None:
            self.applied.append(str(migration))
            self.steps.update(len(self.applied), message=str(migration))


def _database_url(runtime: Runtime) -> str:
    url = runtime.config.database_url
    if url:
        return url
    from akter._store.embedded import default_data_dir, running_url

    found = running_url(default_data_dir())
    if found is None:
        raise ConfigurationError(
            "No database URL and no running embedded server; set AKTER_DATABASE_URL or run "
            "'akter db start'."
        )
    return found


def _fetch(runtime: Runtime, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(_database_url(runtime), autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(runtime.store.queries[name], params)
        return cur.fetchall() if cur.description else []


@app.command("inspect")
def inspect_command(
    target: TargetArg,
    actor_type: Annotated[str, typer.Argument(help="The actor type.")],
    actor_id: Annotated[str, typer.Argument(help="The actor id ('' for a singleton).")] = "",
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
    as_json: JsonOption = False,
) -> None:
    """Show an actor's durable rows: state, version, receipts and pending outbox."""
    with _refusals_exit():
        runtime = load_runtime(target)
        ref = runtime.ref(actor_type, actor_id, tenant=tenant)
        key = {"rk": runtime.routing_key(ref), "tenant": ref.tenant, "type": ref.type, "id": ref.id}
        actor = _fetch(runtime, "query_actor", key)
        receipts = _fetch(runtime, "inspect_receipts", key)
        outbox = _fetch(runtime, "inspect_outbox", key)
        report: dict[str, Any] = {
            "ref": ActorRef(ref.tenant, ref.type, ref.id).to_json(),
            "exists": bool(actor),
            "version": actor[0]["version"] if actor else 0,
            "created": actor[0]["created"] if actor else False,
            "event_seq": actor[0]["event_seq"] if actor else 0,
            "state": actor[0]["state"] if actor else None,
            "receipts": [
                {"command_id": r["command_id"], "command": r["command"], "outcome": r["outcome"]}
                for r in receipts
            ],
            "outbox": [
                {
                    k: o[k]
                    for k in (
                        "intent_id",
                        "kind",
                        "target_type",
                        "target_id",
                        "command",
                        "due_at_ms",
                        "attempts",
                        "last_error",
                    )
                }
                for o in outbox
            ],
        }
        if as_json:
            print(json.dumps(report, default=str))
            return
        _stdout.print(f"[bold]{ref.type}/{ref.id!r}[/bold] tenant {ref.tenant!r}")
        if not actor:
            _stdout.print("no row: the actor has never committed a turn")
            raise typer.Exit(1)
        _stdout.print(
            f"version {report['version']}  created {report['created']}  "
            f"events {report['event_seq']}"
        )
        _stdout.print_json(data=report["state"])
        table = Table("command id", "command", "outcome", title="receipts")
        for r in report["receipts"]:
            table.add_row(r["command_id"], r["command"], json.dumps(r["outcome"])[:80])
        _stdout.print(table)
        _print_outbox(report["outbox"])


def _print_outbox(rows: list[dict[str, Any]]) -> None:
    table = Table(
        "id", "kind", "target", "command", "due (ms)", "attempts", "last error", title="outbox"
    )
    for o in rows:
        table.add_row(
            str(o["intent_id"])[-12:],
            o["kind"],
            f"{o['target_type']}/{o['target_id']}",
            o["command"],
            str(o["due_at_ms"]),
            str(o["attempts"]),
            str(o["last_error"] or "")[:60],
        )
    _stdout.print(table)


@app.command("outbox")
def outbox_command(
    target: TargetArg,
    limit: Annotated[int, typer.Option(help="Rows to show.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """List pending outbox rows (intents, timers, ticks and jobs), oldest due first."""
    with _refusals_exit():
        runtime = load_runtime(target)
        rows = _fetch(runtime, "outbox_overview", {"limit": limit})
        if as_json:
            print(json.dumps(rows, default=str))
            return
        _print_outbox(rows)


def _operate(target: str | Runtime, work: Any) -> Any:
    """Start the runtime quietly (no relay, no maintenance), run ``work(runtime)``, stop."""
    runtime = load_runtime(target) if isinstance(target, str) else target
    runtime.relay_enabled = False
    runtime.maintenance = False
    runtime.executes = set()

    async def run() -> Any:
        async with runtime:
            return await work(runtime)

    return asyncio.run(run())
