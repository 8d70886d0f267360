"""Workflows under real process death (the workflows spec, W6: WF-02, WF-03, WF-04; kill).

Beside the named cases: a cut after a command step's pending record, after a job step's job is
staged, and before the run's end is written; a ``slow`` chaos drill (200 five-step runs on
three runner processes, one SIGKILLed every ~10 s, :func:`tests.faults.workflow_drill.chaos_drill`);
and the cancel drill (issue 38: runs cancelled and timed out at every kind of step, their job
behind ``concurrency=1``, :func:`tests.faults.workflow_drill.cancel_drill`), short and ``slow``.

A child process (``tests.faults.workflow_child``) runs the workflow engine on the test's schema
with a short workflow lease; the parent's runtime only starts runs and reads rows (no relay loop,
no executors) until the child, held at a workflow fault point, is SIGKILLed. Only what
PostgreSQL committed survives: the journal, the receipts, the run's lease end. Another runner
then resumes the run after that lease: a second child in real time (WF-02), or the parent's
runtime driven by ``ActorTest.advance`` past the lease (WF-03, WF-04). Handlers and local steps
log every execution in ``<schema>.wf_effects`` (:mod:`tests.faults.workflow_actors`), so what
really ran is counted durably across processes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests.faults.workflow_actors import ACTORS, EFFECTS, NO_JOB_END_LOG, Flow, install
from tests.faults.workflow_drill import (
    Cancels,
    Chaos,
    cancel_drill,
    chaos_drill,
    effects,
    journal,
    receipts,
    run_row,
    shape,
    workflow_child,
)

pytestmark = [pytest.mark.kill, pytest.mark.timeout(90)]

MakeTest = Callable[..., ActorTest]
WorkflowTest = Callable[[], AbstractAsyncContextManager[ActorTest]]

#: The workflow lease of every runner here (seconds; renewed every third of it).
LEASE_S = 2
CHILD = ("--workflow-lease", str(LEASE_S), "--poll", "0.1")
APPLY = "Flow.apply"


@pytest.fixture
def workflow_test(akter_test: MakeTest) -> WorkflowTest:
    """ActorTests whose runtime starts runs but runs nothing by itself, with the effect log."""

    @asynccontextmanager
    async def make() -> AsyncIterator[ActorTest]:
        async with akter_test(ACTORS, relay=False, jobs=[], workflow_lease=LEASE_S) as t:
            await install(t.database_url, t.schema)
            EFFECTS.configure(t.database_url, t.schema)
            try:
                yield t
            finally:
                await EFFECTS.close()

    return make


def command_id_of(row: dict[str, object]) -> str:
    """The command id a command step's pending record named."""
    return str(json.loads(str(row["detail"]))["command_id"])


async def test_WF02_killed_after_step_2_is_recorded_a_second_runner_resumes_without_rerunning(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").three.start()
        # Held after step 3's pending record, which carried step 2's outcome: steps 1 and 2 are
        # recorded done, step 3's turn has not begun.
        async with workflow_child(t, *CHILD, "--pause", "after_step_record", "--seq", "2") as a:
            assert await a.expect("PAUSED") == ["after_step_record", run.id, "1,2"]
            await a.kill()
        before = await journal(t, run.id)
        assert shape(before) == [
            (0, "command", APPLY, "done"),
            (1, "command", APPLY, "done"),
            (2, "command", APPLY, "pending"),
        ]
        assert await effects(t, run.id) == Counter({("s1", "handler"): 1, ("s2", "handler"): 1})
        dead = await run_row(t, run.id)
        assert (dead["status"], dead["attempts"]) == ("running", 1)
        lease_end = int(dead["wake_at_ms"])

        # A second runner process, real time: it claims the run once the dead lease has ended.
        async with workflow_child(t, *CHILD) as b:
            assert await run.result(timeout=LEASE_S + 30) == [1, 1, 1]
            await b.close(grace=10)
        after = await journal(t, run.id)
        assert shape(after) == [(seq, "command", APPLY, "done") for seq in range(3)]
        assert after[:2] == before[:2]  # steps 1 and 2 answered from the journal, untouched
        assert command_id_of(after[2]) == command_id_of(before[2])  # step 3 by its recorded id
        assert after[2]["recorded_at_ms"] >= lease_end
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("s2", "handler"): 1, ("s3", "handler"): 1}
        )
        assert await t.get(Flow, "f").applied() == {"s1": 1, "s2": 1, "s3": 1}
        for row in after:
            assert len(await receipts(t, command_id_of(row))) == 1
        done = await run_row(t, run.id)
        assert (done["status"], done["attempts"], done["owner"]) == ("completed", 2, None)


