"""Conformance: jobs (JB-*) on a real PostgreSQL — attempts, settles, routes and dead letters.

Each test drives the real runtime through ``ActorTest``: time moves with ``advance`` (which also
drains the relay and the executor), faults come from ``crash_next``/``pause_next``, and the
provider is the scripted :class:`~akter.testing.provider.FakeProvider` of the test actors. The
assertions read durable rows: outbox columns, dead letters, and route receipts whose command id
is the job id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import akter
from akter._engine.jobs.attempt import DEADLINE_MARGIN_MS
from akter._ids import parse_framework_id
from akter.testing import ActorTest, ManualClock
from akter.testing.provider import FakeProvider, fail, gate, hang, raises, succeed
from tests._support import until
from tests._support.providers import fresh_provider
from tests.integration.test_jobs_actors import ALL, PROVIDER, Hot, Rejecting, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


provider = fresh_provider(PROVIDER)


async def jobs(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT * FROM {schema}.outbox WHERE kind = 'job' ORDER BY scheduled_at_ms, intent_id"
    )


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def letters(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.dead_letters ORDER BY dead_at_ms, job_id")


async def receipts_for(t: ActorTest, command_id: str) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT command, caller_key, outcome FROM {schema}.receipts WHERE command_id = %(id)s",
        {"id": command_id},
    )


async def advance_until(
    t: ActorTest,
    check: Callable[[], Awaitable[bool]],
    *,
    step: float = 0.05,
    within: float = 20.0,
) -> None:
    """Advance the clock by ``step`` and drain, until ``check`` holds (bounded by ``within``)."""

    async def advanced() -> bool:
        if await check():
            return True
        await t.advance(step)
        return False

    await until(advanced, within=within, interval=0)


async def settled(t: ActorTest) -> bool:
    return not await outbox(t)


# --- enqueue and success ----------------------------------------------------------------------


async def test_JB01_no_job_row_unless_the_turn_commits(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        shop = t.get(Shop, "s1")
        t.crash_next("before_commit")
        cid = await t.runtime.mint_command_id()
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(shop.with_command_id(cid).buy(10))
        await pause.wait()
        assert await jobs(t) == []  # staged, not visible before the commit
        pause.release()
        job_id = await call  # the crash is retried with the same id, which commits once
        await t.advance(0)
        assert provider.count == 1
        assert [c.job_id for c in provider.calls] == [job_id]
        assert len(await receipts_for(t, job_id)) == 1


async def test_JB02_success_routes_once_under_the_job_id(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(succeed(7))
        shop = t.get(Shop, "s1")
        with akter.as_caller(akter.User("alice")):
            job_id = await shop.buy(100)
        assert parse_framework_id(job_id).raw == job_id
        await t.advance(0)
        assert [(c.job_id, c.attempt, c.principal) for c in provider.calls] == [
            (job_id, 1, "alice")
        ]
        (report,) = await shop.reports()
        assert {**report, "caller": list(report["caller"])} == {
            "route": "success",
            "id": job_id,
            "value": 7,
            "caller": ["job", "Shop", "alice"],
        }
        (receipt,) = await receipts_for(t, job_id)
        assert receipt["command"] == "charged"
        assert json.loads(receipt["caller_key"]) == [
            "System",
            "job",
            ["default", "Shop", "s1"],
            "alice",
        ]
        assert await outbox(t) == []
        await t.advance(3600)
        assert len(await receipts_for(t, job_id)) == 1
        assert provider.count == 1


async def test_JB03_a_running_attempt_is_leased_and_pre_marked_ambiguous(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        step = gate(5)
        provider.script(step)
        job_id = await t.get(Shop, "s1").buy(1)
        before = await t.now_ms()
        drain = asyncio.create_task(t.advance(0))
        await asyncio.wait_for(step.entered.wait(), 10)
        (row,) = await jobs(t)
        after = await t.now_ms()
        assert row["intent_id"] == job_id
        assert row["running"] and row["attempts"] == 1 and row["ambiguous"]
        assert row["last_error"] == "Attempt 1 ended without reporting an outcome"
        lease = t.runtime.config.job_lease_ms
        assert before + lease <= row["due_at_ms"] <= after + lease
        step.release()
        await drain
        assert await settled(t)


# --- failures and dead letters ----------------------------------------------------------------


async def test_JB06_typed_failures_dead_letter_unambiguously(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("card declined"), fail("card declined again"))
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1)
        with caplog.at_level(logging.INFO, logger="akter.jobs"):
            await advance_until(t, lambda: settled(t))
        assert provider.count == 2
        (report,) = await shop.reports()
        assert report["route"] == "dead_letter" and report["id"] == job_id
        assert (report["attempts"], report["ambiguous"]) == (2, False)
        assert "JobFailure" in report["cause"]
        (letter,) = await letters(t)
        assert (letter["job"], letter["attempts"], letter["ambiguous"]) == ("charge", 2, False)
        assert letter["cause"] == "JobFailure: card declined again"
        messages = [r.getMessage().partition(": ")[0] for r in caplog.records]
        assert "Job attempt failed; retrying with backoff" in messages
        assert "Job dead-lettered after its last attempt" in messages
        dead = next(r for r in caplog.records if r.getMessage().startswith("Job dead-lettered"))
        assert (dead.actor, dead.id, dead.tenant, dead.job, dead.job_id, dead.attempt) == (  # type: ignore[attr-defined]
            "Shop",
            "s1",
            "default",
            "charge",
            job_id,
            2,
        )


async def test_JB06_a_final_failure_dead_letters_at_once(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("no such card", final=True))
        shop = t.get(Shop, "s1")
        job_id = await shop.buy_four(1)
        await advance_until(t, lambda: settled(t))
        assert provider.count == 1
        (report,) = await shop.reports()
        assert (report["route"], report["id"], report["attempts"], report["ambiguous"]) == (
            "dead_letter",
            job_id,
            1,
            False,
        )


async def test_JB07_a_crash_after_a_failure_dead_letters_ambiguously(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("declined"))
        t.crash_next("before_execute", lambda info: info["attempt"] == 2)
        job_id = await t.get(Shop, "s1").buy(1)
        await advance_until(t, lambda: _attempts_are(t, 2, running=True))
        assert provider.count == 1
        await t.advance(
            t.runtime.config.job_lease_ms / 1000 + 1
        )  # the crashed attempt's lease ends
        await advance_until(t, lambda: settled(t))
        assert provider.count == 1  # the exhausted row is settled without a new attempt
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 2, True)
        assert letter["cause"] == "Attempt 2 ended without reporting an outcome"


async def test_JB07_a_single_attempt_defect_dead_letters_ambiguously(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(raises(RuntimeError("boom")))
        shop = t.get(Shop, "s1")
        job_id = await shop.buy_plain(1)
        provider.script(raises(RuntimeError("boom again")))
        await advance_until(t, lambda: settled(t))
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 2, True)
        assert letter["cause"] == "RuntimeError: boom again"


async def test_JB08_a_result_the_route_rejects_is_an_ambiguous_dead_letter(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(succeed(1.5))
        r = t.get(Rejecting, "r1")
        job_id = await r.go()
        await advance_until(t, lambda: settled(t))
        assert provider.count == 1
        (report,) = await r.reports()
        assert report["route"] == "dead_letter" and report["id"] == job_id
        assert (report["attempts"], report["ambiguous"]) == (1, True)
        assert report["cause"].startswith("The on_success route cannot accept the result: ")
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["measure_dead"]


async def test_JB08_a_failed_dead_letter_commit_is_finished_without_a_new_attempt(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(succeed(1.5))
        r = t.get(Rejecting, "r1")
        t.crash_next("before_dead_letter_commit")
        job_id = await r.go()
        await t.advance(0)
        (row,) = await jobs(t)
        assert (row["attempts"], row["final_failure"], row["running"]) == (1, True, False)
        assert await letters(t) == []
        await advance_until(t, lambda: settled(t))
        assert provider.count == 1
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 1, True)
        assert letter["cause"].startswith("The on_success route cannot accept the result: ")


async def test_JB09_timeouts_back_off_and_dead_letter(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.default = hang()
        job_id = await t.get(Shop, "s1").buy_slow(1)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            await advance_until(t, lambda: settled(t), step=0)
        assert provider.count == 4
        assert [c.attempt for c in provider.calls] == [1, 2, 3, 4]
        assert all(c.outcome == "interrupted" for c in provider.calls)
        durations = [c.ended - c.started for c in provider.calls if c.ended is not None]
        assert all(0.09 <= d <= 0.6 for d in durations), durations
        # Attempt n+1 starts no earlier than the backoff after attempt n: 10, 20, 40 ms.
        gaps = [
            later.started - earlier.ended
            for earlier, later in zip(provider.calls, provider.calls[1:], strict=False)
            if earlier.ended is not None
        ]
        assert [g >= b / 1000 - 0.002 for g, b in zip(gaps, (10, 20, 40), strict=True)] == [
            True
        ] * 3, gaps
        retries = [r for r in caplog.records if r.getMessage().startswith("Job attempt failed")]
        assert [r.cause for r in retries] == ["Executor timed out after 100 ms"] * 3  # type: ignore[attr-defined]
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 4, True)
        assert letter["cause"] == "Executor timed out after 100 ms"


async def _attempts_are(t: ActorTest, attempts: int, *, running: bool) -> bool:
    rows = await jobs(t)
    return len(rows) == 1 and (rows[0]["attempts"], rows[0]["running"]) == (attempts, running)


async def _pass(t: ActorTest, runtime: int = 0) -> int:
    """One executor pass on one runtime (no drain, no clock move)."""
    return await t.runtimes[runtime]._jobs.run_pass()


# --- crashes and takeovers --------------------------------------------------------------------


async def test_JB04_a_crash_before_execute_calls_nothing_and_attempt_2_is_maybe_applied(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        step = gate(3)
        provider.script(step)
        t.crash_next("before_execute")
        job_id = await t.get(Shop, "s1").buy(1)
        await t.advance(0)
        assert provider.count == 0
        (row,) = await jobs(t)
        assert (row["attempts"], row["running"], row["maybe_applied"]) == (1, True, False)
        drain = asyncio.create_task(t.advance(t.runtime.config.job_lease_ms / 1000 + 1))
        await asyncio.wait_for(step.entered.wait(), 10)
        (row,) = await jobs(t)
        assert (row["attempts"], row["running"], row["maybe_applied"]) == (2, True, True)
        step.release()
        await drain
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 2)]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]
        assert await settled(t)


async def test_JB05_a_crash_after_execute_runs_the_executor_again_and_routes_once(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(succeed(1), succeed(2))
        t.crash_next("after_execute")
        job_id = await t.get(Shop, "s1").buy(1)
        await t.advance(0)
        assert provider.count == 1
        await t.advance(t.runtime.config.job_lease_ms / 1000 + 1)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 1), (job_id, 2)]
        (receipt,) = await receipts_for(t, job_id)
        assert receipt["command"] == "charged" and receipt["outcome"] == {"ok": None}
        assert [r["value"] for r in await t.get(Shop, "s1").reports()] == [2]


@pytest.mark.parametrize("point", ["after_commit", "before_outbox_delete"])
async def test_JB05_a_crash_in_the_route_delivery_keeps_one_attempt_and_one_receipt(
    akter_test: Make, provider: FakeProvider, point: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(succeed(4))
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1)
        t.crash_next(point)
        await t.advance(0)
        (row,) = await outbox(t)
        assert (row["kind"], row["intent_id"], row["command"]) == ("intent", job_id, "charged")
        await t.advance(t.runtime.config.claim_lease_ms / 1000 + 1)
        assert provider.count == 1
        assert len(await receipts_for(t, job_id)) == 1
        assert [r["value"] for r in await shop.reports()] == [4]
        assert await settled(t)


async def test_JB10_only_runners_executing_the_job_claim_it(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, jobs=[Shop.plain]) as t:
        job_id = await t.get(Shop, "s1").buy(1)
        await t.advance(0)
        (row,) = await jobs(t)
        assert (row["attempts"], row["running"]) == (0, False)
        assert provider.count == 0
        await t.add_runtime(jobs=None)
        await t.advance(0)
        assert [c.job_id for c in provider.calls] == [job_id]
        assert await settled(t)


async def test_JB11_a_long_attempt_is_renewed_and_never_taken_over(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        step = gate(11)
        provider.script(step)
        job_id = await t.get(Shop, "s1").buy(1)
        assert await _pass(t) == 1
        await asyncio.wait_for(step.entered.wait(), 10)
        (first,) = await jobs(t)
        seen = {first["due_at_ms"]}
        started = time.monotonic()
        while time.monotonic() - started < 4.0:  # longer than the lease
            assert await _pass(t, 1) == 0
            (row,) = await jobs(t)
            assert row["attempts"] == 1 and row["running"]
            seen.add(row["due_at_ms"])
            await asyncio.sleep(0.25)
        assert len(seen) >= 3  # each renewal moved the lease end
        step.release()
        await t.advance(0)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 1)]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]


async def test_JB12_unreachable_renewals_interrupt_at_the_local_deadline(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    local = ManualClock()  # the attempt's lease deadline is measured on this clock
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1, local_clock=local) as t:
        await t.add_runtime()
        provider.script(hang(), succeed(12))
        renew = t.pause_next("before_renew")
        job_id = await t.get(Shop, "s1").buy(1)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            claim_sent = local.now()
            assert await _pass(t) == 1
            await renew.wait()  # no renewal will be confirmed
            # The deadline: the claim's send time + the lease − the margin, before the server's.
            deadline = claim_sent + 3 - DEADLINE_MARGIN_MS / 1000
            assert local.next_wake() == deadline
            await local.advance(deadline - local.now() - 0.001)
            assert provider.calls[0].outcome == "running"  # a millisecond before it
            await local.advance(0.001)
            await t.wait_idle()  # ends at the local deadline
            assert provider.calls[0].outcome == "interrupted"
            (row,) = await jobs(t)
            assert (row["attempts"], row["running"], row["ambiguous"]) == (1, True, True)
            messages = [r.getMessage().partition(": ")[0] for r in caplog.records]
            assert "Job attempt outlived its lease; interrupted" in messages
            renew.release()
            await t.advance(3)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 1), (job_id, 2)]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]


async def test_JB12_an_attempt_held_past_its_lease_never_calls_the_executor(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    local = ManualClock()
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1, local_clock=local) as t:
        await t.add_runtime()
        provider.script(succeed(12))
        held = t.pause_next("before_execute")
        job_id = await t.get(Shop, "s1").buy(1)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            assert await _pass(t) == 1
            await held.wait()
            await local.advance(3)  # the whole lease passes, locally, while it is held
            held.release()
            await t.wait_idle()
        assert provider.count == 0
        assert "Job attempt outlived its lease before it started" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        await t.advance(3.1)  # and on the server: the row's lease ends, attempt 2 is claimed
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 2)]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]


async def _lose_lease(t: ActorTest) -> None:
    """Give runtime 1 a clock past runtime 0's lease (a takeover without waiting)."""
    t.runtimes[1]._clock.offset_ms += t.runtime.config.job_lease_ms + 1000


