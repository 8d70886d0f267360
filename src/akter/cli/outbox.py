"""``akter outbox [list]|parked|retry|discard``: pending rows, and the rows parked by the code.

``akter outbox TARGET`` (or ``outbox list TARGET``) lists pending rows as before. A parked row
(evolution E3) is one the code could not deliver — an unknown command or job, or a payload that
fails validation after its migrations. ``retry`` makes parked rows due now (after a deploy that
added an alias or a migration); ``discard`` deletes them and writes one operator audit row per
row (``v_operator_audit``), and asks for ``--reason`` and ``--yes``. Both take ids, or
``--all`` narrowed by ``--type`` and ``--command``; an id that names no parked row refuses the
whole call and nothing changes.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from akter.cli._common import JsonOption, TargetArg, operate, refusals_exit, stdout
from akter.cli._tables import Col, WideOption, is_full_id, print_table, resolve_id, when
from akter.cli.inspection import outbox_command
from akter.errors import ConfigurationError
from akter.operators.outbox import ParkedRow
from akter.runtime import Runtime

_VERBS = ("list", "parked", "retry", "discard")


class _ListByDefault(TyperGroup):
    """``akter outbox TARGET`` keeps meaning ``akter outbox list TARGET``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


outbox_app = typer.Typer(
    name="outbox",
    cls=_ListByDefault,
    help="Pending outbox rows; parked rows: list, retry, discard.",
    no_args_is_help=True,
)
outbox_app.command("list")(outbox_command)

IdsArg = Annotated[
    list[str] | None,
    typer.Argument(help="Ids of parked rows, or their short forms (or use --all)."),
]
AllOption = Annotated[bool, typer.Option("--all", help="Every parked row (narrow with filters).")]
TypeFilter = Annotated[
    str | None, typer.Option("--type", help="Only rows to (or jobs of) this actor type.")
]
CommandFilter = Annotated[
    str | None, typer.Option("--command", help="Only rows of this stored command or job name.")
]


def _ids(ids: list[str] | None, every: bool, actor_type: str | None, command: str | None) -> Any:
    if ids and every:
        raise ConfigurationError("Name parked rows by id or pass --all, not both.")
    if not ids and not every:
        raise ConfigurationError("Name the parked rows by id, or pass --all.")
    if (actor_type or command) and not every:
        raise ConfigurationError("--type and --command narrow --all; pass --all with them.")
    return None if every else list(ids or [])


@outbox_app.command("parked")
def outbox_parked(
    target: TargetArg,
    kind: Annotated[str | None, typer.Option(help="intent or job.")] = None,
    actor_type: TypeFilter = None,
    command: CommandFilter = None,
    as_json: JsonOption = False,
    wide: WideOption = False,
) -> None:
    """List parked rows, oldest parking first (short ids; --wide for full ones)."""
    with refusals_exit():
        if kind not in (None, "intent", "job"):
            raise ConfigurationError(f"--kind takes 'intent' or 'job', not {kind!r}.")

        async def work(rt: Runtime) -> list[ParkedRow]:
            return await rt.operators.outbox.parked(
                kind=kind,  # type: ignore[arg-type]  # checked above
                actor_type=actor_type,
                command=command,
            )

        rows: list[ParkedRow] = operate(target, work)
        if as_json:
            print(json.dumps([r.to_json() for r in rows], default=str))
            return
        print_table(
            stdout,
            "parked rows",
            [
                Col("id", "id"),
                Col("kind"),
                Col("actor", "text"),
                Col("command", "text"),
                Col("parked (UTC)"),
                Col("error", "text"),
            ],
            [
                [
                    r.id,
                    r.kind,
                    f"{r.actor_type}/{r.actor_id}",
                    r.command,
                    when(r.parked_at, wide),
                    r.error,
                ]
                for r in rows
            ],
            wide=wide,
        )


async def _parked_ids(rt: Runtime, chosen: list[str] | None) -> list[str] | None:
    """The parked rows' full ids: each short form looked up among the parked rows."""
    if chosen is None or all(is_full_id(given) for given in chosen):
        return chosen
    pool = [r.id for r in await rt.operators.outbox.parked()]
    return [resolve_id(given, pool, "parked row") for given in chosen]


@outbox_app.command("retry")
def outbox_retry(
    target: TargetArg,
    ids: IdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    command: CommandFilter = None,
) -> None:
    """Make parked rows due now; a row that still cannot be delivered parks again."""
    with refusals_exit():
        chosen = _ids(ids, every, actor_type, command)

        async def work(rt: Runtime) -> int:
            ids = await _parked_ids(rt, chosen)
            return await rt.operators.outbox.retry(ids, actor_type=actor_type, command=command)

        done = operate(target, work)
        stdout.print(f"retried {done} parked row{'s' if done != 1 else ''}")


@outbox_app.command("discard")
def outbox_discard(
    target: TargetArg,
    ids: IdsArg = None,
    every: AllOption = False,
    actor_type: TypeFilter = None,
    command: CommandFilter = None,
    reason: Annotated[str, typer.Option(help="Why (kept in the operator audit).")] = "",
    yes: Annotated[bool, typer.Option("--yes", help="Confirm the deletion.")] = False,
) -> None:
    """Delete parked rows, auditing each (who, when, the full row, the reason)."""
    with refusals_exit():
        chosen = _ids(ids, every, actor_type, command)
        if not reason.strip():
            raise ConfigurationError("Give --reason: it is kept in the operator audit.")
        if not yes:
            raise ConfigurationError("Discarding deletes the rows; pass --yes to confirm.")

        async def work(rt: Runtime) -> int:
            ids = await _parked_ids(rt, chosen)
            return await rt.operators.outbox.discard(
                ids, reason=reason, actor_type=actor_type, command=command
            )

        done = operate(target, work)
        stdout.print(f"discarded {done} parked row{'s' if done != 1 else ''} (audited)")


__all__ = ["outbox_app"]
