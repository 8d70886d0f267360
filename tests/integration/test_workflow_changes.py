"""Changing workflow code over stored runs (the workflows spec, W5; WF-09).

Three versions of one workflow share the stored name ``Flow``: the runs one version started are
resumed by a runner with the next version's code, as in a deploy. A reordered step parks the
run as ``diverged`` with a message naming the seq, the recorded step and the requested one;
``wf.patched`` lets old and new runs both finish; an operator's retry resumes a parked run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests.integration.workflow_actors import Note

pytestmark = pytest.mark.timeout(60)


class Go(BaseModel):
    fast: bool = False


class FlowState(BaseModel):
    marks: list[str] = []


class FlowV1(akter.Actor[FlowState], name="Flow"):
    @akter.command
    async def mark(self, text: str) -> None:
        self.state.marks.append(text)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.workflow
    async def ship(wf: akter.Workflow) -> str:
        await wf.get(FlowV1, wf.ref.id).mark("a")
        await wf.wait(Go)
        await wf.get(FlowV1, wf.ref.id).mark("b")
        return "v1"

    @akter.workflow
    async def notes(wf: akter.Workflow) -> str:
        note = await wf.wait(Note)
        return "none" if note is None else note.text


class FlowV2(akter.Actor[FlowState], name="Flow"):
    """``ship`` with ``b`` moved before the wait, unguarded: old runs diverge."""

    @akter.command
    async def mark(self, text: str) -> None:
        self.state.marks.append(text)

    @akter.workflow
    async def ship(wf: akter.Workflow) -> str:
        await wf.get(FlowV2, wf.ref.id).mark("a")
        await wf.get(FlowV2, wf.ref.id).mark("b")
        await wf.wait(Go)
        return "v2"


class FlowV3(akter.Actor[FlowState], name="Flow"):
    """The same change guarded by ``wf.patched``: old runs keep the old path."""

    @akter.command
    async def mark(self, text: str) -> None:
        self.state.marks.append(text)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.workflow
    async def ship(wf: akter.Workflow) -> str:
        await wf.get(FlowV3, wf.ref.id).mark("a")
        if wf.patched("b-first"):
            await wf.get(FlowV3, wf.ref.id).mark("b")
            await wf.wait(Go)
            return "v3-new"
        await wf.wait(Go)
        await wf.get(FlowV3, wf.ref.id).mark("b")
        return "v3-old"


class FlowV4(akter.Actor[FlowState], name="Flow"):
    """``ship`` now takes an argument old runs never stored."""

    @akter.workflow
    async def ship(wf: akter.Workflow, priority: int) -> str:
        return f"v4 {priority}"


async def journal(t: ActorTest, run_id: str) -> list[tuple[int, str, str, str]]:
    rows = await t.rows(
        "SELECT seq, kind, name, status FROM {schema}.workflow_steps WHERE run_id = %(id)s "
        "ORDER BY seq",
        {"id": run_id},
    )
    return [(r["seq"], r["kind"], r["name"], r["status"]) for r in rows]


async def deploy(t: ActorTest, actor: type[akter.Actor[Any]]) -> akter.Runtime:
    """Replace every live runner by one with ``actor``'s code (a deploy)."""
    for i, _ in enumerate(t.runtimes):
        if not t.killed(i):
            await t.kill(i)
    return await t.add_runtime([actor])


async def test_wf09_a_reordered_step_parks_the_run_and_patched_lets_both_finish(
    akter_test: Any,
) -> None:
    async with akter_test([FlowV1]) as t:
        old = await t.get(FlowV1, "f-1").ship.start()
        await t.drain()
        assert await journal(t, old.id) == [
            (0, "command", "Flow.mark", "done"),
            (1, "wait", "Go", "pending"),
        ]

        v2 = await deploy(t, FlowV2)
        await v2.workflow_run(old.id).signal(Go())
        await t.drain()
        status = await v2.workflow_run(old.id).status()
        assert status.status == "diverged"
        assert status.error is not None
        message = status.error.message
        assert "Step 1" in message and "wait 'Go'" in message and "command 'Flow.mark'" in message
        assert status.finished_at_ms is None
        # Nothing ran: the journal is as it was, and "b" was never marked.
        assert await journal(t, old.id) == [
            (0, "command", "Flow.mark", "done"),
            (1, "wait", "Go", "pending"),
        ]
        with pytest.raises(akter.WorkflowDiverged):
            await v2.workflow_run(old.id).result(timeout=5)

        v3 = await deploy(t, FlowV3)
        assert await v3.retry_workflow(old.id) is True
        assert await v3.retry_workflow(old.id) is False  # no longer diverged
        await t.drain()
        assert await v3.workflow_run(old.id).result(timeout=10) == "v3-old"
        assert await v3.get(FlowV3, "f-1").marks() == ["a", "b"]

        new = await v3.get(FlowV3, "f-2").ship.start()
        await t.drain()
        await v3.workflow_run(new.id).signal(Go())
        await t.drain()
        assert await new.result(timeout=10) == "v3-new"
        assert await journal(t, new.id) == [
            (0, "command", "Flow.mark", "done"),
            (1, "patch", "b-first", "done"),
            (2, "command", "Flow.mark", "done"),
            (3, "wait", "Go", "done"),
        ]
        # The old run's journal never got the marker: it answers False on every replay.
        assert [k for _, k, _, _ in await journal(t, old.id)] == ["command", "wait", "command"]


