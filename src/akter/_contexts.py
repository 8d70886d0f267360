"""The private objects behind a handler's ``self``: one kind per way a handler runs.

:class:`CommandContext` backs a command's turn (writable state, staged work),
:class:`QueryContext` a query (committed state, read-only, an event reader) and
:class:`LoopContext` a singleton's ``run()`` loop (no state; the runtime and the lease).
:func:`bind` makes the ``self`` of all three; :mod:`akter.context` is the surface they serve.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from akter._staging import Staged
from akter.callers import ActorRef, Caller, System, caller_to_json, principal_of
from akter.errors import CapabilityEscaped

if TYPE_CHECKING:
    from akter._members import ActorDefinition

__all__ = [
    "IN_TURN",
    "CommandContext",
    "LoopContext",
    "LoopLease",
    "QueryContext",
    "bind",
]

#: Set while a handler runs: a handle call from inside a turn is a defect.
IN_TURN: contextvars.ContextVar[CommandContext | None] = contextvars.ContextVar(
    "akter_in_turn", default=None
)


@dataclass(frozen=True)
class LoopLease:
    """The singleton lease a ``run()`` loop runs under: its fence.

    Attributes:
        actor_type: The singleton type (the ``singletons`` row's ``actor_type``).
        owner: This runner's id (the row's ``owner``).
        epoch: ``acquired_at_ms`` of the acquisition that started this loop; a takeover by
            another runner writes a new one.
        routing_key: The routing key of the singleton's actor (the row's ``routing_key``): on
            Citus the lease row lives in that actor's shard.
    """

    actor_type: str
    owner: str
    epoch: int
    routing_key: int


class _Context:
    """What every ``self`` knows: the actor, its caller and the pinned clock, and its task.

    Three kinds exist, one per way a handler runs: :class:`CommandContext` (a command's turn),
    :class:`QueryContext` (a query) and :class:`LoopContext` (a singleton's ``run()`` loop).
    """

    #: In a query: the event cursor read with the state.
    cursor: int = 0
    #: In a query: reads one page of committed events (``after``, ``limit``).
    events_reader: Callable[[str | None, int], Awaitable[Any]] | None = None
    #: Behind ``self.rows(t)`` of a type with owned tables: the turn's or the query's side.
    owned: Any = None

    def __init__(
        self, *, definition: ActorDefinition, ref: ActorRef, caller: Caller, now_ms: int
    ) -> None:
        self.definition = definition
        self.ref = ref
        self.caller = caller
        self.now_ms = now_ms
        self.task: asyncio.Task[Any] | None = None
        self.active = False

    def activate(self) -> None:
        """Open the capabilities to the current task (until ``active`` is set ``False``)."""
        self.task = asyncio.current_task()
        self.active = True

    def check(self) -> None:
        """Refuse capabilities outside the handler's own task or after it ended."""
        if not self.active or asyncio.current_task() is not self.task:
            raise CapabilityEscaped(
                f"A turn capability of {self.ref.type}/{self.ref.id!r} was used after its "
                "handler returned or from another task; stage work only inside the handler."
            )

    @property
    def principal(self) -> str | None:
        """The principal of the turn's caller."""
        return principal_of(self.caller)


class CommandContext(_Context):
    """The private state behind ``self`` for one command: writable state and staged work."""

    def __init__(
        self,
        *,
        definition: ActorDefinition,
        ref: ActorRef,
        caller: Caller,
        command_id: str,
        now_ms: int,
        state: BaseModel,
        window_ms: int,
        keyed_runs: dict[tuple[str, str], str] | None = None,
    ) -> None:
        super().__init__(definition=definition, ref=ref, caller=caller, now_ms=now_ms)
        self.command_id = command_id
        self.state = state
        self.window_ms = window_ms
        #: The run each (workflow, key) names for this command's keyed starts: live ones, or
        #: started by an earlier command of its batch (``BatchWrites.keyed``; read only).
        self.keyed_runs = keyed_runs
        self.staged = Staged()
        self.mint_ordinal = 0
        #: Set when the handler did something that makes the command a defect (a handle call).
        self.poisoned: str | None = None

    def system_caller(self, source: str, mint: tuple[str, int] | None = None) -> str:
        """The JSON caller of work this turn causes."""
        return caller_to_json(
            System(source=source, ref=self.ref, on_behalf_of=self.principal, mint=mint)  # type: ignore[arg-type]
        )


class QueryContext(_Context):
    """The private state behind ``self`` for one query: committed state, read-only."""

    def __init__(
        self,
        *,
        definition: ActorDefinition,
        ref: ActorRef,
        caller: Caller,
        now_ms: int,
        state: BaseModel,
        cursor: int,
        events_reader: Callable[[str | None, int], Awaitable[Any]],
    ) -> None:
        super().__init__(definition=definition, ref=ref, caller=caller, now_ms=now_ms)
        self.state = state
        self.cursor = cursor
        self.events_reader = events_reader


class LoopContext(_Context):
    """The private state behind ``self`` in a singleton's ``run()`` loop: no state, a runtime."""

    def __init__(
        self,
        *,
        definition: ActorDefinition,
        ref: ActorRef,
        caller: Caller,
        now_ms: int,
        runtime: Any,
        runner_id: str,
        lease: LoopLease | None,
    ) -> None:
        super().__init__(definition=definition, ref=ref, caller=caller, now_ms=now_ms)
        #: What ``self.runtime`` is: the runtime, fenced on ``lease`` when there is one.
        self.runtime = runtime
        self.runner_id = runner_id
        self.lease = lease


def bind(ctx: _Context) -> Any:
    """A fresh instance of the actor class with ``ctx`` behind its ``self`` (not yet active)."""
    cls: Any = ctx.definition.cls
    instance = cls.__new__(cls)
    instance.__dict__["_akter_ctx"] = ctx
    return instance


class RequestReplyInTurn(BaseException):
    """A handler called another actor request/reply: the turn is poisoned (semantics §3.1)."""


def refuse_inside_turn() -> None:
    """Refuse a request/reply call from inside a running turn (use ``self.send``)."""
    ctx = IN_TURN.get()
    if ctx is not None and ctx.active:
        ctx.poisoned = (
            "request/reply inside a turn: a handler called another actor through a handle; "
            "use self.send(...) instead."
        )
        raise RequestReplyInTurn(ctx.poisoned)
