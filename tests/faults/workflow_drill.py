"""Child workflow runners and the durable rows the workflow kill tests read.

:func:`workflow_child` starts ``python -m tests.faults.workflow_child`` on a test's schema and
always kills it on exit; the helpers below read the journal and the effect log of
:mod:`tests.faults.workflow_actors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

import akter
from akter.testing import ActorTest
from tests.faults.child_process import LINE_WITHIN, ChildProcess, start_module
from tests.faults.workflow_actors import Flow, Go


class WorkflowChild(ChildProcess):
    """A workflow runner in a child process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "workflow child")
        self.runner_id = ""

    async def expect(self, word: str, within: float = LINE_WITHIN) -> list[str]:
        """The fields of the next line, which must start with ``word``."""
        fields = (await self.line(within)).split()
        assert fields and fields[0] == word, (word, fields, await self.diagnosis())
        return fields[1:]


async def spawn(url: str, schema: str, *options: str) -> WorkflowChild:
    """Start a child runner on ``schema`` (not yet READY)."""
    return WorkflowChild(await start_module("tests.faults.workflow_child", url, schema, *options))


@asynccontextmanager
async def workflow_child(t: ActorTest, *options: str) -> AsyncIterator[WorkflowChild]:
    """A READY child runner on the test's schema; killed and reaped on exit."""
    async with await spawn(t.database_url, t.schema, *options) as running:
        pid, running.runner_id = await running.expect("READY")
        assert int(pid) == running.pid
        yield running


async def journal(t: ActorTest, run_id: str) -> list[dict[str, Any]]:
    """The run's journal rows in seq order."""
    return await t.rows(
        "SELECT seq, kind, name, status, detail, outcome, started_at_ms, recorded_at_ms"
        " FROM {schema}.workflow_steps WHERE run_id = %(id)s ORDER BY seq",
        {"id": run_id},
    )


def shape(rows: list[dict[str, Any]]) -> list[tuple[int, str, str, str]]:
    """(seq, kind, name, status) of journal rows."""
    return [(int(r["seq"]), str(r["kind"]), str(r["name"]), str(r["status"])) for r in rows]


async def run_row(t: ActorTest, run_id: str) -> dict[str, Any]:
    """The run's row."""
    (row,) = await t.rows(
        "SELECT *, lease_owner::text AS owner FROM {schema}.workflows WHERE run_id = %(id)s",
        {"id": run_id},
    )
    return row


async def effects(t: ActorTest, run_id: str) -> Counter[tuple[str, str]]:
    """How often each (step, kind) of a run really ran, in any process."""
    rows = await t.rows(
        "SELECT step, kind FROM {schema}.wf_effects WHERE run_id = %(id)s", {"id": run_id}
    )
    return Counter((str(r["step"]), str(r["kind"])) for r in rows)


async def receipts(t: ActorTest, command_id: str) -> list[dict[str, Any]]:
    """The receipts stored under one command id."""
    return await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )


# --- the chaos drill -----------------------------------------------------------------------------

#: A run's steps when it completes, and when its job dead-letters (the run fails there).
COMPLETED_STEPS = [
    (0, "command", "Flow.apply"),
    (1, "job", "charge"),
    (2, "sleep", "sleep"),
    (3, "wait", "Go"),
    (4, "command", "Flow.apply"),
]
FAILED_STEPS = COMPLETED_STEPS[:2]
#: ``Flow.charge``'s attempts: a run whose ``fail_until`` reaches them is doomed.
JOB_ATTEMPTS = 6
TERMINAL = ("completed", "failed", "cancelled", "diverged")


