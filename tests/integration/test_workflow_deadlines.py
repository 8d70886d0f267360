"""A workflow's deadline and its cancellation at a job step (issue 38, findings 1 and 2).

- ``timeout=`` bounds every suspension: a signal wait without a timeout, a job step and a sleep
  longer than the deadline all wake at the deadline (the wake time is capped), and the default
  30-day timeout is enforced too. Expiry cancels exactly like ``run.cancel()`` (W3).
- Cancelling (or timing out) a run at a job step cancels its job as a turn's ``cancel_job``
  does (semantics §5.8): a job that never ran is deleted and never runs; an attempted one is
  settled once, with honest ambiguity. The job's final outcome is recorded on the run's step
  (the ``cancel`` record that took the job step's place), where ``run.status()``, the step
  feed, the console and ``v_workflow_steps`` show it.

Clock jumps move the runtime's framework clock (``ActorTest.advance``, or :func:`jump` while a
job attempt hangs, which ``advance``'s drain would wait for).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.http.console.workflows import detail_json
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, gate, hang, succeed
from tests._support import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

PROVIDER = FakeProvider()
DAY_S = 86_400


class Sig(BaseModel):
    n: int = 0


class Pay(BaseModel):
    n: int


class BillState(BaseModel):
    marks: list[str] = []


class Bill(akter.Actor[BillState]):
    @akter.command
    async def mark(self, text: str) -> int:
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.job(attempts=1, timeout=30, concurrency=1)
    async def charge(call: akter.JobCall, payload: Pay) -> str:
        return str(await PROVIDER(call))

    @akter.workflow(timeout=timedelta(seconds=2))
    async def awaits_signal(wf: akter.Workflow) -> str:
        await wf.wait(Sig)
        return "signalled"

    @akter.workflow(timeout=timedelta(seconds=2))
    async def long_sleep(wf: akter.Workflow) -> str:
        await wf.sleep(timedelta(hours=1))
        return "woke"

    @akter.workflow(timeout=timedelta(seconds=2))
    async def slow_to_compensate(wf: akter.Workflow) -> str:
        try:
            await wf.wait(Sig)
        except akter.WorkflowCancelled:
            await wf.sleep(timedelta(seconds=60))  # compensation may suspend past the deadline
            await wf.get(Bill, wf.ref.id).mark("compensated")
            raise
        return "signalled"

    @akter.workflow
    async def forever(wf: akter.Workflow) -> str:
        await wf.wait(Sig)
        return "signalled"

    @akter.workflow
    async def charged(wf: akter.Workflow, n: int) -> str:
        try:
            return await wf.job(Bill.charge, Pay(n=n))
        except akter.WorkflowCancelled:
            await wf.get(Bill, wf.ref.id).mark(f"refund {n}")
            raise

    @akter.workflow(timeout=timedelta(seconds=2))
    async def charged_briefly(wf: akter.Workflow, n: int) -> str:
        try:
            return await wf.job(Bill.charge, Pay(n=n))
        except akter.WorkflowCancelled:
            await wf.get(Bill, wf.ref.id).mark(f"refund {n}")
            raise


@pytest.fixture(autouse=True)
def provider() -> Iterator[FakeProvider]:
    PROVIDER.reset()
    yield PROVIDER
    PROVIDER.reset()


async def run_row(t: ActorTest, run_id: str) -> dict[str, Any]:
    (row,) = await t.rows("SELECT * FROM {schema}.workflows WHERE run_id = %(id)s", {"id": run_id})
    return row


async def status_of(t: ActorTest, run_id: str) -> str:
    return str((await run_row(t, run_id))["status"])


async def jump(t: ActorTest, seconds: float) -> None:
    """Move the framework clock forward without draining (a job attempt may hang)."""
    ms = int(seconds * 1000)
    runtime = t.runtime
    await runtime._workflow_engine.wait_idle()
    runtime._clock.jumping = True
    try:
        await runtime._jobs.shift(ms)
        runtime._clock.offset_ms += ms
    finally:
        runtime._clock.jumping = False
    runtime._relay.wake()


async def cancelled_and_recorded(t: ActorTest, run_id: str) -> dict[str, Any]:
    """Wait until the run is cancelled and its job step's outcome is recorded; that record."""

    async def check() -> dict[str, Any] | None:
        rows = await t.rows(
            "SELECT w.status, s.seq, s.kind, s.name, s.status AS step_status, s.detail,"
            " s.outcome FROM {schema}.workflows w JOIN {schema}.workflow_steps s"
            " ON s.routing_key = w.routing_key AND s.run_id = w.run_id"
            " WHERE w.run_id = %(id)s AND s.seq = 0",
            {"id": run_id},
        )
        if rows and rows[0]["status"] == "cancelled" and rows[0]["outcome"] is not None:
            return rows[0]
        return None

    found: dict[str, Any] | None = await until(
        check, what="the run cancelled with its job's outcome recorded"
    )
    assert found is not None
    return found


