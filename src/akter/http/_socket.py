"""One WebSocket session: commands, queries and subscriptions multiplexed on JSON messages.

Each client message is one JSON object with a ``type`` and an ``id`` the client chooses (a
string of at most 128 characters) that every answer about it carries::

    {"type": "command", "id": "c1", "actor": "Account", "actor_id": "a-1",
     "command": "deposit", "args": {"cents": 5}, "idempotency_key": "<command id>"}
        -> {"type": "result", "id": "c1", "value": 5} | {"type": "error", "id": "c1", ...}
    {"type": "query", "id": "q1", "actor": ..., "actor_id": ..., "query": "balance", "args": {}}
        -> {"type": "result", ...} | {"type": "error", ...}
    {"type": "subscribe", "id": "s1", "kind": "watch", "actor": ..., "actor_id": ...,
     "query": "balance", "args": {}}
                                 -> "subscribed", then {"type": "value", "version", "value"}
    {"type": "subscribe", "id": "s2", "kind": "events", ..., "after": "0"}
                                 -> "subscribed", then {"type": "event", "cursor", "tag", ...}
    {"type": "subscribe", "id": "s3", "kind": "broadcast", ..., "topic": "chat"}
                                          -> {"type": "broadcast", "topic", "message"}
    {"type": "unsubscribe", "id": "s1"}   -> {"type": "unsubscribed", "id": "s1"}

An ``error`` answer carries the ``problem`` the HTTP route would answer (``status``, ``reason``,
``code``, ``detail``, ``retryable`` ...); a subscription that ends sends ``closed`` (or an
``error``, e.g. when access is revoked). A command is the HTTP command path: the key is its
command id, so sending it again (on this socket or any other, or over HTTP) is one effect.

Subscription kinds are :data:`KINDS`, a table from the ``kind`` to the coroutine that checks and
opens one: ``watch``, ``events``, ``broadcast`` and ``job_stream`` (a job's output stream after
a seq, its items as the SSE route's ``data``, ending after the close).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from starlette.websockets import WebSocket, WebSocketDisconnect

from akter.callers import ActorRef, as_caller
from akter.errors import ActorError, DeclaredError
from akter.events import EventRecord
from akter.http._sse import event_json
from akter.http.auth import Identity
from akter.http.problems import from_actor_error, from_declared
from akter.job_streams import item_to_json

if TYPE_CHECKING:
    from akter.runtime import Runtime

log = logging.getLogger("akter.http")

#: Subscriptions one socket may hold open, and commands or queries it may have in flight.
MAX_SUBSCRIPTIONS = 64
MAX_IN_FLIGHT = 32
#: Messages waiting to be sent on one socket; a subscription waits (a watch coalesces meanwhile).
SEND_QUEUE = 256
_MAX_ID = 128


@dataclass
class Opened:
    """An open subscription: the messages to send (without ``id``), and how to close it."""

    messages: AsyncIterator[dict[str, Any]]
    close: Callable[[], Any]


#: Opens one subscription of a kind for the session's caller: checks access, then follows.
Opener = Callable[["Session", ActorRef, dict[str, Any]], Awaitable[Opened]]


def _bad(detail: str, code: str = "malformed_message") -> ActorError:
    return ActorError("InvalidInput", detail, code=code)


async def _open_watch(session: Session, ref: ActorRef, message: dict[str, Any]) -> Opened:
    runtime = session.runtime
    member = runtime.definition(ref.type).member(_text(message, "query"), "query")
    payload = member.validate_payload(_args(message))
    watch = await runtime.live.open_watch(member, ref, payload, session.identity.caller)

    async def values() -> AsyncIterator[dict[str, Any]]:
        async for item in watch.values():
            value = member.result.dump_python(item.value, mode="json")
            yield {"type": "value", "version": item.version, "value": value}

    return Opened(values(), watch.close)


async def _open_events(session: Session, ref: ActorRef, message: dict[str, Any]) -> Opened:
    after = message.get("after")
    if after is not None and not isinstance(after, str):
        raise _bad("'after' must be a cursor string.")
    runtime = session.runtime
    await runtime.read_events(ref, after, 1)  # access and the cursor, before "subscribed"
    records = cast(AsyncGenerator[EventRecord, None], runtime.follow_events(ref, after))

    async def events() -> AsyncIterator[dict[str, Any]]:
        async for record in records:
            yield {"type": "event", **event_json(record)}

    return Opened(events(), records.aclose)


async def _open_broadcast(session: Session, ref: ActorRef, message: dict[str, Any]) -> Opened:
    topic = _text(message, "topic")
    follower = await session.runtime.live.follow_topic(ref, topic, session.identity.caller)

    async def messages() -> AsyncIterator[dict[str, Any]]:
        async for item in follower.messages():
            yield {"type": "broadcast", "topic": topic, "message": item}

    return Opened(messages(), follower.close)


async def _open_job_stream(session: Session, ref: ActorRef, message: dict[str, Any]) -> Opened:
    """A job's output stream after seq ``after`` (default 0), ending after its close."""
    after = message.get("after", 0)
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise _bad("'after' must be a sequence number (an integer, 0 or more).")
    stream = session.runtime.job_stream(ref, _text(message, "job_id"), after)
    with as_caller(session.identity.caller):
        await stream.open()  # access, the job and the cursor, before "subscribed"

    async def items() -> AsyncIterator[dict[str, Any]]:
        async for item in stream:
            yield {"type": "job_stream", "item": item_to_json(item)}

    return Opened(items(), stream.aclose)


