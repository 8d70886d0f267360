"""Parked outbox rows and the operator verbs on them (evolution E3).

A row the code cannot deliver (an unknown command or job, a payload that fails validation after
its migrations) is parked by the relay or the executor: it keeps every column and waits for an
operator. ``retry`` makes parked rows due now (after a deploy that added an alias or a
migration); a row that still cannot be delivered parks again with its new cause. ``discard``
deletes them and writes one ``operator_audit`` row per row, in the same transaction; the audit
is never pruned (``v_operator_audit``). The pending rows' overviews (``akter outbox``, the
console) only read.
"""

from __future__ import annotations

import builtins
import getpass
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from akter._store.gateway import ops
from akter._store.gateway.parked import ParkedEntry, ParkedGateway, Selection, UnknownParked
from akter.callers import System, current_caller, principal_of
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter._engine.services import Services

#: The most rows ``parked`` lists.
LIST_LIMIT = 10_000


@dataclass(frozen=True)
class ParkedRow:
    """One parked outbox row.

    Attributes:
        id: The row's id (the intent or job id).
        kind: ``"intent"`` (intents, timers and schedule ticks) or ``"job"``.
        tenant: The tenant of the actor it belongs to.
        actor_type: The receiving actor type (an intent's target, a job's owner).
        actor_id: The receiving actor's id.
        command: The stored command or job name.
        payload: The stored payload (decoded JSON, as stored; not migrated).
        parked_at: When it was parked (framework clock, UTC).
        error: Why it was parked (names every failing field).
    """

    id: str
    kind: Literal["intent", "job"]
    tenant: str
    actor_type: str
    actor_id: str
    command: str
    payload: Any
    parked_at: datetime
    error: str

    def to_json(self) -> dict[str, Any]:
        """The row as JSON (``akter outbox parked --json``, the console)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "tenant": self.tenant,
            "actor_type": self.actor_type,
            "actor_id": self.actor_id,
            "command": self.command,
            "payload": self.payload,
            "parked_at": self.parked_at.isoformat(),
            "error": self.error,
        }


def _parked(row: ParkedEntry) -> ParkedRow:
    """The operators' view of a stored parked row: its payload decoded, its time a date."""
    try:
        payload = json.loads(row.payload)
    except ValueError:
        payload = row.payload
    return ParkedRow(
        id=row.intent_id,
        kind="job" if row.kind == "job" else "intent",
        tenant=row.tenant_id,
        actor_type=row.actor_type,
        actor_id=row.actor_id,
        command=row.command,
        payload=payload,
        parked_at=datetime.fromtimestamp(row.parked_at_ms / 1000, UTC),
        error=row.last_error or "",
    )


class Outbox:
    """Operator access to parked rows: ``parked``, ``retry`` and ``discard`` (``runtime.outbox``).

    Args:
        services: A runner's services (started on the deployment's database when called).
        wake: Asks the relay for a pass (retried rows are due now).
    """

    def __init__(
        self, services: Services, *, wake: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._services = services
        self._gateway = ParkedGateway(services.store, services.clock)
        self._wake = wake

    def overview(self, url: str, limit: int = 100) -> builtins.list[dict[str, Any]]:
        """Pending outbox rows by column name, oldest due first, over a connection to ``url``.

        Works without starting the runtime (``akter outbox``).
        """
        return ops.outbox_overview(url, self._services.store.queries, limit)

    async def pending(self, limit: int, timeout_ms: int) -> builtins.list[dict[str, Any]]:
        """Pending intents, timers and ticks, oldest due first, read within ``timeout_ms``.

        Raises:
            ActorError: ``Timeout`` (``console_query_timeout``) past ``timeout_ms``.
        """
        return await ops.console_outbox(self._services.store, limit, timeout_ms)

    async def parked(
        self,
        *,
        kind: Literal["intent", "job"] | None = None,
        actor_type: str | None = None,
        command: str | None = None,
    ) -> builtins.list[ParkedRow]:
        """The parked rows, oldest parking first, optionally filtered."""
        rows = await self._gateway.list(
            kind=kind, actor_type=actor_type, command=command, limit=LIST_LIMIT
        )
        return [_parked(r) for r in rows]

    async def retry(
        self,
        ids: Sequence[str] | None = None,
        *,
        actor_type: str | None = None,
        command: str | None = None,
    ) -> int:
        """Make parked rows due now; returns how many (``ids=None``: every matching row).

        Raises:
            ActorError: ``InvalidInput/unknown_parked`` naming the ids that name no parked
                row; nothing was written.
        """
        selection = _selection(ids, actor_type, command)
        hooks = self._services.hooks

        async def before_commit(retried: list[str]) -> None:
            await hooks.at("before_retry_commit", {"ids": retried})

        try:
            done = await self._gateway.retry(selection, before_commit=before_commit)
        except UnknownParked as exc:
            raise _unknown(exc.missing) from None
        if done and self._wake is not None:
            await self._wake()
        return done

    async def discard(
        self,
        ids: Sequence[str] | None,
        *,
        reason: str,
        actor_type: str | None = None,
        command: str | None = None,
    ) -> int:
        """Delete parked rows, auditing each (who, when, the row, ``reason``); returns how many.

        Raises:
            ActorError: ``InvalidInput`` when ``reason`` is empty, or
                ``InvalidInput/unknown_parked`` naming the ids that name no parked row;
                nothing was written.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ActorError(
                "InvalidInput",
                "Discarding parked rows needs a reason (it is kept in the operator audit).",
                field="reason",
            )
        selection = _selection(ids, actor_type, command)
        hooks = self._services.hooks

        async def before_commit(discarded: list[str]) -> None:
            await hooks.at("before_discard_commit", {"ids": discarded})

        try:
            return await self._gateway.discard(
                selection, operator=_operator(), reason=reason, before_commit=before_commit
            )
        except UnknownParked as exc:
            raise _unknown(exc.missing) from None


def _selection(ids: Sequence[str] | None, actor_type: str | None, command: str | None) -> Selection:
    if isinstance(ids, str):
        ids = [ids]
    return Selection(None if ids is None else list(ids), actor_type, command)


def _operator() -> str:
    """Who acts: the current caller's principal, else the OS user (the CLI, a script)."""
    caller = current_caller()
    principal = principal_of(caller)
    if principal:
        return principal
    if isinstance(caller, System) and caller.source != "process":
        return f"system:{caller.source}"
    try:
        return f"os:{getpass.getuser()}"
    except (KeyError, OSError):
        return "os:unknown"


def _unknown(missing: Sequence[str]) -> ActorError:
    names = ", ".join(repr(m) for m in missing)
    return ActorError(
        "InvalidInput",
        f"No parked row has id {names}; nothing was changed. List them with 'akter outbox parked'.",
        code="unknown_parked",
        field="ids",
    )
