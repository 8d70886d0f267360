"""The call paths into actors: commands, deliveries, queries and singleton loops.

- ``command``: an external command (a handle, HTTP). Access check, one command id, then
  ``submit`` and retries with that id until the delivery timeout (``akter._retry``).
- ``deliver``: an internal delivery (the relay): no access policy, the framework id as given.
- ``query``: one unlocked read of committed state, run against a read-only view.
- ``run_loop``: a singleton's ``run()`` loop, on the lease owner.

Commands and deliveries reach a turn through ``submit`` (the dispatcher's mailbox, then the turn
engine); queries and loops run the actor's method in place through ``invoke``. Access is checked
by ``check_access`` alone, for members and for event/progress reads.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from akter._engine.dispatcher import Dispatcher
from akter._engine.services import Services
from akter._engine.turn import Request, Result
from akter._evolution import StateDecodeError
from akter._ids import (
    mint_command_id,
    mint_parsed_command_id,
    parse_command_id,
    parse_framework_id,
)
from akter._members import refuse_internal
from akter._retry import CommandRetry
from akter._store.gateway.actors import actor_key, committed
from akter._store.gateway.tables import QueryRows
from akter.actor import AccessKind, ActorDefinition, Member
from akter.callers import ActorRef, Caller, System, current_caller
from akter.context import LoopContext, LoopLease, QueryContext, bind, unwrap_read_only
from akter.errors import ActorError, Reason

EventsReader = Callable[[ActorRef, "str | None", int], Awaitable[Any]]


async def check_access(
    definition: ActorDefinition,
    ref: ActorRef,
    caller: Caller,
    kind: AccessKind,
    member: str | None = None,
) -> None:
    """Ask the type's access policy; ``member`` is ``None`` for event and progress reads."""
    allowed = definition.access(caller, ref, member or "events", kind)
    if inspect.isawaitable(allowed):
        allowed = await allowed
    if allowed:
        return
    if kind == "rows":
        detail = f"{type(caller).__name__} may not read the rows of {member!r} ({ref.type})."
    elif member is None:
        detail = f"{type(caller).__name__} may not read the {kind} of {ref.type}/{ref.id!r}."
    else:
        detail = f"{type(caller).__name__} may not call {ref.type}.{member}."
    raise ActorError("Unauthorized", detail, code="access_denied")


