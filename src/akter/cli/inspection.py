"""``akter inspect`` and ``akter outbox``: a user's durable rows, read without starting it.

Both read over a connection of their own to the runtime's database URL (else the running
embedded server's): ``inspect`` shows one actor's state, version, receipts and pending outbox;
``outbox`` lists pending rows across actors, oldest due first.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from akter.callers import ActorRef
from akter.cli._common import (
    JsonOption,
    TargetArg,
    database_url,
    load_runtime,
    refusals_exit,
    stdout,
)
from akter.cli._tables import Col, WideOption, print_table, when

inspection_app = typer.Typer()

#: The outbox columns ``inspect --json`` reports.
_OUTBOX_FIELDS = (
    "intent_id",
    "kind",
    "target_type",
    "target_id",
    "command",
    "due_at_ms",
    "attempts",
    "last_error",
    "payload_version",
    "parked_at_ms",
)


@inspection_app.command("inspect")
def inspect_command(
    target: TargetArg,
    actor_type: Annotated[str, typer.Argument(help="The actor type.")],
    actor_id: Annotated[str, typer.Argument(help="The actor id ('' for a singleton).")] = "",
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
    as_json: JsonOption = False,
    wide: WideOption = False,
) -> None:
    """Show an actor's durable rows: state, version, receipts and pending outbox."""
    with refusals_exit():
        runtime = load_runtime(target)
        ref = runtime.ref(actor_type, actor_id, tenant=tenant)
        rows = runtime.operators.actors.inspect(database_url(runtime), ref)
        actor = rows.actor
        report: dict[str, Any] = {
            "ref": ActorRef(ref.tenant, ref.type, ref.id).to_json(),
            "exists": actor is not None,
            "version": actor["version"] if actor else 0,
            "created": actor["created"] if actor else False,
            "event_seq": actor["event_seq"] if actor else 0,
            "state": actor["state"] if actor else None,
            # The stored version, and the code's: a row below it migrates when a turn writes it.
            "state_version": actor["state_version"] if actor else None,
            "code_state_version": runtime.definition(ref.type).state_version,
            "receipts": [
                {"command_id": r["command_id"], "command": r["command"], "outcome": r["outcome"]}
                for r in rows.receipts
            ],
            "outbox": [{k: o[k] for k in _OUTBOX_FIELDS} for o in rows.outbox],
        }
        if as_json:
            print(json.dumps(report, default=str))
            return
        stdout.print(f"[bold]{ref.type}/{ref.id!r}[/bold] tenant {ref.tenant!r}")
        if not actor:
            stdout.print("no row: the actor has never committed a turn")
            raise typer.Exit(1)
        stdout.print(
            f"version {report['version']}  created {report['created']}  "
            f"events {report['event_seq']}  state version {report['state_version']} "
            f"(this code: {report['code_state_version']})"
        )
        stdout.print_json(data=report["state"])
        print_table(
            stdout,
            "receipts",
            [Col("command id", "id"), Col("command", "text"), Col("outcome", "text")],
            [
                [str(r["command_id"]), str(r["command"]), json.dumps(r["outcome"], default=str)]
                for r in report["receipts"]
            ],
            wide=wide,
        )
        _print_outbox(report["outbox"], wide)


def _print_outbox(rows: list[dict[str, Any]], wide: bool) -> None:
    print_table(
        stdout,
        "outbox",
        [
            Col("id", "id"),
            Col("kind"),
            Col("target", "text"),
            Col("command", "text"),
            Col("due (UTC)"),
            Col("attempts", "number"),
            Col("last error", "text"),
        ],
        [
            [
                str(o["intent_id"]),
                str(o["kind"]),
                f"{o['target_type']}/{o['target_id']}",
                str(o["command"]),
                when(o["due_at_ms"], wide),
                str(o["attempts"]),
                str(o["last_error"] or ""),
            ]
            for o in rows
        ],
        wide=wide,
    )


# Registered as ``akter outbox [list]`` by ``akter.cli.outbox``.
def outbox_command(
    target: TargetArg,
    limit: Annotated[int, typer.Option(help="Rows to show.")] = 50,
    as_json: JsonOption = False,
    wide: WideOption = False,
) -> None:
    """List pending outbox rows (intents, timers, ticks and jobs), oldest due first."""
    with refusals_exit():
        runtime = load_runtime(target)
        rows = runtime.operators.outbox.overview(database_url(runtime), limit)
        if as_json:
            print(json.dumps(rows, default=str))
            return
        _print_outbox(rows, wide)


__all__ = ["inspection_app"]
