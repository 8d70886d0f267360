"""Typed in-process handles: ``runtime.get(Order, "o-1")`` type-checks as ``Order``.

A handle resolves attribute access to the actor's public commands and queries. Each command
call mints one command id from the framework clock (or uses the pinned one) and retries
retryable failures with that same id until ``delivery_timeout``; the receipt turns a retry of a
committed call into a replay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from akter.actor import ActorDefinition
from akter.callers import ActorRef
from akter.errors import ActorError
from akter.events import EventStream

if TYPE_CHECKING:
    from akter.runtime import Runtime


class Handle:
    """A handle to one actor; at type-check time it is the actor class itself."""

    __slots__ = ("_command_id", "_definition", "_ref", "_runtime")

    def __init__(
        self,
        runtime: Runtime,
        definition: ActorDefinition,
        ref: ActorRef,
        command_id: str | None = None,
    ) -> None:
        self._runtime = runtime
        self._definition = definition
        self._ref = ref
        self._command_id = command_id

    @property
    def id(self) -> str:
        """The actor's id."""
        return self._ref.id

    @property
    def tenant(self) -> str:
        """The actor's tenant."""
        return self._ref.tenant

    @property
    def ref(self) -> ActorRef:
        """The actor's address."""
        return self._ref

    def events(self, after: str | None = None, limit: int = 1000) -> EventStream:
        """``async for``: replay events after ``after``, then follow live; ``await``: one page."""
        runtime, ref = self._runtime, self._ref
        return EventStream(
            lambda: runtime.read_events(ref, after, limit),
            lambda: runtime.follow_events(ref, after),
        )

    def progress(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live progress frames of one of this actor's jobs, then ``{"closed": true}``."""
        return self._runtime.job_progress(self._ref, job_id)

    def with_command_id(self, command_id: str) -> Handle:
        """A handle whose next command call uses ``command_id`` (idempotent retries)."""
        return Handle(self._runtime, self._definition, self._ref, command_id)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("__"):
            raise AttributeError(name)
        member = self._definition.members.get(name)
        if member is None or member.internal:
            raise ActorError(
                "InvalidInput",
                f"Actor type {self._definition.name!r} has no public command or query {name!r}.",
                code="unknown_member",
            )
        runtime, ref, pinned = self._runtime, self._ref, self._command_id

        if member.kind == "query":

            async def run_query(*args: Any, **kwargs: Any) -> Any:
                return await runtime._query(member, ref, member.bind(args, kwargs))

            return run_query

        async def run_command(*args: Any, **kwargs: Any) -> Any:
            runtime._refuse_inside_turn()
            return await runtime._command(member, ref, member.bind(args, kwargs), pinned)

        return run_command

    def __repr__(self) -> str:
        return f"<akter handle {self._ref.type}/{self._ref.id!r} tenant={self._ref.tenant!r}>"
