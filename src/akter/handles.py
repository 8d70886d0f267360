"""Typed in-process handles: ``runtime.get(Order, "o-1")`` type-checks as ``Order``.

A handle resolves attribute access to the actor's public commands and queries. Each command
call mints one command id from the framework clock (or uses the pinned one) and retries
retryable failures with that same id until ``delivery_timeout``; the receipt turns a retry of a
committed call into a replay.

Handles from a singleton loop's ``self.runtime`` (a :class:`FencedRuntime`) carry the loop's
lease: their commands are refused with ``LeaseLost`` once that lease is no longer current.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from akter._ids import uuid7
from akter.actor import ActorDefinition
from akter.callers import ActorRef
from akter.context import LoopLease
from akter.errors import ActorError
from akter.events import EventStream

if TYPE_CHECKING:
    from akter.actor import Actor
    from akter.runtime import Runtime

A = TypeVar("A", bound="Actor[Any]")


class Handle:
    """A handle to one actor; at type-check time it is the actor class itself."""

    __slots__ = ("_command_id", "_definition", "_fence", "_ref", "_runtime")

    def __init__(
        self,
        runtime: Runtime,
        definition: ActorDefinition,
        ref: ActorRef,
        command_id: str | None = None,
        fence: LoopLease | None = None,
    ) -> None:
        self._runtime = runtime
        self._definition = definition
        self._ref = ref
        self._command_id = command_id
        self._fence = fence

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
        return Handle(self._runtime, self._definition, self._ref, command_id, self._fence)

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
        runtime, ref, pinned, fence = self._runtime, self._ref, self._command_id, self._fence

        if member.kind == "query":

            async def run_query(*args: Any, **kwargs: Any) -> Any:
                return await runtime._query(member, ref, member.bind(args, kwargs))

            return run_query

        async def run_command(*args: Any, **kwargs: Any) -> Any:
            runtime._refuse_inside_turn()
            return await runtime._command(
                member, ref, member.bind(args, kwargs), pinned, fence=fence
            )

        return run_command

    def __repr__(self) -> str:
        return f"<akter handle {self._ref.type}/{self._ref.id!r} tenant={self._ref.tenant!r}>"


class FencedRuntime:
    """A singleton loop's view of its runtime: handles it gives out are fenced on the lease.

    ``get`` and ``create`` return handles whose commands carry ``lease``; every other attribute
    is the runtime's own.
    """

    __slots__ = ("_lease", "_runtime")

    def __init__(self, runtime: Runtime, lease: LoopLease) -> None:
        self._runtime = runtime
        self._lease = lease

    @property
    def lease(self) -> LoopLease:
        """The lease the handles are fenced on."""
        return self._lease

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> A:
        """A typed handle to one actor whose commands are fenced on the loop's lease."""
        runtime = self._runtime
        ref = runtime.ref(actor, id, tenant=tenant)
        return cast(A, Handle(runtime, runtime.definition(actor), ref, fence=self._lease))

    async def create(self, actor: type[A], *, tenant: str = "default") -> A:
        """A fenced handle to a new actor with a minted UUIDv7 id; nothing is written yet."""
        return self.get(actor, uuid7(), tenant=tenant)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def __repr__(self) -> str:
        return f"<akter fenced runtime {self._lease.actor_type} epoch={self._lease.epoch}>"
