"""A replayed step must be the recorded one: target actor and arguments too (issue 38, finding 3).

A command step writes ``pending {command_id, actor, args}`` before its turn and is marked done
only with the next record. Two versions of one workflow (stored name ``Desk``) share that
journal, as in a rolling deploy: v1 adds 1 to ``Acct("x")``; v2 adds 1 to ``Acct("y")``; v3
adds 2 to ``Acct("x")``. A resumed run whose code calls another actor, or passes other
arguments, is parked as ``diverged`` naming the seq and both sides, and a pending command step
is first looked up at its *recorded* target: nothing is ever sent to the new one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests._support.polling import until

pytestmark = pytest.mark.timeout(60)


class Go(BaseModel):
    pass


class Balance(BaseModel):
    total: int = 0
    adds: int = 0


class Acct(akter.Actor[Balance]):
    @akter.command
    async def add(self, n: int, note: str = "") -> int:
        self.state.total += n
        self.state.adds += 1
        return self.state.total

    @akter.query
    async def balance(self) -> tuple[int, int]:
        return self.state.total, self.state.adds


class Empty(BaseModel):
    pass


class DeskV1(akter.Actor[Empty], name="Desk"):
    @akter.workflow
    async def move(wf: akter.Workflow) -> int:
        total = await wf.get(Acct, "x").add(1)
        await wf.wait(Go)
        return total


class DeskV2(akter.Actor[Empty], name="Desk"):
    """The step now targets another actor."""

    @akter.workflow
    async def move(wf: akter.Workflow) -> int:
        total = await wf.get(Acct, "y").add(1)
        await wf.wait(Go)
        return total


class DeskV3(akter.Actor[Empty], name="Desk"):
    """The step now passes other arguments."""

    @akter.workflow
    async def move(wf: akter.Workflow) -> int:
        total = await wf.get(Acct, "x").add(2)
        await wf.wait(Go)
        return total


class DeskV4(akter.Actor[Empty], name="Desk"):
    """The step passes its new defaulted parameter explicitly, at its default: the same call."""

    @akter.workflow
    async def move(wf: akter.Workflow) -> int:
        total = await wf.get(Acct, "x").add(1, note="")
        await wf.wait(Go)
        return total


async def journal(t: ActorTest, run_id: str) -> list[tuple[int, str, str, str]]:
    rows = await t.rows(
        "SELECT seq, kind, name, status FROM {schema}.workflow_steps WHERE run_id = %(id)s "
        "ORDER BY seq",
        {"id": run_id},
    )
    return [(r["seq"], r["kind"], r["name"], r["status"]) for r in rows]


async def deploy(t: ActorTest, desk: type[akter.Actor[Any]]) -> akter.Runtime:
    """Replace every live runner by one running ``desk``'s code (a deploy)."""
    for i, _ in enumerate(t.runtimes):
        if not t.killed(i):
            await t.kill(i)
    return await t.add_runtime([desk, Acct])


async def balances(rt: akter.Runtime) -> dict[str, tuple[int, int]]:
    return {a: tuple(await rt.get(Acct, a).balance()) for a in ("x", "y")}  # type: ignore[misc]


async def interrupted_after_the_turn(t: ActorTest) -> akter.WorkflowRun[Any]:
    """A v1 run whose command committed at x, killed before the step's done record."""
    # The done record of seq 0 rides with the wait's pending record (seq 1): crash there.
    t.crash_next("before_step_record", lambda info: info["seqs"] == [0, 1])
    run = await t.get(DeskV1, "d-1").move.start()
    await t.drain()
    assert await journal(t, run.id) == [(0, "command", "Acct.add", "pending")]
    return run


