"""Bounds on slow clients: the time a request's head and its body may take to arrive.

A client that sends one byte per second would otherwise hold a connection, and a request, for
as long as it likes. Two bounds, both answered ``408`` problem+json and a closed connection:

- **the body** (``akter.http.app(..., body_timeout=30)``): the app reads a command's or query's
  body within ``body_timeout`` seconds of starting to read it, else answers ``body_timeout``.
  Nothing ran; the same command id may be sent again.
- **the head** (request line and headers): an ASGI app only sees a request once its head has
  arrived, so this bound belongs to the server. ``akter serve`` runs uvicorn with
  :func:`headers_timeout_protocol` (``--headers-timeout``, default 10 s): a connection whose
  request head is not complete that long after it opened (or after the first byte of its next
  request, on a kept-alive connection) is answered ``headers_timeout`` and closed. Give the same
  protocol to your own uvicorn: ``uvicorn.Config(asgi, http=headers_timeout_protocol(10))``.

A request whose head has arrived is never cut by the head bound: a handler may take its time and
an event feed stays open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import Any

from akter.errors import ConfigurationError
from akter.http.problems import type_uri

#: Default seconds for a request's head to arrive (``akter serve --headers-timeout``).
HEADERS_TIMEOUT = 10.0
#: Default seconds for a request's body to arrive (``app(body_timeout=...)``).
BODY_TIMEOUT = 30.0
#: Seconds a cut connection still reads (and drops) what the client sends after the 408: closing
#: with unread bytes would send a reset, which can destroy the 408 before the client reads it.
LINGER = 2.0

log = logging.getLogger("akter.http")


def check_timeout(seconds: float, name: str) -> float:
    """``seconds`` as a float, or a ``ConfigurationError`` naming ``name``."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 0 < seconds <= 3600
    ):
        raise ConfigurationError(f"{name}={seconds!r} must be a number of seconds in (0, 3600].")
    return float(seconds)


def timeout_problem(code: str, detail: str) -> bytes:
    """A whole ``408`` problem+json response that closes its connection (raw HTTP/1.1)."""
    body = json.dumps(
        {
            "type": type_uri("InvalidInput"),
            "title": "InvalidInput",
            "status": 408,
            "detail": detail,
            "reason": "InvalidInput",
            "code": code,
            "retryable": True,
        },
        separators=(",", ":"),
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode()
    return head + body


class _HeadTimer(asyncio.Protocol):
    """The head bound, mixed in before a uvicorn HTTP protocol (:func:`headers_timeout_protocol`).

    It times each request's head from the connection's opening, or from the first byte of a
    kept-alive connection's next request, and disarms once uvicorn has a request cycle for it.
    """

    headers_timeout: float
    _head_timer: asyncio.TimerHandle | None = None
    _cut = False
    # The uvicorn protocol's own attributes that the bound reads.
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._cut:
            return  # answered 408 and lingering: drop what still trickles in
        cycle = self.cycle
        if self._head_timer is None and (cycle is None or cycle.response_complete):
            self._arm()  # the first byte of a kept-alive connection's next request
        super().data_received(data)
        if self.cycle is not cycle:
            self._disarm()  # the head arrived: the request is the app's now

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()  # type: ignore[misc]  # the uvicorn protocol's
        if self.cycle is not cycle:
            self._disarm()  # a pipelined request's head was already here

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.headers_timeout, self._expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expired(self) -> None:
        self._head_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or (cycle is not None and not cycle.response_complete):
            return
        client = self.client
        log.debug(
            "Closed a connection whose request head did not arrive within %g s",
            self.headers_timeout,
            extra={"client": f"{client[0]}:{client[1]}" if client else None},
        )
        self.transport.write(
            timeout_problem(
                "headers_timeout",
                f"The request's head did not arrive within {self.headers_timeout:g} s.",
            )
        )
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # A lingering close: end our side after the 408, drop what the client still sends,
        # close a moment later.
        self._cut = True
        self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)


def headers_timeout_protocol(
    seconds: float = HEADERS_TIMEOUT, base: type[asyncio.Protocol] | None = None
) -> type[asyncio.Protocol]:
    """The uvicorn HTTP protocol ``base`` (default: its ``auto`` one), bounding request heads.

    Args:
        seconds: How long a request's head may take to arrive, from the connection's opening
            (its first request) or from the first byte of a later request on a kept-alive
            connection. Past it the client gets a ``408`` (code ``headers_timeout``) and the
            connection is closed.
        base: The uvicorn protocol class to extend (``H11Protocol``, ``HttpToolsProtocol``).

    Returns:
        A protocol class to pass as ``uvicorn.Config(..., http=...)``.
    """
    bound = check_timeout(seconds, "headers_timeout")
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol
    chosen: Any = base

    class HeadersTimeoutProtocol(_HeadTimer, chosen):  # type: ignore[misc]
        """Closes a connection whose request head does not arrive in time (module docstring)."""

        headers_timeout = bound

    return HeadersTimeoutProtocol


__all__ = [
    "BODY_TIMEOUT",
    "HEADERS_TIMEOUT",
    "check_timeout",
    "headers_timeout_protocol",
]
