"""Flow control for jobs (issue 17, docs/flow-control.md): priorities, max_wait, concurrency caps.

The start order of attempts comes from :data:`~tests.integration.flow_actors.STARTS`; the
deployment-wide cap is checked on the durable rows (running rows with a live lease, the
``v_jobs`` derived state) and on what the executors saw, across three runners of one schema.
Passes are driven explicitly (``run_pass``) where a test asserts that a claim took nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import akter
from akter.testing import ActorTest
from tests._support import until
from tests.integration.flow_actors import FLOW, LIVE, STARTS, Lanes, Metered, Search, Slots

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    STARTS.clear()
    LIVE.reset()
    yield
    LIVE.gate.set()
    STARTS.clear()


async def job_rows(t: ActorTest) -> list[dict[str, Any]]:
    """Every job row with its status (``v_jobs``; on Citus too since migration 0009)."""
    return await t.rows("SELECT * FROM {schema}.v_jobs")


async def running(t: ActorTest, job: str) -> int:
    rows = await t.rows(
        "SELECT count(*) AS n FROM {schema}.outbox WHERE kind = 'job' AND running"
        " AND command = %(job)s",
        {"job": job},
    )
    return int(rows[0]["n"])


# --- priorities -------------------------------------------------------------------------------


async def test_high_priority_rows_start_before_an_older_low_backlog(akter_test: Make) -> None:
    """1,000 low rows, then 100 high ones: every high row starts before any low row."""
    async with akter_test(FLOW, relay=False, executor_concurrency=64) as t:
        lanes = t.get(Lanes, "l1")
        for chunk in range(10):
            await lanes.fill(100, f"low{chunk}")
        await lanes.fill(100, "high", priority=9)
        priorities = Counter(r["priority"] for r in await job_rows(t))
        assert sorted(priorities.items()) == [(0, 1000), (9, 100)]
        await t.advance(0)
        tags = [tag for _, tag in STARTS]
        assert len(tags) == 1100 and len(set(tags)) == 1100
        assert all(tag.startswith("high-") for tag in tags[:100]), tags[:110]
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []


async def test_max_wait_lets_a_low_row_through_a_steady_high_load(akter_test: Make) -> None:
    """High rows due every 0.5 s: the max_wait=2 s row starts among them, the strict one last."""
    async with akter_test(FLOW, relay=False, executor_concurrency=1) as t:
        await t.get(Lanes, "l1").spread(10, 0.5)
        await t.advance(6)  # everything due at once: one attempt per pass, by rank
        tags = [tag for _, tag in STARTS]
        # The aged row ranks like a priority-9 row ready 2 s after it: after the high rows due
        # at 0.5 … 2.0 s, before those due later; the strict low row waits for all of them.
        assert tags == [
            *(f"high-{i}" for i in range(3)),
            "aged",
            *(f"high-{i}" for i in range(3, 10)),
            "strict",
        ], tags


async def test_bad_priorities_are_refused() -> None:
    with pytest.raises(akter.DefinitionError, match="priority must be an integer from 0 to 9"):
        akter.job(priority=10)
    with pytest.raises(akter.DefinitionError, match="priority must be an integer from 0 to 9"):
        akter.job(priority=True)
    with pytest.raises(akter.DefinitionError, match="max_wait"):
        akter.job(max_wait=0)


async def test_an_enqueue_priority_out_of_range_refuses_the_command(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False) as t:
        lanes = t.get(Lanes, "l1")
        for bad in (10, -1, "9", 2.5):
            with pytest.raises(akter.ActorError) as caught:
                await lanes.bad_priority(bad)
            # Like any refusal raised inside a handler, the command fails as a Defect.
            assert caught.value.reason == "Defect"
            assert "enqueue(priority=) must be an integer from 0 to 9" in str(caught.value)
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []
        assert await t.rows("SELECT 1 FROM {schema}.actors") == []


# --- deployment-wide concurrency ----------------------------------------------------------------


async def test_bad_concurrency_is_refused() -> None:
    for bad in (0, -3, 10_001, True, 1.5, "2"):
        with pytest.raises(akter.DefinitionError, match="concurrency must be an integer"):
            akter.job(concurrency=bad)  # type: ignore[arg-type]


async def test_concurrency_holds_across_three_runners(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False, runners=3) as t:
        for i in range(4):
            await t.get(Slots, f"s{i}").fill(3)
        for rt in t.runtimes:  # every runner tries to claim: two attempts start in all
            await rt._jobs.run_pass()
        await until(lambda: LIVE.now == 2, what="two capped calls running")
        for rt in t.runtimes:
            assert await rt._jobs.run_pass() == 0
        assert await running(t, "capped") == 2
        states = Counter(r["status"] for r in await job_rows(t))
        assert sorted(states.items()) == [("running", 2), ("waiting_slot", 10)]
        await t.runtime._runners.sampler.sample()
        gauge = t.runtime.metrics.gauge
        assert gauge("akter.jobs.waiting_slot", actor_type="Slots", job="capped") == 10
        assert gauge("akter.jobs.running", actor_type="Slots", job="capped") == 2
        q = t.runtime._store.queries
        for listing in (q["jobs_overview"], q["console_jobs"]):  # akter jobs list, console
            shown = await t.rows(listing, {"limit": 100})
            assert sorted(r["status"] for r in shown) == ["running"] * 2 + ["waiting_slot"] * 10
        limits = await t.rows(
            "SELECT actor_type, job, concurrency FROM {schema}.job_limits ORDER BY job"
        )
        assert limits == [
            {"actor_type": "Slots", "job": "capped", "concurrency": 2},
            {"actor_type": "Slots", "job": "paired", "concurrency": 2},
        ]
        LIVE.gate.set()
        for _ in range(20):  # each settle frees a slot; passes on every runner take them
            for rt in t.runtimes:
                await rt._jobs.run_pass()
                await rt._jobs.wait_idle()
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        await t.drain()
        assert LIVE.most == 2
        assert len(STARTS) == 12
        seen = [tag for i in range(4) for tag in await t.get(Slots, f"s{i}").seen()]
        assert sorted(seen) == sorted(f"s{i}-{j}" for i in range(4) for j in range(3))


async def test_a_crashed_attempt_holds_its_slot_until_its_lease_ends(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False, lease=3, cancel_check=1) as t:
        LIVE.gate.set()
        slots = t.get(Slots, "s1")
        t.crash_next("before_execute")
        await slots.fill(1)
        assert await t.runtime._jobs.run_pass() == 1
        await t.wait_idle()  # the attempt "died": its row keeps running, leased
        await slots.fill(2)
        # One slot is the crashed attempt's, one is free: a pass takes one row, then none.
        assert await t.runtime._jobs.run_pass() == 1
        await t.wait_idle()
        assert await running(t, "capped") == 1
        await t.drain()
        assert await running(t, "capped") == 1  # still leased: the slot is not given back
        assert len(await slots.seen()) == 2
        await t.advance(4)  # the lease ends: the slot comes back and the retry runs
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []
        assert len(await slots.seen()) == 3
        assert LIVE.most <= 2


async def test_concurrency_combines_with_per_actor(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False, runners=2) as t:
        for i in range(3):
            await t.get(Slots, f"p{i}").fill_paired(2)
        for rt in t.runtimes:
            await rt._jobs.run_pass()
        await until(lambda: LIVE.now == 2, what="two paired calls running")
        for rt in t.runtimes:
            assert await rt._jobs.run_pass() == 0
        actors = await t.rows(
            "SELECT actor_id FROM {schema}.outbox WHERE kind = 'job' AND running ORDER BY 1"
        )
        assert len({r["actor_id"] for r in actors}) == 2  # per_actor=1: two actors, one each
        LIVE.gate.set()
        for _ in range(30):
            for rt in t.runtimes:
                await rt._jobs.run_pass()
                await rt._jobs.wait_idle()
            await t.advance(0.5)  # deferred group rows wait at most a lease for their wake
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        assert LIVE.most == 2
        assert len(STARTS) == 6


def test_concurrency_options_land_in_the_job_options() -> None:
    options: Any = Slots.capped.options
    assert options.concurrency == 2 and options.per_actor is None
    assert Lanes.aging.options.max_wait_ms == 2000
    assert Lanes.work.options.priority == 0


# --- keyed rate limits --------------------------------------------------------------------------


async def test_a_rate_defers_rows_without_counting_an_attempt(akter_test: Make) -> None:
    """Burst 2 per tenant: two start at once, the rest wait uncounted, one per 10 s."""
    async with akter_test(FLOW, relay=False) as t:
        ids = await t.get(Metered, "m1").fill(5)
        await t.runtime._jobs.run_pass()
        await t.wait_idle()
        assert len(STARTS) == 2
        rows = [r for r in await job_rows(t) if r["job"] == "metered"]
        assert [(r["status"], r["attempts"], r["ambiguous"], r["last_error"]) for r in rows] == [
            ("waiting_rate", 0, False, None)
        ] * 3
        buckets = await t.rows(
            "SELECT limit_no, key, tokens FROM {schema}.rate_buckets ORDER BY limit_no"
        )
        assert [(b["limit_no"], b["key"]) for b in buckets] == [(0, "default"), (1, "")]
        await t.runtime._runners.sampler.sample()
        gauge = t.runtime.metrics.gauge
        assert gauge("akter.jobs.waiting_rate", actor_type="Metered", job="metered") == 3
        assert buckets[0]["tokens"] < 1
        for _ in range(3):
            assert await t.runtime._jobs.run_pass() == 0  # nothing due before a token is
            await t.advance(10)  # one token of the tenant's bucket refills per 10 s
        assert len(STARTS) == 5 and len(set(STARTS)) == 5
        assert sorted(await t.get(Metered, "m1").seen()) == sorted(f"m1-{i}" for i in range(5))
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []
        assert len(ids) == 5


async def test_rate_keys_keep_tenants_apart(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False) as t:
        await t.get(Metered, "m1", tenant="a").fill(3)
        await t.get(Metered, "m1", tenant="b").fill(3)
        await t.runtime._jobs.run_pass()
        await t.wait_idle()
        started = sorted(tag for _, tag in STARTS)
        assert len(started) == 4  # two of each tenant's burst
        keys = await t.rows("SELECT key FROM {schema}.rate_buckets WHERE limit_no = 0 ORDER BY key")
        assert [k["key"] for k in keys] == ["a", "b"]


async def test_a_rate_key_that_raises_dead_letters_the_job(akter_test: Make) -> None:
    async with akter_test(FLOW, relay=False) as t:
        job_id = await t.get(Metered, "m2").fill_broken()
        await t.advance(0)
        assert STARTS == []  # the executor never ran
        letters = await t.rows("SELECT job_id, cause, ambiguous FROM {schema}.dead_letters")
        assert letters == [
            {
                "job_id": job_id,
                "cause": "Rate key of Metered.unkeyable raised ValueError: no key for m2",
                "ambiguous": False,
            }
        ]
        seen = await t.get(Metered, "m2").seen()
        assert seen == [
            "dead: Rate key of Metered.unkeyable raised ValueError: no key for m2 after 1"
        ]
        assert await t.rows("SELECT 1 FROM {schema}.outbox") == []


def test_bad_rates_are_refused() -> None:
    bad: list[tuple[Callable[[], Any], str]] = [
        (lambda: akter.Rate(0), "Rate limit must be an integer"),
        (lambda: akter.Rate(True), "Rate limit must be an integer"),
        (lambda: akter.Rate(5, burst=0), "Rate burst must be an integer"),
        (lambda: akter.Rate(5, per=0), "Rate per must be between"),
        (lambda: akter.Rate(5, key="tenant"), "Rate key must be a function"),  # type: ignore[arg-type]
        (lambda: akter.job(rate=5), "rate= takes an akter.Rate"),  # type: ignore[arg-type]
        (lambda: akter.job(rate=[akter.Rate(1)] * 9), "at most 8 limits"),
    ]
    for make, message in bad:
        with pytest.raises(akter.DefinitionError, match=message):
            make()


# --- debounce: the recipe ---------------------------------------------------------------------


async def test_the_debounce_recipe_fires_once_after_the_last_event(akter_test: Make) -> None:
    """Events 1 s apart keep moving the flush; it fires once, 2 s after the last, with all."""
    async with akter_test([Search]) as t:
        search = t.get(Search, "q1")
        for text in ("a", "ab", "abc"):
            await search.typed(text)
            await t.advance(1)  # less than the 2 s debounce: the flush never fires
            assert await search.batches() == []
        timers = await t.rows("SELECT timer_key FROM {schema}.outbox WHERE kind = 'intent'")
        assert timers == [{"timer_key": "flush"}]  # one pending flush, replaced each time
        await t.advance(0.5)  # 1.5 s after the last event (real time adds a little)
        assert await search.batches() == []
        await t.advance(1)
        assert await search.batches() == [["a", "ab", "abc"]]
        await t.advance(5)
        assert await search.batches() == [["a", "ab", "abc"]]  # once
        await search.typed("x")
        await t.advance(2.1)
        assert await search.batches() == [["a", "ab", "abc"], ["x"]]
