"""Jobs under real process death (JB-24, JB-30 … JB-34, kill) and the per-actor cap under fire.

A child process (``tests.faults.jobs_child``) runs a job runner on the test's schema with a 3 s
lease; the parent's runtime only enqueues (``jobs=[]``, no relay loop) until the child is
SIGKILLed at a fault point or mid-call. Only what PostgreSQL committed survives: the claim's
pre-marked ambiguity and its lease end. A "restart" is a new runtime in the parent that executes
the jobs; it is driven by ``ActorTest.advance`` (its framework clock passes the dead runner's
lease) or, where the timing of the lease itself is the point, by real time. Executors log every
call in ``<schema>.job_calls`` (see ``tests.faults.jobs_actors``), so calls are counted durably
across processes, after the restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS
from tests.faults.jobs_actors import NO_LEASE_LOG, Worker
from tests.faults.jobs_drill import (
    CHILD,
    LEASE_S,
    Drill,
    EnqueueOnly,
    analyse,
    attempt_intervals,
    call_log,
    caps_drill,
    db_ms,
    describe,
    enqueue_only,
    jobs_child,
    lease_ends,
    max_live,
)

pytestmark = [pytest.mark.kill, pytest.mark.timeout(90)]

MakeTest = Callable[..., ActorTest]

JobsTest = EnqueueOnly


@pytest.fixture
def jobs_test(akter_test: MakeTest) -> JobsTest:
    """ActorTests whose runtime enqueues but executes nothing, with the call and lease logs."""
    return enqueue_only(akter_test)


async def jobs(t: ActorTest) -> list[dict[str, Any]]:
    """The outbox, oldest first."""
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY ready_at_ms, intent_id")


async def receipts_for(t: ActorTest, command_id: str) -> list[str]:
    """The commands of the receipts stored under one command id (a job's route)."""
    rows = await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
    return [str(r["command"]) for r in rows]


async def restart(t: ActorTest) -> None:
    """A new runner that executes the jobs; its clock then passes every dead runner's lease."""
    await t.add_runtime(jobs=None)
    await t.advance(LEASE_S + 1)


def calls_of(calls: list[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
    """(job id, attempt, outcome) of each logged call."""
    return [(str(c["job_id"]), int(c["attempt"]), c["outcome"]) for c in calls]


# --- JB-30 … JB-34: a runner killed at a point of one attempt ------------------------------------


async def test_JB30_killed_at_before_execute_calls_nothing_and_the_restart_routes_once(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start("a")
        async with jobs_child(t, *CHILD, "--pause", "before_execute") as child:
            assert await child.expect("PAUSED") == ["before_execute", job_id, "1"]
            await child.kill()
        (row,) = await jobs(t)
        assert (row["kind"], row["intent_id"], row["attempts"]) == ("job", job_id, 1)
        assert (row["running"], row["ambiguous"]) == (True, True)
        assert await call_log(t) == []

        await restart(t)
        assert calls_of(await call_log(t)) == [(job_id, 2, "succeeded")]
        assert await receipts_for(t, job_id) == ["charged"]
        assert await w.reports() == [{"route": "success", "id": job_id, "value": 2}]
        assert await jobs(t) == []


async def test_JB31_killed_at_after_execute_runs_the_executor_again_and_routes_once(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start("a")
        async with jobs_child(t, *CHILD, "--pause", "after_execute") as child:
            assert await child.expect("PAUSED") == ["after_execute", job_id, "1"]
            await child.kill()
        (row,) = await jobs(t)
        assert (row["kind"], row["attempts"], row["running"]) == ("job", 1, True)
        assert calls_of(await call_log(t)) == [(job_id, 1, "succeeded")]

        await restart(t)
        assert calls_of(await call_log(t)) == [
            (job_id, 1, "succeeded"),
            (job_id, 2, "succeeded"),
        ]
        assert await receipts_for(t, job_id) == ["charged"]
        assert await w.reports() == [{"route": "success", "id": job_id, "value": 2}]
        assert await jobs(t) == []


async def test_JB32_killed_at_before_commit_of_the_route_delivers_it_once_without_a_new_call(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start("a")
        async with jobs_child(t, *CHILD, "--pause", "before_commit", "--route", "charged") as child:
            assert await child.expect("PAUSED") == ["before_commit", job_id, "-"]
            await child.kill()
        (row,) = await jobs(t)
        assert (row["kind"], row["intent_id"], row["command"]) == ("intent", job_id, "charged")
        assert calls_of(await call_log(t)) == [(job_id, 1, "succeeded")]
        assert await receipts_for(t, job_id) == []  # the route's turn rolled back

        await restart(t)
        assert calls_of(await call_log(t)) == [(job_id, 1, "succeeded")]
        assert await receipts_for(t, job_id) == ["charged"]
        assert await w.reports() == [{"route": "success", "id": job_id, "value": 1}]
        assert await jobs(t) == []


async def test_JB33_a_cancelled_jobs_runner_killed_after_execute_is_reported_unknown_once(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start("a", key="k")
        async with jobs_child(t, *CHILD, "--pause", "after_execute") as child:
            assert await child.expect("PAUSED") == ["after_execute", job_id, "1"]
            await w.cancel("k")  # committed in the parent; the child's attempt never sees it
            (row,) = await jobs(t)
            assert row["cancelled_at_ms"] is not None and row["running"]
            await child.kill()
        assert calls_of(await call_log(t)) == [(job_id, 1, "succeeded")]

        await restart(t)
        assert await receipts_for(t, job_id) == ["charge_cancelled"]
        (report,) = await w.reports()
        assert (report["route"], report["id"], report["attempts"]) == ("cancelled", job_id, 1)
        assert report["outcome"] == {
            "kind": "Unknown",
            "cause": "Attempt 1 ended without reporting an outcome",
        }
        assert report["ambiguous"] is True
        await t.advance(3600)
        assert len(await w.reports()) == 1
        assert calls_of(await call_log(t)) == [(job_id, 1, "succeeded")]
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        assert await jobs(t) == []


async def test_JB34_the_last_attempts_runner_killed_dead_letters_ambiguously_once(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start_once("a")
        async with jobs_child(t, *CHILD, "--hold", "-1", "--announce") as child:
            assert await child.expect("STARTED") == [job_id, "1"]
            await child.kill()
        (row,) = await jobs(t)
        assert (row["kind"], row["attempts"], row["running"]) == ("job", 1, True)

        await restart(t)
        (letter,) = await t.rows("SELECT * FROM {schema}.dead_letters")
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 1, True)
        assert letter["cause"] == "Attempt 1 ended without reporting an outcome"
        assert await receipts_for(t, job_id) == ["once_dead"]
        (report,) = await w.reports()
        assert (report["route"], report["id"], report["attempts"], report["ambiguous"]) == (
            "dead_letter",
            job_id,
            1,
            True,
        )
        await t.advance(3600)
        assert len(await w.reports()) == 1
        assert calls_of(await call_log(t)) == [(job_id, 1, None)]  # killed mid-call
        assert await jobs(t) == []


# --- JB-24: cap 1, the runner of attempt 1 killed ------------------------------------------------


@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
async def test_JB24_a_killed_attempt_holds_its_slot_until_its_lease_ends_then_goes_first(
    jobs_test: JobsTest,
) -> None:
    async with jobs_test() as t:
        w = t.get(Worker, "w")
        first, second = await w.start_serial(["a", "b"])
        async with jobs_child(t, *CHILD, "--hold", "-1", "--announce") as child:
            assert await child.expect("STARTED") == [first, "1"]
            await child.kill()

        # A new runner, real time: the dead attempt keeps the actor's only slot.
        await t.add_runtime(jobs=None)
        rows = {r["intent_id"]: r for r in await jobs(t)}
        assert (rows[first]["attempts"], rows[first]["running"]) == (1, True)
        assert (rows[second]["attempts"], rows[second]["waiting"]) == (0, True)
        assert rows[first]["due_at_ms"] - await db_ms(t) > 1000  # the lease has long to run
        await t.drain()
        assert calls_of(await call_log(t)) == [(first, 1, None)]
        rows = {r["intent_id"]: r for r in await jobs(t)}
        assert (rows[second]["attempts"], rows[second]["running"]) == (0, False)

        # Passes until both jobs are routed: nothing starts before the lease ends.
        async def routed() -> list[dict[str, Any]]:
            rows = await jobs(t)
            if rows:
                await t.drain()
            return rows

        # Real time must pass the dead runner's lease, hence the real-time bound.
        await until(
            routed,
            within=3 * LEASE_S + 10,
            what="both jobs routed",
            holds=lambda rows: not rows,
            interval=0.05,
        )

        calls = await call_log(t)
        assert calls_of(calls) == [
            (first, 1, None),
            (first, 2, "succeeded"),
            (second, 1, "succeeded"),
        ]
        leases = await lease_ends(t)
        ended = leases[(first, 1)]
        a2, b1 = calls[1], calls[2]
        assert a2["started_ms"] >= ended  # attempt 2 only after the dead lease ended
        assert b1["started_ms"] >= a2["ended_ms"]  # the second job only after it
        claims = await t.rows(
            "SELECT intent_id, attempts, at_ms FROM {schema}.job_leases WHERE claimed ORDER BY id"
        )
        assert [(c["intent_id"], c["attempts"]) for c in claims] == [
            (first, 1),
            (first, 2),
            (second, 1),
        ]
        assert claims[1]["at_ms"] >= ended
        assert max_live(attempt_intervals(calls, leases)["w"]) == 1
        assert await receipts_for(t, first) == ["serial_done"]
        assert await receipts_for(t, second) == ["serial_done"]
        assert await w.reports() == [
            {"route": "success", "id": first, "value": 2},
            {"route": "success", "id": second, "value": 1},
        ]


# --- caps under fire ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "drill",
    [
        # 3 runner processes, 40 cold actors × 5 jobs and a hot actor with 200, one runner killed.
        pytest.param(
            Drill(
                runners=3,
                cold_actors=40,
                jobs_per_actor=5,
                hot_jobs=200,
                hold=0.05,
                kill_at=0.3,
                cold_bound=30.0,
                hot_share=0.6,
                within=120.0,
            ),
            id="reduced",
        ),
        # 3 runner processes, 200 cold actors × 10 jobs and a hot actor with 1,000, one killed.
        pytest.param(
            Drill(
                runners=3,
                cold_actors=200,
                jobs_per_actor=10,
                hot_jobs=1_000,
                hold=0.05,
                kill_at=0.3,
                cold_bound=120.0,
                hot_share=0.6,
                within=500.0,
            ),
            id="full",
            marks=[pytest.mark.slow, pytest.mark.timeout(600)],
        ),
    ],
)
@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
async def test_caps_under_fire(jobs_test: JobsTest, drill: Drill) -> None:
    """Per-actor caps and fairness while one of three runner processes is killed."""
    async with jobs_test() as t:
        outcome = await caps_drill(t, drill)
        print(describe(drill, outcome))
        analyse(drill, outcome)
