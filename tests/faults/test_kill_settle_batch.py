"""Successes waiting in the settle coalescer when their runner dies (issue 45, semantics §5.9).

A child runner (``tests.faults.jobs_child``) is SIGKILLed while its coalescer holds successes: at
``before_settle_flush`` (the batch's statement not yet sent) and, with a long ``settle_wait``,
with more successes queued behind that held flush. Nothing of them was written, so each row is
still running under the lease its claim wrote: a new runner claims it once the lease ends, the
attempt runs again (at-least-once, semantics §5.7.8) and its success is routed once. Executors
log every call durably in ``<schema>.job_calls`` (``tests.faults.jobs_actors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS
from tests.faults.jobs_actors import Worker
from tests.faults.jobs_drill import CHILD, LEASE_S, EnqueueOnly, call_log, enqueue_only, jobs_child

pytestmark = [
    pytest.mark.kill,
    pytest.mark.timeout(90),
    pytest.mark.skipif(ON_CITUS, reason="batched settles run on plain PostgreSQL only"),
]

MakeTest = Callable[..., ActorTest]

SettleTest = EnqueueOnly


@pytest.fixture
def settle_test(akter_test: MakeTest) -> SettleTest:
    """ActorTests whose runtime enqueues but executes nothing, with the executors' call log."""
    return enqueue_only(akter_test)


async def job_rows(t: ActorTest) -> dict[str, dict[str, Any]]:
    rows = await t.rows("SELECT * FROM {schema}.outbox ORDER BY intent_id")
    return {str(r["intent_id"]): r for r in rows}


async def receipts_for(t: ActorTest, command_id: str) -> list[str]:
    rows = await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
    return [str(r["command"]) for r in rows]


async def restart(t: ActorTest) -> None:
    """A new runner that executes the jobs; its clock then passes the dead runner's lease."""
    await t.add_runtime(jobs=None)
    await t.advance(LEASE_S + 1)


async def test_a_runner_killed_before_its_settle_flush_runs_the_attempt_again_and_routes_once(
    settle_test: SettleTest,
) -> None:
    async with settle_test() as t:
        w = t.get(Worker, "w")
        job_id = await w.start("a")
        async with jobs_child(t, *CHILD, "--pause", "before_settle_flush") as child:
            assert await child.expect("PAUSED") == ["before_settle_flush", job_id, "-"]
            await child.kill()
        (row,) = (await job_rows(t)).values()
        # The success was never written: the row is as the claim left it, running at attempt 1.
        assert (row["kind"], row["attempts"], row["running"], row["ambiguous"]) == (
            "job",
            1,
            True,
            True,
        )
        assert [(c["job_id"], c["attempt"], c["outcome"]) for c in await call_log(t)] == [
            (job_id, 1, "succeeded")
        ]

        await restart(t)
        assert [(c["job_id"], c["attempt"], c["outcome"]) for c in await call_log(t)] == [
            (job_id, 1, "succeeded"),
            (job_id, 2, "succeeded"),
        ]
        assert await receipts_for(t, job_id) == ["charged"]
        assert await w.reports() == [{"route": "success", "id": job_id, "value": 2}]
        assert await job_rows(t) == {}


async def test_successes_queued_behind_a_held_flush_of_a_killed_runner_each_route_once(
    settle_test: SettleTest,
) -> None:
    async with settle_test() as t:
        workers = [t.get(Worker, f"w{i}") for i in range(4)]
        ids = [await w.start(f"t{i}") for i, w in enumerate(workers)]
        args = (*CHILD, "--pause", "before_settle_flush", "--settle-wait", "1")
        async with jobs_child(t, *args) as child:
            point, held, _ = await child.expect("PAUSED")
            assert point == "before_settle_flush"
            # Every attempt returns; the ones not in the held batch queue behind it (1 s wait).
            await until(
                lambda: call_log(t),
                holds=lambda calls: len(calls) == 4 and all(c["outcome"] for c in calls),
                what="four finished calls",
            )
            await child.kill()
        assert set(held.split(",")) <= set(ids)
        rows = await job_rows(t)
        assert {i: (r["kind"], r["attempts"], r["running"]) for i, r in rows.items()} == (
            dict.fromkeys(ids, ("job", 1, True))
        )

        await restart(t)
        calls = [(c["job_id"], c["attempt"], c["outcome"]) for c in await call_log(t)]
        assert sorted(calls) == sorted(
            [(i, 1, "succeeded") for i in ids] + [(i, 2, "succeeded") for i in ids]
        )
        for worker, job_id in zip(workers, ids, strict=True):
            assert await receipts_for(t, job_id) == ["charged"]
            assert await worker.reports() == [{"route": "success", "id": job_id, "value": 2}]
        assert await job_rows(t) == {}
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