async def test_a_run_whose_input_the_new_code_cannot_read_is_parked_not_failed(
    akter_test: Any,
) -> None:
    async with akter_test([FlowV1]) as t:
        run = await t.get(FlowV1, "f-3").ship.start()
        await t.drain()
        v4 = await deploy(t, FlowV4)
        await v4.workflow_run(run.id).signal(Go())
        await t.drain()
        status = await v4.workflow_run(run.id).status()
        assert status.status == "diverged"
        assert status.error is not None and "does not validate" in status.error.message
        rows = await t.rows("SELECT input FROM {schema}.workflows")
        assert [json.loads(r["input"]) for r in rows] == [{}]  # the stored input is kept


async def test_a_run_of_a_workflow_the_code_no_longer_declares_is_parked(akter_test: Any) -> None:
    async with akter_test([FlowV1]) as t:
        run = await t.get(FlowV1, "f-4").notes.start()
        await t.drain()
        v2 = await deploy(t, FlowV2)  # FlowV2 has no `notes`
        await v2.workflow_run(run.id).signal(Note(text="x"))
        await t.drain()
        status = await v2.workflow_run(run.id).status()
        assert status.status == "diverged"
        assert status.error is not None and "not declared" in status.error.message
        # Cancelling a parked run ends it as cancelled at once.
        await v2.workflow_run(run.id).cancel()
        assert (await v2.workflow_run(run.id).status()).status == "cancelled"


async def test_a_signal_that_does_not_validate_is_set_aside_and_the_wait_goes_on(
    akter_test: Any,
) -> None:
    async with akter_test([FlowV1]) as t:
        run = await t.get(FlowV1, "f-5").notes.start()
        engine = t.runtime.workflows
        await engine.signal_json(run.id, "Note", {"text": 5})  # not a string
        await t.drain()
        assert (await run.status()).status == "suspended"
        await engine.signal_json(run.id, "Note", {"text": "good"})
        await t.drain()
        assert await run.result(timeout=10) == "good"
        signals = await t.rows(
            "SELECT payload, consumed_seq FROM {schema}.workflow_signals ORDER BY signal_seq"
        )
        assert [(json.loads(s["payload"]), s["consumed_seq"]) for s in signals] == [
            ({"text": 5}, -1),
            ({"text": "good"}, 0),
        ]


@pytest.mark.parametrize(
    ("name", "payload", "code"),
    [
        ("Not a name", {}, "invalid_signal"),
        ("Note", ["not", "an", "object"], "invalid_signal"),
        ("Note", {"text": "nul\x00"}, "invalid_signal"),
        ("Note", {"text": float("nan")}, "invalid_signal"),
    ],
)
async def test_a_signal_akter_cannot_store_is_refused_and_writes_nothing(
    akter_test: Any, name: str, payload: Any, code: str
) -> None:
    async with akter_test([FlowV1]) as t:
        run = await t.get(FlowV1, "f-6").notes.start()
        with pytest.raises(akter.ActorError) as refused:
            await t.runtime.workflows.signal_json(run.id, name, payload)
        assert (refused.value.reason, refused.value.code) == ("InvalidInput", code)
        assert await t.rows("SELECT * FROM {schema}.workflow_signals") == []


async def test_a_signal_to_an_unknown_run_is_refused(akter_test: Any) -> None:
    async with akter_test([FlowV1]) as t:
        with pytest.raises(akter.ActorError) as refused:
            await t.runtime.workflow_run("no-such-run").signal(Go())
        assert refused.value.code == "unknown_workflow_run"


async def test_akter_check_reports_runs_the_new_code_would_park(akter_test: Any) -> None:
    async with akter_test([FlowV1]) as t:
        await t.get(FlowV1, "f-7").ship.start()
        await t.get(FlowV1, "f-8").notes.start()
        await t.drain()
        ok = await akter.Runtime([FlowV1], database_url=t.database_url, schema=t.schema).check()
        assert [f.kind for f in ok.findings if f.severity == "error"] == []
        report = await akter.Runtime([FlowV4], database_url=t.database_url, schema=t.schema).check()
        errors = sorted(
            (f.kind, f.member, f.count) for f in report.findings if f.severity == "error"
        )
        assert errors == [("unknown_workflow", "notes", 1), ("workflow_input", "ship", 1)]
        # The check wrote nothing: both runs wait where they were.
        rows = await t.rows("SELECT status FROM {schema}.workflows ORDER BY run_id")
        assert [r["status"] for r in rows] == ["suspended", "suspended"]