@dataclass(frozen=True)
class Chaos:
    """The shape of one chaos drill."""

    runs: int = 200
    runners: int = 3
    #: Mean seconds between two SIGKILLs (each ±20 %, seeded). The victim is a runner that
    #: holds a running run when one does within ``aim`` seconds, else a random one.
    kill_every: float = 10.0
    aim: float = 2.0
    #: Starts are spread over this many seconds; each run's signal comes within
    #: ``signal_within`` seconds of its start (before or after its wait begins).
    start_over: float = 40.0
    signal_within: float = 40.0
    #: Seconds each command handler and job call holds (a window for kills mid-step).
    hold: float = 0.3
    #: The share of runs whose job always fails (they dead-letter, the run fails).
    doomed: float = 0.2
    workflow_lease: float = 2.0
    job_lease: float = 3.0
    claim_lease: float = 3.0
    poll: float = 0.2
    within: float = 300.0
    seed: int = 15

    def argv(self) -> list[str]:
        """The children's options."""
        return [
            f"--workflow-lease={self.workflow_lease}",
            f"--lease={self.job_lease}",
            f"--claim-lease={self.claim_lease}",
            f"--poll={self.poll}",
        ]


@dataclass
class Kill:
    """One SIGKILL: when (drill seconds), whom, and the runs it held at that instant."""

    at_s: float
    pid: int
    runner_id: str
    held_runs: int


@dataclass
class ChaosReport:
    """What a chaos drill did and found."""

    drill: Chaos
    fail_until: dict[str, int] = field(default_factory=dict)  # actor id → its job's failures
    run_ids: dict[str, str] = field(default_factory=dict)  # actor id → run id
    kills: list[Kill] = field(default_factory=list)
    signals_refused: int = 0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    handler_reruns: int = 0
    job_calls: int = 0
    local_problems: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every broken guarantee found (empty: the drill passed)."""
        out = list(self.local_problems)
        if len(self.run_ids) != self.drill.runs:
            out.append(f"{len(self.run_ids)} of {self.drill.runs} runs started")
        return out

    def summary(self) -> str:
        """One line of figures (printed by the test; shown with ``-s``)."""
        held = sum(k.held_runs for k in self.kills)
        return (
            f"{self.drill.runs} runs × 5 steps on {self.drill.runners} runners in "
            f"{self.seconds:.1f} s: {dict(self.statuses)}; {len(self.kills)} SIGKILLs holding "
            f"{held} running runs; {self.attempts} run attempts; {self.job_calls} job calls; "
            f"{self.handler_reruns} handler executions rolled back and rerun; "
            f"{self.signals_refused} signals to ended runs refused"
        )


def _expected(fail_until: int) -> str:
    return "failed" if fail_until >= JOB_ATTEMPTS else "completed"


async def chaos_drill(
    t: ActorTest, drill: Chaos, log: Callable[[str], None] = print
) -> ChaosReport:
    """Run the drill on ``t``'s schema (the parent runtime starts runs and sends signals only)."""
    rng = random.Random(drill.seed)
    report = ChaosReport(drill)
    for i in range(drill.runs):
        doomed = rng.random() < drill.doomed
        report.fail_until[f"c-{i:04d}"] = 99 if doomed else rng.choice([0, 1, 2])
    events: list[tuple[float, int, str]] = []
    for i in range(drill.runs):
        start = rng.uniform(0, drill.start_over)
        events.append((start, i, "start"))
        events.append((start + rng.uniform(0, drill.signal_within), i, "signal"))
    events.sort()

    async def feed(t0: float) -> None:
        for at, i, what in events:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))  # load pacing only
            actor = f"c-{i:04d}"
            if what == "start":
                run = await t.get(Flow, actor).chaos.start(report.fail_until[actor], drill.hold)
                report.run_ids[actor] = run.id
                continue
            try:
                await t.runtime.workflow_run(report.run_ids[actor]).signal(Go(n=i))
            except akter.ActorError as exc:
                if exc.code != "workflow_finished":
                    raise
                report.signals_refused += 1

    report.seconds = await drive_under_kills(t, drill, rng, feed, report.kills, log)
    await analyse(t, report)
    return report


