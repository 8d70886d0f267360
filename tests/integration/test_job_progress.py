"""Conformance: job progress frames (JB-28, semantics §5.11) on a real PostgreSQL.

Frames are reported by a scripted executor; they are read in-process (``job_progress``) and on
the SSE route served by a real uvicorn server on loopback, at the same time. Ordering comes from
barriers (the executor waits on a gate the test opens once it has seen a frame), never from
sleeps; the only timing asserted is the publication interval, with a small tolerance.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Field

import akter
import akter.http
from akter._engine.jobs.progress import MAX_FRAME_BYTES, ProgressHub
from akter.callers import ActorRef
from akter.testing import ActorTest
from tests._support import until
from tests.integration.live_serving import serving

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: Written into every valid frame: it must never reach a table.
MARK = "progress-frame-marker-5f1c"
EVERY = 0.1
#: Slack on the publication interval (the monotonic clock's and the event loop's resolution).
TOLERANCE = 0.001


class Pct(BaseModel):
    done: int = Field(ge=0)
    note: str = ""


class Work(BaseModel):
    frames: int


class Results(BaseModel):
    values: list[int] = Field(default_factory=list)


@dataclass
class Control:
    """What the executors wait on and leave behind, fresh for every test."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[akter.JobCall] = field(default_factory=list)


CONTROL = Control()


def _access(caller: akter.Caller, ref: ActorRef, member: str, kind: str) -> bool:
    """Public, except the progress of actor "secret"."""
    return not (kind == "progress" and ref.id == "secret")


class Reporter(akter.Actor[Results], access=_access):
    @akter.command
    async def start(self, frames: int) -> str:
        return self.enqueue(Reporter.work, Work(frames=frames))

    @akter.command
    async def start_plain(self) -> str:
        return self.enqueue(Reporter.plain, Work(frames=1))

    @akter.query
    async def values(self) -> list[int]:
        return self.state.values

    @akter.job(attempts=1, timeout=20, progress=Pct, progress_every=EVERY)
    async def work(call: akter.JobCall, payload: Work) -> int:
        CONTROL.calls.append(call)
        for i in range(1, payload.frames + 1):  # a burst: the first is published, the last wins
            call.report(Pct(done=i, note=MARK))
        call.report(Pct.model_construct(done=-1, note=MARK))  # fails the model: dropped
        call.report(Pct(done=0, note="x" * 5120))  # a 5 KiB frame: dropped
        # From another thread (a synchronous executor's case): accepted in order, still paced.
        await asyncio.to_thread(call.report, Pct(done=payload.frames + 1, note=MARK))
        await CONTROL.gate.wait()
        call.report(Pct(done=100, note=MARK))
        call.report(Pct(done=101, note=MARK))
        return payload.frames

    @work.on_success
    async def worked(self, value: int) -> None:
        self.state.values.append(value)

    @akter.job(attempts=1, timeout=20)
    async def plain(call: akter.JobCall, payload: Work) -> int:
        CONTROL.calls.append(call)
        call.report(Pct(done=1, note=MARK))  # the job declares no progress model: dropped
        return 1


@pytest.fixture(autouse=True)
def control() -> Iterator[Control]:
    global CONTROL
    CONTROL = Control()
    yield CONTROL


# --- helpers ----------------------------------------------------------------------------------


