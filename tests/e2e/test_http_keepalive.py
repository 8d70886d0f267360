"""Idle server-sent event feeds send a keep-alive comment, so proxies keep them open.

The period is :data:`akter.http._sse.KEEPALIVE_SECONDS` (15 s), shortened here. An idle event feed
sends ``: keep-alive`` lines, then the next event as usual; a job's progress feed does the same
while the job is quiet, then its frames and its close. The document states the period.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import httpx
import pytest

import akter.http._sse as sse
from tests.e2e.conftest import ACTORS, Account, Courier, CourierControl, Serve, token

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")


@pytest.fixture(autouse=True)
def _short_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.2)


async def lines_of(response: httpx.Response) -> AsyncIterator[str]:
    async for line in response.aiter_lines():
        yield line


async def until(lines: AsyncIterator[str], wanted: str, within: float = 5.0) -> list[str]:
    """Lines up to and including the first that starts with ``wanted``."""
    seen: list[str] = []
    async with asyncio.timeout(within):
        async for line in lines:
            seen.append(line)
            if line.startswith(wanted):
                return seen
    raise AssertionError(f"the feed ended before {wanted!r}: {seen}")


async def test_an_idle_event_feed_sends_keep_alive_comments(served: Serve) -> None:
    async with served() as s:
        http = s.http(ALICE)
        async with http.stream("GET", "/actors/Account/k1/events") as response:
            assert response.status_code == 200
            lines = lines_of(response)
            assert (await until(lines, ":")) == [": keep-alive"]
            assert (await until(lines, ":")) == ["", ": keep-alive"]
            await s.client(ALICE).get(Account, "k1").deposit(3)
            frame = await until(lines, "data:")
            assert [line for line in frame if line.startswith("event:")] == ["event: e2e.Deposited"]
            assert (await until(lines, ":"))[-1] == ": keep-alive"
        spec = (await http.get("/openapi.json")).json()
        feed = spec["paths"]["/actors/Account/{id}/events"]["get"]
        assert "every 15 s" in feed["responses"]["200"]["description"]


async def test_a_quiet_progress_feed_sends_keep_alive_then_its_frames(
    served: Serve, courier: CourierControl
) -> None:
    async with served([*ACTORS, Courier]) as s:
        job_id = await s.t.get(Courier, "c-9", tenant="acme").haul(1)
        http = s.http(ALICE)
        path = f"/actors/Courier/c-9/jobs/{job_id}/progress"
        async with http.stream("GET", path) as response:
            assert response.status_code == 200
            lines = lines_of(response)
            await until(lines, ": keep-alive")
            await until(lines, ": keep-alive")
            courier.permits.put_nowait(None)
            assert "event: progress" in await until(lines, "event: progress")
            rest = [line async for line in lines]
            assert "event: closed" in rest


async def test_keep_alive_passes_frames_and_errors_through_and_stops_its_pump() -> None:
    stopped = asyncio.Event()

    async def frames() -> AsyncIterator[str]:
        try:
            yield "a"
            await asyncio.sleep(0.5)
            yield "b"
            raise RuntimeError("source failed")
        finally:
            stopped.set()

    got: list[str] = []
    with pytest.raises(RuntimeError, match="source failed"):
        async for frame in sse.keep_alive(frames()):
            got.append(frame)
    assert got[0] == "a" and got[-1] == "b" and sse.KEEPALIVE in got
    assert stopped.is_set()

    async def endless() -> AsyncIterator[str]:
        try:
            while True:
                await asyncio.sleep(10)
                yield "never"
        finally:
            stopped.set()

    stopped.clear()
    feed = cast(AsyncGenerator[str, None], sse.keep_alive(endless()))
    assert await anext(feed) == sse.KEEPALIVE
    await feed.aclose()  # a client that went away: the pump is cancelled
    assert stopped.is_set()