async def test_WF03_killed_after_a_command_step_committed_before_its_record_replays_the_receipt(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").three.start()
        # Seq 1's 'done' is written with seq 2's pending record, after seq 1's turn committed.
        async with workflow_child(
            t, *CHILD, "--pause", "before_step_record", "--seq", "2"
        ) as child:
            assert await child.expect("PAUSED") == ["before_step_record", run.id, "1,2"]
            await child.kill()
        before = await journal(t, run.id)
        assert shape(before) == [(0, "command", APPLY, "done"), (1, "command", APPLY, "pending")]
        pending_id = command_id_of(before[1])
        assert [r["command"] for r in await receipts(t, pending_id)] == ["apply"]
        assert await effects(t, run.id) == Counter({("s1", "handler"): 1, ("s2", "handler"): 1})
        assert await t.get(Flow, "f").applied() == {"s1": 1, "s2": 1}  # the turn committed

        # The parent's runtime resumes once its clock has passed the dead attempt's lease.
        await t.advance(LEASE_S + 1)
        assert await run.result(timeout=10) == [1, 1, 1]
        after = await journal(t, run.id)
        assert shape(after) == [(seq, "command", APPLY, "done") for seq in range(3)]
        assert command_id_of(after[1]) == pending_id  # the same command id: its receipt replayed
        assert json.loads(str(after[1]["outcome"])) == {"ok": 1}
        assert len(await receipts(t, pending_id)) == 1
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("s2", "handler"): 1, ("s3", "handler"): 1}
        )
        assert await t.get(Flow, "f").applied() == {"s1": 1, "s2": 1, "s3": 1}
        done = await run_row(t, run.id)
        assert (done["status"], done["attempts"]) == ("completed", 2)


async def test_WF04_a_local_step_killed_between_call_and_record_runs_again(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").local.start()
        # A local step writes no pending record: its only record is the 'done' after the call.
        async with workflow_child(t, *CHILD, "--pause", "before_step_record", "--seq", "1") as c:
            assert await c.expect("PAUSED") == ["before_step_record", run.id, "1"]
            await c.kill()
        assert shape(await journal(t, run.id)) == [(0, "command", APPLY, "done")]
        assert await effects(t, run.id) == Counter({("s1", "handler"): 1, ("touch", "local"): 1})

        await t.advance(LEASE_S + 1)
        assert await run.result(timeout=10) == f"touched {run.id}"
        assert shape(await journal(t, run.id)) == [
            (0, "command", APPLY, "done"),
            (1, "step", "touch", "done"),
            (2, "command", APPLY, "done"),
        ]
        # At least once, counted: the function ran in the dead attempt and again on resume.
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("touch", "local"): 2, ("s3", "handler"): 1}
        )
        assert await t.get(Flow, "f").applied() == {"s1": 1, "s3": 1}


async def test_WF03_killed_after_the_pending_record_before_the_turn_runs_it_once_by_that_id(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").three.start()
        # Seq 1's first write is its pending record: the turn has not begun when the child dies.
        async with workflow_child(t, *CHILD, "--pause", "after_step_record", "--seq", "1") as c:
            assert await c.expect("PAUSED") == ["after_step_record", run.id, "0,1"]
            await c.kill()
        before = await journal(t, run.id)
        assert shape(before) == [(0, "command", APPLY, "done"), (1, "command", APPLY, "pending")]
        pending_id = command_id_of(before[1])
        assert await receipts(t, pending_id) == []
        assert await effects(t, run.id) == Counter({("s1", "handler"): 1})

        await t.advance(LEASE_S + 1)
        assert await run.result(timeout=10) == [1, 1, 1]
        after = await journal(t, run.id)
        assert shape(after) == [(seq, "command", APPLY, "done") for seq in range(3)]
        assert command_id_of(after[1]) == pending_id  # the turn ran under the recorded id
        assert len(await receipts(t, pending_id)) == 1
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("s2", "handler"): 1, ("s3", "handler"): 1}
        )


