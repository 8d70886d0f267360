"""Callers and principals (semantics §1.6) and the in-process caller scope."""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from akter._ids import validate_subject
from akter.errors import invalid_input

SystemSource = Literal[
    "process", "actor", "timer", "cron", "job", "workflow", "transaction", "subscription"
]


@dataclass(frozen=True, slots=True)
class ActorRef:
    """The address of one actor: tenant, actor type and id (``""`` for a singleton)."""

    tenant: str
    type: str
    id: str

    def to_json(self) -> dict[str, str]:
        """The JSON form ``{"tenant":…,"type":…,"id":…}``."""
        return {"tenant": self.tenant, "type": self.type, "id": self.id}


@dataclass(frozen=True, slots=True)
class User:
    """An authenticated end user, identified by ``subject``."""

    subject: str

    def __post_init__(self) -> None:
        validate_subject(self.subject)


@dataclass(frozen=True, slots=True)
class Anonymous:
    """A caller without credentials."""


@dataclass(frozen=True, slots=True)
class System:
    """Trusted code: in-process calls, or the framework delivering durable work.

    Attributes:
        source: ``process`` (in-process code), ``actor`` (intent), ``timer``, ``cron``, ``job``,
            ``workflow``, ``transaction`` (a command staged in the application's transaction) or
            ``subscription`` (a subscription delivery).
        ref: The actor that caused the delivery, if any.
        on_behalf_of: The principal the work is attributed to.
        mint: ``(parent_command_id, ordinal)`` proof for a minted child's creating intent.
        workflow: ``(run_id, seq)`` of the workflow step a job row belongs to: its outcome is
            routed to that step instead of the job's routes.
    """

    source: SystemSource = "process"
    ref: ActorRef | None = None
    on_behalf_of: str | None = None
    mint: tuple[str, int] | None = None
    workflow: tuple[str, int] | None = None


Caller = User | Anonymous | System

_MAX_CALLER_KEY = 1024


def principal_of(caller: Caller) -> str | None:
    """The principal a caller acts for (subject, ``on_behalf_of`` or none)."""
    if isinstance(caller, User):
        return caller.subject
    if isinstance(caller, System):
        return caller.on_behalf_of
    return None


@functools.lru_cache(maxsize=4096)
def caller_key(caller: Caller) -> str:
    """The canonical caller key stored in receipts (no credential, ever).

    Cached: a caller is frozen, and most turns come from a few callers (one per process, job
    or user), so the key's JSON is built once per caller rather than once per command.
    """
    key: list[Any]
    if isinstance(caller, User):
        key = ["User", caller.subject]
    elif isinstance(caller, Anonymous):
        key = ["Anonymous"]
    else:
        ref = [caller.ref.tenant, caller.ref.type, caller.ref.id] if caller.ref else None
        key = ["System", caller.source, ref, caller.on_behalf_of]
        if caller.mint is not None:
            key.append([caller.mint[0], caller.mint[1]])
    text = json.dumps(key, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > _MAX_CALLER_KEY:
        raise invalid_input("The caller key is longer than 1,024 bytes.", field="caller")
    return text


def caller_to_json(caller: Caller) -> str:
    """Serialize a caller for ``outbox.caller``."""
    if isinstance(caller, User):
        data: dict[str, Any] = {"kind": "User", "subject": caller.subject}
    elif isinstance(caller, Anonymous):
        data = {"kind": "Anonymous"}
    else:
        data = {
            "kind": "System",
            "source": caller.source,
            "ref": caller.ref.to_json() if caller.ref else None,
            "on_behalf_of": caller.on_behalf_of,
        }
        if caller.mint is not None:
            data["mint"] = [caller.mint[0], caller.mint[1]]
        if caller.workflow is not None:
            data["workflow"] = [caller.workflow[0], caller.workflow[1]]
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def caller_from_json(text: str) -> Caller:
    """Parse ``outbox.caller``."""
    data = json.loads(text)
    kind = data.get("kind")
    if kind == "User":
        return User(str(data["subject"]))
    if kind == "Anonymous":
        return Anonymous()
    if kind == "System":
        ref = data.get("ref")
        mint = data.get("mint")
        workflow = data.get("workflow")
        return System(
            source=data["source"],
            ref=ActorRef(ref["tenant"], ref["type"], ref["id"]) if ref else None,
            on_behalf_of=data.get("on_behalf_of"),
            mint=(str(mint[0]), int(mint[1])) if mint else None,
            workflow=(str(workflow[0]), int(workflow[1])) if workflow else None,
        )
    raise ValueError(f"Unknown caller kind {kind!r}.")


_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "akter_caller", default=None
)
_PROCESS = System("process")


def current_caller() -> Caller:
    """The caller in-process code runs as (``System("process")`` unless scoped)."""
    return _CALLER.get() or _PROCESS


@contextmanager
def as_caller(caller: Caller) -> Iterator[Caller]:
    """Scope trusted in-process code to act as ``caller``.

    Example:
        ``with akter.as_caller(akter.User("alice")): await order.place(1)``
    """
    if not isinstance(caller, User | Anonymous | System):
        raise TypeError(f"as_caller() takes User, Anonymous or System, not {caller!r}.")
    token = _CALLER.set(caller)
    try:
        yield caller
    finally:
        _CALLER.reset(token)