async def read_sse(http: httpx.AsyncClient, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (event, data) of an SSE response, until the server ends the stream."""
    events: list[tuple[str, dict[str, Any]]] = []
    async with http.stream("GET", path) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = "message"
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, json.loads(line.removeprefix("data: "))))
                event = "message"
    return events


@dataclass
class Reader:
    """An in-process reader of a job's progress, timing each message."""

    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    seen: dict[int, asyncio.Event] = field(default_factory=dict)

    def saw(self, seq: int) -> asyncio.Event:
        return self.seen.setdefault(seq, asyncio.Event())

    async def run(self, stream: AsyncIterator[dict[str, Any]]) -> None:
        async for message in stream:
            self.messages.append((time.monotonic(), message))
            if "seq" in message:
                self.saw(int(message["seq"])).set()


def timed_publications(
    hub: ProgressHub, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[float, dict[str, Any]]]:
    """Record when the hub publishes each message (pacing measured at the source)."""
    published: list[tuple[float, dict[str, Any]]] = []
    publish = hub.publish

    def timed(message: dict[str, Any]) -> None:
        published.append((time.monotonic(), message))
        publish(message)

    monkeypatch.setattr(hub, "publish", timed)
    return published


async def text_columns(t: ActorTest) -> str:
    """Every text-like value in every table of the test schema, as one string."""
    columns = await t.rows(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = %(schema)s "
        "AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'bytea')",
        {"schema": t.schema},
    )
    assert columns
    dumped: list[str] = []
    for column in columns:
        rows = await t.rows(
            f'SELECT "{column["column_name"]}"::text AS v FROM {{schema}}."{column["table_name"]}"'
        )
        dumped.extend(str(r["v"]) for r in rows if r["v"] is not None)
    return "\n".join(dumped)


# --- JB-28 ------------------------------------------------------------------------------------


async def test_JB28_frames_are_validated_coalesced_paced_and_served_on_sse(
    akter_test: Make,
    control: Control,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with akter_test([Reporter], relay=False) as t:
        runtime = t.runtime
        reporter = t.get(Reporter, "r1")
        job_id = await reporter.start(10)
        reader = Reader()
        async with (
            serving(akter.http.app(runtime)) as address,
            httpx.AsyncClient(base_url=f"http://{address}", timeout=15) as http,
        ):
            sse = asyncio.create_task(read_sse(http, f"/actors/Reporter/r1/jobs/{job_id}/progress"))
            local = asyncio.create_task(reader.run(runtime.job_progress(reporter.ref, job_id)))
            await until(lambda: runtime._jobs.progress.subscribers(job_id) == 2)
            publications = timed_publications(runtime._jobs.progress, monkeypatch)
            before = await t.now_ms()
            with caplog.at_level(logging.WARNING, logger="akter.progress"):
                assert await runtime._jobs.run_pass() == 1
                await asyncio.wait_for(reader.saw(11).wait(), 10)
                control.gate.set()
                await asyncio.wait_for(local, 10)
                streamed = await asyncio.wait_for(sse, 10)
            await runtime._jobs.wait_idle()
        messages = [m for _, m in reader.messages]
        ref = {"tenant": "default", "type": "Reporter", "id": "r1"}

        # Latest wins, seq counts accepted reports (dropped ones are not counted).
        *frames, closing = messages
        published = [(m["seq"], m["frame"]["done"]) for m in frames]
        assert published[:2] == [(1, 1), (11, 11)] and published[-1] == (13, 101)
        # Frames 2-10 lost to 11 (the same interval); 12 only shows when the gate opened late.
        assert set(published) <= {(1, 1), (11, 11), (12, 100), (13, 101)}
        for message in frames:
            assert set(message) == {
                "ref",
                "job_id",
                "job",
                "attempt",
                "seq",
                "lease_until",
                "frame",
            }
            assert (message["ref"], message["job_id"], message["job"]) == (ref, job_id, "work")
            assert message["attempt"] == 1 and message["frame"]["note"] == MARK
            assert isinstance(message["lease_until"], int) and message["lease_until"] > before
        # At most one frame per progress_every.
        times = [at for at, m in publications if "seq" in m]
        assert len(times) == len(frames)
        assert all(b - a >= EVERY - TOLERANCE for a, b in itertools.pairwise(times))
        # The close follows the last frame, after the terminal settle.
        closed = {"ref": ref, "job_id": job_id, "attempt": 1, "closed": True}
        assert closing == {**closed, "outcome": "succeeded"}

        # The SSE route served the same messages and ended after the close.
        assert [data for _, data in streamed] == messages
        assert [event for event, _ in streamed] == ["progress"] * len(frames) + ["closed"]

        # Dropped frames warned; none of them raised into the executor.
        dropped = {r.getMessage(): r for r in caplog.records if r.name == "akter.progress"}
        big = dropped["Progress frame dropped: larger than 4096 bytes"]
        assert big.bytes > MAX_FRAME_BYTES  # type: ignore[attr-defined]
        assert (big.job_id, big.attempt, big.job) == (job_id, 1, "work")  # type: ignore[attr-defined]
        assert "Progress frame dropped: it fails the job's progress model" in dropped

        # A report after the attempt ended is dropped with a warning and never raises.
        (call,) = control.calls
        with caplog.at_level(logging.WARNING, logger="akter.progress"):
            call.report(Pct(done=5, note=MARK))
        assert caplog.records[-1].getMessage() == "Progress frame dropped: the attempt has ended"

        # The job itself routed its result; no frame is stored anywhere.
        await t.advance(0)
        assert await reporter.values() == [10]
        dumped = await text_columns(t)
        assert "r1" in dumped and job_id in dumped  # the dump reads the rows ...
        assert MARK not in dumped  # ... and no frame is in any of them


async def test_JB28_a_job_without_a_progress_model_drops_frames_and_still_closes(
    akter_test: Make, control: Control, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Reporter], relay=False) as t:
        reporter = t.get(Reporter, "r2")
        job_id = await reporter.start_plain()
        reader = Reader()
        local = asyncio.create_task(reader.run(t.runtime.job_progress(reporter.ref, job_id)))
        await until(lambda: t.runtime._jobs.progress.subscribers(job_id) == 1)
        with caplog.at_level(logging.WARNING, logger="akter.progress"):
            await t.advance(0)
            await asyncio.wait_for(local, 10)
        assert [m for _, m in reader.messages] == [
            {
                "ref": {"tenant": "default", "type": "Reporter", "id": "r2"},
                "job_id": job_id,
                "attempt": 1,
                "closed": True,
                "outcome": "succeeded",  # the settle tells it; no route would tell it later
            }
        ]
        assert "Progress frame dropped: the job declares no progress model" in [
            r.getMessage() for r in caplog.records
        ]
        assert len(control.calls) == 1
        assert MARK not in await text_columns(t)


async def test_JB28_progress_route_refusals_and_ended_jobs(akter_test: Make) -> None:
    async with akter_test([Reporter], relay=False) as t:
        runtime = t.runtime
        CONTROL.gate.set()
        ended = await t.get(Reporter, "r3").start(1)
        bare = await t.get(Reporter, "r3").start_plain()
        await t.advance(0)
        transport = httpx.ASGITransport(akter.http.app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            # The actor's access policy decides on kind "progress" before the stream starts.
            denied = await http.get(f"/actors/Reporter/secret/jobs/{ended}/progress")
            assert denied.status_code in (401, 403)
            assert denied.json()["reason"] == "Unauthorized"
            malformed = await http.get("/actors/Reporter/r3/jobs/not-a-job-id/progress")
            assert 400 <= malformed.status_code < 500
            unknown_type = await http.get(f"/actors/Nope/r3/jobs/{ended}/progress")
            assert unknown_type.status_code == 404  # unknown_type, as on every actor route
            # A job that already ended closes at once, with the outcome its route tells.
            done = await http.get(f"/actors/Reporter/r3/jobs/{ended}/progress")
            assert done.status_code == 200
            assert done.text == (
                "event: closed\ndata: "
                + json.dumps(
                    {
                        "ref": {"tenant": "default", "type": "Reporter", "id": "r3"},
                        "job_id": ended,
                        "attempt": None,
                        "closed": True,
                        "outcome": "succeeded",
                    },
                    separators=(",", ":"),
                )
                + "\n\n"
            )
            # Another actor's job, and a job that ended leaving no row (no route), are unknown.
            for actor_id, job_id in (("someone-else", ended), ("r3", bare)):
                gone = await http.get(f"/actors/Reporter/{actor_id}/jobs/{job_id}/progress")
                assert gone.status_code == 404
                assert gone.headers["content-type"].startswith("application/problem+json")
                assert (gone.json()["reason"], gone.json()["code"]) == (
                    "InvalidInput",
                    "unknown_job",
                )
        assert runtime._jobs.progress.subscribers(ended) == 0
        assert runtime._jobs.progress.subscribers(bare) == 0


async def test_JB28_frames_reach_another_runner_with_notify(
    akter_test: Make, control: Control
) -> None:
    async with akter_test([Reporter], relay=False, notify=True) as t:
        viewer = await t.add_runtime(jobs=[])  # executes no job: it only serves progress
        reporter = t.get(Reporter, "r4")
        job_id = await reporter.start(3)
        reader = Reader()
        local = asyncio.create_task(
            reader.run(viewer.job_progress(ActorRef("default", "Reporter", "r4"), job_id))
        )
        await until(lambda: viewer._jobs.progress.subscribers(job_id) == 1)
        await asyncio.wait_for(viewer._jobs.progress.hearing.wait(), 10)
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(reader.saw(4).wait(), 10)
        control.gate.set()
        await asyncio.wait_for(local, 10)
        await t.wait_idle()
        messages = [m for _, m in reader.messages]
        seqs = [m.get("seq") for m in messages]
        assert seqs[:2] == [1, 4] and seqs[-2:] == [6, None] and set(seqs) <= {1, 4, 5, 6, None}
        assert messages[-1] == {
            "ref": {"tenant": "default", "type": "Reporter", "id": "r4"},
            "job_id": job_id,
            "attempt": 1,
            "closed": True,
            "outcome": "succeeded",  # from the settle on the other runner, through NOTIFY
        }
        assert all("origin" not in m for m in messages)
