"""Job output streams over the app's WebSocket: the ``job_stream`` subscription kind.

The socket serves what the SSE route serves (docs/guides/job-streams.md): the items after a seq,
ending after the close, the same refusal for another tenant's job as for one never enqueued, and
the typed client's socket handle reads the stream as the HTTP handle does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import akter
import akter.http
from akter._ids import mint_command_id
from akter.client import Client
from akter.testing import ActorTest
from tests.integration.live_serving import answer_to, by_header, send, serving, socket
from tests.integration.test_job_streams_http import Speaker, finished, shape

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


async def items_of(ws: Any, message_id: str) -> list[dict[str, Any]]:
    """The ``job_stream`` items of one subscription, until it is closed."""
    found: list[dict[str, Any]] = []
    while True:
        message = await answer_to(ws, message_id, {"job_stream", "closed", "error"})
        if message["type"] != "job_stream":
            assert message["type"] == "closed", message
            return found
        found.append(message["item"])


async def test_a_job_stream_over_the_socket_resumes_after_a_seq(akter_test: Make) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await finished(t, ["one", "two"])
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            async with socket(address) as ws:
                await send(ws, type="subscribe", id="j", kind="job_stream", actor="Speaker",
                           actor_id="s1", job_id=job_id)  # fmt: skip
                await answer_to(ws, "j", {"subscribed"})
                whole = await items_of(ws, "j")
                assert [item["type"] for item in whole] == ["attempt", "chunk", "chunk", "closed"]
                assert whole[1] == {"seq": 2, "type": "chunk", "attempt": 1, "data": "one"}
                await send(ws, type="subscribe", id="k", kind="job_stream", actor="Speaker",
                           actor_id="s1", job_id=job_id, after=2)  # fmt: skip
                await answer_to(ws, "k", {"subscribed"})
                assert await items_of(ws, "k") == whole[2:]
                for bad in (-1, "2", True):
                    await send(ws, type="subscribe", id="x", kind="job_stream", actor="Speaker",
                               actor_id="s1", job_id=job_id, after=bad)  # fmt: skip
                    refused = await answer_to(ws, "x", {"error"})
                    assert refused["problem"]["code"] == "malformed_message"
            async with Client(f"http://{address}", headers={"X-Test-User": "u"}) as remote:
                async with remote.connect() as live:
                    items = [item async for item in live.get(Speaker, "s1").job_stream(job_id)]
                    assert shape(items) == [{"attempt": 1}, "one", "two", "succeeded"]


async def test_another_tenants_job_stream_is_refused_like_one_never_enqueued(
    akter_test: Make,
) -> None:
    async with akter_test([Speaker]) as t:
        job_id = await t.get(Speaker, "s1", tenant="acme").speak(["secret"])
        await t.drain()
        answers: dict[str, Any] = {}
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            for name, tenant, asked in (
                ("other tenant", "globex", job_id),
                ("never existed", "acme", mint_command_id(int(time.time() * 1000), 60_000)),
            ):
                async with socket(address, tenant=tenant) as ws:
                    await send(ws, type="subscribe", id="j", kind="job_stream",
                               actor="Speaker", actor_id="s1", job_id=asked)  # fmt: skip
                    answers[name] = (await answer_to(ws, "j", {"error", "subscribed"}))["problem"]
        assert answers["other tenant"]["code"] == "unknown_job"
        assert {k: v for k, v in answers["other tenant"].items() if k != "detail"} == {
            k: v for k, v in answers["never existed"].items() if k != "detail"
        }
