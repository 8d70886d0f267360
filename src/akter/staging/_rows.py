"""A staged call as one validated outbox row (plain values for the store's ``plan``).

Validation is a handle's: the arguments are bound and validated by the command's signature
(``InvalidInput`` naming the field), the tenant and id by the addressing rules, internal
commands and workflows are refused, and nothing is written for a refused call.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from akter._ids import (
    canonical_json,
    parse_framework_id,
    payload_hash,
    placement_key,
    routing_key,
    validate_actor_id,
    validate_tenant,
)
from akter._kinds import WorkflowCommand
from akter._members import ActorDefinition, definition_of, refuse_internal
from akter._staging import parse_due
from akter._store.gateway.staging import StageRow
from akter.callers import Caller, System, User, caller_key, caller_to_json
from akter.errors import ActorError, invalid_input

#: The caller of a staged command when none is given.
TRANSACTION = System(source="transaction")


def definition(actor: Any) -> ActorDefinition:
    """The resolved definition of an actor class."""
    found = definition_of(actor)
    found.resolve()
    return found


def address(found: ActorDefinition, id: str, tenant: str) -> tuple[str, str]:
    """The validated ``(tenant, id)`` of an actor of ``found`` (a singleton's id is ``""``)."""
    tenant = validate_tenant(tenant)
    if found.singleton:
        if id != "":
            raise invalid_input(
                f"{found.name} is a singleton; stage to it without an id.", field="id"
            )
        return tenant, ""
    return tenant, validate_actor_id(id)


def check_caller(caller: Caller | None) -> Caller:
    """A staged command's caller: ``System(source="transaction")`` or a vouched-for ``User``."""
    if caller is None:
        return TRANSACTION
    if isinstance(caller, User):
        return caller
    if isinstance(caller, System) and caller.source == "transaction" and caller.ref is None:
        return caller
    raise invalid_input(
        f"stage(caller=) takes akter.System(source='transaction', on_behalf_of=...) or an "
        f"akter.User the application vouches for, not {caller!r}.",
        field="caller",
    )


def due(after: float | timedelta | None, at: datetime | None) -> tuple[int | None, int | None]:
    """``after=`` / ``at=`` as ``(delay_ms, at_ms)``, refused as ``InvalidInput``."""
    try:
        return parse_due(after, at, "stage()")
    except ValueError as exc:
        raise invalid_input(str(exc), field="at" if at is not None else "after") from None


def check_pinned(command_id: str | None) -> str | None:
    """A pinned command id's form (its window and expiry are checked against the database)."""
    if command_id is None:
        return None
    return parse_framework_id(command_id).raw


def command_row(
    found: ActorDefinition,
    tenant: str,
    id: str,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    caller: Caller,
    pinned: str | None,
    timing: tuple[int | None, int | None],
) -> StageRow:
    """The row of ``found``'s command ``name`` called with ``args``/``kwargs`` (validated)."""
    member = found.members.get(name)
    if member is None or member.kind != "command":
        what = "a query: queries are not staged" if member is not None else "unknown"
        raise ActorError(
            "InvalidInput",
            f"Actor type {found.name!r} has no public command {name!r} ({what}).",
            code="unknown_member",
        )
    if member.internal:
        raise refuse_internal(found.name, name, "command", "akter.stage")
    payload = member.bind(args, kwargs)
    return _row(found, tenant, id, member.name, payload, member.version, caller, pinned, "", timing)


def workflow_row(
    found: ActorDefinition,
    tenant: str,
    id: str,
    flow: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    caller: Caller,
    pinned: str | None,
    timing: tuple[int | None, int | None],
) -> StageRow:
    """The ``$workflow.start`` row of ``flow``: its id (the run id) is ``<cid>~<actor digest>``."""
    if flow.internal and not isinstance(caller, System):
        raise refuse_internal(found.name, flow.name, "workflow", "User callers")
    body = {"workflow": flow.name, "input": flow.bind(args, kwargs), "key": None}
    digest = hashlib.sha256(f"{tenant}\0{found.name}\0{id}".encode()).hexdigest()[:12]
    return _row(
        found,
        tenant,
        id,
        WorkflowCommand.START.value,
        body,
        0,
        caller,
        pinned,
        "~" + digest,
        timing,
    )


def _row(
    found: ActorDefinition,
    tenant: str,
    id: str,
    command: str,
    payload: dict[str, Any],
    version: int,
    caller: Caller,
    pinned: str | None,
    suffix: str,
    timing: tuple[int | None, int | None],
) -> StageRow:
    delay, at = timing
    return StageRow(
        rk=routing_key(placement_key(found.placement, tenant, found.name, id)),
        tenant=tenant,
        type=found.name,
        id=id,
        command=command,
        payload=canonical_json(payload),
        payload_hash=payload_hash(payload),
        version=version,
        caller=caller_to_json(caller),
        caller_key=caller_key(caller),
        pinned=pinned,
        suffix=suffix,
        delay=delay,
        at=at,
        slack=int(found.policy.execution_timeout),
    )