async def test_changed_command_step_target_parks_the_run_as_diverged(akter_test: Any) -> None:
    async with akter_test([DeskV1, Acct], workflow_lease=1) as t:
        run = await interrupted_after_the_turn(t)
        assert await balances(t.runtimes[0]) == {"x": (1, 1), "y": (0, 0)}

        v2 = await deploy(t, DeskV2)
        await t.advance(2)  # the killed attempt's lease ends; v2 claims the run
        status = await v2.workflow_run(run.id).status()
        assert status.status == "diverged", status
        assert status.error is not None
        message = status.error.message
        assert "Step 0" in message
        assert "Acct('x'" in message and "Acct('y'" in message
        assert "was applied to Acct('x', tenant 'default') once" in message
        # Nothing was sent to y; x was applied once; the journal is as it was.
        assert await balances(v2) == {"x": (1, 1), "y": (0, 0)}
        assert await journal(t, run.id) == [(0, "command", "Acct.add", "pending")]
        with pytest.raises(akter.WorkflowDiverged):
            await v2.workflow_run(run.id).result(timeout=5)

        # Restoring the call and retrying replays x's receipt: still applied once.
        v1 = await deploy(t, DeskV1)
        assert await v1.retry_workflow(run.id) is True
        await t.drain()
        await v1.workflow_run(run.id).signal(Go())
        await t.drain()
        assert await v1.workflow_run(run.id).result(timeout=10) == 1
        assert await balances(v1) == {"x": (1, 1), "y": (0, 0)}


async def test_changed_command_step_arguments_park_the_run(akter_test: Any) -> None:
    async with akter_test([DeskV1, Acct], workflow_lease=1) as t:
        # Interrupted between the turn and its record: today's main failed it (CommandConflict).
        run = await interrupted_after_the_turn(t)
        v3 = await deploy(t, DeskV3)
        await t.advance(2)
        status = await v3.workflow_run(run.id).status()
        assert status.status == "diverged", status
        assert status.error is not None
        assert "Step 0" in status.error.message and "arguments #" in status.error.message
        assert await balances(v3) == {"x": (1, 1), "y": (0, 0)}

        # A recorded (done) step whose arguments changed parks the run too, on replay.
        v1 = await deploy(t, DeskV1)
        done = await v1.get(DeskV1, "d-2").move.start()
        await t.drain()
        assert await journal(t, done.id) == [
            (0, "command", "Acct.add", "done"),
            (1, "wait", "Go", "pending"),
        ]
        v3 = await deploy(t, DeskV3)
        await v3.workflow_run(done.id).signal(Go())
        await t.drain()
        status = await v3.workflow_run(done.id).status()
        assert status.status == "diverged" and status.error is not None
        assert "Step 0" in status.error.message
        assert await balances(v3) == {"x": (2, 2), "y": (0, 0)}

        # Passing a defaulted parameter at its default is the same call: the run finishes.
        v4 = await deploy(t, DeskV4)
        again = await v4.get(DeskV4, "d-3").move.start()
        await t.drain()
        v1 = await deploy(t, DeskV1)
        await v1.workflow_run(again.id).signal(Go())
        await t.drain()
        assert await v1.workflow_run(again.id).result(timeout=10) == 3


async def test_pending_command_step_resolves_against_its_recorded_target(
    akter_test: Any,
) -> None:
    async with akter_test([DeskV1, Acct], workflow_lease=1) as t:
        # Killed after the pending record, before the command was sent: x has nothing.
        t.crash_next("after_step_record", lambda info: info["seqs"] == [0])
        run = await t.get(DeskV1, "d-4").move.start()
        await t.drain()
        assert await journal(t, run.id) == [(0, "command", "Acct.add", "pending")]
        assert await balances(t.runtimes[0]) == {"x": (0, 0), "y": (0, 0)}

        v2 = await deploy(t, DeskV2)
        await t.advance(2)
        status = await v2.workflow_run(run.id).status()
        assert status.status == "diverged" and status.error is not None
        assert "was not applied to Acct('x'" in status.error.message
        assert await balances(v2) == {"x": (0, 0), "y": (0, 0)}  # nothing sent anywhere

        # The recorded target is where the step goes on once its call is restored.
        v1 = await deploy(t, DeskV1)
        assert await v1.retry_workflow(run.id) is True
        await t.drain()
        await v1.workflow_run(run.id).signal(Go())
        await t.drain()
        assert await v1.workflow_run(run.id).result(timeout=10) == 1
        assert await balances(v1) == {"x": (1, 1), "y": (0, 0)}


