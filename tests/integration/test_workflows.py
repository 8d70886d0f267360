"""Workflows on a real PostgreSQL (the workflows spec, W6: WF-01 and WF-04 to WF-10).

Runs are driven by the real runtime through ``ActorTest``: ``advance`` moves the database clock
and drains the relay, the job executor and the workflow engine; faults come from the fault
points ``before_step_record``/``after_step_record``/``before_workflow_complete``. Assertions
read durable rows (``workflows``, ``workflow_steps``, ``workflow_signals``, receipts) and what
really ran (``CALLS``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import akter
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, fail, hang, succeed
from tests.integration.workflow_actors import (
    ALL,
    CALLS,
    PROVIDER,
    Careless,
    Note,
    Order,
    OutOfStock,
    Stock,
)

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def counters() -> Iterator[FakeProvider]:
    CALLS.clear()
    PROVIDER.reset()
    yield PROVIDER
    CALLS.clear()
    PROVIDER.reset()


async def run_row(t: ActorTest, run_id: str) -> dict[str, Any]:
    rows = await t.rows("SELECT * FROM {schema}.workflows WHERE run_id = %(id)s", {"id": run_id})
    assert len(rows) == 1
    return rows[0]


async def steps(t: ActorTest, run_id: str) -> list[tuple[int, str, str, str]]:
    rows = await t.rows(
        "SELECT seq, kind, name, status FROM {schema}.workflow_steps WHERE run_id = %(id)s "
        "ORDER BY seq",
        {"id": run_id},
    )
    return [(r["seq"], r["kind"], r["name"], r["status"]) for r in rows]


# --- WF-01 -------------------------------------------------------------------------------------


async def test_wf01_three_command_steps_complete_each_handler_once(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-1")
        run = await order.three.start("sku-1")
        await t.drain()
        result: str = await run.result(timeout=10)
        assert result == "reserved, 2 left"
        assert CALLS["mark:o-1:reserving"] == 1
        assert CALLS["reserve:o-1"] == 1
        assert CALLS["mark:o-1:left 2"] == 1
        assert await order.marks() == ["reserving", "left 2"]
        assert await t.get(Stock, "sku-1").left() == 2
        row = await run_row(t, run.id)
        assert (row["status"], row["wake_at_ms"], json.loads(row["result"])) == (
            "completed",
            None,
            "reserved, 2 left",
        )
        assert await steps(t, run.id) == [
            (0, "command", "Order.mark", "done"),
            (1, "command", "Stock.reserve", "done"),
            (2, "command", "Order.mark", "done"),
        ]
        status = await t.workflow(run.id)
        assert status.status == "completed" and len(status.steps) == 3
        # Each command step's receipt is stored under the command id its pending record named.
        for step in status.steps:
            command_id = json.loads(step.detail or "{}")["command_id"]
            receipts = await t.rows(
                "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s",
                {"id": command_id},
            )
            assert len(receipts) == 1


async def test_wf01_starting_again_with_the_same_command_id_returns_the_same_run(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        cid = await t.runtime.mint_command_id()
        order = t.get(Order, "o-2")
        first = await order.with_command_id(cid).three.start("sku-2")
        again = await order.with_command_id(cid).three.start("sku-2")
        assert first.id == again.id
        with pytest.raises(akter.ActorError) as refused:
            await order.with_command_id(cid).three.start("sku-other")
        assert refused.value.reason == "CommandConflict"
        await t.drain()
        assert await first.result(timeout=10) == "reserved, 2 left"
        assert CALLS["reserve:o-2"] == 1
        assert len(await t.rows("SELECT run_id FROM {schema}.workflows")) == 1


async def test_a_start_with_arguments_that_do_not_validate_is_refused_and_writes_nothing(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        with pytest.raises(akter.ActorError) as refused:
            await t.get(Order, "o-3").fulfil.start("sku", "not cents")  # type: ignore[arg-type]
        assert refused.value.reason == "InvalidInput"
        with pytest.raises(akter.ActorError) as nan:
            await t.get(Order, "o-3").waiter.start(1, float("nan"))
        assert nan.value.reason == "InvalidInput"
        assert await t.rows("SELECT run_id FROM {schema}.workflows") == []


async def test_a_declared_error_of_a_command_step_fails_the_run_with_its_class(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-4").declared.start("sku-4")
        await t.drain()
        with pytest.raises(OutOfStock) as raised:
            await run.result(timeout=10)
        assert raised.value.sku == "sku-4"
        status = await t.workflow(run.id)
        assert status.status == "failed"
        assert status.error is not None and status.error.tag == "WfOutOfStock"
        assert status.steps[0].outcome["declared"]["fields"] == {"sku": "sku-4"}


# --- WF-04 -------------------------------------------------------------------------------------


async def test_wf04_a_local_step_interrupted_between_call_and_record_runs_again(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, workflow_lease=1) as t:
        t.crash_next("before_step_record", lambda info: info["seqs"] == [0])
        run = await t.get(Order, "o-5").local.start()
        await t.drain()
        assert CALLS["flaky:a"] == 3  # two failed attempts, then the call that was not recorded
        assert await steps(t, run.id) == []
        await t.advance(2)  # the crashed attempt's lease ends; the next claim resumes the run
        result = await run.result(timeout=10)
        assert CALLS["flaky:a"] == 4  # at least once: it ran again, and succeeded at once
        assert result[0] == "ok:a"
        kinds = [(kind, name) for _, kind, name, _ in await steps(t, run.id)]
        assert kinds == [
            ("step", "flaky"),
            ("value", "now"),
            ("value", "uuid4"),
            ("value", "random"),
            ("command", "Order.mark"),
        ]
        # The recorded values are what the command saw.
        assert await t.get(Order, "o-5").marks() == [" ".join(result[1:])]


async def test_a_local_step_that_fails_every_attempt_raises_step_failed(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-6").failing.start()
        await t.drain()
        with pytest.raises(akter.WorkflowFailed) as failed:
            await run.result(timeout=10)
        assert failed.value.type == "StepFailed"
        assert CALLS["always_fails"] == 2
        status = await t.workflow(run.id)
        assert status.steps[0].outcome == {"failed": {"attempts": 2, "cause": "RuntimeError: nope"}}


# --- WF-05 -------------------------------------------------------------------------------------


async def test_wf05_a_sleeping_run_holds_no_lease_and_wakes_under_advance(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-7").sleeper.start(1)
        await t.drain()
        row = await run_row(t, run.id)
        now = await t.now_ms()
        assert row["status"] == "suspended"
        assert row["lease_owner"] is None
        assert 3_590_000 <= row["wake_at_ms"] - now <= 3_600_000
        assert t.runtime._workflow_engine.running == 0  # no task holds it
        await t.advance(1800)
        assert (await run_row(t, run.id))["status"] == "suspended"
        await t.advance(1801)
        assert await run.result(timeout=10) == "woke"
        assert await steps(t, run.id) == [(0, "sleep", "sleep", "done")]


async def test_wf05_an_idle_relay_probe_sees_the_next_sleeping_run(akter_test: Make) -> None:
    async with akter_test(ALL, notify=True) as t:
        if t.on_citus:
            pytest.skip("the probe answers 0 on Citus (the claims run)")
        await t.get(Order, "o-8").sleeper.start(2)
        await t.drain()
        wait_ms = await t.runtime._relay._outbox.next_due()
        assert wait_ms is not None and 7_100_000 <= wait_ms <= 7_200_000
        assert await t.runtime._relay._outbox.any_due() is False


# --- WF-06 -------------------------------------------------------------------------------------


async def test_wf06_a_job_step_returns_its_result(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        PROVIDER.script(succeed("ch_1"))
        run = await t.get(Order, "o-9").paid.start(500)
        await t.drain()
        assert await run.result(timeout=10) == "ch_1"
        assert PROVIDER.count == 1
        assert await steps(t, run.id) == [(0, "job", "charge", "done")]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


async def test_wf06_a_dead_lettered_job_raises_job_dead_lettered_with_its_ambiguity(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        PROVIDER.script(fail("declined"), fail("declined"))
        run = await t.get(Order, "o-10").paid.start(500)
        await t.advance(1)
        assert await run.result(timeout=10) == "dead:False"
        letters = await t.rows("SELECT job, attempts, cause FROM {schema}.dead_letters")
        assert [(r["job"], r["attempts"]) for r in letters] == [("charge", 2)]


async def test_wf06_a_cancelled_job_raises_job_cancelled(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        PROVIDER.script(hang())
        run = await t.get(Order, "o-11").paid.start(500)
        calls = await PROVIDER.wait_calls(1)
        assert await t.runtime.cancel_job(calls[0].job_id) == "cancelled"
        await t.drain()
        # The attempt was running when it was cancelled: the provider may have applied it.
        assert await run.result(timeout=10) == "cancelled:Unknown"
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


# --- WF-07 -------------------------------------------------------------------------------------


async def test_wf07_signals_sent_before_the_wait_are_kept_in_order_each_once(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-12").waiter.start(3)
        await run.signal(Note(text="one"))
        await run.signal(Note(text="two"))
        await t.drain()
        assert (await run_row(t, run.id))["status"] == "suspended"
        await run.signal(Note(text="three"))
        await t.drain()
        assert await run.result(timeout=10) == ["one", "two", "three"]
        signals = await t.rows(
            "SELECT name, consumed_seq FROM {schema}.workflow_signals ORDER BY signal_seq"
        )
        assert [(s["name"], s["consumed_seq"]) for s in signals] == [
            ("Note", 0),
            ("Note", 1),
            ("Note", 2),
        ]
        with pytest.raises(akter.ActorError) as ended:
            await run.signal(Note(text="late"))
        assert ended.value.code == "workflow_finished"


async def test_wf07_a_wait_times_out_with_none(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-13").waiter.start(2, 60)
        await run.signal(Note(text="first"))
        await t.drain()
        await t.advance(61)
        assert await run.result(timeout=10) == ["first", "timeout"]


async def test_wf07_a_signal_from_a_turn_is_staged_with_it(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-14")
        run = await order.fulfil.start("sku-14", 1000)
        PROVIDER.script(succeed("ch_14"))
        await t.drain()
        assert (await run_row(t, run.id))["waiting"] == "signal Shipped"
        await order.ship(run.id, "TRACK-1")
        await t.drain()
        await t.advance(86_401)
        assert await run.result(timeout=10) == "ch_14"
        assert await order.marks() == ["reserving", "closed TRACK-1 fee 100"]
        assert CALLS["fee"] == 1
        outcomes = await order.outcomes()
        assert [(o.status, o.result) for o in outcomes] == [("completed", "ch_14")]
        assert CALLS[f"on_complete:{run.id}"] == 1


# --- WF-08 -------------------------------------------------------------------------------------


async def test_wf08_a_start_staged_in_a_turn_that_raises_creates_no_run(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-15")
        with pytest.raises(OutOfStock):
            await order.begin_then_fail("sku-15")
        await t.drain()
        assert await t.rows("SELECT run_id FROM {schema}.workflows") == []
        run_id = await order.begin("sku-15")
        await t.drain()
        assert await t.runtime.workflow_run(run_id).result(timeout=10) == "reserved, 2 left"


async def test_wf08_a_key_allows_one_live_run(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-16")
        gate = t.pause_next("before_step_record")  # the first run stays live at its first step
        first = await order.begin("sku-16", "k")
        await gate.wait()
        # A second start while the first run is held at its step: the live run's id, and no
        # second run (W1).
        second = await order.begin("sku-16", "k")
        assert second == first
        runs = await t.rows("SELECT run_id, status FROM {schema}.workflows")
        assert [r["run_id"] for r in runs] == [first]
        gate.release()
        await t.drain()
        assert await t.runtime.workflow_run(second).result(timeout=10) == "reserved, 2 left"
        assert CALLS["reserve:o-16"] == 1
        # Once it has ended, the key starts a new run.
        third = await order.begin("sku-16", "k")
        await t.drain()
        assert await t.runtime.workflow_run(third).result(timeout=10) == "reserved, 1 left"
        assert len(await t.rows("SELECT run_id FROM {schema}.workflows")) == 2


# --- WF-10 -------------------------------------------------------------------------------------


async def test_wf10_cancel_raises_at_the_next_await_compensates_and_reports_once(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-17")
        run = await order.compensating.start()
        await t.drain()
        assert (await run_row(t, run.id))["status"] == "suspended"
        await run.cancel()
        await t.drain()
        with pytest.raises(akter.WorkflowCancelled):
            await run.result(timeout=10)
        assert await order.marks() == ["reserve", "compensate"]
        # The cancel took the place of the pending wait it interrupted.
        assert await steps(t, run.id) == [
            (0, "command", "Order.mark", "done"),
            (1, "cancel", "cancel", "done"),
            (2, "command", "Order.mark", "done"),
        ]
        await t.drain()
        outcomes = await order.outcomes()
        assert [o.status for o in outcomes] == ["cancelled"]
        assert CALLS[f"on_complete:{run.id}"] == 1
        await run.cancel()  # idempotent on an ended run
        await t.drain()
        assert CALLS[f"on_complete:{run.id}"] == 1


async def test_wf10_a_timeout_cancels_the_run(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        order = t.get(Order, "o-18")
        run = await order.fulfil.start("sku-18", 100)
        await t.drain()
        await t.advance(7 * 86_400 + 1)
        with pytest.raises(akter.WorkflowCancelled) as cancelled:
            await run.result(timeout=10)
        assert "timed out" in str(cancelled.value)
        outcomes = await order.outcomes()
        assert [o.status for o in outcomes] == ["cancelled"]


# --- careless workflow code --------------------------------------------------------------------


async def test_a_workflow_that_swallows_its_suspension_still_suspends(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Careless, "c-1").swallows.start()
        await t.drain()
        assert (await run_row(t, run.id))["status"] == "suspended"
        assert CALLS["careless:c-1:after the wait"] == 0
        assert await steps(t, run.id) == [(0, "wait", "Shipped", "pending")]


async def test_steps_started_together_fail_the_run_with_a_clear_error(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Careless, "c-2").parallel.start()
        await t.drain()
        with pytest.raises(akter.WorkflowFailed) as failed:
            await run.result(timeout=10)
        assert "one at a time" in failed.value.message


async def test_job_steps_of_a_capped_job_keep_their_order(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Careless, "c-3").capped.start()
        await t.drain()
        assert await run.result(timeout=10) == "shipped 1 shipped 2"


@pytest.mark.parametrize(
    ("workflow", "type", "says"),
    [
        ("nan_result", "InvalidResult", "NaN"),
        ("nul_step", "Fatal", "NUL"),
        ("huge_step", "Fatal", "larger than 1 MiB"),
    ],
)
async def test_a_value_akter_cannot_store_fails_the_run_with_its_reason_and_stores_nothing_bad(
    akter_test: Make, workflow: str, type: str, says: str
) -> None:
    async with akter_test(ALL) as t:
        starter = getattr(t.get(Careless, f"c-{workflow}"), workflow)
        run = await starter.start()
        await t.drain()
        with pytest.raises(akter.WorkflowFailed) as failed:
            await run.result(timeout=10)
        assert (failed.value.type, says in failed.value.message) == (type, True)
        rows = await t.rows("SELECT outcome FROM {schema}.workflow_steps")
        assert all("\\u0000" not in (r["outcome"] or "") for r in rows)
        assert CALLS["nul_text"] <= 1


async def test_a_signal_resent_with_its_id_after_the_run_ended_answers_as_the_first_send(
    akter_test: Make,
) -> None:
    async with akter_test(ALL) as t:
        run = await t.get(Order, "o-19").waiter.start(1)
        ops = t.runtime.workflows
        await ops.signal(run.id, Note(text="only"), signal_id="sig-1")
        await t.drain()
        assert await run.result(timeout=10) == ["only"]
        await ops.signal(run.id, Note(text="only"), signal_id="sig-1")  # a retry: no error
        with pytest.raises(akter.ActorError) as ended:
            await ops.signal(run.id, Note(text="new"), signal_id="sig-2")
        assert ended.value.code == "workflow_finished"
        signals = await t.rows("SELECT signal_id FROM {schema}.workflow_signals")
        assert [s["signal_id"] for s in signals] == ["sig-1"]
