"""Plain successes settled many per statement (issue 45; semantics §5.9 "Batched successes").

The executor's settle coalescer sends a lone success at once and batches what finishes while a
flush is in flight; a row the batch does not take (cancelled meanwhile), and every row of a batch
that fails, goes on through the per-row settle. Flushes are held with ``pause_next`` at
``before_settle_flush`` and attempts are started by explicit passes (``run_pass``), so which
successes share a statement is forced, not timed. Plain PostgreSQL only: on Citus each settle is
its own keyed statement. The gateway's ``end_successes`` is wrapped only to record its batches;
every assertion reads durable rows, receipts and the routes' reports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from akter._engine.jobs.coalescer import SettleCoalescer
from akter.operators.runner import RunnerControl
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, succeed
from tests._support import until
from tests._support.providers import fresh_provider
from tests.integration.test_jobs_actors import ALL, PROVIDER, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


provider = fresh_provider(PROVIDER)


def plain_only(t: ActorTest) -> None:
    if t.on_citus:
        pytest.skip("batched settles run on plain PostgreSQL; on Citus each settle is keyed")


def coalescer(t: ActorTest, runner: int = 0) -> SettleCoalescer:
    settles = t.runtimes[runner]._jobs.settles
    assert settles is not None
    return settles


def recorded(t: ActorTest, *, fail: Callable[[int], BaseException | None] | None = None,
             lose: Callable[[int], bool] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """From now on, each batch the gateway ends: its job ids, what it took, when it started.

    ``fail(n)``: an error the n-th batch raises before sending anything; ``lose(n)``: the n-th
    batch commits and then raises, as if its answer was lost on the way back.
    """
    gateway = t.runtime._jobs.gateway
    real = gateway.end_successes
    batches: list[dict[str, Any]] = []

    async def end_successes(successes: Any) -> set[str]:
        n = len(batches)
        batch: dict[str, Any] = {
            "ids": sorted(row.intent_id for row, _ in successes),
            "at": time.monotonic(),
            "taken": None,
        }
        batches.append(batch)
        error = fail(n) if fail is not None else None
        if error is not None:
            raise error
        taken = await real(successes)
        batch["taken"] = sorted(taken)
        if lose is not None and lose(n):
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return taken

    gateway.end_successes = end_successes  # type: ignore[method-assign]
    return batches


async def receipts_for(t: ActorTest, command_id: str) -> list[str]:
    rows = await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
    return [str(r["command"]) for r in rows]


async def outbox(t: ActorTest) -> dict[str, dict[str, Any]]:
    rows = await t.rows("SELECT * FROM {schema}.outbox ORDER BY intent_id")
    return {str(r["intent_id"]): r for r in rows}


async def claim(t: ActorTest) -> int:
    """One executor pass on runner 0: starts the due attempts and returns at once."""
    return await t.runtime._jobs.run_pass()


async def test_successes_that_finish_while_a_flush_is_in_flight_share_the_next_statement(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        batches = recorded(t)
        shops = [t.get(Shop, f"a{i}") for i in range(6)]
        for i in range(6):
            provider.script(succeed(10 + i), key=f"t{i}")
        first = await shops[0].buy(1, tag="t0")
        held = t.pause_next("before_settle_flush")
        assert await claim(t) == 1
        assert (await held.wait())["job_ids"] == [first]
        rest = [await shops[i].buy(i, tag=f"t{i}") for i in range(1, 6)]
        assert await claim(t) == 5
        settles = coalescer(t)
        # The five wait behind the held flush (settle_wait is 1 s, settle_batch 64): none is sent.
        await until(lambda: settles.waiting, holds=lambda n: n == 5, what="five queued successes")
        assert batches == []
        held.release()
        await t.advance(0)
        assert [b["ids"] for b in batches] == [[first], sorted(rest)]
        assert [b["taken"] for b in batches] == [[first], sorted(rest)]
        assert (settles.flushed, settles.carried) == (2, 6)
        for i, job_id in enumerate([first, *rest]):
            assert await receipts_for(t, job_id) == ["charged"]
            reports = await shops[i].reports()
            assert [(r["route"], r["id"], r["value"]) for r in reports] == [
                ("success", job_id, 10 + i)
            ]
        assert await outbox(t) == {}


async def test_a_lone_success_is_sent_at_once_not_after_the_wait(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        batches = recorded(t)
        provider.script(succeed(7), key="solo")
        job_id = await t.get(Shop, "s1").buy(1, tag="solo")
        executed = t.pause_next("after_execute")
        drain = asyncio.create_task(t.advance(0))
        await executed.wait()
        returned = time.monotonic()
        executed.release()
        await drain
        (batch,) = batches
        assert batch["ids"] == [job_id] and batch["taken"] == [job_id]
        # settle_wait is 1 s: a lone success that waited for it would start a second later.
        assert batch["at"] - returned < 0.5
        assert await receipts_for(t, job_id) == ["charged"]


async def test_successes_behind_a_slow_flush_go_beside_it_after_the_wait(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_wait=0.005) as t:
        plain_only(t)
        batches = recorded(t)
        for i in range(4):
            provider.script(succeed(i), key=f"u{i}")
        first = await t.get(Shop, "b0").buy(1, tag="u0")
        held = t.pause_next("before_settle_flush")
        await claim(t)
        await held.wait()
        rest = [await t.get(Shop, f"b{i}").buy(i, tag=f"u{i}") for i in range(1, 4)]
        await claim(t)
        # The held flush never ends by itself: the three go in a flush of their own beside it.
        await until(
            lambda: sorted(i for b in batches if b["taken"] for i in b["taken"]),
            holds=lambda ids: ids == sorted(rest),
            what="the three successes taken while the first flush is held",
        )
        rows = await outbox(t)
        assert {i: (rows[i]["kind"], rows[i]["command"]) for i in rest} == dict.fromkeys(
            rest, ("intent", "charged")
        )
        assert (rows[first]["kind"], rows[first]["running"]) == ("job", True)
        held.release()
        await t.advance(0)
        for job_id in [first, *rest]:
            assert await receipts_for(t, job_id) == ["charged"]


async def test_a_row_cancelled_while_its_success_waits_is_left_to_the_per_row_settle(
    akter_test: Make, provider: FakeProvider
) -> None:
    # The batch's guard is the open row: B's cancellation committed after its executor returned
    # and before the flush, so the batch leaves B, and B's own settle routes its success as the
    # cancellation report (semantics §5.9, Succeeded step 2), once.
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        batches = recorded(t)
        provider.script(succeed(1), key="a")
        provider.script(succeed(2), key="b")
        provider.script(succeed(3), key="c")
        a = await t.get(Shop, "c0").buy(1, tag="a")
        held = t.pause_next("before_settle_flush")
        await claim(t)
        await held.wait()
        shop_b, shop_c = t.get(Shop, "c1"), t.get(Shop, "c2")
        b = await shop_b.buy(2, tag="b", key="kb")
        c = await shop_c.buy(3, tag="c")
        await claim(t)
        await until(lambda: coalescer(t).waiting, holds=lambda n: n == 2, what="two queued")
        await shop_b.cancel("kb")
        assert (await outbox(t))[b]["cancelled_at_ms"] is not None
        held.release()
        await t.advance(0)
        assert [(bt["ids"], bt["taken"]) for bt in batches] == [
            ([a], [a]),
            (sorted([b, c]), [c]),
        ]
        (report,) = await shop_b.reports()
        assert (report["route"], report["id"]) == ("cancelled", b)
        assert report["outcome"] == {"kind": "Succeeded", "value": 2}
        assert report["ambiguous"] is False
        assert await receipts_for(t, b) == ["charge_cancelled"]
        assert [r["value"] for r in await shop_c.reports()] == [3]
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        assert await outbox(t) == {}


async def test_a_batch_that_fails_leaves_each_success_to_its_own_writes(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        plain_only(t)
        batches = recorded(
            t, fail=lambda n: psycopg.errors.DeadlockDetected("deadlock") if n == 0 else None
        )
        provider.script(succeed(5), key="f")
        shop = t.get(Shop, "f1")
        job_id = await shop.buy(5, tag="f")
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            await t.advance(0)
        assert "A batched settle of 1 job successes failed; each is settled on its own" in (
            caplog.text
        )
        assert [(b["ids"], b["taken"]) for b in batches] == [([job_id], None)]
        assert await receipts_for(t, job_id) == ["charged"]
        assert [r["value"] for r in await shop.reports()] == [5]
        assert provider.count == 1
        assert await outbox(t) == {}


async def test_a_batch_whose_answer_is_lost_after_it_committed_routes_each_success_once(
    akter_test: Make, provider: FakeProvider
) -> None:
    # The per-row settle then finds the row already routed: a late success that writes nothing
    # (no dead letter, no cancellation report), never a second outcome.
    async with akter_test(ALL, relay=False) as t:
        plain_only(t)
        batches = recorded(t, lose=lambda n: n == 0)
        provider.script(succeed(6), key="l")
        shop = t.get(Shop, "l1")
        job_id = await shop.buy(6, tag="l")
        await t.advance(0)
        assert [(b["ids"], b["taken"]) for b in batches] == [([job_id], [job_id])]
        assert await receipts_for(t, job_id) == ["charged"]
        assert [r["value"] for r in await shop.reports()] == [6]
        assert provider.count == 1
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []
        assert await outbox(t) == {}


async def test_a_batch_with_and_without_routes_ends_both_in_one_transaction(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        batches = recorded(t)
        provider.script(succeed(8), key="d0")
        provider.script(succeed(1), key="d1")
        provider.script(succeed(9), key="d2")
        first = await t.get(Shop, "d0").buy(1, tag="d0")
        held = t.pause_next("before_settle_flush")
        await claim(t)
        await held.wait()
        plain = await t.get(Shop, "d1").buy_slow(1, tag="d1")  # ``slow`` has no on_success
        routed = await t.get(Shop, "d2").buy(2, tag="d2")
        await claim(t)
        await until(lambda: coalescer(t).waiting, holds=lambda n: n == 2, what="two queued")
        held.release()
        await until(lambda: len(batches), holds=lambda n: n == 2, what="the second batch")
        await t.wait_idle()
        rows = await outbox(t)
        assert plain not in rows  # deleted
        assert (rows[routed]["kind"], rows[routed]["command"]) == ("intent", "charged")
        assert [bt["taken"] for bt in batches] == [[first], sorted([plain, routed])]
        await t.advance(0)
        assert await receipts_for(t, routed) == ["charged"]
        assert await receipts_for(t, plain) == []
        assert [r["value"] for r in await t.get(Shop, "d2").reports()] == [9]
        assert await outbox(t) == {}


async def test_a_stopping_runner_sends_the_successes_it_holds(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        runtime = t.runtime
        for i in range(3):
            provider.script(succeed(i), key=f"e{i}")
        first = await t.get(Shop, "e0").buy(1, tag="e0")
        held = t.pause_next("before_settle_flush")
        await claim(t)
        await held.wait()
        rest = [await t.get(Shop, f"e{i}").buy(i, tag=f"e{i}") for i in (1, 2)]
        await claim(t)
        await until(lambda: coalescer(t).waiting, holds=lambda n: n == 2, what="two queued")
        stopping = asyncio.create_task(runtime.stop())
        await until(lambda: runtime.readiness, holds=lambda r: r == "draining", what="draining")
        held.release()
        await stopping
        rows = await outbox(t)
        assert {i: (r["kind"], r["command"]) for i, r in rows.items()} == dict.fromkeys(
            [first, *rest], ("intent", "charged")
        )


async def test_settle_batch_one_sends_every_success_alone(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_batch=1) as t:
        plain_only(t)
        batches = recorded(t)
        for i in range(4):
            provider.script(succeed(i), key=f"g{i}")
        ids = [await t.get(Shop, f"g{i}").buy(i, tag=f"g{i}") for i in range(4)]
        await t.advance(0)
        assert sorted(i for b in batches for i in b["ids"]) == sorted(ids)
        assert all(len(b["ids"]) == 1 for b in batches)
        for job_id in ids:
            assert await receipts_for(t, job_id) == ["charged"]


async def test_settle_batch_successes_waiting_go_at_once_beside_a_flush_in_flight(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False, settle_batch=2, settle_wait=1) as t:
        plain_only(t)
        batches = recorded(t)
        for i in range(6):
            provider.script(succeed(i), key=f"n{i}")
        first = await t.get(Shop, "n0").buy(1, tag="n0")
        held = t.pause_next("before_settle_flush")
        await claim(t)
        await held.wait()
        rest = [await t.get(Shop, f"n{i}").buy(i, tag=f"n{i}") for i in range(1, 6)]
        await claim(t)
        settles = coalescer(t)
        # Two batches of two go beside the held flush as soon as two are waiting; the fifth
        # waits for the held flush to end (the 1 s wait has not passed).
        await until(
            lambda: sorted(len(b["taken"] or []) for b in batches),
            holds=lambda sizes: sizes == [2, 2],
            what="two full batches beside the held flush",
        )
        assert settles.waiting == 1
        held.release()
        await t.advance(0)
        assert sorted(i for b in batches for i in b["ids"]) == sorted([first, *rest])
        assert all(len(b["ids"]) <= 2 for b in batches)
        for job_id in [first, *rest]:
            assert await receipts_for(t, job_id) == ["charged"]


async def test_a_success_waiting_for_its_batch_frees_its_executor_slot(
    akter_test: Make, provider: FakeProvider
) -> None:
    # One slot: the first success waits behind its held flush without holding the slot, so the
    # next claim starts the second job; two waiting successes hold one slot again (the bound:
    # at most executor_concurrency successes free theirs), so the third job waits.
    async with akter_test(ALL, relay=False, settle_wait=1, executor_concurrency=1) as t:
        plain_only(t)
        for i in range(3):
            provider.script(succeed(i), key=f"s{i}")
        first = await t.get(Shop, "s0").buy(1, tag="s0")
        held = t.pause_next("before_settle_flush")
        try:
            assert await claim(t) == 1
            assert (await held.wait())["job_ids"] == [first]
            second = await t.get(Shop, "s1").buy(1, tag="s1")
            assert await claim(t) == 1
            settles = coalescer(t)
            await until(lambda: settles.waiting, holds=lambda n: n == 1, what="the second queued")
            third = await t.get(Shop, "s2").buy(1, tag="s2")
            assert await claim(t) == 0
            assert (await outbox(t))[third]["attempts"] == 0
        finally:
            held.release()  # else the runner's stop waits for the held flush
        await t.advance(0)
        for i, job_id in enumerate([first, second, third]):
            assert await receipts_for(t, job_id) == ["charged"]
            reports = await t.get(Shop, f"s{i}").reports()
            assert [(r["route"], r["id"], r["value"]) for r in reports] == [("success", job_id, i)]
        assert await outbox(t) == {}


async def test_a_drain_waits_for_a_success_its_pass_did_not_start(
    akter_test: Make, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by CI (an HTTP test read the actor before its job's route had run): another pass
    # starts the attempt after the drain awaited the attempts, and its success waits for its
    # flush while the drain's own pass claims nothing. The success frees its executor slot, but
    # its row and route are not written: the drain must go round again, not return.
    async with akter_test(ALL, relay=False, settle_wait=1) as t:
        plain_only(t)
        provider.script(succeed(7), key="d0")
        job_id = await t.get(Shop, "d0").buy(1, tag="d0")
        real = RunnerControl.run_pass
        passes = 0

        async def run_pass(control: RunnerControl) -> int:
            nonlocal passes
            passes += 1
            if passes > 1:
                return await real(control)
            held = t.pause_next("before_settle_flush")
            assert await claim(t) == 1  # the other pass, between the drain's wait and its own
            await held.wait()
            claimed = await real(control)
            held.release()  # the flush goes on only after the drain has looked
            return claimed

        monkeypatch.setattr(RunnerControl, "run_pass", run_pass)
        await t.drain()
        assert passes >= 2
        assert await receipts_for(t, job_id) == ["charged"]
        reports = await t.get(Shop, "d0").reports()
        assert [(r["route"], r["id"], r["value"]) for r in reports] == [("success", job_id, 7)]
        assert await outbox(t) == {}
