"""A commit's own job rows claimed by primary key (issue 13, goal 4: job start latency).

A commit that made only job rows due wakes its relay for a jobs-only pass naming those rows; the
executor claims them with ``claim_jobs_keyed`` (by primary key, prepared) instead of the bucket
probe of ``claim_jobs``, but only when nothing else should go first: the rows are of uncapped
types without a deployment-wide cap, each has a free slot, and the last full claim left no due
rows behind. Otherwise, or when the keyed claim does not take every row (locked by another
claimer, parked, not executed here), the full claims run as before. Every statement runs on
PostgreSQL; the gateway's methods are wrapped only to count calls.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.sql
import pytest

from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, gate, succeed
from tests._support import until
from tests._support.counting import count_calls
from tests._support.providers import fresh_provider
from tests.integration.test_jobs_actors import ALL, PROVIDER, Hot, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

CLAIMS = ["claim_keyed", "claim_uncapped", "claim_group"]


def claimed_rows(gateway: Any) -> Counter[str]:
    """From now on, the rows each of the gateway's claim methods returned, in all."""
    rows: Counter[str] = Counter()
    for name in CLAIMS:
        original = getattr(gateway, name)

        async def counted(
            *args: Any, _name: str = name, _original: Any = original, **kw: Any
        ) -> Any:
            found = await _original(*args, **kw)
            rows[_name] += len(found)
            return found

        setattr(gateway, name, counted)
    return rows


provider = fresh_provider(PROVIDER)


async def job_rows(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox WHERE kind = 'job' ORDER BY intent_id")


def plain_only(t: ActorTest) -> None:
    if t.on_citus:
        pytest.skip("keyed claims run on plain PostgreSQL; Citus runs the full claim")


async def first_full_pass(t: ActorTest) -> None:
    """Until a full claim has run, a wake runs the full claim (the backlog is not known)."""
    t.runtime._relay.wake()
    await until(lambda: t.runtime._jobs._uncapped_backlog is False, what="a first full pass")


async def settled(t: ActorTest, shop: Any, n: int) -> None:
    async def done() -> bool:
        return len(await shop.reports()) >= n and await job_rows(t) == []

    await until(done, what=f"{n} job(s) settled and routed")


async def test_a_commits_due_job_is_claimed_by_key_and_runs_once(
    akter_test: Make, provider: FakeProvider
) -> None:
    # poll=60: only the commit's wake can start the job within the test's time.
    async with akter_test(ALL, poll=60) as t:
        plain_only(t)
        await first_full_pass(t)
        rows = claimed_rows(t.runtime._jobs.gateway)
        provider.script(succeed(7), succeed(8))
        shop = t.get(Shop, "k1")

        first = await shop.buy(100, tag="one")
        await settled(t, shop, 1)
        assert +rows == {"claim_keyed": 1}  # (routing the outcome woke full passes: no rows)
        second = await shop.buy(200, tag="two")
        await settled(t, shop, 2)
        assert +rows == {"claim_keyed": 2}
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(first, 1), (second, 1)]
        assert [r["value"] for r in await shop.reports()] == [7, 8]


async def test_a_backlog_left_by_the_last_claim_makes_the_wake_run_the_full_claim(
    akter_test: Make, provider: FakeProvider
) -> None:
    # One executor slot, held by a gated attempt: the next commit's row has no free slot, so the
    # full claim runs (it finds no slot either). When the slot frees, the full claim takes the
    # waiting row; a later commit is keyed again once a claim left nothing behind.
    async with akter_test(ALL, poll=60, executor_concurrency=1) as t:
        plain_only(t)
        await first_full_pass(t)
        held = gate(1)
        provider.script(held, succeed(2), succeed(3))
        calls = count_calls(t.runtime._jobs.gateway, CLAIMS)
        shop = t.get(Shop, "k2")

        await shop.buy(100, tag="held")
        await until(lambda: provider.count == 1, what="the first attempt holding the slot")
        assert calls == {"claim_keyed": 1}
        await shop.buy(200, tag="waits")
        # The wake's pass: no free slot, so no keyed claim and no full claim either.
        await until(lambda: t.runtime._relay.in_flight == 0 and provider.count == 1)
        assert calls["claim_keyed"] == 1
        held.release()
        await settled(t, shop, 2)
        assert calls["claim_keyed"] == 1 and calls["claim_uncapped"] >= 1

        await shop.buy(300, tag="after")
        await settled(t, shop, 3)
        assert [r["value"] for r in await shop.reports()] == [1, 2, 3]