def the_job_id(record: dict[str, Any]) -> str:
    return str(json.loads(str(record["detail"]))["job_id"])


# --- finding 1: the deadline bounds every suspension ---------------------------------------------


async def test_workflow_timeout_fires_while_waiting_for_a_signal(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        run = await t.get(Bill, "b-1").awaits_signal.start()
        await t.drain()
        row = await run_row(t, run.id)
        assert row["status"] == "suspended"
        assert row["wake_at_ms"] == row["deadline_ms"]  # a wait without timeout: the deadline
        await t.advance(3)
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await run.result(timeout=10)
        steps = (await run.status()).steps
        assert [(s.seq, s.kind, s.status) for s in steps] == [(0, "cancel", "done")]


async def test_workflow_timeout_caps_a_long_sleep(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        run = await t.get(Bill, "b-2").long_sleep.start()
        await t.drain()
        row = await run_row(t, run.id)
        assert row["status"] == "suspended"
        assert row["wake_at_ms"] == row["deadline_ms"]  # not the hour the sleep asked for
        await t.advance(3)
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await run.result(timeout=10)


async def test_a_compensation_may_suspend_past_the_deadline(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        order = t.get(Bill, "b-12")
        run = await order.slow_to_compensate.start()
        await t.drain()
        await t.advance(3)  # timed out: the compensation sleeps for a minute
        row = await run_row(t, run.id)
        assert row["status"] == "suspended"
        assert row["wake_at_ms"] > row["deadline_ms"] + 50_000  # its own wake time, not capped
        assert row["attempts"] == 2  # no claim loop at the passed deadline
        await t.advance(61)
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await run.result(timeout=10)
        assert await order.marks() == ["compensated"]


async def test_default_workflow_timeout_is_enforced(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        run = await t.get(Bill, "b-3").forever.start()
        await t.drain()
        row = await run_row(t, run.id)
        assert row["deadline_ms"] - row["started_at_ms"] == 30 * DAY_S * 1000
        assert row["wake_at_ms"] == row["deadline_ms"]
        await t.advance(29 * DAY_S)
        assert await status_of(t, run.id) == "suspended"
        await t.advance(DAY_S + 1)
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await run.result(timeout=10)


async def test_workflow_timeout_fires_while_a_job_step_runs(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        PROVIDER.script(hang())
        order = t.get(Bill, "b-4")
        run = await order.charged_briefly.start(4)
        (call,) = await PROVIDER.wait_calls(1)
        await until(lambda: status_of(t, run.id), holds=lambda s: s == "suspended")
        assert (await run_row(t, run.id))["wake_at_ms"] == (await run_row(t, run.id))["deadline_ms"]
        await jump(t, 3)
        record = await cancelled_and_recorded(t, run.id)
        assert (record["kind"], record["name"], record["step_status"]) == (
            "cancel",
            "cancel",
            "done",
        )
        assert the_job_id(record) == call.job_id
        outcome = json.loads(str(record["outcome"]))["cancelled"]
        assert outcome["attempts"] == 1
        assert outcome["outcome"]["kind"] == "Unknown"  # interrupted: it may have applied
        assert outcome["ambiguous"] is True
        assert PROVIDER.calls_for(call.job_id)[0].outcome == "interrupted"
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await run.result(timeout=10)
        await t.drain()
        assert await order.marks() == ["refund 4"]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []


# --- finding 2: a cancel at a job step cancels the job and records its outcome ------------------


async def test_cancel_at_a_job_step_never_starts_a_queued_job(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        first = gate("ch_a")
        PROVIDER.script(first, succeed("ch_b"))
        a = await t.get(Bill, "b-5a").charged.start(1)
        await PROVIDER.wait_calls(1)
        b_order = t.get(Bill, "b-5b")
        b = await b_order.charged.start(2)
        # B's job is staged behind concurrency=1 while A's attempt holds the only slot.
        await until(lambda: status_of(t, b.id), holds=lambda s: s == "suspended")
        queued = await t.rows(
            "SELECT intent_id, attempts, running FROM {schema}.outbox WHERE kind = 'job'"
            " AND actor_id = 'b-5b'"
        )
        assert [(r["attempts"], r["running"]) for r in queued] == [(0, False)]
        await b.cancel()
        with pytest.raises(akter.WorkflowCancelled):
            await b.result(timeout=10)
        first.release()
        assert await a.result(timeout=10) == "ch_a"
        await t.drain()
        assert PROVIDER.count == 1  # B's job never ran
        assert await b_order.marks() == ["refund 2"]
        record = (await b.status()).steps[0]
        assert (record.kind, record.status) == ("cancel", "done")
        assert json.loads(str(record.detail))["job_id"] == queued[0]["intent_id"]
        report = record.outcome["cancelled"]
        assert report["attempts"] == 0
        assert report["outcome"]["kind"] == "Failed"
        assert report["ambiguous"] is False
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


async def test_cancel_at_a_running_job_step_records_its_outcome_once(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        PROVIDER.script(hang())
        order = t.get(Bill, "b-6")
        run = await order.charged.start(6)
        (call,) = await PROVIDER.wait_calls(1)
        await until(lambda: status_of(t, run.id), holds=lambda s: s == "suspended")
        await run.cancel()
        record = await cancelled_and_recorded(t, run.id)
        await t.drain()
        assert the_job_id(record) == call.job_id
        assert PROVIDER.calls_for(call.job_id)[0].outcome == "interrupted"
        expected = json.loads(str(record["outcome"]))
        assert expected["cancelled"]["outcome"]["kind"] == "Unknown"
        assert expected["cancelled"]["ambiguous"] is True
        # The same outcome wherever the run's steps are read.
        status = await run.status()
        first = status.steps[0]
        assert (first.seq, first.kind, first.outcome) == (0, "cancel", expected)
        assert status.steps[1].kind == "command"  # the compensation ran after it
        feed = await t.runtime.workflows.gateway.steps(
            (await t.runtime.workflows._locate(run.id))[0]
        )
        assert json.loads(str(feed[0].outcome)) == expected
        console = detail_json(await t.runtime.workflows.detail(run.id))
        assert console["steps"][0]["outcome"] == expected
        view = await t.rows(
            "SELECT kind, outcome::text AS outcome FROM {schema}.v_workflow_steps"
            " WHERE run_id = %(id)s AND seq = 0",
            {"id": run.id},
        )
        assert [(v["kind"], json.loads(v["outcome"])) for v in view] == [("cancel", expected)]
        assert await order.marks() == ["refund 6"]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        assert PROVIDER.count == 1


async def test_timed_out_at_a_queued_job_step_never_starts_the_job(akter_test: Make) -> None:
    async with akter_test([Bill]) as t:
        first = gate("ch_a")
        PROVIDER.script(first, succeed("ch_b"))
        a = await t.get(Bill, "b-7a").charged.start(1)
        await PROVIDER.wait_calls(1)
        b = await t.get(Bill, "b-7b").charged_briefly.start(2)
        await until(lambda: status_of(t, b.id), holds=lambda s: s == "suspended")
        await jump(t, 3)
        with pytest.raises(akter.WorkflowCancelled, match="timed out"):
            await b.result(timeout=10)
        first.release()
        assert await a.result(timeout=10) == "ch_a"
        await t.drain()
        assert PROVIDER.count == 1
        report = (await b.status()).steps[0].outcome["cancelled"]
        assert (report["attempts"], report["outcome"]["kind"]) == (0, "Failed")


async def test_a_job_outcome_that_matches_no_step_is_logged(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Bill]) as t:
        run = await t.get(Bill, "b-8").forever.start()
        await t.drain()
        engine = t.runtime._workflow_engine
        ref = akter.ActorRef("default", "Bill", "b-8")
        with caplog.at_level(logging.WARNING, logger="akter.workflows"):
            await engine.deliver(
                ref,
                "$workflow.job",
                json.dumps({"run_id": run.id, "seq": 7, "outcome": {"ok": "x"}}),
                "job-x",
                "{}",
            )
        assert any("matches no" in r.getMessage() for r in caplog.records), caplog.records


async def test_migration_0012_caps_the_wake_of_runs_suspended_by_older_code(
    akter_test: Make,
) -> None:
    from akter._store.migrate import known_migrations

    (migration,) = [m for m in known_migrations() if m.id.endswith("_workflow_deadline_wakes")]
    async with akter_test([Bill]) as t:
        waiting = await t.get(Bill, "b-9").forever.start()
        sleeping = await t.get(Bill, "b-10").long_sleep.start()
        await t.drain()
        # As older code left them: no wake time for a signal wait, a sleep's end past the
        # deadline.
        await t.rows(
            "UPDATE {schema}.workflows SET wake_at_ms = NULL WHERE run_id = %(id)s",
            {"id": waiting.id},
        )
        await t.rows(
            "UPDATE {schema}.workflows SET wake_at_ms = deadline_ms + 3600000"
            " WHERE run_id = %(id)s",
            {"id": sleeping.id},
        )
        await t.rows(migration.text)
        for run in (waiting, sleeping):
            row = await run_row(t, run.id)
            assert row["wake_at_ms"] == row["deadline_ms"]
        await t.advance(30 * DAY_S + 1)
        for run in (waiting, sleeping):
            with pytest.raises(akter.WorkflowCancelled, match="timed out"):
                await run.result(timeout=10)


# --- crashes around the cancel at a job step -----------------------------------------------------


def job_step_write(info: dict[str, Any]) -> bool:
    """A fault-point matcher: a write whose newest record is seq 0's (the job step's)."""
    return bool(info.get("seqs")) and list(info["seqs"])[-1] == 0


@pytest.mark.parametrize("point", ["before_step_record", "after_step_record"])
async def test_a_crash_around_the_cancel_at_a_job_step_cancels_the_job_once(
    akter_test: Make, point: str
) -> None:
    async with akter_test([Bill], jobs=[]) as t:  # no executor: the job stays queued
        order = t.get(Bill, "b-11")
        run = await order.charged.start(11)
        await t.drain()
        (job,) = await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'job'")
        t.crash_next(point, job_step_write)
        await run.cancel()
        await t.drain()  # the attempt dies at the fault point, holding its lease
        (step,) = await t.rows(
            "SELECT kind, status, outcome FROM {schema}.workflow_steps WHERE run_id = %(id)s",
            {"id": run.id},
        )
        left = await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'job'")
        if point == "before_step_record":  # nothing written: the job and the step as they were
            assert (step["kind"], step["status"], left) == ("job", "pending", [job])
        else:  # the job's cancellation and the cancel record committed together
            assert (step["kind"], step["status"], left) == ("cancel", "done", [])
            assert json.loads(str(step["outcome"]))["cancelled"]["attempts"] == 0
        assert await status_of(t, run.id) == "running"
        await t.advance(31)  # past the dead attempt's lease: another attempt resumes the run
        with pytest.raises(akter.WorkflowCancelled):
            await run.result(timeout=10)
        steps = (await run.status()).steps
        assert [(s.seq, s.kind) for s in steps] == [(0, "cancel"), (1, "command")]
        report = steps[0].outcome["cancelled"]
        assert (report["job_id"], report["attempts"]) == (job["intent_id"], 0)
        assert report["outcome"]["kind"] == "Failed"
        assert await order.marks() == ["refund 11"]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


async def test_a_job_outcome_recorded_while_the_cancel_is_written_is_answered_not_replaced(
    akter_test: Make,
) -> None:
    async with akter_test([Bill], jobs=[]) as t:
        run = await t.get(Bill, "b-13").charged.start(13)
        await t.drain()
        pause = t.pause_next("before_step_record", job_step_write)
        await run.cancel()
        t.runtime._relay.wake()
        await pause.wait()  # the attempt holds its journal: the job step is pending there
        # The job's outcome arrives now, as its settle's $workflow.job delivery would.
        await t.runtime._workflow_engine.deliver(
            akter.ActorRef("default", "Bill", "b-13"),
            "$workflow.job",
            json.dumps({"run_id": run.id, "seq": 0, "outcome": {"ok": "ch_13"}}),
            "job-13",
            "{}",
        )
        pause.release()
        await t.drain()
        # The outcome is kept, never replaced by the cancel; with no durable await after the
        # job step, the cancel reaches no further step and the run completes (W3).
        assert await run.result(timeout=10) == "ch_13"
        steps = (await run.status()).steps
        assert [(s.seq, s.kind, s.status, s.outcome) for s in steps] == [
            (0, "job", "done", {"ok": "ch_13"})
        ]