async def test_journal_rows_without_an_arguments_hash_still_replay(akter_test: Any) -> None:
    """Rows written before the hash existed: what they record is compared, nothing more."""
    async with akter_test([DeskV1, Acct], workflow_lease=1) as t:
        run = await t.get(DeskV1, "d-5").move.start()
        await t.drain()
        # As older code wrote it: the command id and the actor, no arguments' hash.
        rows = await t.rows("SELECT detail FROM {schema}.workflow_steps WHERE seq = 0")
        old = {k: v for k, v in json.loads(rows[0]["detail"]).items() if k != "args"}
        assert set(old) == {"command_id", "actor"}
        await t.rows(
            "UPDATE {schema}.workflow_steps SET detail = %(d)s WHERE seq = 0",
            {"d": json.dumps(old)},
        )
        await t.runtimes[0].workflow_run(run.id).signal(Go())
        await t.drain()
        assert await run.result(timeout=10) == 1

        # An old pending row whose arguments changed: the receipt's conflict parks the run.
        second = await interrupted_after_the_turn_on(t, "d-6")
        rows = await t.rows(
            "SELECT detail FROM {schema}.workflow_steps WHERE run_id = %(id)s AND seq = 0",
            {"id": second.id},
        )
        old = {k: v for k, v in json.loads(rows[0]["detail"]).items() if k != "args"}
        await t.rows(
            "UPDATE {schema}.workflow_steps SET detail = %(d)s WHERE run_id = %(id)s AND seq = 0",
            {"d": json.dumps(old), "id": second.id},
        )
        v3 = await deploy(t, DeskV3)
        await t.advance(2)
        status = await v3.workflow_run(second.id).status()
        assert status.status == "diverged", status
        assert await balances(v3) == {"x": (2, 2), "y": (0, 0)}


async def interrupted_after_the_turn_on(t: ActorTest, desk: str) -> akter.WorkflowRun[Any]:
    t.crash_next("before_step_record", lambda info: info["seqs"] == [0, 1])
    run = await t.get(DeskV1, desk).move.start()
    await t.drain()
    assert await journal(t, run.id) == [(0, "command", "Acct.add", "pending")]
    return run


async def test_a_runner_stopped_mid_step_during_a_deploy_applies_the_step_once(
    akter_test: Any,
) -> None:
    """``Runtime.stop()`` hands the attempt back only once its in-flight step command answered.

    Handed back at once, the run could be resumed by new code while the old runner's turn was
    still about to commit: the new code's receipt lookup would find nothing, and the parked
    message would say the step was not applied while it was (the rolling-deploy drill found it).
    """
    async with akter_test([DeskV1, Acct], workflow_lease=1) as t:
        v1 = t.runtimes[0]
        gate = t.pause_next("before_commit")  # the step's turn at x, before its commit
        run = await v1.get(DeskV1, "d-7").move.start()
        await gate.wait()
        v2 = await t.add_runtime([DeskV2, Acct])  # deployed meanwhile
        stopping = asyncio.create_task(v1.stop())
        # The drain cancels the attempt, which waits for its step's turn with its lease still
        # renewed: through three renewals (three lease lengths) the run stays v1's.
        seen: list[int] = []

        async def lease() -> int:
            rows = await t.rows("SELECT status, wake_at_ms FROM {schema}.workflows")
            assert [r["status"] for r in rows] == ["running"]
            wake = int(rows[0]["wake_at_ms"])
            if not seen or seen[-1] != wake:
                seen.append(wake)
            return wake

        await until(lease, holds=lambda _: len(seen) > 3, what="three renewals of v1's lease")
        gate.release()
        await stopping
        # Then v2 resumes it: another target, so parked, and the message tells the truth.
        await until(
            lambda: v2.workflow_run(run.id).status(),
            holds=lambda s: s.status == "diverged",
            what="the run parked by v2",
        )
        status = await v2.workflow_run(run.id).status()
        assert status.error is not None and "Step 0" in status.error.message
        assert "Acct('y'" in status.error.message
        assert "applied to Acct('x', tenant 'default') once" in status.error.message
        assert await balances(v2) == {"x": (1, 1), "y": (0, 0)}  # x once, y never