async def test_a_row_another_claimer_holds_is_skipped_and_claimed_once_it_is_free(
    akter_test: Make, akter_db: str, provider: FakeProvider
) -> None:
    # The keyed claim is SKIP LOCKED like the full one: a row another transaction holds is not
    # taken, and the full claim that follows skips it too. Once the lock is gone a pass takes
    # it, and the job runs exactly once. (poll=60: no poll can claim it meanwhile.)
    async with akter_test(ALL, poll=60) as t:
        plain_only(t)
        await first_full_pass(t)
        provider.script(succeed(5))
        calls = count_calls(t.runtime._jobs.gateway, CLAIMS)
        shop = t.get(Shop, "k3")
        async with await psycopg.AsyncConnection.connect(akter_db) as other:
            held = t.pause_next("after_commit")  # committed; its wake not yet sent
            buy = asyncio.create_task(shop.buy(100, tag="locked"))
            await held.wait()
            cur = await other.execute(
                psycopg.sql.SQL(
                    "SELECT intent_id FROM {}.outbox WHERE kind = 'job' FOR UPDATE"
                ).format(psycopg.sql.Identifier(t.schema))
            )
            [(job_id,)] = await cur.fetchall()
            held.release()
            assert await buy == job_id
            await until(
                lambda: calls["claim_keyed"] == 1 and calls["claim_uncapped"] == 1,
                what="the keyed claim, then the full claim, both skipping the row",
            )
            [row] = await job_rows(t)
            assert (row["attempts"], row["running"], provider.count) == (0, False, 0)
            await other.rollback()

        t.runtime._relay.wake()
        await settled(t, shop, 1)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 1)]


async def test_rows_of_capped_types_are_never_claimed_by_key(
    akter_test: Make, provider: FakeProvider
) -> None:
    # A per-actor cap is kept by the group claim under its lock: a capped row is never keyed.
    async with akter_test(ALL, poll=60) as t:
        plain_only(t)
        await first_full_pass(t)
        provider.script(succeed(1))
        calls = count_calls(t.runtime._jobs.gateway, CLAIMS)
        hot = t.get(Hot, "k4")
        await hot.start_one(["a"])

        async def routed() -> bool:
            return len(await hot.reports()) == 1 and await job_rows(t) == []

        await until(routed, what="the capped job run and routed")
        assert calls["claim_keyed"] == 0 and calls["claim_group"] >= 1


async def test_a_job_this_runner_does_not_execute_is_left_for_the_runner_that_does(
    akter_test: Make, provider: FakeProvider
) -> None:
    # Runner A commits the row but executes no jobs: its wake claims nothing by key (the row's
    # job is not among its executed ones) and its full claim has no types. Runner B runs it.
    async with akter_test(ALL, poll=60, jobs=[]) as t:
        plain_only(t)
        provider.script(succeed(9))
        a_calls = count_calls(t.runtime._jobs.gateway, CLAIMS)
        b = await t.add_runtime(ALL, poll=0.05, jobs=None)  # all of its types' jobs
        shop = t.get(Shop, "k5")
        job_id = await shop.buy(100, tag="elsewhere")
        await settled(t, shop, 1)
        assert a_calls["claim_keyed"] == 0
        assert [c.job_id for c in provider.calls] == [job_id]
        assert b._jobs.finished == 1


async def test_a_keyed_claim_cut_short_by_a_crash_is_taken_over_after_its_lease_and_runs_once(
    akter_test: Make, provider: FakeProvider
) -> None:
    # The runner dies right after the keyed claim committed, before the attempt begins (a crash
    # at after_claim: no further write). The row stays claimed, running and pre-marked
    # ambiguous, like any claim a death cut short; after its lease attempt 2 runs, once, and
    # its outcome is routed once.
    async with akter_test(ALL, poll=60) as t:
        plain_only(t)
        await first_full_pass(t)
        provider.script(succeed(4))
        rows = claimed_rows(t.runtime._jobs.gateway)
        t.crash_next("after_claim")
        shop = t.get(Shop, "k6")
        job_id = await shop.buy(100, tag="crash")
        await until(lambda: rows["claim_keyed"] == 1, what="the keyed claim")
        [row] = await job_rows(t)
        assert (row["attempts"], row["running"], row["ambiguous"]) == (1, True, True)
        assert provider.count == 0

        await t.advance(t.runtime.config.job_lease_ms / 1000 + 1)
        await settled(t, shop, 1)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 2)]
        assert [r["value"] for r in await shop.reports()] == [4]