async def test_a_job_step_staged_by_a_killed_attempt_runs_once_and_the_run_resumes(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").paid.start()
        # The job step's pending record and its job commit together; the dead runner executes
        # no jobs, so the job is still staged when it dies, before the run is suspended.
        async with workflow_child(
            t, *CHILD, "--no-jobs", "--pause", "after_step_record", "--seq", "1"
        ) as a:
            assert await a.expect("PAUSED") == ["after_step_record", run.id, "0,1"]
            await a.kill()
        before = await journal(t, run.id)
        assert shape(before) == [(0, "command", APPLY, "done"), (1, "job", "charge", "pending")]
        job_id = str(json.loads(str(before[1]["detail"]))["job_id"])
        staged = await t.rows("SELECT intent_id, kind, attempts FROM {schema}.outbox")
        assert staged == [{"intent_id": job_id, "kind": "job", "attempts": 0}]
        assert (await run_row(t, run.id))["status"] == "running"

        async with workflow_child(t, *CHILD) as b:
            assert await run.result(timeout=LEASE_S + 30) == 1
            await b.close(grace=10)
        assert shape(await journal(t, run.id)) == [
            (0, "command", APPLY, "done"),
            (1, "job", "charge", "done"),
            (2, "command", APPLY, "done"),
        ]
        calls = await t.rows("SELECT job_id, attempt FROM {schema}.wf_effects WHERE kind = 'job'")
        assert calls == [{"job_id": job_id, "attempt": 1}]  # staged once, executed once
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("charge", "job"): 1, ("s3", "handler"): 1}
        )
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


async def test_killed_before_the_run_end_is_written_the_resume_replays_every_step_and_ends_once(
    workflow_test: WorkflowTest,
) -> None:
    async with workflow_test() as t:
        run = await t.get(Flow, "f").three.start()
        async with workflow_child(t, *CHILD, "--pause", "before_workflow_complete") as child:
            assert await child.expect("PAUSED") == [
                "before_workflow_complete",
                run.id,
                "completed",
            ]
            await child.kill()
        before = await journal(t, run.id)
        # The last step's outcome is written with the run's end: it is still pending.
        assert shape(before) == [
            (0, "command", APPLY, "done"),
            (1, "command", APPLY, "done"),
            (2, "command", APPLY, "pending"),
        ]
        dead = await run_row(t, run.id)
        assert (dead["status"], dead["result"]) == ("running", None)

        await t.advance(LEASE_S + 1)
        assert await run.result(timeout=10) == [1, 1, 1]
        after = await journal(t, run.id)
        assert after[:2] == before[:2]  # answered from the journal
        assert command_id_of(after[2]) == command_id_of(before[2])  # its receipt replayed
        assert shape(after) == [(seq, "command", APPLY, "done") for seq in range(3)]
        assert await effects(t, run.id) == Counter(
            {("s1", "handler"): 1, ("s2", "handler"): 1, ("s3", "handler"): 1}
        )
        done = await run_row(t, run.id)
        assert (done["status"], done["attempts"]) == ("completed", 2)


# --- the chaos drill ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(ON_CITUS, reason=NO_JOB_END_LOG)
async def test_workflow_chaos_three_runners_sigkilled_every_10s(
    workflow_test: WorkflowTest,
) -> None:
    """Runs of five steps finish as their inputs say while runner processes are SIGKILLed."""
    drill = Chaos()
    async with workflow_test() as t:
        report = await chaos_drill(t, drill)
        print(report.summary())
        assert report.problems() == []
        assert len(report.kills) >= 4
        assert sum(k.held_runs for k in report.kills) > 0  # kills landed on running runs
        assert report.statuses["completed"] + report.statuses["failed"] == drill.runs


# --- the cancel drill (issue 38) ---------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.skipif(ON_CITUS, reason=NO_JOB_END_LOG)
async def test_workflow_cancel_drill_short(workflow_test: WorkflowTest) -> None:
    """Cancels and timeouts at every kind of step on two runners, one SIGKILLed every ~3 s."""
    drill = Cancels(
        runs=16,
        runners=2,
        start_over=4.0,
        cancel_within=4.0,
        signal_within=4.0,
        kill_every=3.0,
        hold=0.15,
        within=150.0,
        seed=381,
    )
    async with workflow_test() as t:
        report = await cancel_drill(t, drill)
        print(report.summary())
        assert report.problems == []
        assert report.kills
        assert any(s == "cancelled" for _, s in report.statuses)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(ON_CITUS, reason=NO_JOB_END_LOG)
async def test_workflow_cancel_drill_three_runners_sigkilled_every_4s(
    workflow_test: WorkflowTest,
) -> None:
    """120 runs cancelled and timed out at every kind of step while runners are SIGKILLed."""
    drill = Cancels()
    async with workflow_test() as t:
        report = await cancel_drill(t, drill)
        print(report.summary())
        assert report.problems == []
        assert len(report.kills) >= 4
        assert sum(k.held_runs for k in report.kills) > 0  # kills landed on running runs
        # Cancels and timeouts reached queued and attempted jobs alike.
        assert report.job_outcomes["cancel:cancelled"] > 0
        assert report.statuses[("timed", "cancelled")] > 0
        assert report.statuses[("cancellable", "cancelled")] > 0
