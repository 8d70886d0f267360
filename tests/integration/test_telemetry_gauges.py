"""Sampled gauges (semantics §10.1): computed only by the ``$maintenance`` owner.

``akter.outbox.rows``, ``akter.relay.lag_ms``, ``akter.relay.stuck_rows`` and
``akter.outbox.parked`` by kind, and
``akter.jobs.running`` by actor type and job, for a known outbox (relay off, clock moved by hand),
and their ownership across two runners.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from akter.runtime import Runtime
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, Step, gate
from tests._support.counting import count_calls
from tests._support.providers import fresh_provider
from tests.integration.telemetry_actors import ACTORS, PROVIDER, Pinger

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


provider = fresh_provider(PROVIDER)


def gauges(runtime: Runtime, kind: str) -> tuple[float | None, ...]:
    metrics = runtime.metrics
    return tuple(
        metrics.gauge(name, kind=kind)
        for name in ("akter.outbox.rows", "akter.relay.lag_ms", "akter.relay.stuck_rows")
    )


async def a_running_job(t: ActorTest, provider: FakeProvider) -> Step:
    """Pinger c's ``hold`` job, claimed and running until the returned gate is released."""
    step = gate(7)
    provider.script(step)
    await t.get(Pinger, "c").start()
    assert await t.runtime._jobs.run_pass() == 1
    await asyncio.wait_for(step.entered.wait(), 10)
    return step


async def test_sampled_gauges_of_a_known_outbox(akter_test: Make, provider: FakeProvider) -> None:
    async with akter_test(ACTORS, relay=False) as t:
        sampler = t.runtime._runners.sampler
        await asyncio.wait_for(sampler.wait_for(1), 10)  # taken as the lease is acquired
        assert gauges(t.runtime, "intent") == (0, 0, 0)
        assert gauges(t.runtime, "job") == (0, 0, 0)

        # Three due intents nobody claims (no relay) and a timer due in a minute.
        assert await t.get(Pinger, "a").ping(3) == 3
        await t.get(Pinger, "b").remind(60)
        for runtime in t.runtimes:
            runtime._clock.offset_ms += 5_000  # the intents are now 5 s overdue
        await sampler.sample()
        rows, lag, stuck = gauges(t.runtime, "intent")
        assert rows == 4 and stuck == 0
        assert lag is not None and 5_000 <= lag < 60_000
        assert gauges(t.runtime, "job") == (0, 0, 0)

        # A row claimed eight times is stuck.
        await t.rows(
            "UPDATE {schema}.outbox SET attempts = 8 WHERE kind = 'intent' AND target_id = 'p0'"
        )
        await sampler.sample()
        assert gauges(t.runtime, "intent")[2] == 1
        assert t.runtime.metrics.gauge("akter.outbox.parked", kind="intent") == 0

        # A parked row is still a row, counted apart (read in the same statement).
        await t.rows(
            "UPDATE {schema}.outbox SET parked_at_ms = 1 WHERE kind = 'intent' AND target_id = 'p1'"
        )
        await sampler.sample()
        assert t.runtime.metrics.gauge("akter.outbox.parked", kind="intent") == 1
        assert t.runtime.metrics.gauge("akter.outbox.parked", kind="job") == 0
        assert gauges(t.runtime, "intent")[0] == 4

        # A job attempt running under its lease.
        step = await a_running_job(t, provider)
        await sampler.sample()
        metrics = t.runtime.metrics
        assert metrics.gauge("akter.jobs.running", actor_type="Pinger", job="hold") == 1
        assert gauges(t.runtime, "job") == (1, 0, 0)  # a running row is not due
        text = metrics.render()
        assert 'akter_jobs_running{actor_type="Pinger",job="hold"} 1.0\n' in text
        assert 'akter_outbox_rows{kind="intent"} 4.0\n' in text
        assert 'akter_relay_stuck_rows{kind="intent"} 1.0\n' in text
        assert "# TYPE akter_relay_lag_ms gauge" in text

        # Once it settled, the series reads 0 rather than vanishing.
        step.release()
        await t.wait_idle()
        await sampler.sample()
        assert metrics.gauge("akter.jobs.running", actor_type="Pinger", job="hold") == 0
        assert gauges(t.runtime, "job") == (0, 0, 0)


async def test_the_job_gauges_are_read_only_while_the_outbox_holds_a_job_row(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ACTORS, relay=False) as t:
        sampler = t.runtime._runners.sampler
        await asyncio.wait_for(sampler.wait_for(1), 10)
        counted = (
            count_calls(sampler._gateway, ["running_jobs"]),
            count_calls(sampler._flow, ["sample_flow"]),
            count_calls(sampler._parked, ["due_jobs"]),
        )
        metrics = t.runtime.metrics

        def reads() -> dict[str, int]:
            return {name: n for calls in counted for name, n in calls.items()}

        def running() -> float | None:
            return metrics.gauge("akter.jobs.running", actor_type="Pinger", job="hold")

        assert await t.get(Pinger, "a").ping(1) == 1  # an intent row, no job row
        await sampler.sample()
        assert reads() == {}
        assert gauges(t.runtime, "intent")[0] == 1

        step = await a_running_job(t, provider)
        await sampler.sample()
        assert reads() == {"running_jobs": 1, "sample_flow": 1, "due_jobs": 1}
        assert running() == 1

        # Settled, the row is gone: the job gauges read 0 without their statements.
        step.release()
        await t.wait_idle()
        await sampler.sample()
        assert reads() == {"running_jobs": 1, "sample_flow": 1, "due_jobs": 1}
        assert running() == 0
        assert gauges(t.runtime, "job") == (0, 0, 0)


async def test_sampled_gauges_only_on_the_maintenance_owner(akter_test: Make) -> None:
    async with akter_test(ACTORS, relay=False) as t:
        first = t.runtime
        first._runners.sampler.every_ms = 20  # before its loop first waits
        second = await t.add_runtime()
        second._runners.sampler.every_ms = 20
        second._runners.refresh_ms = 50  # contends for $maintenance every 50 ms
        await asyncio.wait_for(first._runners.sampler.wait_for(10), 10)
        # Ten samples (and several lease attempts of the second runner) later: one owner.
        assert second._runners.sampler.taken == 0
        assert gauges(second, "intent") == (None, None, None)
        assert "akter_outbox_rows" not in second.metrics.render()

        await t.get(Pinger, "a").ping(2)
        taken = first._runners.sampler.taken
        await asyncio.wait_for(first._runners.sampler.wait_for(taken + 2), 10)
        assert gauges(first, "intent")[0] == 2
        assert gauges(second, "intent") == (None, None, None)

        # A stopping owner releases the lease and stops reporting; the survivor takes over.
        await first.stop()
        t.runtimes.remove(first)
        assert gauges(first, "intent") == (None, None, None)
        assert "akter_outbox_rows" not in first.metrics.render()
        await asyncio.wait_for(second._runners.sampler.wait_for(1), 10)
        assert gauges(second, "intent")[0] == 2
