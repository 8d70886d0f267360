"""CLI commands that run or inspect a user's runtime: serve, worker, migrate, inspect, outbox.

``TARGET`` names the user's runtime as ``module:attribute`` (``app:runtime``), imported with the
current directory on ``sys.path``. ``serve`` runs a runner (with ``--http`` also the ASGI app under
uvicorn) until SIGTERM/SIGINT, then drains gracefully; ``worker`` runs executors only.
"""

from __future__ import annotations

import asyncio
import importlib
import json
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
from akter.cli import _refusals_exit, _stderr, app
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


async def _run_until_signalled(runtime: Runtime, http: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = None
    if http:
        import uvicorn

        from akter.http import app as http_app

        host, _, port = http.rpartition(":")
        runtime.runners.http_address = http
        config = uvicorn.Config(
            http_app(runtime),
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
def migrate_command(target: TargetArg) -> None:
    """Apply pending migrations for the runtime's database and schema, then exit."""
    with _refusals_exit():
        runtime = load_runtime(target)

        async def run() -> None:
            runtime.relay_enabled = False
            runtime.maintenance = False
            async with runtime:
                pass

        asyncio.run(run())
        _stdout.print(f"schema {runtime.schema!r} is up to date")


def _database_url(runtime: Runtime) -> str:
    url = runtime._database_url
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


jobs_app = typer.Typer(name="jobs", help="List and cancel jobs.", no_args_is_help=True)
letters_app = typer.Typer(
    name="dead-letters", help="Dead letters: list, show, retry, discard.", no_args_is_help=True
)
app.add_typer(jobs_app)
app.add_typer(letters_app)


def _operate(target: str, work: Any) -> Any:
    """Start the runtime quietly (no relay, no maintenance), run ``work(runtime)``, stop."""
    runtime = load_runtime(target)
    runtime.relay_enabled = False
    runtime.maintenance = False
    runtime.executes = set()

    async def run() -> Any:
        async with runtime:
            return await work(runtime)

    return asyncio.run(run())


@jobs_app.command("list")
def jobs_list(target: TargetArg, limit: int = 100, as_json: JsonOption = False) -> None:
    """List job rows, oldest due first."""
    with _refusals_exit():
        runtime = load_runtime(target)
        rows = _fetch(runtime, "jobs_overview", {"limit": limit})
        if as_json:
            print(json.dumps(rows, default=str))
            return
        table = Table("job id", "actor", "job", "attempts", "state", "last error", title="jobs")
        for r in rows:
            state = (
                "cancelled"
                if r["cancelled_at_ms"]
                else "running"
                if r["running"]
                else "waiting"
                if r["waiting"]
                else "pending"
            )
            table.add_row(
                str(r["job_id"])[-12:],
                f"{r['actor_type']}/{r['actor_id']}",
                r["job"],
                str(r["attempts"]),
                state,
                str(r["last_error"] or "")[:50],
            )
        _stdout.print(table)


@jobs_app.command("cancel")
def jobs_cancel(target: TargetArg, job_id: str) -> None:
    """Cancel one job by id (never-run jobs are deleted; others settle as cancelled)."""
    with _refusals_exit():
        outcome = _operate(target, lambda rt: rt.cancel_job(job_id))
        _stdout.print(outcome)
        if outcome == "unknown":
            raise typer.Exit(1)


def _letter_json(letter: Any) -> dict[str, Any]:
    return {
        "job_id": letter.job_id,
        "ref": letter.ref.to_json(),
        "job": letter.job,
        "payload": json.loads(letter.payload),
        "attempts": letter.attempts,
        "cause": letter.cause,
        "ambiguous": letter.ambiguous,
        "dead_at_ms": letter.dead_at_ms,
    }


@letters_app.command("list")
def letters_list(target: TargetArg, as_json: JsonOption = False) -> None:
    """List dead letters (never pruned)."""
    with _refusals_exit():
        letters = _operate(target, lambda rt: rt.dead_letters.list())
        if as_json:
            print(json.dumps([_letter_json(x) for x in letters], default=str))
            return
        table = Table(
            "job id", "actor", "job", "attempts", "ambiguous", "cause", title="dead letters"
        )
        for x in letters:
            table.add_row(
                x.job_id[-12:],
                f"{x.ref.type}/{x.ref.id}",
                x.job,
                str(x.attempts),
                "yes" if x.ambiguous else "no",
                x.cause[:60],
            )
        _stdout.print(table)


@letters_app.command("show")
def letters_show(target: TargetArg, job_id: str) -> None:
    """Show one dead letter as JSON."""
    with _refusals_exit():
        letter = _operate(target, lambda rt: rt.dead_letters.show(job_id))
        print(json.dumps(_letter_json(letter), default=str))


@letters_app.command("retry")
def letters_retry(target: TargetArg, job_id: str) -> None:
    """Re-enqueue a dead letter as a new job (new id); warns when it was ambiguous."""
    with _refusals_exit():

        async def work(rt: Runtime) -> tuple[Any, str]:
            letter = await rt.dead_letters.show(job_id)
            return letter, await rt.dead_letters.retry(job_id)

        letter, new_id = _operate(target, work)
        if letter.ambiguous:
            _stderr.print(
                "[yellow]warning:[/yellow] this letter is ambiguous: the provider may already "
                "have applied the call; the retry runs it again under a new job id."
            )
        print(new_id)


@letters_app.command("discard")
def letters_discard(target: TargetArg, job_id: str) -> None:
    """Delete a dead letter."""
    with _refusals_exit():
        _operate(target, lambda rt: rt.dead_letters.discard(job_id))
        _stdout.print("discarded")