async def invoke(ctx: QueryContext | LoopContext, method: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``method`` of a fresh, uninitialised actor instance bound to ``ctx``."""
    instance = bind(ctx)
    ctx.activate()
    try:
        return await method(instance)
    finally:
        ctx.active = False


class _DeliveryTimeout(Exception):
    """A command's wait reached its delivery deadline (set on its result future)."""


def _expire(future: asyncio.Future[Result]) -> None:
    if not future.done():
        future.set_exception(_DeliveryTimeout())


class Calls:
    """The call paths of one runner (module docstring)."""

    def __init__(
        self, services: Services, dispatcher: Dispatcher, read_events: EventsReader
    ) -> None:
        self._services = services
        self._dispatcher = dispatcher
        self._read_events = read_events

    def mint_command_id(self) -> str:
        """A fresh command id from the framework clock."""
        self._services.supervisor.require_started()
        return mint_command_id(self._services.clock.estimate(), self._services.config.window_ms)

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        pinned: str | None,
        caller: Caller | None = None,
        *,
        retry: bool = True,
        fence: LoopLease | None = None,
    ) -> Any:
        """An external command: admission, then retries with one id until the deadline.

        With ``retry=False`` (the HTTP path) a retryable refusal is raised at once, for the
        remote caller to retry with the same id after ``retry_after``; so is ``StateTooNew``
        with retries on (the row stays newer than this runtime's code, evolution E4).
        ``fence`` (a singleton loop's lease) makes the turn refuse the command with
        ``LeaseLost`` once it is stale.
        """
        services = self._services
        services.supervisor.require_started()
        caller = caller or current_caller()
        window_ms = services.config.window_ms
        if pinned is None:  # minted here: nothing to parse
            command_id = mint_parsed_command_id(services.clock.estimate(), window_ms)
        else:
            command_id = parse_command_id(pinned, window_ms)
        if member.internal and not isinstance(caller, System):  # a workflow's step may
            by = f"{type(caller).__name__} callers"
            raise refuse_internal(ref.type, member.name, "command", by)
        await check_access(member.owner, ref, caller, "command", member.name)
        deadline = time.monotonic() + member.owner.policy.delivery_timeout / 1000
        retries: CommandRetry | None = None  # built at the first retry: most calls have none
        # An id minted just now has no receipt before its first attempt commits: that attempt
        # skips the receipt probe. Every retry probes (the first may have committed).
        unseen = pinned is None
        while True:
            result = await self.submit(
                member, ref, payload, command_id, caller, True, deadline, fence, unseen=unseen
            )
            unseen = False
            if result.kind == "ok":
                return result.value
            error = result.error
            assert error is not None
            if not (isinstance(error, ActorError) and error.retryable) or not retry:
                raise error
            if not services.supervisor.started:
                raise error  # the runtime stopped or died: the caller retries elsewhere
            if error.reason == "Timeout" or error.code in (
                "pool_exhausted",
                "database_unreachable",
            ):
                raise error  # the turn already waited pool_wait for a connection: shed the load
            if error.reason == "StateTooNew":
                # The row is newer than this runtime's code, and stays so: no retry here can
                # succeed. Still retryable (retry_after set): an HTTP client or a load balancer
                # retries on a runner with newer code.
                raise error
            if retries is None:
                retries = CommandRetry(
                    f"{ref.type}/{ref.id!r}.{member.name}",
                    command_id.raw,
                    deadline,
                    first_wait=0.05,
                    floor=0.001,
                    fixed_first=True,
                    expiry_guard=lambda: (
                        (command_id.expires_ms - 1000 - services.clock.estimate()) / 1000
                    ),
                )
            await asyncio.sleep(retries.wait_after(error))

    async def deliver(
        self,
        ref: ActorRef,
        command: str,
        payload: dict[str, Any],
        command_id: str,
        caller: Caller,
        *,
        within: float | None = None,
    ) -> Result:
        """An internal delivery (``Runtime.deliver``): no access policy, no expiry, the id as given.

        ``payload`` is validated here; the relay uses :meth:`deliver_decoded` instead.
        """
        definition = self._services.registry.definition(ref.type)
        member = definition.member(command, "command")
        body = member.validate_payload(payload)
        return await self.deliver_decoded(ref, member.name, body, command_id, caller, within=within)

    async def deliver_decoded(
        self,
        ref: ActorRef,
        command: str,
        payload: dict[str, Any],
        command_id: str,
        caller: Caller,
        *,
        within: float | None = None,
        first: bool = False,
    ) -> Result:
        """The relay's delivery: ``payload`` is already migrated and validated for ``command``.

        ``first``: the relay's first attempt at an intent no one else could have delivered
        (``Request.first_delivery``): its turn may take the one flight.

        The relay decodes every claimed row with ``Member.decode_payload`` (``parking``), which
        validates it: validating it again here cost a second model validation and storable walk
        per delivery.
        """
        self._services.supervisor.require_started()
        definition = self._services.registry.definition(ref.type)
        member = definition.member(command, "command")
        parsed = parse_framework_id(command_id)
        deadline = time.monotonic() + (within or definition.policy.delivery_timeout / 1000)
        return await self.submit(
            member, ref, payload, parsed, caller, False, deadline, first_delivery=first
        )

    async def submit(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        command_id: Any,
        caller: Caller,
        external: bool,
        deadline: float,
        fence: LoopLease | None = None,
        *,
        unseen: bool = False,
        first_delivery: bool = False,
    ) -> Result:
        """Hand a command to its mailbox and wait for its result until ``deadline``.

        ``unseen``: ``command_id`` was minted for this call and never submitted before
        (``Request.unseen``); ``first_delivery``: ``Request.first_delivery``.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        request = Request(
            member,
            ref,
            payload,
            None,
            command_id,
            caller,
            external,
            future,
            fence=fence,
            unseen=unseen,
            first_delivery=first_delivery,
        )
        try:
            self._dispatcher.submit(member.owner, request)
        except ActorError as exc:
            return Result("error", error=exc)
        # The caller's deadline never cancels an admitted turn: the turn runs in its mailbox's
        # task, and the deadline only ends the wait on ``future`` (``_expire``), which the
        # mailbox then leaves alone (it sets only futures not done). No asyncio.shield: its
        # outer future costs an event-loop iteration per call. No asyncio.timeout either: it
        # cancels and uncancels the caller's task, where failing ``future`` is all it takes
        # (and a caller cancelled at the same moment still sees its CancelledError: the task
        # delivers a pending cancel before the result).
        timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), _expire, future)
        try:
            return await future
        except _DeliveryTimeout:
            name, raw = member.name, command_id.raw
            return Result(
                "error",
                error=ActorError(
                    "Timeout",
                    f"{ref.type}/{ref.id!r}.{name} did not complete within the delivery "
                    f"timeout; it may still commit — retry with command id {raw!r}.",
                    code="outcome_unknown",  # still queued or running: it may commit later
                    command_id=raw,
                ),
            )
        finally:
            timer.cancel()
            if future.done() and not future.cancelled():
                # Marks an error as read when a cancellation of the caller raced it (asyncio
                # would log "exception was never retrieved" for it otherwise).
                future.exception()

    async def query(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        caller: Caller | None = None,
    ) -> Any:
        """A query: one unlocked read of committed state, a read-only view, no receipt."""
        return (await self.query_versioned(member, ref, payload, caller))[0]

    async def query_versioned(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        caller: Caller | None = None,
    ) -> tuple[Any, int]:
        """A query's value and the actor row's version it read (0: no row), for watches."""
        services = self._services
        services.supervisor.require_started()
        caller = caller or current_caller()
        definition = member.owner
        await check_access(definition, ref, caller, "query", member.name)
        state, cursor, now_ms, version = await self._read_state(member, ref)
        ctx = QueryContext(
            definition=definition,
            ref=ref,
            caller=caller,
            now_ms=now_ms,
            state=state,
            cursor=cursor,
            events_reader=lambda after, limit: self._read_events(ref, after, limit),
        )
        if definition.tables:
            ctx.owned = self._query_rows(ref, member.name)
        arguments = member.arguments(payload)
        async with asyncio.timeout(definition.policy.execution_timeout / 1000):
            value = await invoke(ctx, lambda actor: member.fn(actor, **arguments))
        await check_access(definition, ref, caller, "query", member.name)
        try:
            return member.result.validate_python(unwrap_read_only(value)), version
        except ValidationError as exc:
            raise ActorError(
                "Defect", f"{ref.type}.{member.name} returned a value that fails its annotation."
            ) from exc

    def _query_rows(self, ref: ActorRef, name: str) -> QueryRows:
        """A query's ``self.rows`` reader: its actor's owned rows, read-only."""
        services = self._services
        return QueryRows(
            services.store,
            (services.registry.routing_key(ref), ref.tenant, ref.id),
            services.config.query_pool_wait_ms / 1000,
            f"the query {ref.type}.{name}",
        )

    async def _read_state(self, member: Member, ref: ActorRef) -> tuple[Any, int, int, int]:
        """The committed state, event cursor, database time and row version for a query.

        A row at an older state version is migrated in memory and never written (evolution
        E1). The loss guard does not refuse a query: only a write would drop the keys the
        model lacks, so the query is served the validated model, and the next command's turn
        refuses. A row newer than this code is refused with ``StateTooNew`` (retryable).
        """
        services, definition = self._services, member.owner
        key = actor_key(services.registry.routing_key(ref), ref.tenant, ref.type, ref.id)
        row, now_ms = await committed(
            services.store,
            services.clock,
            key,
            wait_s=services.config.query_pool_wait_ms / 1000,
            what=f"the query {ref.type}.{member.name}",
        )
        if (row is None or not row.created) and definition.gated:
            raise ActorError("NotCreated", f"{definition.name}/{ref.id!r} has not been created.")
        if row is None:
            return definition.default_state(), 0, now_ms, 0
        actor, version = f"{ref.type}/{ref.id!r}", row.state_version
        try:
            state, _ = definition.decode_state(row.state, version, actor, guard=False)
        except StateDecodeError as exc:
            reason: Reason = "StateTooNew" if exc.kind == "too_new" else "Defect"
            raise ActorError(reason, exc.message) from None
        return state, row.event_seq, now_ms, row.version

    async def run_loop(
        self, actor_type: str, runner_id: str, lease: LoopLease | None, runtime: Any
    ) -> None:
        """Run a singleton's ``run()`` loop for its "default"-tenant instance (lease owner).

        ``runtime`` is what the loop sees as ``self.runtime``: fenced on ``lease`` (the lease
        acquisition that started the loop), so its commands are refused once it is stale.
        """
        definition = self._services.registry.definition(actor_type)
        ctx = LoopContext(
            definition=definition,
            ref=ActorRef("default", definition.name, ""),
            caller=System("process"),
            now_ms=self._services.clock.estimate(),
            runtime=runtime,
            runner_id=runner_id,
            lease=lease,
        )
        await invoke(ctx, lambda actor: actor.run())
