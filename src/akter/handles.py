"""Typed handles: ``runtime.get(Order, "o-1")`` (and ``client.get``) type-check as ``Order``.

A handle resolves attribute access to the actor's public commands and queries and hands each
call to its ``Transport``: in-process (``LocalTransport``, the runtime's call paths) or HTTP
(``akter.client``). Each command call mints one command id (or uses the pinned one) and retries
retryable failures with that same id until ``delivery_timeout``; the receipt turns a retry of a
committed call into a replay.

Handles from a singleton loop's ``self.runtime`` (a :class:`FencedRuntime`) carry the loop's
lease: their commands are refused with ``LeaseLost`` once that lease is no longer current.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from akter._contexts import refuse_inside_turn
from akter._ids import uuid7
from akter._members import refuse_internal
from akter.actor import ActorDefinition, Member
from akter.callers import ActorRef
from akter.context import LoopLease
from akter.errors import ActorError
from akter.events import EventRecord, EventStream
from akter.job_streams import StreamReader
from akter.workflows import WorkflowMember, WorkflowRun, WorkflowStarter

if TYPE_CHECKING:
    from akter.actor import Actor

A = TypeVar("A", bound="Actor[Any]")


class Transport(Protocol):
    """Where a handle's calls go."""

    @property
    def calls_internal(self) -> bool:
        """Whether the handle may call internal commands: only a workflow's steps may."""
        ...

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
        fence: LoopLease | None,
    ) -> Any:
        """Run a command (with retries under one command id)."""
        ...

    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """Run a query."""
        ...

    def watch(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> AsyncIterator[Any]:
        """Watch a query: its value now, then after each commit that changes it."""
        ...

    def events(self, ref: ActorRef, after: str | None, limit: int) -> EventStream:
        """The actor's event feed after a cursor."""
        ...

    def job_stream(self, ref: ActorRef, job_id: str, after: int) -> StreamReader:
        """A job's output stream after a cursor, then its close."""
        ...

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """Start a workflow run (its id derives from the command id)."""
        ...


class BaseHandle:
    """A handle to one actor over some transport; at type-check time it is the actor class."""

    __slots__ = ("_command_id", "_definition", "_fence", "_ref", "_transport")

    def __init__(
        self,
        transport: Transport,
        definition: ActorDefinition,
        ref: ActorRef,
        command_id: str | None = None,
        fence: LoopLease | None = None,
    ) -> None:
        self._transport = transport
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
        """The actor's tenant (``"?"`` over HTTP: the credential's)."""
        return self._ref.tenant

    @property
    def ref(self) -> ActorRef:
        """The actor's address."""
        return self._ref

    def events(self, after: str | None = None, limit: int = 1000) -> EventStream:
        """``async for``: replay events after ``after``, then follow live; ``await``: one page."""
        return self._transport.events(self._ref, after, limit)

    def job_stream(self, job_id: str, after: int = 0) -> StreamReader:
        """``async for``: a job's output stream after seq ``after``, then its close.

        Items are ``AttemptStarted``, ``Chunk`` and ``Closed`` (``akter.job_streams``); each
        one's ``seq`` is the cursor to resume after (docs/guides/job-streams.md).
        """
        return self._transport.job_stream(self._ref, job_id, after)

    def with_command_id(self, command_id: str) -> Any:
        """A handle whose next command call uses ``command_id`` (idempotent retries)."""
        return type(self)(self._transport, self._definition, self._ref, command_id, self._fence)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("__"):
            raise AttributeError(name)
        flow = self._definition.workflows.get(name)
        if flow is not None:
            transport, ref, pinned = self._transport, self._ref, self._command_id

            async def start(*args: Any, **kwargs: Any) -> WorkflowRun[Any]:
                return await transport.start_workflow(flow, ref, flow.bind(args, kwargs), pinned)

            return WorkflowStarter(start)  # type: ignore[return-value]
        member = self._definition.members.get(name)
        if member is None:
            raise ActorError(
                "InvalidInput",
                f"Actor type {self._definition.name!r} has no public command or query {name!r}.",
                code="unknown_member",
            )
        if member.internal and not self._transport.calls_internal:
            raise refuse_internal(self._definition.name, name, "command", "handles")
        transport, ref, pinned, fence = self._transport, self._ref, self._command_id, self._fence

        if member.kind == "query":
            return QueryCall(transport, member, ref)

        async def run_command(*args: Any, **kwargs: Any) -> Any:
            return await transport.command(member, ref, member.bind(args, kwargs), pinned, fence)

        return run_command

    def __repr__(self) -> str:
        return f"<akter handle {self._ref.type}/{self._ref.id!r} tenant={self._ref.tenant!r}>"


class QueryCall:
    """A query on a handle: ``await handle.balance()``, or ``handle.balance.watch()``."""

    __slots__ = ("_member", "_ref", "_transport")

    def __init__(self, transport: Transport, member: Member, ref: ActorRef) -> None:
        self._transport = transport
        self._member = member
        self._ref = ref

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The query's value now."""
        member = self._member
        return await self._transport.query(member, self._ref, member.bind(args, kwargs))

    def watch(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The value now, then after each commit that changes it (docs/guides/live.md).

        Raises:
            ActorError: ``InvalidInput`` (``not_watchable``) unless declared ``watch=True``.
        """
        member = self._member
        if not member.spec.watch:
            raise ActorError(
                "InvalidInput",
                f"{member.owner.name}.{member.name} is not a watchable query; declare it with "
                "@akter.query(watch=True).",
                code="not_watchable",
            )
        return self._transport.watch(member, self._ref, member.bind(args, kwargs))


class LiveHost(Protocol):
    """The runtime's live reads, as an in-process handle uses them (``runtime.live``)."""

    async def open_watch(
        self, member: Member, ref: ActorRef, payload: dict[str, Any], caller: Any = None
    ) -> Any:
        """A registered watch (``values()`` yields ``WatchValue``, ``close()`` ends it)."""
        ...

    async def follow_topic(self, ref: ActorRef, topic: str, caller: Any = None) -> Any:
        """A topic follower (``messages()`` yields each broadcast, ``close()`` ends it)."""
        ...


class Calls(Protocol):
    """The runtime's call paths an in-process handle uses (``akter._engine.calls.Calls``)."""

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        pinned: str | None,
        caller: Any = None,
        *,
        retry: bool = True,
        fence: LoopLease | None = None,
    ) -> Any:
        """A command with retries under one id."""
        ...

    async def query(
        self, member: Member, ref: ActorRef, payload: dict[str, Any], caller: Any = None
    ) -> Any:
        """A query."""
        ...


class Host(Protocol):
    """What an in-process handle needs of its runtime (beside its call paths)."""

    @property
    def live(self) -> LiveHost:
        """The runtime's query watches and broadcasts."""
        ...

    def definition(self, actor: type[Any] | str) -> ActorDefinition:
        """A hosted type's definition."""
        ...

    async def read_events(
        self, ref: ActorRef, after: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """One page of committed events."""
        ...

    def follow_events(self, ref: ActorRef, after: str | None = None) -> AsyncIterator[EventRecord]:
        """Replay, then follow live."""
        ...

    def job_progress(self, ref: ActorRef, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """A job's progress frames."""
        ...

    def job_stream(self, ref: ActorRef, job_id: str, after: int = 0) -> StreamReader:
        """A job's output stream."""
        ...

    async def outcome(self, cid: str, *, timeout: float = 30, ref: ActorRef | None = None) -> Any:  # noqa: ASYNC109
        """A command's outcome by id (``Runtime.outcome``)."""
        ...

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """Start a workflow run."""
        ...


class LocalTransport:
    """Calls into this process's runtime."""

    __slots__ = ("_calls", "_host")
    calls_internal = False

    def __init__(self, host: Host, calls: Calls) -> None:
        self._host = host
        self._calls = calls

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
        fence: LoopLease | None,
    ) -> Any:
        """A command, refused from inside a running turn (request/reply)."""
        refuse_inside_turn()
        return await self._calls.command(member, ref, body, pinned, fence=fence)

    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """A query against committed state."""
        return await self._calls.query(member, ref, body)

    async def watch(
        self, member: Member, ref: ActorRef, body: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """A query watch on this runner (access and limits checked at the first value)."""
        refuse_inside_turn()
        watch = await self._host.live.open_watch(member, ref, body)
        try:
            async for item in watch.values():
                yield item.value
        finally:
            watch.close()

    def events(self, ref: ActorRef, after: str | None, limit: int) -> EventStream:
        """The actor's event feed."""
        host = self._host
        return EventStream(
            lambda: host.read_events(ref, after, limit), lambda: host.follow_events(ref, after)
        )

    def progress(self, ref: ActorRef, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """A job's progress frames."""
        return self._host.job_progress(ref, job_id)

    def job_stream(self, ref: ActorRef, job_id: str, after: int) -> StreamReader:
        """A job's output stream."""
        return self._host.job_stream(ref, job_id, after)

    async def follow(self, ref: ActorRef, topic: str) -> Any:
        """Follow the actor's broadcasts on ``topic``."""
        return await self._host.live.follow_topic(ref, topic)

    async def outcome(self, ref: ActorRef, command_id: str, timeout: float) -> Any:  # noqa: ASYNC109
        """A command's outcome on ``ref`` by id."""
        return await self._host.outcome(command_id, timeout=timeout, ref=ref)

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """Start a workflow run, refused from inside a running turn (use ``self.start``)."""
        refuse_inside_turn()
        return await self._host.start_workflow(flow, ref, body, pinned)


class Handle(BaseHandle):
    """An in-process handle (``runtime.get``)."""

    __slots__ = ()
    _transport: LocalTransport

    def progress(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live progress frames of one of this actor's jobs, then the close with its ``outcome``.

        The closing message is ``{"closed": true, "outcome": ...}`` (``succeeded``,
        ``dead_lettered``, ``cancelled`` or ``unknown``); a job that already ended closes at
        once. Iterating raises ``ActorError`` (code ``unknown_job``) for a job no row names.
        """
        return self._transport.progress(self._ref, job_id)

    async def broadcasts(self, topic: str) -> AsyncIterator[Any]:
        """Follow, from now on, what this actor's turns broadcast on ``topic`` (best-effort).

        ``messages = await handle.broadcasts("chat")`` follows at once (access kind
        ``events``); ``async for message in messages`` reads them, ``aclose()`` stops.
        """
        follower = await self._transport.follow(self._ref, topic)
        messages: AsyncIterator[Any] = follower.messages()
        return messages

    async def outcome(self, command_id: str, *, timeout: float = 30) -> Any:  # noqa: ASYNC109
        """The outcome of one of this actor's commands by id: ``Runtime.outcome(ref=)``.

        Its value, or its declared error raised; its rules and errors are ``Runtime.outcome``'s.
        """
        return await self._transport.outcome(self._ref, command_id, timeout)


def local_handle(
    host: Host, calls: Calls, actor: type[Any] | str, ref: ActorRef, fence: LoopLease | None = None
) -> Any:
    """An in-process handle to ``ref`` on ``host``, through its call paths (``runtime.get``)."""
    definition = host.definition(actor)
    return Handle(LocalTransport(host, calls), definition, ref, fence=fence)


class FencedRuntime:
    """A singleton loop's view of its runtime: handles it gives out are fenced on the lease.

    ``get`` and ``create`` return handles whose commands carry ``lease``; every other attribute
    is the runtime's own.
    """

    __slots__ = ("_calls", "_lease", "_runtime")

    def __init__(self, runtime: Any, lease: LoopLease, calls: Calls) -> None:
        self._runtime = runtime
        self._lease = lease
        self._calls = calls

    @property
    def lease(self) -> LoopLease:
        """The lease the handles are fenced on."""
        return self._lease

    def get(self, actor: type[A], id: str = "", *, tenant: str = "default") -> A:
        """A typed handle to one actor whose commands are fenced on the loop's lease."""
        ref = self._runtime.ref(actor, id, tenant=tenant)
        return cast(A, local_handle(self._runtime, self._calls, actor, ref, fence=self._lease))

    async def create(self, actor: type[A], *, tenant: str = "default") -> A:
        """A fenced handle to a new actor with a minted UUIDv7 id; nothing is written yet."""
        return self.get(actor, uuid7(), tenant=tenant)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def __repr__(self) -> str:
        return f"<akter fenced runtime {self._lease.actor_type} epoch={self._lease.epoch}>"