async def test_JB13_a_stale_failure_never_touches_the_newer_attempt(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        first, second = gate(then=fail("stale")), gate(13)
        provider.script(first, second)
        job_id = await t.get(Shop, "s1").buy(1)
        assert await _pass(t) == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await _pass(t, 1) == 1
        await asyncio.wait_for(second.entered.wait(), 10)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            first.release()
            await t.wait_idle()
        assert "Job attempt failed after a newer attempt or a settle took its row" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        (row,) = await jobs(t)
        assert (row["attempts"], row["running"], row["ambiguous"]) == (2, True, True)
        assert row["last_error"] == "Attempt 2 ended without reporting an outcome"
        second.release()
        await t.wait_idle(runner=1)
        await t.advance(0)
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]
        assert await letters(t) == []


async def test_JB13_a_stale_success_wins_and_the_newer_failure_changes_nothing(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        first, second = gate(21), gate(then=fail("late failure", final=True))
        provider.script(first, second)
        job_id = await t.get(Shop, "s1").buy(1)
        assert await _pass(t) == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await _pass(t, 1) == 1
        await asyncio.wait_for(second.entered.wait(), 10)
        first.release()
        await t.wait_idle()
        second.release()
        await t.wait_idle(runner=1)
        await t.advance(0)
        assert [r["value"] for r in await t.get(Shop, "s1").reports()] == [21]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charged"]
        assert await letters(t) == []
        assert await settled(t)


async def test_JB14_a_stale_success_after_the_dead_letter_flips_it_ambiguous(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        first, second = gate(5), fail("declined", final=True)
        provider.script(first, second)
        job_id = await t.get(Shop, "s1").buy(1)
        assert await _pass(t) == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await _pass(t, 1) == 1
        await t.wait_idle(runner=1)
        (letter,) = await letters(t)
        assert (letter["attempts"], letter["ambiguous"]) == (2, False)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            first.release()
            await t.wait_idle()
        assert "Job succeeded after it was dead-lettered" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 2, True)
        await t.advance(0)
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charge_dead"]


# --- cancellation -----------------------------------------------------------------------------


async def test_JB15_a_job_cancelled_before_any_attempt_is_deleted(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        shop = t.get(Shop, "s1")
        await shop.buy(1, key="k")
        await shop.cancel("k")
        assert await jobs(t) == []
        await shop.buy_and_cancel(1, "k2")
        assert await jobs(t) == []
        await shop.cancel("unknown")
        first = await shop.buy(1, key="k3")
        second = await shop.buy(2, key="k3")
        assert [r["intent_id"] for r in await jobs(t)] == [second]
        with pytest.raises(akter.DeclaredError):
            await shop.cancel_then_fail("k3")
        await t.advance(0)
        assert [c.job_id for c in provider.calls] == [second]
        assert await receipts_for(t, first) == []
        assert [r["id"] for r in await shop.reports()] == [second]


@pytest.mark.parametrize(
    ("step", "kind", "ambiguous"),
    [(fail("declined"), "Failed", False), (raises(RuntimeError("boom")), "Unknown", True)],
)
async def test_JB16_cancelled_during_backoff(
    akter_test: Make, provider: FakeProvider, step: Any, kind: str, ambiguous: bool
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(step)
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1, key="k")
        assert await _pass(t) == 1
        await t.wait_idle()
        (row,) = await jobs(t)
        assert (row["attempts"], row["running"]) == (1, False)
        await shop.cancel("k")
        await t.advance(1)
        assert provider.count == 1
        (report,) = await shop.reports()
        assert (report["route"], report["id"], report["attempts"]) == ("cancelled", job_id, 1)
        assert (report["outcome"]["kind"], report["ambiguous"]) == (kind, ambiguous)
        assert await settled(t)


async def test_JB17_a_running_attempt_cancelled_on_its_runner_is_interrupted_at_once(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(hang())
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1, key="k")
        assert await _pass(t) == 1
        await provider.wait_calls(1)
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="akter.jobs"):
            await shop.cancel("k")
            await t.wait_idle()
        assert time.monotonic() - started < 1.0  # cancel_check is 20 s: the signal did it
        assert "Job attempt interrupted by its cancellation" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        await t.advance(0)
        (report,) = await shop.reports()
        assert (report["route"], report["id"]) == ("cancelled", job_id)
        assert report["outcome"] == {
            "kind": "Unknown",
            "cause": "Cancelled while attempt 1 was running; the provider may have applied it",
        }
        assert report["ambiguous"] is True
        await t.advance(3600)
        assert provider.count == 1


async def test_JB17_a_cancellation_while_held_at_before_execute_interrupts(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(hang())
        held = t.pause_next("before_execute")
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1, key="k")
        assert await _pass(t) == 1
        await held.wait()
        await shop.cancel("k")
        held.release()
        await t.wait_idle()
        await t.advance(0)
        (report,) = await shop.reports()
        assert (report["id"], report["outcome"]["kind"], report["ambiguous"]) == (
            job_id,
            "Unknown",
            True,
        )
        assert provider.count <= 1
        assert await settled(t)


async def test_JB17_a_cancellation_from_another_runner_is_seen_at_the_next_renewal(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1, jobs=[]) as t:
        await t.add_runtime(jobs=None)
        provider.script(hang())
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1, key="k")
        assert await _pass(t, 1) == 1
        await provider.wait_calls(1)
        started = time.monotonic()
        await shop.cancel("k")  # on runtime 0, which runs no attempt
        await t.wait_idle(runner=1)
        assert time.monotonic() - started < 2.5
        await t.advance(0)
        (report,) = await shop.reports()
        assert (report["id"], report["outcome"]["kind"]) == (job_id, "Unknown")


