"""Operating workflows (the workflows spec W3, W4): sampled gauges and retention.

``akter.workflows.running`` and ``akter.workflows.suspended`` are sampled by the
``$maintenance`` owner (relay off, passes driven by hand); retention prunes finished runs
``keep_workflows`` after their end with their journal and signals, and never a suspended or
diverged run, however old.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from akter.testing import ActorTest
from tests.integration.workflow_actors import ALL, CALLS, PROVIDER, Order

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    CALLS.clear()
    PROVIDER.reset()
    yield
    CALLS.clear()
    PROVIDER.reset()


def run_gauges(t: ActorTest, actor_type: str = "Order") -> tuple[float | None, float | None]:
    metrics = t.runtime.metrics
    return (
        metrics.gauge("akter.workflows.running", actor_type=actor_type),
        metrics.gauge("akter.workflows.suspended", actor_type=actor_type),
    )


async def test_running_and_suspended_runs_are_sampled_by_the_maintenance_owner(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        sampler = t.runtime._runners.sampler
        await asyncio.wait_for(sampler.wait_for(1), 10)
        assert run_gauges(t) == (None, None)  # no live run: no series

        for i in range(2):
            await t.get(Order, f"o-{i}").sleeper.start(1)
        waiting = await t.get(Order, "o-2").waiter.start(1)
        await t.drain()
        await sampler.sample()
        assert run_gauges(t) == (0, 3)

        # A run held mid-attempt (before its first record) runs under a live lease.
        held = t.pause_next("before_step_record")
        await t.get(Order, "o-3").three.start("sku-1")
        await t.runtime._relay.run_pass()
        await held.wait()
        await sampler.sample()
        assert run_gauges(t) == (1, 3)
        text = t.runtime.metrics.render()
        assert 'akter_workflows_running{actor_type="Order"} 1.0\n' in text
        assert 'akter_workflows_suspended{actor_type="Order"} 3.0\n' in text
        assert "# TYPE akter_workflows_suspended gauge" in text
        held.release()
        await t.drain()

        await t.runtime.workflows.signal_json(waiting.id, "Note", {"text": "hi"})
        await t.drain()
        await sampler.sample()
        assert run_gauges(t) == (0, 2)  # the series stays, at 0 when nothing runs
        sampler.clear()
        assert run_gauges(t) == (None, None)


async def test_finished_runs_are_pruned_after_keep_workflows_and_live_ones_never(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        order = t.get(Order, "o-1")
        done = await order.waiter.start(1)
        asleep = await order.sleeper.start(24 * 365)  # wakes long after any retention
        parked = await order.compensating.start()  # waits for a signal only
        diverged = await order.waiter.start(1)
        await t.drain()
        engine = t.runtime.workflows
        await engine.signal_json(done.id, "Note", {"text": "done"})
        await engine.signal_json(done.id, "Stray", {"kept": "with the run"})
        await engine.signal_json(diverged.id, "Note", {"text": "late"})
        await t.rows(
            "UPDATE {schema}.workflow_steps SET kind = 'local', name = 'reordered'"
            " WHERE run_id = %(id)s",
            {"id": diverged.id},
        )
        await t.drain()
        statuses = {
            r["run_id"]: r["status"]
            for r in await t.rows("SELECT run_id, status FROM {schema}.workflows")
        }
        assert statuses == {
            done.id: "completed",
            asleep.id: "suspended",
            parked.id: "suspended",
            diverged.id: "diverged",
        }

        await t.advance(timedelta(days=29, hours=23))
        assert (await t.runtime.cleanup()).workflows == 0
        live = await t.rows(
            "SELECT run_id FROM {schema}.workflows WHERE status = 'suspended'"
        )  # live runs are never pruned
        assert {r["run_id"] for r in live} == {asleep.id, parked.id}
        await t.advance(timedelta(hours=2))
        counts = await t.runtime.cleanup()
        assert counts.workflows == 1
        assert t.runtime.metrics.value("akter.workflows.pruned", actor_type="Order") == 1
        left = {r["run_id"] for r in await t.rows("SELECT run_id FROM {schema}.workflows")}
        assert left == {asleep.id, parked.id, diverged.id}
        for table in ("workflow_steps", "workflow_signals"):
            rows = await t.rows(
                f"SELECT run_id FROM {{schema}}.{table} WHERE run_id = %(id)s", {"id": done.id}
            )
            assert rows == [], table
        kept = await t.rows(
            "SELECT run_id FROM {schema}.workflow_steps WHERE run_id = ANY(%(ids)s)",
            {"ids": [asleep.id, parked.id, diverged.id]},
        )
        assert {r["run_id"] for r in kept} == {asleep.id, parked.id, diverged.id}

        # The live runs met their default 30-day timeout meanwhile (issue 38): cancelled, then
        # pruned after keep_workflows like any finished run. The diverged run is still there.
        ended = {
            r["run_id"]: r["status"]
            for r in await t.rows("SELECT run_id, status FROM {schema}.workflows")
        }
        assert ended == {asleep.id: "cancelled", parked.id: "cancelled", diverged.id: "diverged"}
        await t.advance(timedelta(days=60))
        assert (await t.runtime.cleanup()).workflows == 2
        still = {
            r["run_id"]: r["status"]
            for r in await t.rows("SELECT run_id, status FROM {schema}.workflows")
        }
        assert still == {diverged.id: "diverged"}
