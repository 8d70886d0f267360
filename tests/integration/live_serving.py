"""Serving an app with WebSockets on loopback for the live tests, and a header auth provider."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp
from websockets.asyncio.client import ClientConnection, connect

import akter
from akter.http import Identity

WITHIN = 5.0


async def by_header(request: Request) -> Identity:
    """The caller is ``X-Test-User`` (none: refused as missing) in tenant ``X-Test-Tenant``."""
    user = request.headers.get("x-test-user")
    if not user:
        raise akter.ActorError("Unauthorized", "No test user.", code="missing_credentials")
    return Identity(akter.User(user), request.headers.get("x-test-tenant", "default"))


@contextlib.asynccontextmanager
async def serving(asgi: ASGIApp) -> AsyncIterator[str]:
    """Serve ``asgi`` (WebSockets on) on 127.0.0.1, an ephemeral port, in this event loop."""
    config = uvicorn.Config(
        asgi,
        host="127.0.0.1",
        port=0,
        lifespan="off",
        log_level="warning",
        log_config=None,
        ws="websockets-sansio",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="live.uvicorn")
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("uvicorn exited before it started")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


def socket(
    address: str, user: str | None = "alice", tenant: str = "default", origin: str | None = None
) -> Any:
    """A WebSocket client on the app's ``/ws`` (an async context manager)."""
    headers = {"X-Test-Tenant": tenant}
    if user is not None:
        headers["X-Test-User"] = user
    return connect(
        f"ws://{address}/ws",
        additional_headers=headers,
        origin=origin,  # type: ignore[arg-type]
        open_timeout=WITHIN,
    )


async def send(ws: ClientConnection, **message: Any) -> None:
    await ws.send(json.dumps(message))


async def receive(ws: ClientConnection, within: float = WITHIN) -> dict[str, Any]:
    async with asyncio.timeout(within):
        answer: dict[str, Any] = json.loads(await ws.recv())
        return answer


_UNREAD: dict[int, list[dict[str, Any]]] = {}


async def answer_to(ws: ClientConnection, message_id: str, kinds: set[str]) -> dict[str, Any]:
    """The next message about ``message_id`` of one of ``kinds``; others wait for their turn."""
    unread = _UNREAD.setdefault(id(ws), [])
    for message in unread:
        if message.get("id") == message_id and message["type"] in kinds:
            unread.remove(message)
            return message
    while True:
        message = await receive(ws)
        if message.get("id") == message_id and message["type"] in kinds:
            return message
        unread.append(message)
