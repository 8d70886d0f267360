"""Live routes: a query watch as server-sent events, and the app's one WebSocket.

Routes (docs/guides/live.md)::

    POST /actors/{Type}/{id}/{query}/watch   body = the query's arguments; SSE ``value`` frames
    GET  /ws (WebSocket)                     commands, watches, event feeds, broadcasts

Both take the caller and tenant from the auth provider, and the browser origin rule, exactly as
the other routes: the WebSocket's upgrade request is authenticated once, and refused before the
upgrade (403 with the problem, or a close) when its origin or credentials are. Every watch,
feed or topic it opens asks the type's access policy as its HTTP route does; a command is the
HTTP command path itself (``Idempotency-Key`` semantics: the same key twice is one effect).

The socket's protocol is JSON text messages (:mod:`akter.http._socket` holds the session).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from akter.actor import ActorDefinition, Member
from akter.callers import as_caller
from akter.errors import ActorError
from akter.http._socket import Session
from akter.http._sse import MEDIA_TYPE, keep_alive
from akter.http.auth import Identity
from akter.http.problems import from_actor_error

if TYPE_CHECKING:
    from akter.runtime import Runtime

_STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class Host(Protocol):
    """What the routes use of the app (``akter.http.app``'s ``_Api``)."""

    runtime: Runtime
    max_body: int

    async def identity(self, request: Request) -> Identity: ...

    def refused(self, request: Request, exc: ActorError) -> Response: ...

    async def json_object(self, request: Request) -> tuple[bytes, dict[str, Any]]: ...

    def resolve(self, request: Request) -> tuple[ActorDefinition, str]: ...


class LiveRoutes:
    """The watch route and the WebSocket endpoint of one app."""

    def __init__(self, host: Host) -> None:
        self._host = host

    def routes(self) -> list[Route | WebSocketRoute]:
        """The routes, to be placed before the command route (``.../{query}/watch``)."""
        return [
            Route("/actors/{type}/{id:path}/{member}/watch", self.watch, methods=["POST"]),
            WebSocketRoute("/ws", self.socket),
        ]

    async def watch(self, request: Request) -> Response:
        """``POST /actors/{Type}/{id}/{query}/watch``: the watch as server-sent events."""
        host = self._host
        runtime = host.runtime
        try:
            identity = await host.identity(request)
            definition, actor_id = host.resolve(request)
            member = definition.member(request.path_params["member"], "query")
            raw, body = await host.json_object(request)
            member.validate_json_body(raw, body)
            ref = runtime.ref(definition.name, actor_id, tenant=identity.tenant)
            with as_caller(identity.caller):
                watch = await runtime.live.open_watch(
                    member, ref, member.validate_payload(body), identity.caller
                )
        except ActorError as exc:
            return host.refused(request, exc)
        return StreamingResponse(
            keep_alive(_frames(watch, member)), media_type=MEDIA_TYPE, headers=_STREAM_HEADERS
        )

    async def socket(self, websocket: WebSocket) -> None:
        """``/ws``: authenticate the upgrade like a request, then serve the session."""
        host = self._host
        request = _as_request(websocket)
        try:
            identity = await host.identity(request)
        except ActorError as exc:
            await _deny(websocket, host.refused(request, exc))
            return
        await websocket.accept()
        missing = getattr(request.state, "missing_credentials", None)
        await Session(host.runtime, websocket, identity, host.max_body, missing).serve()


async def _frames(watch: Any, member: Member) -> AsyncIterator[str]:
    """A watch's values as ``value`` frames (``id``: the row version); a refusal ends it."""
    try:
        async for item in watch.values():
            data = json.dumps(
                {
                    "version": item.version,
                    "value": member.result.dump_python(item.value, mode="json"),
                },
                separators=(",", ":"),
            )
            yield f"id: {item.version}\nevent: value\ndata: {data}\n\n"
    except ActorError as exc:
        yield f"event: error\ndata: {json.dumps(problem_json(exc))}\n\n"
    finally:
        watch.close()


def problem_json(exc: ActorError) -> dict[str, Any]:
    """An ``ActorError`` as the problem body its HTTP route answers."""
    return dict(json.loads(bytes(from_actor_error(exc).body)))


def _as_request(websocket: WebSocket) -> Request:
    """The upgrade request as the auth provider and the origin rule read it.

    Its scheme is the page's (``ws`` → ``http``, ``wss`` → ``https``), so that a page's own
    ``Origin`` is recognised as the app's.
    """
    scope = dict(websocket.scope)
    scope["type"] = "http"
    scope["method"] = "GET"
    scope["scheme"] = {"ws": "http", "wss": "https"}.get(scope.get("scheme", "ws"), "http")
    return Request(scope)


async def _deny(websocket: WebSocket, response: Response) -> None:
    """Refuse the upgrade: with the problem as an HTTP response if the server can, else close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:
        await websocket.close(code=1008)
