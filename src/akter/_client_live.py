"""The client's live reads: query watches over SSE, and the app's WebSocket (``client.connect``).

``async for value in client.get(Account, "a").balance.watch()`` follows the watch route
(``POST .../{query}/watch``); ``async with client.connect() as socket`` opens one WebSocket on
the app's ``/ws`` whose handles (``socket.get(Account, "a")``) send commands (under this
client's command ids, retried with the same id), queries, watches and event feeds on it, and
whose ``socket.broadcasts(...)`` follows an actor's topic (docs/guides/live.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, cast

import httpx
from websockets.asyncio.client import ClientConnection, connect

from akter._client_streams import RemoteStream
from akter._event_decl import Event, decode_stored
from akter.actor import Actor, ActorDefinition, Member, definition_of
from akter.callers import ActorRef
from akter.context import LoopLease
from akter.errors import ActorError, DeclaredError, Reason
from akter.events import EventRecord, EventStream, parse_cursor
from akter.handles import BaseHandle
from akter.job_streams import StreamItem, StreamReader, item_from_json
from akter.workflows import WorkflowMember, WorkflowRun

A = TypeVar("A", bound=Actor[Any])

#: Headers httpx sends on its own: not carried over to the WebSocket's upgrade request.
_HTTPX_DEFAULTS = frozenset({"accept", "accept-encoding", "connection", "user-agent"})


def error_from_problem(problem: dict[str, Any]) -> ActorError | DeclaredError:
    """The error an answer's problem body stands for (as the HTTP client raises it)."""
    if problem.get("status") == 422 and "error" in problem:
        return DeclaredError.from_receipt(
            str(problem["error"]), dict(problem.get("fields") or {}), problem.get("detail")
        )
    return ActorError(
        cast(Reason, problem.get("reason") or "InvalidInput"),
        str(problem.get("detail") or "refused"),
        code=problem.get("code"),
        retryable=bool(problem.get("retryable", False)),
        retry_after=problem.get("retry_after"),
        command_id=problem.get("command_id"),
        field=problem.get("field"),
    )


async def watch_sse(
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    member: Member,
    error_of: Callable[[httpx.Response], Exception],
) -> AsyncIterator[Any]:
    """A query watch over SSE: each ``value`` frame's value; an ``error`` frame is raised."""
    headers = {"Accept": "text/event-stream"}
    async with http.stream("POST", path, json=body, headers=headers, timeout=None) as response:
        if response.status_code != 200:
            await response.aread()
            raise error_of(response)
        frame: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                name, _, value = line.partition(": ")
                frame[name] = value
                continue
            data = json.loads(frame.get("data", "null"))
            if frame.get("event") == "value":
                yield member.result.validate_python(data["value"])
            elif frame.get("event") == "error":
                raise error_from_problem(data)
            frame = {}


class SyncCall:
    """A blocking handle member: call it, or iterate ``watch(...)`` (``SyncClient``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target: Any) -> None:
        self._loop = loop
        self._target = target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._loop.run_until_complete(self._target(*args, **kwargs))

    def watch(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """The query's values, blocking for each (close the iterator to stop)."""
        values = self._target.watch(*args, **kwargs)
        try:
            while True:
                try:
                    yield self._loop.run_until_complete(anext(values))
                except StopAsyncIteration:
                    return
        finally:
            self._loop.run_until_complete(values.aclose())