#: The subscription kinds, by the ``kind`` of a ``subscribe`` message.
KINDS: dict[str, Opener] = {
    "watch": _open_watch,
    "events": _open_events,
    "broadcast": _open_broadcast,
    "job_stream": _open_job_stream,
}


def _text(message: dict[str, Any], name: str) -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value:
        raise _bad(f"The message needs {name!r}, a non-empty string.")
    return value


def _args(message: dict[str, Any]) -> dict[str, Any]:
    args = message.get("args", {})
    if not isinstance(args, dict):
        raise _bad("'args' must be a JSON object of arguments.")
    return args


def _problem(exc: ActorError | DeclaredError, missing: ActorError | None = None) -> dict[str, Any]:
    if missing is not None and isinstance(exc, ActorError) and exc.code == "access_denied":
        exc = missing
    response = from_actor_error(exc) if isinstance(exc, ActorError) else from_declared(exc)
    return dict(json.loads(bytes(response.body)))


class Session:
    """One accepted socket, served until the client leaves (module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        websocket: WebSocket,
        identity: Identity,
        max_message: int,
        missing: ActorError | None = None,
    ) -> None:
        self.runtime = runtime
        self.identity = identity
        #: The upgrade came without credentials: an access refusal is this "log in" (401), as
        #: over HTTP.
        self._missing = missing
        self._socket = websocket
        self._max_message = max_message
        self._outgoing: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SEND_QUEUE)
        self._subscriptions: dict[str, asyncio.Task[None]] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Read messages until the client disconnects; then end every subscription."""
        sender = asyncio.create_task(self._send(), name="akter.ws.send")
        try:
            while True:
                text = await self._socket.receive_text()
                if len(text) > self._max_message:
                    await self._socket.close(code=1009)
                    return
                await self._handle(text)
        except WebSocketDisconnect:
            pass
        finally:
            tasks = [sender, *self._subscriptions.values(), *self._calls]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self) -> None:
        while True:
            message = await self._outgoing.get()
            await self._socket.send_text(json.dumps(message, separators=(",", ":")))

    async def _handle(self, text: str) -> None:
        message_id: str | None = None
        try:
            try:
                message = json.loads(text)
            except ValueError:
                raise _bad("The message is not valid JSON.") from None
            if not isinstance(message, dict):
                raise _bad("A message must be a JSON object.")
            message_id = message.get("id")
            if not isinstance(message_id, str) or not 0 < len(message_id) <= _MAX_ID:
                message_id = None
                raise _bad(f"A message needs an 'id': a string of 1-{_MAX_ID} characters.")
            kind = message.get("type")
            if kind == "unsubscribe":
                await self._unsubscribe(message_id)
            elif kind == "subscribe":
                await self._subscribe(message_id, message)
            elif kind in ("command", "query"):
                if len(self._calls) >= MAX_IN_FLIGHT:
                    raise _bad(
                        f"{MAX_IN_FLIGHT} commands and queries are in flight on this socket; "
                        "wait for their answers.",
                        "too_many_in_flight",
                    )
                task = asyncio.create_task(self._call(message_id, message), name="akter.ws.call")
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
            else:
                raise _bad(f"Unknown message type {kind!r}.")
        except ActorError as exc:
            await self._outgoing.put(
                {"type": "error", "id": message_id, "problem": _problem(exc, self._missing)}
            )

    def _ref(self, message: dict[str, Any]) -> ActorRef:
        definition = self.runtime.definition(_text(message, "actor"))
        actor_id = message.get("actor_id", "")
        if not isinstance(actor_id, str):
            raise _bad("'actor_id' must be a string.")
        if definition.singleton and actor_id == "_":
            actor_id = ""
        return self.runtime.ref(definition.name, actor_id, tenant=self.identity.tenant)

    async def _call(self, message_id: str, message: dict[str, Any]) -> None:
        """A command (the HTTP command path, with its Idempotency-Key) or a query."""
        runtime = self.runtime
        try:
            ref = self._ref(message)
            command = message["type"] == "command"
            member = runtime.definition(ref.type).member(
                _text(message, "command" if command else "query"), message["type"]
            )
            key = message.get("idempotency_key") if command else None
            if command and (not isinstance(key, str) or not key):
                raise ActorError(
                    "InvalidInput",
                    "A command needs an 'idempotency_key' holding a command id (mint one with "
                    "POST /command-ids).",
                    code="missing_idempotency_key",
                )
            args = _args(message)
            member.validate_json_body(json.dumps(args).encode(), args)
            with as_caller(self.identity.caller):
                value = await runtime.call(
                    ref.type, ref.id, member.name, args, tenant=ref.tenant,
                    command_id=key, retry=False,
                )  # fmt: skip
            answer: dict[str, Any] = {"type": "result", "id": message_id}
            answer["value"] = member.result.dump_python(value, mode="json")
        except (ActorError, DeclaredError) as exc:
            answer = {"type": "error", "id": message_id, "problem": _problem(exc, self._missing)}
        await self._outgoing.put(answer)

    async def _subscribe(self, message_id: str, message: dict[str, Any]) -> None:
        if message_id in self._subscriptions:
            raise _bad(f"Subscription {message_id!r} is already open.", "duplicate_subscription")
        if len(self._subscriptions) >= MAX_SUBSCRIPTIONS:
            raise _bad(
                f"This socket holds {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe one first.",
                "too_many_subscriptions",
            )
        opener = KINDS.get(str(message.get("kind")))
        if opener is None:
            raise _bad(
                f"Unknown subscription kind {message.get('kind')!r}; one of {sorted(KINDS)}.",
                "unknown_subscription_kind",
            )
        ref = self._ref(message)
        with as_caller(self.identity.caller):
            opened = await opener(self, ref, message)
        await self._outgoing.put({"type": "subscribed", "id": message_id})
        task = asyncio.create_task(self._pump(message_id, opened), name="akter.ws.subscription")
        self._subscriptions[message_id] = task

    async def _pump(self, message_id: str, opened: Opened) -> None:
        ending: dict[str, Any] = {"type": "closed", "id": message_id}
        try:
            with as_caller(self.identity.caller):
                async for message in opened.messages:
                    await self._outgoing.put({**message, "id": message_id})
        except ActorError as exc:
            ending = {"type": "error", "id": message_id, "problem": _problem(exc, self._missing)}
        finally:
            with contextlib.suppress(Exception):
                closed = opened.close()
                if asyncio.iscoroutine(closed):
                    await closed
        if self._subscriptions.pop(message_id, None) is not None:
            await self._outgoing.put(ending)

    async def _unsubscribe(self, message_id: str) -> None:
        task = self._subscriptions.pop(message_id, None)
        if task is None:
            raise _bad(f"No subscription {message_id!r} is open.", "unknown_subscription")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await self._outgoing.put({"type": "unsubscribed", "id": message_id})