async def drive_under_kills(
    t: ActorTest,
    drill: Chaos,
    rng: random.Random,
    feed: Callable[[float], Coroutine[Any, Any, None]],
    kills: list[Kill],
    log: Callable[[str], None] = print,
    stderr: list[str] | None = None,
) -> float:
    """Run ``feed`` against child runners under SIGKILLs until every run has ended.

    ``drill.runners`` children run; one is SIGKILLed every ``drill.kill_every`` s (aimed at one
    holding running runs) and replaced at once. Returns once ``feed`` (given the drill's
    monotonic start) is done, all ``drill.runs`` runs have ended and the outbox is empty: the
    drill's seconds.
    Every child's stderr is appended to ``stderr`` once it has ended.
    """
    children: list[WorkflowChild] = []
    finished = asyncio.Event()
    t0 = time.monotonic()

    async def aim(fallback: WorkflowChild) -> tuple[WorkflowChild, int]:
        """A runner holding running runs (polled for up to ``drill.aim`` s), and how many."""
        by_id = {c.runner_id: c for c in children}
        until = time.monotonic() + drill.aim
        while True:
            rows = await t.rows(
                "SELECT lease_owner::text AS owner, count(*) AS n FROM {schema}.workflows"
                " WHERE status = 'running' GROUP BY 1 ORDER BY 2 DESC"
            )
            for row in rows:
                if str(row["owner"]) in by_id:
                    return by_id[str(row["owner"])], int(row["n"])
            if time.monotonic() > until:
                return fallback, 0
            await asyncio.sleep(0.02)  # polling an observable condition

    async def kill_loop() -> None:
        while not finished.is_set():
            with contextlib.suppress(TimeoutError):
                wait = drill.kill_every * rng.uniform(0.8, 1.2)
                await asyncio.wait_for(finished.wait(), wait)  # paced kills, or the drill ended
                return
            victim, held = await aim(rng.choice(children))
            await victim.kill()
            kill = Kill(time.monotonic() - t0, victim.pid, victim.runner_id, held)
            kills.append(kill)
            log(
                f"kill {len(kills)} at {kill.at_s:.1f} s: pid {kill.pid}, "
                f"{kill.held_runs} runs held"
            )
            await victim.close()
            children.remove(victim)
            if stderr is not None:
                stderr.append(victim.stderr.decode(errors="replace"))
            replacement = await spawn(t.database_url, t.schema, *drill.argv())
            children.append(replacement)
            _pid, replacement.runner_id = await replacement.expect("READY")

    try:
        for _ in range(drill.runners):
            child = await spawn(t.database_url, t.schema, *drill.argv())
            children.append(child)
            _pid, child.runner_id = await child.expect("READY")
        feeder = asyncio.create_task(feed(t0), name="drill feeder")
        killer = asyncio.create_task(kill_loop(), name="drill killer")
        deadline = t0 + drill.within
        while True:
            if feeder.done():
                await feeder  # raises what stopped it
            if killer.done():
                await killer
            rows = await t.rows(
                "SELECT status, count(*) AS n FROM {schema}.workflows GROUP BY status"
            )
            statuses = Counter({str(r["status"]): int(r["n"]) for r in rows})
            ended = sum(statuses[s] for s in TERMINAL)
            # Ended runs, and every outcome delivered (a job settled after its run ended is
            # still routed to the run's step).
            if (
                feeder.done()
                and ended == drill.runs
                and not await t.rows("SELECT 1 FROM {schema}.outbox LIMIT 1")
            ):
                break
            if time.monotonic() > deadline:
                stderr = [await c.diagnosis() for c in children]
                pytest.fail(f"runs not ended in {drill.within} s: {dict(statuses)} {stderr}")
            await asyncio.sleep(0.5)  # polling an observable condition
        finished.set()
        await killer
        seconds = time.monotonic() - t0
        for child in children:
            await child.close(grace=15)
    finally:
        finished.set()
        for child in children:
            await child.close()
            if stderr is not None:
                stderr.append(child.stderr.decode(errors="replace"))
    return seconds


