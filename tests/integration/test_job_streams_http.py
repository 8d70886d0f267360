"""Job output streams over HTTP and the typed client: resume by seq, scoping, refusals.

The SSE route answers refusals before the stream starts (problem details); a stream read with
``Last-Event-ID`` resumes after that seq; the async client reconnects after a dropped connection
without missing or repeating an item; the sync client reads the same items from a real server;
another tenant's or actor's job id is refused exactly like one that never existed (no oracle).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field
from starlette.requests import Request

import akter
import akter.http
from akter._ids import mint_command_id
from akter.client import Client, SyncClient
from akter.http.auth import Identity
from akter.job_streams import AttemptStarted, Chunk, Closed, StreamItem
from akter.testing import ActorTest
from tests.integration.live_serving import serving

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Words(BaseModel):
    words: list[str] = Field(default_factory=list)


class Nothing(BaseModel):
    pass


class Speaker(akter.Actor[Nothing], access=akter.public):
    @akter.command
    async def speak(self, words: list[str]) -> str:
        return self.enqueue(Speaker.say, Words(words=words))

    @akter.job(attempts=1, timeout=20)
    async def say(call: akter.JobCall, words: Words) -> int:
        for word in words.words:
            call.stream(word)
        return len(words.words)


async def by_header(request: Request) -> Identity:
    """A test provider: the tenant is the ``X-Test-Tenant`` header (never do this for real)."""
    return Identity(akter.Anonymous(), request.headers.get("x-test-tenant", "default"))


def shape(items: list[StreamItem]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        match item:
            case AttemptStarted(_, attempt):
                out.append({"attempt": attempt})
            case Chunk(_, _, data):
                out.append(data)
            case Closed(_, outcome):
                out.append(outcome)
    return out


async def frames(http: httpx.AsyncClient, path: str, **headers: str) -> list[tuple[str, str, Any]]:
    """Every (id, event, data) of one SSE response, until the server ends it."""
    found: list[tuple[str, str, Any]] = []
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        frame: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                frame[key] = value
            elif "data" in frame:
                found.append((frame["id"], frame["event"], json.loads(frame["data"])))
                frame = {}
    return found


async def finished(t: ActorTest, words: list[str], actor: str = "s1") -> str:
    job_id = await t.get(Speaker, actor).speak(words)
    await t.drain()
    return job_id


async def test_the_sse_route_resumes_after_last_event_id(akter_test: Make) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await finished(t, ["one", "two", "three"])
        transport = httpx.ASGITransport(akter.http.app(t.runtime, by_header))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            path = f"/actors/Speaker/s1/jobs/{job_id}/stream"
            whole = await frames(http, path)
            assert [(i, e) for i, e, _ in whole] == [
                ("1", "attempt"), ("2", "chunk"), ("3", "chunk"), ("4", "chunk"), ("5", "closed")
            ]  # fmt: skip
            assert whole[1][2] == {"seq": 2, "type": "chunk", "attempt": 1, "data": "one"}
            assert whole[4][2] == {"seq": 5, "type": "closed", "outcome": "succeeded", "attempt": 1}
            rest = await frames(http, path, **{"Last-Event-ID": "3"})
            assert rest == whole[3:]
            assert await frames(http, path + "?after=4") == whole[4:]
            for bad_cursor in ("x", "-1", "01", str(2**63), ""):
                bad = await http.get(path, headers={"Last-Event-ID": bad_cursor})
                assert (bad.status_code, bad.json()["reason"]) == (400, "UnknownCursor")
                bad = await http.get(path, params={"after": bad_cursor})
                assert (bad.status_code, bad.json()["reason"]) == (400, "UnknownCursor")
            for beyond in ("6", str(2**63 - 1)):  # past the close: not a seq of this stream
                bad = await http.get(path, headers={"Last-Event-ID": beyond})
                assert (bad.status_code, bad.json()["code"]) == (400, "beyond_end")
            # Resumed after the close (a browser's EventSource reconnects): the close again.
            assert await frames(http, path, **{"Last-Event-ID": "5"}) == whole[4:]


async def test_another_tenants_or_actors_job_is_refused_like_one_never_enqueued(
    akter_test: Make,
) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await t.get(Speaker, "s1", tenant="acme").speak(["secret"])
        await t.drain()
        never = mint_command_id(int(time.time() * 1000), 60_000)
        refusals = {}
        for name, handle, asked in (
            ("other tenant", t.get(Speaker, "s1", tenant="globex"), job_id),
            ("other actor", t.get(Speaker, "s2", tenant="acme"), job_id),
            ("never existed", t.get(Speaker, "s2", tenant="acme"), never),
        ):
            with pytest.raises(akter.ActorError) as refused:
                await anext(aiter(handle.job_stream(asked)))
            error = refused.value
            text = (
                error.message.replace("'s1'", "'s2'").replace(job_id, "<j>").replace(never, "<j>")
            )
            refusals[name] = (error.reason, error.code, text)
        assert refusals["other tenant"] == refusals["other actor"] == refusals["never existed"]
        assert refusals["never existed"][:2] == ("InvalidInput", "unknown_job")

        transport = httpx.ASGITransport(akter.http.app(t.runtime, by_header))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answers = {}
            for name, tenant, actor_id, asked in (
                ("other tenant", "globex", "s1", job_id),
                ("other actor", "acme", "s2", job_id),
                ("never existed", "acme", "s2", never),
            ):
                answer = await http.get(
                    f"/actors/Speaker/{actor_id}/jobs/{asked}/stream",
                    headers={"X-Test-Tenant": tenant},
                )
                body = answer.json()
                body["detail"] = (
                    body["detail"]
                    .replace("'s1'", "'s2'")
                    .replace(job_id, "<j>")
                    .replace(never, "<j>")
                )
                body.pop("instance", None)
                answers[name] = (answer.status_code, body)
            assert answers["other tenant"] == answers["other actor"] == answers["never existed"]
            assert answers["never existed"][0] == 404
            own = await frames(http, f"/actors/Speaker/s1/jobs/{job_id}/stream", **{
                "X-Test-Tenant": "acme"
            })  # fmt: skip
            assert [data.get("data") for _, _, data in own] == [None, "secret", None]


class Dropping(httpx.AsyncBaseTransport):
    """ASGI transport whose first stream response breaks after ``keep`` frames."""

    def __init__(self, inner: httpx.ASGITransport, keep: int) -> None:
        self.inner = inner
        self.keep = keep
        self.cursors: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/stream"):
            return response
        self.cursors.append(request.headers.get("last-event-id"))
        if len(self.cursors) > 1:
            return response
        body = b"".join([part async for part in response.stream])  # type: ignore[union-attr]
        kept = b"".join(frame + b"\n\n" for frame in body.split(b"\n\n")[: self.keep])

        async def broken() -> AsyncIterator[bytes]:
            yield kept
            raise httpx.ReadError("connection reset by peer")

        return httpx.Response(
            response.status_code, headers=response.headers, stream=_Stream(broken())
        )


class _Stream(httpx.AsyncByteStream):
    def __init__(self, parts: AsyncIterator[bytes]) -> None:
        self.parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.parts:
            yield part


async def test_the_async_client_resumes_after_a_dropped_connection(akter_test: Make) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await finished(t, ["a", "b", "c", "d"])
        app = akter.http.app(t.runtime, by_header)
        dropping = Dropping(httpx.ASGITransport(app), keep=3)
        async with Client("http://test", transport=dropping) as client:
            handle = client.get(Speaker, "s1")
            items = [item async for item in handle.job_stream(job_id)]
        assert shape(items) == [{"attempt": 1}, "a", "b", "c", "d", "succeeded"]
        assert [item.seq for item in items] == [1, 2, 3, 4, 5, 6]
        assert dropping.cursors == ["0", "3"]


async def test_the_sync_client_reads_a_stream_and_resumes_by_cursor(akter_test: Make) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await finished(t, ["x", "y"])
        async with serving(akter.http.app(t.runtime, by_header)) as address:

            def read(after: int) -> list[StreamItem]:
                with SyncClient(f"http://{address}") as client:
                    return list(client.get(Speaker, "s1").job_stream(job_id, after=after))

            whole = await asyncio.to_thread(read, 0)
            rest = await asyncio.to_thread(read, 2)
        assert shape(whole) == [{"attempt": 1}, "x", "y", "succeeded"]
        assert rest == whole[2:]