class Socket:
    """One WebSocket session on an app's ``/ws`` (``async with client.connect() as socket``).

    It carries the client's string credentials and headers (an ``httpx.Auth`` object cannot
    sign a WebSocket upgrade: pass the token as ``auth="..."`` or a header).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        mint: Callable[[], Awaitable[str]],
        delivery_timeout: float,
    ) -> None:
        base = str(http.base_url).rstrip("/")
        self.url = "ws" + base.removeprefix("http") + "/ws"
        self._headers = {k: v for k, v in http.headers.items() if k not in _HTTPX_DEFAULTS}
        #: Mints the command ids of the socket's commands (the client's).
        self.mint = mint
        self.delivery_timeout = delivery_timeout
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._streams: dict[str, asyncio.Queue[dict[str, Any]]] = {}

    async def __aenter__(self) -> Socket:
        self._ws = await connect(self.url, additional_headers=self._headers)
        self._reader = asyncio.create_task(self._read(), name="akter.client.socket")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the socket (every subscription on it ends)."""
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    def get(self, actor: type[A], id: str = "") -> A:
        """A typed handle whose calls, watches and feeds go over this socket."""
        definition = definition_of(actor)
        definition.resolve()
        ref = ActorRef("?", definition.name, id)
        return cast(A, BaseHandle(_SocketTransport(self, definition), definition, ref))

    async def broadcasts(self, actor: type[Any], id: str, topic: str) -> AsyncIterator[Any]:
        """Follow ``topic`` of one actor from now on (best-effort); iterate its messages."""
        stream = await self.subscribe(
            {
                "kind": "broadcast",
                "actor": definition_of(actor).name,
                "actor_id": id,
                "topic": topic,
            }
        )
        return _fields(stream, "message")

    # --- the protocol ---------------------------------------------------------------------

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a command or query; its ``result`` (or raise its ``error``)."""
        message_id = f"r{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[message_id] = future
        try:
            await self._send({**message, "id": message_id})
            answer = await future
        finally:
            self._answers.pop(message_id, None)
        if answer["type"] == "error":
            raise error_from_problem(answer["problem"])
        return answer

    async def subscribe(self, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Open a subscription (raise its refusal); iterate its messages until it ends."""
        message_id = f"s{next(self._ids)}"
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._streams[message_id] = queue
        await self._send({**message, "type": "subscribe", "id": message_id})
        first = await queue.get()
        if first["type"] == "error":
            self._streams.pop(message_id, None)
            raise error_from_problem(first["problem"])
        return self._follow(message_id, queue)

    async def _follow(
        self, message_id: str, queue: asyncio.Queue[dict[str, Any]]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                message = await queue.get()
                kind = message["type"]
                if kind in ("closed", "unsubscribed", "socket_closed"):
                    return
                if kind == "error":
                    raise error_from_problem(message["problem"])
                yield message
        finally:
            if self._streams.pop(message_id, None) is not None and self._ws is not None:
                with contextlib.suppress(Exception):
                    await self._send({"type": "unsubscribe", "id": message_id})

    async def _send(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            raise ActorError("InvalidInput", "Use the socket as 'async with client.connect()'.")
        await self._ws.send(json.dumps(message, separators=(",", ":")))

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for text in self._ws:
                message = json.loads(text)
                message_id = message.get("id")
                future = self._answers.get(message_id)
                if future is not None and not future.done():
                    future.set_result(message)
                elif message_id in self._streams:
                    self._streams[message_id].put_nowait(message)
        finally:
            gone = ActorError("ActorUnavailable", "The WebSocket closed.", code="socket_closed")
            for future in self._answers.values():
                if not future.done():
                    future.set_exception(gone)
            for queue in self._streams.values():
                queue.put_nowait({"type": "socket_closed"})


async def _fields(stream: AsyncIterator[dict[str, Any]], name: str) -> AsyncIterator[Any]:
    async for message in stream:
        yield message[name]


class _SocketTransport:
    """A socket handle's calls: messages on the session."""

    __slots__ = ("_definition", "_socket")
    calls_internal = False

    def __init__(self, socket: Socket, definition: ActorDefinition) -> None:
        self._socket = socket
        self._definition = definition

    def _address(self, ref: ActorRef) -> dict[str, Any]:
        return {"actor": self._definition.name, "actor_id": ref.id or "_"}

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
        fence: LoopLease | None,
    ) -> Any:
        """A command under one command id, retried with it until the delivery timeout."""
        key = pinned or await self._socket.mint()
        message = {"type": "command", **self._address(ref), "command": member.name, "args": body}
        deadline = time.monotonic() + self._socket.delivery_timeout
        while True:
            try:
                answer = await self._socket.request({**message, "idempotency_key": key})
                return member.result.validate_python(answer["value"])
            except ActorError as error:
                if not error.retryable or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(error.retry_after or 0.25)

    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """A query."""
        message = {"type": "query", **self._address(ref), "query": member.name, "args": body}
        answer = await self._socket.request(message)
        return member.result.validate_python(answer["value"])

    async def watch(
        self, member: Member, ref: ActorRef, body: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """A watch subscription's values."""
        message = {"kind": "watch", **self._address(ref), "query": member.name, "args": body}
        stream = await self._socket.subscribe(message)
        async for value in _fields(stream, "value"):
            yield member.result.validate_python(value)

    def job_stream(self, ref: ActorRef, job_id: str, after: int) -> StreamReader:
        """A job's output stream subscription (no reconnect: a dropped socket ends it)."""
        return RemoteStream(self._stream_items(ref, job_id, after))

    async def _stream_items(
        self, ref: ActorRef, job_id: str, after: int
    ) -> AsyncGenerator[StreamItem, None]:
        message = {"kind": "job_stream", **self._address(ref), "job_id": job_id, "after": after}
        async for data in _fields(await self._socket.subscribe(message), "item"):
            yield item_from_json(data)

    def events(self, ref: ActorRef, after: str | None, limit: int) -> EventStream:
        """An event feed subscription (a page: what it replays before 0.5 s of quiet)."""
        return EventStream(lambda: self._page(ref, after, limit), lambda: self._follow(ref, after))

    async def _follow(self, ref: ActorRef, after: str | None) -> AsyncIterator[EventRecord]:
        message = {"kind": "events", **self._address(ref), "after": str(parse_cursor(after))}
        definition = self._definition
        classes = {t: e for e in definition.events for t in (e.event_tag, *e.event_aliases)}
        async for data in await self._socket.subscribe(message):
            tag = str(data["tag"])
            klass = classes.get(tag) or Event.registry().get(tag)
            event, version = decode_stored(klass, tag, data["event"], int(data["version"]))
            yield EventRecord(
                cursor=str(data["cursor"]),
                event=event,
                command_id=data["command_id"],
                emitted_at=datetime.fromisoformat(data["emitted_at"]),
                tag=tag,
                version=version,
            )

    async def _page(self, ref: ActorRef, after: str | None, limit: int) -> list[EventRecord]:
        records: list[EventRecord] = []
        stream = self._follow(ref, after)
        try:
            while len(records) < limit:
                try:
                    records.append(await asyncio.wait_for(anext(stream), 0.5))
                except (TimeoutError, StopAsyncIteration):
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        return records

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """Not over the socket: start workflows with the client's HTTP handle."""
        raise ActorError(
            "InvalidInput",
            "Workflows are not started over the WebSocket; use client.get(...) instead.",
            code="unknown_member",
        )
