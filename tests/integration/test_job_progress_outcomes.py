"""The job-progress close tells how the job ended; a job no row names is refused (semantics §5.11).

Readers come before, during and after a job's end: live (the settle's outcome rides on the close),
late (the outcome is read from the trace the end left: the route intent, then its receipt, or the
dead letter), at the very moment it ends (between the subscription and the first look at the
rows), and for jobs that never existed (``unknown_job``: an ``ActorError`` in-process, 404 on
HTTP). Ordering comes from gates and the harness's passes, never from sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

import akter
import akter.http
import akter.jobs
from akter._engine.jobs.progress import ProgressStreams
from akter._ids import mint_command_id
from akter.http.problems import status_of
from akter.testing import ActorTest
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

GATE = asyncio.Event()


class Mode(BaseModel):
    fail: bool = False


class Log(BaseModel):
    routes: list[str] = Field(default_factory=list)


class Ender(akter.Actor[Log], access=akter.public):
    @akter.command
    async def start(self, fail: bool = False, key: str | None = None) -> str:
        return self.enqueue(Ender.work, Mode(fail=fail), key=key)

    @akter.command
    async def start_bare(self) -> str:
        return self.enqueue(Ender.bare, Mode())

    @akter.command
    async def cancel(self, key: str) -> None:
        self.cancel_job(key)

    @akter.query
    async def routes(self) -> list[str]:
        return self.state.routes

    @akter.job(attempts=1, timeout=20)
    async def work(call: akter.JobCall, payload: Mode) -> int:
        await GATE.wait()
        if payload.fail:
            raise RuntimeError("the provider refused")
        return 1

    @work.on_success
    async def worked(self, value: int) -> None:
        self.state.routes.append("success")

    @work.on_dead_letter
    async def work_dead(self, letter: akter.DeadLetter[Mode]) -> None:
        self.state.routes.append("dead_letter")

    @work.on_cancelled
    async def work_cancelled(self, report: akter.jobs.Cancelled[Mode, int]) -> None:
        self.state.routes.append("cancelled")

    @akter.job(attempts=1, timeout=20)
    async def bare(call: akter.JobCall, payload: Mode) -> int:
        await GATE.wait()
        return 1


@pytest.fixture(autouse=True)
def gate() -> None:
    global GATE
    GATE = asyncio.Event()


async def read_all(stream: Any) -> list[dict[str, Any]]:
    return [message async for message in stream]


async def closing(t: ActorTest, actor_id: str, job_id: str) -> dict[str, Any]:
    messages = await asyncio.wait_for(read_all(t.get(Ender, actor_id).progress(job_id)), 10)
    assert messages and messages[-1]["closed"] is True
    return messages[-1]


async def test_a_job_that_never_existed_is_refused_in_process_and_over_http(
    akter_test: Make,
) -> None:
    async with akter_test([Ender], relay=False) as t:
        never = mint_command_id(int(time.time() * 1000), 60_000)
        with pytest.raises(akter.ActorError) as refused:
            await anext(aiter(t.get(Ender, "a").progress(never)))
        assert (refused.value.reason, refused.value.code) == ("InvalidInput", "unknown_job")
        assert status_of(refused.value) == 404 and never in refused.value.message
        transport = httpx.ASGITransport(akter.http.app(t.runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answer = await http.get(f"/actors/Ender/a/jobs/{never}/progress")
            document = (await http.get("/openapi.json")).json()
            # A feed's path answers other methods 405, not the command route's 404.
            for feed in (f"/actors/Ender/a/jobs/{never}/progress", "/actors/Ender/a/events"):
                wrong = await http.post(feed, json={}, headers={"Idempotency-Key": never})
                assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET"), wrong.text
                assert wrong.json()["code"] == "method_not_allowed"
        route = document["paths"]["/actors/Ender/{id}/jobs/{job_id}/progress"]["get"]
        assert "unknown_job" in route["responses"]["404"]["description"]
        assert "outcome" in route["responses"]["200"]["description"]
        assert answer.status_code == 404
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["code"] == "unknown_job"
        assert t.runtime._jobs.progress.subscribers(never) == 0


async def test_ended_jobs_close_at_once_with_the_outcome_their_trace_tells(
    akter_test: Make,
) -> None:
    async with akter_test([Ender], relay=False) as t:
        GATE.set()
        ok = await t.get(Ender, "s").start()
        doomed = await t.get(Ender, "d").start(fail=True)
        assert await t.runtime._jobs.run_pass() == 2  # run and settle; the relay delivers nothing
        await t.wait_idle()
        streams: ProgressStreams = t.runtime._progress_streams
        pending = await streams.trace(t.get(Ender, "s").ref, ok)
        assert pending is not None and pending.row_kind == "intent"  # the route waits
        assert (await closing(t, "s", ok))["outcome"] == "succeeded"
        assert (await closing(t, "d", doomed))["outcome"] == "dead_lettered"
        await t.advance(0)  # deliver the routes: the trace is now their receipts
        assert await t.get(Ender, "s").routes() == ["success"]
        delivered = await streams.trace(t.get(Ender, "s").ref, ok)
        assert delivered is not None and delivered.row_kind is None
        assert delivered.receipt_command == "worked"
        late = await closing(t, "s", ok)
        assert late == {
            "ref": {"tenant": "default", "type": "Ender", "id": "s"},
            "job_id": ok,
            "attempt": None,
            "closed": True,
            "outcome": "succeeded",
        }
        assert (await closing(t, "d", doomed))["outcome"] == "dead_lettered"
        # The same job under another actor is unknown there.
        with pytest.raises(akter.ActorError, match="no job"):
            await anext(aiter(t.get(Ender, "other").progress(ok)))


async def test_a_job_cancelled_while_running_closes_cancelled_live_and_late(
    akter_test: Make,
) -> None:
    async with akter_test([Ender], relay=False) as t:
        handle = t.get(Ender, "c")
        job_id = await handle.start(key="k-1")
        assert await t.runtime._jobs.run_pass() == 1  # the attempt waits at the gate
        live = asyncio.create_task(read_all(handle.progress(job_id)))
        await asyncio.wait_for(_subscribed(t, job_id), 10)
        await handle.cancel("k-1")
        await t.wait_idle()
        messages = await asyncio.wait_for(live, 10)
        assert messages[-1]["outcome"] == "cancelled" and messages[-1]["attempt"] == 1
        assert (await closing(t, "c", job_id))["outcome"] == "cancelled"
        await t.advance(0)
        assert await handle.routes() == ["cancelled"]
        assert (await closing(t, "c", job_id))["outcome"] == "cancelled"


async def test_a_live_reader_hears_the_settle_outcome_even_without_a_route(
    akter_test: Make,
) -> None:
    async with akter_test([Ender], relay=False) as t:
        handle = t.get(Ender, "b")
        bare = await handle.start_bare()
        doomed = await handle.start(fail=True)
        assert await t.runtime._jobs.run_pass() == 2
        readers = [asyncio.create_task(read_all(handle.progress(j))) for j in (bare, doomed)]
        await asyncio.wait_for(_subscribed(t, bare, doomed), 10)
        GATE.set()
        await t.wait_idle()
        first, second = await asyncio.wait_for(asyncio.gather(*readers), 10)
        assert (first[-1]["outcome"], second[-1]["outcome"]) == ("succeeded", "dead_lettered")
        # Once ended, the job without a route left no row: it cannot be told from one that
        # never existed, and is refused the same way.
        with pytest.raises(akter.ActorError) as refused:
            await anext(aiter(handle.progress(bare)))
        assert refused.value.code == "unknown_job"


@pytest.mark.parametrize("routed", [True, False])
async def test_a_job_that_ends_while_the_reader_connects_still_closes_with_its_outcome(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch, routed: bool
) -> None:
    async with akter_test([Ender], relay=False) as t:
        handle = t.get(Ender, "r")
        job_id = await (handle.start() if routed else handle.start_bare())
        assert await t.runtime._jobs.run_pass() == 1
        read = ProgressStreams.trace
        looks = 0

        async def end_first(self: ProgressStreams, ref: akter.ActorRef, job: str) -> Any:
            # Subscribed, not yet looked at the rows: the job ends exactly now.
            nonlocal looks
            looks += 1
            if looks == 1:
                GATE.set()
                await t.wait_idle()
            return await read(self, ref, job)

        monkeypatch.setattr(ProgressStreams, "trace", end_first)
        messages = await asyncio.wait_for(read_all(handle.progress(job_id)), 10)
        assert looks >= 1
        assert messages[-1]["closed"] is True and messages[-1]["outcome"] == "succeeded"
        assert messages[-1]["attempt"] == 1  # the close the settle published, not a late one


async def _subscribed(t: ActorTest, *job_ids: str) -> None:
    await until(lambda: all(t.runtime._jobs.progress.subscribers(j) == 1 for j in job_ids))
