"""The chaos drill (issue 5): runner SIGKILLs and a PostgreSQL restart under load (kill).

Three runner processes (``tests.faults.chaos_child``) serve 16 callers over 256 accounts through
HTTP; every command mutates state, sends an intent and enqueues a job. Runners are SIGKILLed
and restarted, PostgreSQL is stopped and started once, callers retry with the same command id.
Afterwards the database must show no acknowledged command lost, no transition applied twice, no
intent delivered twice, every job terminal exactly once and an empty outbox
(:mod:`tests.faults.chaos_drill`). The full drill is ``slow``; the short one (15 s, one kill,
no PostgreSQL restart) runs with the default selection so the drill's logic stays exercised.
"""

from __future__ import annotations

import pytest

from tests.faults.chaos_drill import FULL, SHORT, Drill, Plan, Report

pytestmark = [pytest.mark.kill]


async def run(plan: Plan) -> tuple[Report, Drill]:
    """Run a drill; on failure, the runners' stderr goes into the message."""
    drill = Drill(plan, log=print)
    try:
        report = await drill.run()
    except BaseException:
        print(drill.child_stderr())
        raise
    print(report.table())
    return report, drill


def assert_no_loss_no_duplicate(report: Report, drill: Drill) -> None:
    """The drill's guarantees, and that the disruptions really happened."""
    assert report.problems() == [], drill.child_stderr()
    c = report.counts
    assert c.acked > 0 and c.committed == c.acked  # callers retry until acknowledged
    assert c.acked_lost == c.applied_twice == c.applied_without_receipt == 0
    assert c.intents_delivered == c.committed and c.intents_twice == c.intents_missing == 0
    assert c.jobs == c.committed == c.jobs_succeeded + c.jobs_dead_lettered
    assert c.jobs_terminal_twice == c.jobs_not_terminal == 0
    assert c.outbox_left == 0
    assert len(report.kills) == len([e for e in report.plan.events() if e[1] == "kill"])
    for kill in report.kills:
        assert kill.survivor_commit_ms is not None
        assert kill.unacked == 0  # every call in flight on the victim was acknowledged
        assert kill.leases_settled_ms is not None
        # Rows the dead runner had claimed come back after their lease (5 s intents, 3 s jobs)
        # and a relay pass (1 s poll); the survivors' own claims settle sooner.
        assert kill.leases_settled_ms < 30_000


@pytest.mark.timeout(180)
async def test_chaos_short_one_kill() -> None:
    report, drill = await run(SHORT)
    assert_no_loss_no_duplicate(report, drill)
    assert report.restart is None


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_chaos_full_drill_kills_every_15s_and_restarts_postgres() -> None:
    report, drill = await run(FULL)
    assert report.plan.duration_s >= 60 and report.elapsed_s >= 60
    assert len(report.kills) >= 4
    assert report.restart is not None
    assert_no_loss_no_duplicate(report, drill)
    # Runners recover from the PostgreSQL restart by themselves (no drill restart needed).
    assert report.recovery_problems() == []
    assert set(report.restart.readiness.values()) <= {"ready", "storage"}
