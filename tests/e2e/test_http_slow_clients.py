"""Slow clients are bounded (issue 38, finding 11): raw sockets against a real uvicorn server.

A client that trickles its body gets a 408 problem (``body_timeout``) once ``body_timeout`` has
passed, and its connection is closed; a client that trickles its request head (or sends none) is
cut by ``akter serve``'s headers bound with a 408; a request whose head arrived is never cut by
it (a feed stays open). A client that disconnects in the middle of its body is an ordinary
event: one DEBUG line, no ERROR traceback. Trickling is what is tested, so these tests send bytes
at a pace; every wait is bounded by the test's own deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import pytest

from tests._support import until
from tests.e2e.conftest import ACTORS, Account, Serve
from tests.e2e.example_server import ALICE, KEYS, example_server, free_port
from tests.e2e.test_serving import readme_command, with_port

pytestmark = pytest.mark.timeout(120)

#: Seconds between two trickled bytes: far slower than any real client.
PACE = 0.2
#: Scheduling slack on a loaded 2-core machine.
SLACK = 4.0


@contextlib.asynccontextmanager
async def raw(url: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, _, port = url.removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` one byte per :data:`PACE` until it is sent or the server closes."""
    for byte in data:
        if writer.transport.is_closing():
            return
        writer.write(bytes([byte]))
        try:
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(PACE)


async def answer(reader: asyncio.StreamReader, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took.

    The time is that of the answer's first byte. A server that closes while a trickled byte is
    in flight may end with a reset after its answer: that counts as the end too.
    """
    started = time.monotonic()
    data = b""
    took = within
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                assert data, "the connection was reset before any answer"
                break
            if not chunk:
                break  # EOF: the server closed the connection
            if not data:
                took = time.monotonic() - started
            data += chunk
    return data, took


def problem_of(response: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return status, headers, json.loads(body) if body else {}


def post_head(path: str, length: int, **headers: str) -> bytes:
    fields = {
        "Host": "test",
        "Content-Type": "application/json",
        "Content-Length": str(length),
        **headers,
    }
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_slow_body_is_answered_408(served: Serve) -> None:
    async with served(ACTORS, auth=None, app_options={"body_timeout": 1.0}) as s:
        key = await s.mint()
        body = json.dumps({"cents": 5, "memo": "x" * 40}).encode()
        async with raw(s.url) as (reader, writer):
            writer.write(
                post_head("/actors/Account/slow/deposit", len(body), **{"Idempotency-Key": key})
            )
            sending = asyncio.create_task(trickle(writer, body))
            response, took = await answer(reader, 1.0 + SLACK)
            sending.cancel()
        status, headers, problem = problem_of(response)
        assert status == 408, response
        assert headers["content-type"].startswith("application/problem+json")
        assert headers["connection"] == "close"
        assert problem["code"] == "body_timeout" and problem["retryable"] is True
        assert 1.0 - 0.1 <= took <= 1.0 + SLACK, took
        # Nothing ran; the same command id then goes through in full.
        assert await s.t.get(Account, "slow").balance() == 0
        http = s.http()
        done = await http.post(
            "/actors/Account/slow/deposit", json={"cents": 5}, headers={"Idempotency-Key": key}
        )
        assert (done.status_code, done.json()) == (200, 5), done.text


async def test_client_disconnect_mid_body_logs_at_debug(
    served: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="akter.http")
    async with served(ACTORS, auth=None) as s:
        key = await s.mint()
        async with raw(s.url) as (_, writer):
            writer.write(post_head("/actors/Account/gone/deposit", 100, **{"Idempotency-Key": key}))
            writer.write(b'{"cents": 5')
            await writer.drain()
        # The client is gone; the app notices when it next reads the body.
        disconnected = await until(
            lambda: [r for r in caplog.records if "disconnected" in r.getMessage()],
            what="the disconnect's log line",
        )
        assert [r.levelno for r in disconnected] == [logging.DEBUG]
        assert "gone" in disconnected[0].getMessage()
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert await s.t.get(Account, "gone").balance() == 0


def test_slow_headers_are_cut(akter_db: str) -> None:
    port = free_port()
    argv = [
        *with_port(readme_command("akter serve"), port),
        "--headers-timeout",
        "1",
        "--body-timeout",
        "1",
    ]
    with example_server(akter_db, argv, port) as child:
        asyncio.run(_slow_heads(child.url))
    assert KEYS  # the child signed callers in with these keys


async def _slow_heads(url: str) -> None:
    # A head trickled byte by byte: cut with a 408 about a second after the connection opened.
    head = post_head("/actors/Account/alice/deposit", 2, **ALICE)
    async with raw(url) as (reader, writer):
        sending = asyncio.create_task(trickle(writer, head))
        response, took = await answer(reader, 1.0 + SLACK)
        sending.cancel()
    status, headers, problem = problem_of(response)
    assert status == 408, response
    assert headers["connection"] == "close"
    assert problem["code"] == "headers_timeout"
    assert 1.0 - 0.1 <= took <= 1.0 + SLACK, took
    # A connection that sends nothing at all is cut the same way.
    async with raw(url) as (reader, _):
        response, took = await answer(reader, 1.0 + SLACK)
    assert problem_of(response)[0] == 408 and took <= 1.0 + SLACK
    # The body bound holds under `akter serve` too.
    async with raw(url) as (reader, writer):
        writer.write(post_head("/actors/Rates/_/queries/rate", 40))
        sending = asyncio.create_task(trickle(writer, b'{"currency": "EUR"}' + b" " * 21))
        response, took = await answer(reader, 1.0 + SLACK)
        sending.cancel()
    assert problem_of(response)[:1] == (408,) and problem_of(response)[2]["code"] == "body_timeout"
    # A request whose head arrived is not cut by the headers bound: a feed stays open.
    async with raw(url) as (reader, writer):
        writer.write(b"GET /actors/Rates/_/events HTTP/1.1\r\nHost: test\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert first.startswith(b"HTTP/1.1 200"), first
        with pytest.raises(TimeoutError):
            # Still open two header bounds later (a cut would read as EOF here).
            await asyncio.wait_for(reader.read(), 2.0)
    # A prompt client is served as before.
    async with raw(url) as (reader, writer):
        body = b'{"currency": "EUR"}'
        writer.write(post_head("/actors/Rates/_/queries/rate", len(body)) + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
        assert head.startswith(b"HTTP/1.1 200"), head