async def analyse(t: ActorTest, report: ChaosReport) -> None:
    """Check the drill's guarantees from durable rows into ``report.local_problems``."""
    problems = report.local_problems
    runs = {
        str(r["actor_id"]): r
        for r in await t.rows(
            "SELECT actor_id, run_id, status, attempts, result, error FROM {schema}.workflows"
        )
    }
    steps: dict[str, list[dict[str, Any]]] = {}
    for step in await t.rows(
        "SELECT run_id, seq, kind, name, status, outcome FROM {schema}.workflow_steps"
        " ORDER BY run_id, seq"
    ):
        steps.setdefault(str(step["run_id"]), []).append(step)
    effect_rows = await t.rows(
        "SELECT run_id, step, kind, job_id, attempt, at_ms FROM {schema}.wf_effects"
    )
    handler_runs = Counter(
        (str(e["run_id"]), str(e["step"])) for e in effect_rows if e["kind"] == "handler"
    )
    calls: dict[str, list[dict[str, Any]]] = {}
    for e in effect_rows:
        if e["kind"] == "job":
            calls.setdefault(str(e["job_id"]), []).append(e)
    report.job_calls = sum(len(c) for c in calls.values())
    ends = {
        str(r["job_id"]): float(r["at_ms"])
        for r in await t.rows("SELECT * FROM {schema}.wf_job_ends")
    }
    report.statuses = Counter(str(r["status"]) for r in runs.values())
    report.attempts = sum(int(r["attempts"]) for r in runs.values())
    report.handler_reruns = sum(n - 1 for n in handler_runs.values() if n > 1)
    job_of_run = {str(e["run_id"]): str(e["job_id"]) for e in effect_rows if e["kind"] == "job"}
    for actor, fail_until in report.fail_until.items():
        row = runs.get(actor)
        if row is None:
            problems.append(f"{actor}: no run")
            continue
        run_id = str(row["run_id"])
        expected = _expected(fail_until)
        if row["status"] != expected:
            problems.append(f"{actor}: {row['status']} ({row['error']}), expected {expected}")
            continue
        journal = steps.get(run_id, [])
        want = COMPLETED_STEPS if expected == "completed" else FAILED_STEPS
        got = [(int(s["seq"]), str(s["kind"]), str(s["name"])) for s in journal]
        if got != want or any(s["status"] != "done" for s in journal):
            problems.append(
                f"{actor}: journal {[(*g, s['status']) for g, s in zip(got, journal, strict=True)]}"
            )
        # Exactly once per command step: committed effects in the actor's state.
        applied = await t.get(Flow, actor).applied()
        want_applied = {"s1": 1, "s5": 1} if expected == "completed" else {"s1": 1}
        if applied != want_applied:
            problems.append(f"{actor}: committed effects {applied}, expected {want_applied}")
        # The job: attempts distinct, none after its terminal outcome, the outcome as dictated.
        job_id = job_of_run.get(run_id)
        if job_id is None:
            problems.append(f"{actor}: its job never ran")
            continue
        job_calls = calls[job_id]
        attempts = [int(c["attempt"]) for c in job_calls]
        if len(set(attempts)) != len(attempts):
            problems.append(f"{actor}: job {job_id} attempts repeated {sorted(attempts)}")
        end = ends.get(job_id)
        if end is None:
            problems.append(f"{actor}: job {job_id} has no terminal outcome")
        elif any(float(c["at_ms"]) >= end for c in job_calls):
            problems.append(f"{actor}: job {job_id} attempted after its terminal outcome")
        job_step = json.loads(str(journal[1]["outcome"])) if len(journal) > 1 else {}
        if expected == "completed":
            charged = int(job_step.get("ok", -1))
            if charged <= fail_until or charged not in attempts:
                problems.append(f"{actor}: job outcome {job_step}, attempts {attempts}")
            n = int(actor.split("-")[1])
            result = json.loads(str(row["result"]))
            if result != f"charged at attempt {charged}, go {n}":
                problems.append(f"{actor}: result {result!r}")
        elif "dead_letter" not in job_step:
            problems.append(f"{actor}: job outcome {job_step}, expected a dead letter")
    left = await t.rows("SELECT kind, command FROM {schema}.outbox")
    if left:
        problems.append(f"outbox not empty: {left[:5]}")
    # Each signal was kept once; a completed run consumed its own at the wait (seq 3).
    kept = {
        str(r["run_id"]): (int(r["n"]), int(r["used"]))
        for r in await t.rows(
            "SELECT run_id, count(*) AS n, count(*) FILTER (WHERE consumed_seq = 3) AS used"
            " FROM {schema}.workflow_signals GROUP BY run_id"
        )
    }
    for actor, fail_until in report.fail_until.items():
        run_id = report.run_ids.get(actor, "")
        n, used = kept.get(run_id, (0, 0))
        if n > 1 or (_expected(fail_until) == "completed" and (n, used) != (1, 1)):
            problems.append(f"{actor}: {n} signals kept, {used} consumed at the wait")


