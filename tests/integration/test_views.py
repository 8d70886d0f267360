"""The read-only inspection views: a SQL contract for operators."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from akter.testing import ActorTest
from tests.integration.actors import ALL, Counter
from tests.integration.workflow_actors import ALL as WORKFLOW_ACTORS
from tests.integration.workflow_actors import Order as WfOrder

Make = Callable[..., ActorTest]


async def test_views_show_actors_outbox_jobs_and_refuse_writes(
    akter_test: Make, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "c1", tenant="acme")
        await counter.stage_everything(3)  # state, an event, an intent, a timer and a job
        [actor] = await t.rows("SELECT * FROM {schema}.v_actors")
        assert (actor["tenant_id"], actor["actor_id"], actor["version"]) == ("acme", "c1", 1)
        assert actor["receipts"] == 1 and actor["state"]["n"] == 3
        roles = sorted(r["role"] for r in await t.rows("SELECT role FROM {schema}.v_outbox"))
        assert roles == ["intent", "job", "timer"]
        [job] = await t.rows("SELECT * FROM {schema}.v_jobs")
        assert (job["job"], job["status"], job["job_key"], job["attempts"]) == (
            "work",
            "pending",
            "w",
            0,
        )
        assert await t.rows("SELECT * FROM {schema}.v_dead_letters") == []
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            for view in ("v_actors", "v_outbox", "v_jobs", "v_dead_letters"):
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    await conn.execute(t.substitute(f"DELETE FROM {{schema}}.{view}"))


async def test_workflow_views_show_runs_their_wake_condition_and_journal(
    akter_test: Make, akter_db: str
) -> None:
    async with akter_test(WORKFLOW_ACTORS) as t:
        order = t.get(WfOrder, "o1", tenant="acme")
        done = await order.three.start("sku-1")
        asleep = await order.sleeper.start(2)
        failed = await order.failing.start()
        waiting = await order.waiter.start(1)
        parked = await order.compensating.start()
        await t.drain()
        await t.runtime.workflows.signal_json(waiting.id, "Note", {"text": "early"})
        await t.runtime.workflows.signal_json(waiting.id, "Other", {"x": 1})
        await t.runtime.workflows.signal_json(parked.id, "Note", {"text": "not shipped"})
        await t.drain()
        runs = {r["run_id"]: r for r in await t.rows("SELECT * FROM {schema}.v_workflows")}
        assert set(runs) == {done.id, asleep.id, failed.id, waiting.id, parked.id}

        completed = runs[done.id]
        assert (completed["tenant_id"], completed["actor_type"], completed["actor_id"]) == (
            "acme",
            "Order",
            "o1",
        )
        assert (completed["workflow"], completed["status"], completed["steps"]) == (
            "three",
            "completed",
            3,
        )
        assert completed["result"] == "reserved, 2 left" and completed["pending_steps"] == 0
        assert completed["finished_at"] >= completed["started_at"]
        assert completed["wake_at"] is None and completed["error_message"] is None

        sleeping = runs[asleep.id]
        assert (sleeping["status"], sleeping["finished_at"]) == ("suspended", None)
        assert sleeping["waiting"].startswith("sleep until")
        assert (sleeping["steps"], sleeping["pending_steps"]) == (1, 1)
        hours = (sleeping["wake_at"] - sleeping["updated_at"]).total_seconds() / 3600
        assert 1.99 < hours <= 2.0

        errored = runs[failed.id]
        assert (errored["status"], errored["error_type"]) == ("failed", "StepFailed")
        assert "nope" in errored["error_message"]

        # A signal the run took, and one of a name no wait asked for, still pending.
        signalled = runs[waiting.id]
        assert signalled["status"] == "completed" and signalled["pending_signals"] == 1
        # Waits for a signal only: it wakes at its deadline at the latest (the timeout= rule).
        blocked = runs[parked.id]
        assert (blocked["status"], blocked["waiting"]) == ("suspended", "signal Shipped")
        assert blocked["pending_signals"] == 1
        assert blocked["deadline_at"] > blocked["started_at"]
        assert blocked["wake_at"] == blocked["deadline_at"]

        steps = await t.rows(
            "SELECT * FROM {schema}.v_workflow_steps WHERE run_id = %(id)s ORDER BY seq",
            {"id": done.id},
        )
        assert [(s["seq"], s["kind"], s["name"], s["status"]) for s in steps] == [
            (0, "command", "Order.mark", "done"),
            (1, "command", "Stock.reserve", "done"),
            (2, "command", "Order.mark", "done"),
        ]
        assert steps[1]["outcome"] == {"ok": 2} and steps[1]["actor_id"] == "o1"
        assert all(s["recorded_at"] >= s["started_at"] and s["duration_ms"] >= 0 for s in steps)
        [pending] = await t.rows(
            "SELECT * FROM {schema}.v_workflow_steps WHERE run_id = %(id)s", {"id": asleep.id}
        )
        assert (pending["kind"], pending["status"], pending["recorded_at"]) == (
            "sleep",
            "pending",
            None,
        )
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            for view in ("v_workflows", "v_workflow_steps"):
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                    await conn.execute(t.substitute(f"DELETE FROM {{schema}}.{view}"))