@pytest.mark.parametrize("actor", ["Shop", "Hot", "Rejecting"])
async def test_JB18_a_result_finished_before_the_cancellation_is_reported_as_succeeded(
    akter_test: Make, provider: FakeProvider, actor: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        value: Any = {"Shop": 18, "Hot": 19, "Rejecting": 1.5}[actor]
        provider.script(succeed(value))
        held = t.pause_next("after_execute")
        if actor == "Shop":
            handle: Any = t.get(Shop, "x")
            job_id = await handle.buy(1, key="k")
        elif actor == "Hot":
            handle = t.get(Hot, "x")
            job_id = await handle.start_one_keyed("a", "k")
        else:
            handle = t.get(Rejecting, "x")
            job_id = await handle.go(key="k")
        assert await _pass(t) == 1
        await held.wait()
        await handle.cancel("k")
        held.release()
        await t.wait_idle()
        await t.advance(0)
        (report,) = await handle.reports()
        assert (report["route"], report["id"], report["ambiguous"]) == ("cancelled", job_id, False)
        assert report["outcome"] == {"kind": "Succeeded", "value": value}
        assert await letters(t) == []
        assert await settled(t)


async def test_JB19_a_success_after_the_cancellation_settled_is_an_ambiguous_dead_letter(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        step = gate(7)
        provider.script(step)
        job_id = await t.get(Shop, "s1").buy(1, key="k")
        assert await _pass(t) == 1
        await asyncio.wait_for(step.entered.wait(), 10)
        await t.runtimes[1].get(Shop, "s1").cancel("k")  # no signal reaches runtime 0
        await _lose_lease(t)
        assert await _pass(t, 1) == 1  # settle-only: the cancelled row is reported Unknown
        await t.wait_idle(runner=1)
        (row,) = await outbox(t)
        assert (row["kind"], row["command"]) == ("intent", "charge_cancelled")
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            step.release()
            await t.wait_idle()
        assert "Job succeeded after its cancellation settled" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["ambiguous"]) == (job_id, True)
        assert letter["cause"] == "Succeeded after it was cancelled"
        await t.advance(0)
        (report,) = await t.get(Shop, "s1").reports()
        assert (report["route"], report["outcome"]["kind"]) == ("cancelled", "Unknown")
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["charge_cancelled"]


async def test_JB20_without_on_cancelled(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        shop = t.get(Shop, "s1")
        # An ambiguous cancellation becomes an ambiguous dead letter.
        provider.script(hang(), key="amb")
        ambiguous = await shop.buy_plain(1, tag="amb", key="amb")
        assert await _pass(t) == 1
        await provider.wait_calls(1)
        await shop.cancel("amb")
        await t.wait_idle()
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["ambiguous"]) == (ambiguous, True)
        # A failed cancellation is dropped with an info line, no dead letter.
        provider.script(fail("declined"), key="failed")
        failed = await shop.buy_plain(1, tag="failed", key="failed")
        assert await _pass(t) == 1
        await t.wait_idle()
        await shop.cancel("failed")
        with caplog.at_level(logging.INFO, logger="akter.jobs"):
            await t.advance(1)
        assert "Cancelled job dropped after a failed attempt" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        assert [r["job_id"] for r in await letters(t)] == [ambiguous]
        assert await receipts_for(t, failed) == []
        # A cancelled success goes to on_success.
        provider.script(succeed(20), key="ok")
        held = t.pause_next("after_execute")
        succeeded = await shop.buy_plain(1, tag="ok", key="ok")
        assert await _pass(t) == 1
        await held.wait()
        await shop.cancel("ok")
        held.release()
        await t.advance(0)
        reports = {r["id"]: r for r in await shop.reports()}
        assert reports[ambiguous]["route"] == "dead_letter"
        assert reports[succeeded] == {"route": "success", "id": succeeded, "value": 20}
        assert failed not in reports
        assert await settled(t)


async def test_JB21_re_enqueueing_a_running_keyed_job(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(hang(), succeed(21))
        shop = t.get(Shop, "s1")
        old = await shop.buy(1, key="k")
        assert await _pass(t) == 1
        await provider.wait_calls(1)
        new = await shop.buy(2, key="k")
        assert new != old
        await t.advance(0)
        reports = {r["id"]: r for r in await shop.reports()}
        assert reports[old]["route"] == "cancelled"
        assert reports[old]["outcome"]["kind"] == "Unknown"
        assert reports[new] == {
            "route": "success",
            "id": new,
            "value": 21,
            "caller": reports[new]["caller"],
        }
        assert [c.job_id for c in provider.calls] == [old, new]
        assert await settled(t)


# --- per-actor caps ---------------------------------------------------------------------------


async def _enqueue_apart(t: ActorTest, calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run enqueuing turns with the clock 5 ms apart, so their ready times are ordered."""
    results = []
    for call in calls:
        results.append(await call())
        for runtime in t.runtimes:
            runtime._clock.offset_ms += 5
    return results


async def test_JB23_cap_one_runs_an_actors_attempts_one_at_a_time_in_order(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        hot, other = t.get(Hot, "h1"), t.get(Hot, "h2")
        steps = {tag: gate(i) for i, tag in enumerate(["a", "b", "c", "x"])}
        for tag, step in steps.items():
            provider.script(step, key=tag)
        ids = await _enqueue_apart(
            t,
            [
                lambda: hot.start_one(["a"]),
                lambda: hot.start_one(["b"]),
                lambda: hot.start_one(["c"]),
                lambda: other.start_one(["x"]),
            ],
        )
        drain = asyncio.create_task(advance_until(t, lambda: settled(t), step=0))
        await provider.wait_calls(2)
        assert sorted(c.key or "" for c in provider.calls) == ["a", "x"]  # h2 is not held back
        waiting = [r for r in await jobs(t) if r["waiting"]]
        assert {r["intent_id"] for r in waiting} == {ids[1][0], ids[2][0]}
        for tag in ["x", "a", "b", "c"]:
            await asyncio.wait_for(steps[tag].entered.wait(), 10)
            assert provider.max_concurrency() <= 2
            steps[tag].release()
        await drain
        assert [c.key for c in provider.calls if c.key != "x"] == ["a", "b", "c"]
        h1 = [c for c in provider.calls if c.key != "x"]
        assert all(
            e.ended is not None and e.ended <= later.started for e, later in itertools.pairwise(h1)
        )
        assert [r["id"] for r in await hot.reports()] == [i[0] for i in ids[:3]]


async def test_JB23_cap_two_across_three_runners(akter_test: Make, provider: FakeProvider) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        await t.add_runtime()
        provider.default = succeed(1, after=0.05)
        hot = t.get(Hot, "hot")
        await hot.start_two(["hot"] * 6)
        await hot.start_two(["hot"] * 6)
        for i in range(6):
            await t.get(Hot, f"o{i}").start_two([f"o{i}"])
        await advance_until(t, lambda: settled(t), step=0)
        assert provider.max_concurrency("hot") <= 2
        assert len({c.job_id for c in provider.calls}) == 18 == provider.count
        assert {c.attempt for c in provider.calls} == {1}
        assert len(await hot.reports()) == 12


async def test_JB23_a_capped_success_waits_while_a_newer_attempt_is_live(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        first, second = gate(1), gate(2)
        provider.script(first, second)
        (job_id,) = await t.get(Hot, "h1").start_one(["a"])
        assert await _pass(t) == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await _pass(t, 1) == 1  # attempt 2 takes over the expired lease
        await asyncio.wait_for(second.entered.wait(), 10)
        first.release()
        await asyncio.sleep(1.2)
        (row,) = await jobs(t)  # attempt 1's success waits: attempt 2 holds a live lease
        assert (row["kind"], row["attempts"], row["running"]) == ("job", 2, True)
        second.release()
        await t.wait_idle()
        await t.wait_idle(runner=1)
        await t.advance(0)
        # Attempt 1 gave up once attempt 2's success ended the row: one outcome is routed.
        assert [r["value"] for r in await t.get(Hot, "h1").reports()] == [2]
        assert [r["command"] for r in await receipts_for(t, job_id)] == ["one_done"]


async def test_JB26_a_capped_dead_letter_while_a_claim_holds_the_group_lock(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("declined", final=True), key="a")
        provider.script(succeed(2), key="b")
        hot = t.get(Hot, "h1")
        ids = await _enqueue_apart(t, [lambda: hot.start_one(["a"]), lambda: hot.start_one(["b"])])
        letter_pause = t.pause_next("before_dead_letter_commit")
        assert await _pass(t) == 1
        await letter_pause.wait()  # the dead letter is inserted, its transaction open
        rk = t.runtime.routing_key(hot.ref)
        async with await psycopg.AsyncConnection.connect(t.database_url) as conn:
            # Another claim's group lock: FOR NO KEY UPDATE does not wait for the letter's
            # foreign-key share lock.
            await conn.execute(
                t.runtime._store.queries["job_group_lock"],
                {"rk": rk, "tenant": "default", "type": "Hot", "id": "h1"},
            )
            letter_pause.release()
            await asyncio.sleep(0.2)
            await conn.rollback()
        await advance_until(t, lambda: settled(t), step=0)
        assert [r["job_id"] for r in await letters(t)] == [ids[0][0]]
        assert [r["id"] for r in await hot.reports()] == [ids[0][0], ids[1][0]]


# --- dead letters -----------------------------------------------------------------------------


async def test_JB29_retry_and_discard_dead_letters(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    from akter.operators.dead_letters import DeadLetters

    async with akter_test(ALL, relay=False) as t:
        provider.script(raises(RuntimeError("reset")), raises(RuntimeError("reset")), key="r")
        provider.script(fail("no", final=True), key="d")
        shop = t.get(Shop, "s1")
        retried = await shop.buy(1, tag="r")
        discarded = await shop.buy(2, tag="d")
        await advance_until(t, lambda: settled(t))
        letters_ = DeadLetters(t.runtime._services, wake=t.runtime._relay.announce)
        assert {x.job_id: x.ambiguous for x in await letters_.list()} == {
            retried: True,
            discarded: False,
        }
        provider.script(succeed(29), key="r")
        with caplog.at_level(logging.WARNING, logger="akter.dead_letters"):
            new_id = await letters_.retry(retried)
        assert new_id != retried and caplog.records
        (row,) = await jobs(t)
        assert (row["intent_id"], row["maybe_applied"], row["attempts"]) == (new_id, True, 0)
        assert [x.job_id for x in await letters_.list()] == [discarded]
        await t.advance(0)
        assert [r["command"] for r in await receipts_for(t, new_id)] == ["charged"]
        gone = await letters_.discard(discarded)
        assert gone.job_id == discarded and await letters(t) == []
        with pytest.raises(akter.ActorError):
            await letters_.show(discarded)