# --- the cancel drill ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cancels(Chaos):
    """The shape of one cancel drill: :func:`~tests.faults.workflow_actors.guarded` runs.

    A share of runs is ``timed`` (``timeout=`` of ``TIMED_TIMEOUT_S``: they time out wherever
    they are, most often queued behind the job's ``concurrency=1``); of the others
    (``cancellable``) a share is cancelled within ``cancel_within`` s of its start. Signals come
    within ``signal_within`` s of a start, for some runs never.
    """

    runs: int = 120
    timed: float = 0.35
    cancelled: float = 0.5
    cancel_within: float = 6.0
    unsignalled: float = 0.15
    start_over: float = 30.0
    signal_within: float = 8.0
    kill_every: float = 4.0
    doomed: float = 0.1
    seed: int = 38


@dataclass
class CancelReport:
    """What a cancel drill did and found."""

    drill: Cancels
    workflow: dict[str, str] = field(default_factory=dict)  # actor id → timed | cancellable
    fail_until: dict[str, int] = field(default_factory=dict)
    run_ids: dict[str, str] = field(default_factory=dict)
    cancels: set[str] = field(default_factory=set)  # actors whose cancel was acknowledged
    kills: list[Kill] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    seconds: float = 0.0
    statuses: Counter[tuple[str, str]] = field(default_factory=Counter)
    job_outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line of figures (printed by the test; shown with ``-s``)."""
        held = sum(k.held_runs for k in self.kills)
        return (
            f"{self.drill.runs} runs on {self.drill.runners} runners in {self.seconds:.1f} s: "
            f"{dict(self.statuses)}; {len(self.cancels)} cancels; job outcomes "
            f"{dict(self.job_outcomes)}; {len(self.kills)} SIGKILLs holding {held} running runs"
        )


async def cancel_drill(
    t: ActorTest, drill: Cancels, log: Callable[[str], None] = print
) -> CancelReport:
    """Run the cancel drill on ``t``'s schema (the parent starts, cancels and signals only)."""
    rng = random.Random(drill.seed)
    report = CancelReport(drill)
    events: list[tuple[float, int, str]] = []
    for i in range(drill.runs):
        actor = f"k-{i:04d}"
        report.workflow[actor] = "timed" if rng.random() < drill.timed else "cancellable"
        doomed = rng.random() < drill.doomed
        report.fail_until[actor] = 99 if doomed else rng.choice([0, 0, 1])
        start = rng.uniform(0, drill.start_over)
        events.append((start, i, "start"))
        cancel = report.workflow[actor] == "cancellable" and rng.random() < drill.cancelled
        if cancel:
            events.append((start + rng.uniform(0, drill.cancel_within), i, "cancel"))
        # A run neither cancelled nor timed waits for its signal: it always gets one.
        ends_anyway = cancel or report.workflow[actor] == "timed"
        if not ends_anyway or rng.random() >= drill.unsignalled:
            events.append((start + rng.uniform(0, drill.signal_within), i, "signal"))
    events.sort()

    async def feed(t0: float) -> None:
        for at, i, what in events:
            await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))  # load pacing only
            actor = f"k-{i:04d}"
            if what == "start":
                starter = getattr(t.get(Flow, actor), report.workflow[actor])
                run = await starter.start(report.fail_until[actor], drill.hold)
                report.run_ids[actor] = run.id
            elif what == "cancel":
                await t.runtime.workflow_run(report.run_ids[actor]).cancel()
                report.cancels.add(actor)
            else:
                with contextlib.suppress(akter.ActorError):  # workflow_finished: it ended
                    await t.runtime.workflow_run(report.run_ids[actor]).signal(Go(n=i))

    report.seconds = await drive_under_kills(
        t, drill, rng, feed, report.kills, log, stderr=report.stderr
    )
    await analyse_cancels(t, report)
    return report


def _job_of(journal: list[dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """The run's job step record (a job record, or the cancel record that took its place)."""
    for step in journal:
        detail = json.loads(str(step["detail"])) if step["detail"] else {}
        if isinstance(detail, dict) and "job_id" in detail and step["kind"] in ("job", "cancel"):
            return step, str(detail["job_id"])
    return None


async def analyse_cancels(t: ActorTest, report: CancelReport) -> None:
    """Compare every acknowledged start and cancel with the final rows (``report.problems``).

    Each job's outcome is recorded exactly once on its run's step, and is what really ran; no
    attempt of a job started after its run's cancel reached the job; a cancelled run ran its
    compensation once; no command step applied twice; a ``timed`` run cancelled at its
    deadline, not before; nothing is left in the outbox and no outcome was dropped.
    """
    problems = report.problems
    if len(report.run_ids) != report.drill.runs:
        problems.append(f"{len(report.run_ids)} of {report.drill.runs} runs started")
    runs = {
        str(r["actor_id"]): r
        for r in await t.rows(
            "SELECT actor_id, run_id, workflow, status, error, cancel_requested, deadline_ms,"
            " finished_at_ms FROM {schema}.workflows"
        )
    }
    steps: dict[str, list[dict[str, Any]]] = {}
    for step in await t.rows(
        "SELECT run_id, seq, kind, name, status, detail, outcome, recorded_at_ms"
        " FROM {schema}.workflow_steps ORDER BY run_id, seq"
    ):
        steps.setdefault(str(step["run_id"]), []).append(step)
    calls: dict[str, list[dict[str, Any]]] = {}
    for e in await t.rows(
        "SELECT run_id, job_id, attempt, at_ms FROM {schema}.wf_effects WHERE kind = 'job'"
    ):
        calls.setdefault(str(e["run_id"]), []).append(e)
    ends = {
        str(r["job_id"]): float(r["at_ms"])
        for r in await t.rows("SELECT * FROM {schema}.wf_job_ends")
    }
    letters = {str(r["job_id"]) for r in await t.rows("SELECT job_id FROM {schema}.dead_letters")}
    lettered: set[str] = set()
    for actor, run_id in report.run_ids.items():
        row = runs.get(actor)
        if row is None:
            problems.append(f"{actor}: acknowledged start {run_id} has no run")
            continue
        status = str(row["status"])
        report.statuses[(report.workflow[actor], status)] += 1
        journal = steps.get(run_id, [])
        error = json.loads(str(row["error"])) if row["error"] else {}
        if status not in ("completed", "cancelled", "failed"):
            problems.append(f"{actor}: ended {status} ({error})")
            continue
        if any(s["status"] != "done" for s in journal):
            problems.append(f"{actor}: steps left pending {[s['seq'] for s in journal]}")
        # Cancels and timeouts.
        if report.workflow[actor] == "timed":
            if status == "cancelled":
                if "timed out" not in str(error.get("message")):
                    problems.append(f"{actor}: cancelled, not timed out: {error}")
                if int(row["finished_at_ms"]) < int(row["deadline_ms"]):
                    problems.append(f"{actor}: timed out before its deadline")
        elif status == "cancelled" and actor not in report.cancels:
            problems.append(f"{actor}: cancelled without a cancel")
        elif actor in report.cancels and not row["cancel_requested"] and status == "cancelled":
            problems.append(f"{actor}: cancelled, but the cancel is not recorded")
        if report.fail_until[actor] >= 3 and status == "completed":
            problems.append(f"{actor}: completed though its job always fails")
        # Command steps: each applied at most once; the compensation iff cancelled.
        applied = await t.get(Flow, actor).applied()
        if any(n > 1 for n in applied.values()):
            problems.append(f"{actor}: a command step applied twice: {applied}")
        if applied.get("undo", 0) != (1 if status == "cancelled" else 0):
            problems.append(f"{actor}: {status} with compensation applied {applied}")
        if applied.get("s5", 0) != (1 if status == "completed" else 0):
            problems.append(f"{actor}: {status} with the last step applied {applied}")
        # The job: its outcome recorded once on the run, and what really ran.
        ran = calls.get(run_id, [])
        found = _job_of(journal)
        if found is None:
            if ran:
                problems.append(f"{actor}: job calls {ran} without a job step")
            continue
        record, job_id = found
        if any(str(c["job_id"]) != job_id for c in ran):
            problems.append(f"{actor}: calls of another job than {job_id}: {ran}")
        attempts = sorted(int(c["attempt"]) for c in ran)
        if len(set(attempts)) != len(attempts):
            problems.append(f"{actor}: job {job_id} attempts repeated {attempts}")
        end = ends.get(job_id)
        if end is None:
            problems.append(f"{actor}: job {job_id} has no terminal outcome")
        elif any(float(c["at_ms"]) >= end for c in ran):
            problems.append(f"{actor}: job {job_id} attempted after its terminal outcome")
        if record["outcome"] is None:
            problems.append(f"{actor}: job {job_id}'s outcome is recorded nowhere ({record})")
            continue
        outcome = json.loads(str(record["outcome"]))
        kind = next(iter(outcome))
        report.job_outcomes[f"{record['kind']}:{kind}"] += 1
        if kind == "ok" and (not attempts or int(outcome["ok"]) != attempts[-1]):
            problems.append(f"{actor}: job outcome {outcome}, attempts {attempts}")
        elif kind == "dead_letter":
            lettered.add(job_id)
            if int(outcome["dead_letter"]["attempts"]) != (attempts[-1] if attempts else 0):
                problems.append(f"{actor}: job outcome {outcome}, attempts {attempts}")
        elif kind == "cancelled":
            n = int(outcome["cancelled"]["attempts"])
            if any(a > n for a in attempts):
                problems.append(f"{actor}: attempts {attempts} after the cancel at {n}")
            cancel_at = float(record["recorded_at_ms"])
            # Only the attempt claimed before the cancel may log its call after it.
            late = [c for c in ran if float(c["at_ms"]) > cancel_at and int(c["attempt"]) != n]
            if n == 0 and attempts:
                problems.append(f"{actor}: a job cancelled before it ran ran {attempts}")
            if late:
                problems.append(f"{actor}: attempts started after the cancel: {late}")
        if record["kind"] == "cancel" and status != "cancelled":
            problems.append(f"{actor}: cancelled at its job step but ended {status}")
    if letters != lettered:
        problems.append(f"dead letters {sorted(letters)} but dead-letter outcomes {lettered}")
    left = await t.rows("SELECT kind, command FROM {schema}.outbox")
    if left:
        problems.append(f"outbox not empty: {left[:5]}")
    dropped = [line for text in report.stderr for line in text.splitlines() if "matches no" in line]
    if dropped:
        problems.append(f"job outcomes not recorded: {dropped[:5]}")
