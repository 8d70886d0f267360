"""Child job runners and the "caps under fire" drill of the job fault tests.

:func:`jobs_child` starts ``python -m tests.faults.jobs_child`` on a test's schema and always
kills it on exit. :func:`caps_drill` runs the per-actor cap drill: several runner processes
execute capped ``Crowd.pair`` jobs (``per_actor=2``) of many cold actors and one hot actor, one
runner is SIGKILLed mid-run, and :func:`analyse` then checks from the database alone (the
executors' call log and the outbox lease log of :mod:`tests.faults.jobs_actors`):

- **cap:** at no instant did an actor have more than two live attempts, counting a call from
  its start to its end, and a call whose runner was killed until its database lease ended;
- **FIFO:** each actor's first attempts were claimed in ready order (claim transactions of one
  actor took strictly increasing ready times), and first calls started in that order except
  between jobs taken by the same claim;
- **one outcome:** every job id has exactly one route receipt or dead letter, the outbox is
  empty, and no job ran more attempts than a lease loss explains;
- **no head-of-line blocking:** every cold job was first claimed while the hot actor still had
  most of its queue waiting, and within a bound of its ready time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from akter.testing import ActorTest
from tests.faults.child_process import LINE_WITHIN, ChildProcess, start_module
from tests.faults.jobs_actors import ACTORS, DB_MS, RECORDER, Crowd, install

#: The executor lease of every runner of the job drills (seconds), and the child's options.
LEASE_S = 3
CHILD = ("--lease", str(LEASE_S), "--cancel-check", "1", "--claim-lease", "3", "--poll", "0.1")

#: Opens an ActorTest whose runtime enqueues but executes nothing (``enqueue_only``).
EnqueueOnly = Callable[[], AbstractAsyncContextManager[ActorTest]]


def enqueue_only(akter_test: Callable[..., ActorTest]) -> EnqueueOnly:
    """ActorTests whose runtime enqueues but executes nothing, with the call and lease logs."""

    @asynccontextmanager
    async def make() -> AsyncIterator[ActorTest]:
        async with akter_test(
            ACTORS, relay=False, jobs=[], lease=LEASE_S, cancel_check=1, claim_lease=3
        ) as t:
            await install(t.database_url, t.schema)
            RECORDER.configure(t.database_url, t.schema, hold=0.0)
            try:
                yield t
            finally:
                await RECORDER.close()

    return make


#: Longest wait for one protocol line (a child starts a runtime before its first line).


class JobsChild(ChildProcess):
    """A job runner in a child process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "jobs child")

    async def expect(self, word: str, within: float = LINE_WITHIN) -> list[str]:
        """The fields of the next line, which must start with ``word``."""
        fields = (await self.line(within)).split()
        assert fields and fields[0] == word, (word, fields)
        return fields[1:]


async def spawn(t: ActorTest, *options: str) -> JobsChild:
    """Start a child runner on the test's schema (not yet READY)."""
    return JobsChild(
        await start_module("tests.faults.jobs_child", t.database_url, t.schema, *options)
    )


@asynccontextmanager
async def jobs_child(t: ActorTest, *options: str) -> AsyncIterator[JobsChild]:
    """A READY child runner; killed and reaped on exit."""
    async with await spawn(t, *options) as running:
        (pid,) = await running.expect("READY")
        assert int(pid) == running.pid
        yield running


async def db_ms(t: ActorTest) -> float:
    """The database clock (fractional epoch ms, no test offset)."""
    rows = await t.rows("SELECT extract(epoch FROM clock_timestamp()) * 1000 AS now")
    return float(rows[0]["now"])


async def call_log(t: ActorTest) -> list[dict[str, Any]]:
    """Every executor call, in start order."""
    return await t.rows("SELECT * FROM {schema}.job_calls ORDER BY started_ms, id")


async def lease_ends(t: ActorTest) -> dict[tuple[str, int], int]:
    """The last lease end the database granted each (job id, attempt)."""
    rows = await t.rows(
        "SELECT intent_id, attempts, max(due_at_ms) AS until FROM {schema}.job_leases"
        " GROUP BY intent_id, attempts"
    )
    return {(str(r["intent_id"]), int(r["attempts"])): int(r["until"]) for r in rows}


def max_live(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant (an end at a start's instant comes first)."""
    edges = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda edge: (edge[0], edge[1]),
    )
    most = level = 0
    for _, delta in edges:
        level += delta
        most = max(most, level)
    return most


def attempt_intervals(
    calls: Sequence[dict[str, Any]], leases: dict[tuple[str, int], int]
) -> dict[str, list[tuple[float, float]]]:
    """Per actor: each call from its start to its end, or to its lease end if its runner died."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for call in calls:
        end = call["ended_ms"]
        if end is None:
            end = leases[(str(call["job_id"]), int(call["attempt"]))]
        out[str(call["actor_id"])].append((float(call["started_ms"]), float(end)))
    return out


# --- the caps drill -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Drill:
    """The shape of one caps drill."""

    runners: int = 3
    cold_actors: int = 200
    jobs_per_actor: int = 10
    hot_jobs: int = 1_000
    #: Seconds each call holds.
    hold: float = 0.02
    #: The share of cold jobs finished when one runner is killed.
    kill_at: float = 0.3
    #: Most seconds a cold job may wait for its first claim.
    cold_bound: float = 20.0
    #: Highest share of the hot queue that may have been claimed when the last cold job was.
    hot_share: float = 0.6
    concurrency: int = 8
    within: float = 240.0


@dataclass
class Outcome:
    """What a drill did, for the assertions and for a failure message."""

    job_ids: dict[str, list[str]] = field(default_factory=dict)
    killed_pid: int = 0
    killed_in_flight: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    leases: dict[tuple[str, int], int] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    receipts: dict[str, int] = field(default_factory=dict)
    letters: list[str] = field(default_factory=list)
    left: int = 0
    seconds: float = 0.0


HOT = "hot"


def _cold(i: int) -> str:
    return f"cold-{i:03d}"


def _long_at(drill: Drill, i: int) -> int:
    """Every fourth cold actor has one long call, at positions spread over the queue."""
    return (i // 4) % drill.jobs_per_actor if i % 4 == 0 else -1


async def caps_drill(t: ActorTest, drill: Drill) -> Outcome:
    """Run the drill on ``t``'s schema (the parent runtime only enqueues and reads rows)."""
    outcome = Outcome()
    started = time.monotonic()
    options = [
        "--hold",
        str(drill.hold),
        "--lease",
        "3",
        "--cancel-check",
        "1",
        "--claim-lease",
        "3",
        "--poll",
        "0.05",
        "--concurrency",
        str(drill.concurrency),
        "--pool",
        "8",
    ]
    children = [await spawn(t, *options) for _ in range(drill.runners)]
    try:
        for child in children:
            await child.expect("READY")
        # The hot actor's whole queue first, so every cold job is younger than all of it.
        hot = t.get(Crowd, HOT)
        hot_ids: list[str] = []
        for _ in range(0, drill.hot_jobs, 100):
            hot_ids += await hot.fill(min(100, drill.hot_jobs - len(hot_ids)), drill.hold, HOT)
        outcome.job_ids[HOT] = hot_ids
        for first in range(0, drill.cold_actors, 50):
            chunk = range(first, min(first + 50, drill.cold_actors))
            filled = await asyncio.gather(
                *(
                    t.get(Crowd, _cold(i)).fill(
                        drill.jobs_per_actor, drill.hold, "cold", long=_long_at(drill, i)
                    )
                    for i in chunk
                )
            )
            outcome.job_ids.update({_cold(i): ids for i, ids in zip(chunk, filled, strict=True)})
        cold_total = drill.cold_actors * drill.jobs_per_actor

        # Mid-run: once a share of the cold jobs finished, kill a runner in the middle of a long
        # call that started moments ago (it surely is still running when the signal lands).
        deadline = time.monotonic() + drill.within
        victim: JobsChild | None = None
        while victim is None:
            rows = await t.rows(
                "SELECT pid, count(*) FILTER (WHERE ended_ms IS NULL) AS running,"
                " count(*) FILTER (WHERE tag = 'long' AND ended_ms IS NULL"
                f"   AND started_ms > {DB_MS} - 300) AS fresh_long,"
                " count(*) FILTER (WHERE tag <> 'hot' AND ended_ms IS NOT NULL) AS cold_done"
                " FROM {schema}.job_calls GROUP BY pid"
            )
            done = sum(int(r["cold_done"]) for r in rows)
            if done >= drill.kill_at * cold_total:
                fresh = {int(r["pid"]): int(r["running"]) for r in rows if r["fresh_long"]}
                victim = next((c for c in children if c.pid in fresh), None)
                if victim is not None:
                    outcome.killed_in_flight = fresh[victim.pid]
            if time.monotonic() > deadline:
                pytest.fail(f"the drill never reached its kill point: {rows}")
            await asyncio.sleep(0.005)  # polling an observable condition
        await victim.kill()
        outcome.killed_pid = victim.pid

        # The survivors finish everything, the dead runner's leases included.
        while await t.rows("SELECT 1 FROM {schema}.outbox LIMIT 1"):
            if time.monotonic() > deadline:
                survivors = [await c.diagnosis() for c in children if c is not victim]
                pytest.fail(f"the outbox did not drain in {drill.within} s: {survivors}")
            await asyncio.sleep(0.1)
    finally:
        for child in children:
            await child.close()
    outcome.seconds = time.monotonic() - started
    outcome.calls = await call_log(t)
    outcome.leases = await lease_ends(t)
    outcome.claims = await t.rows("SELECT * FROM {schema}.job_leases WHERE claimed ORDER BY id")
    ids = [job_id for ids in outcome.job_ids.values() for job_id in ids]
    receipts = await t.rows(
        "SELECT command_id, count(*) AS n FROM {schema}.receipts"
        " WHERE command_id = ANY(%(ids)s) GROUP BY command_id",
        {"ids": ids},
    )
    outcome.receipts = {str(r["command_id"]): int(r["n"]) for r in receipts}
    letters = await t.rows("SELECT job_id FROM {schema}.dead_letters")
    outcome.letters = [str(r["job_id"]) for r in letters]
    left = await t.rows("SELECT count(*) AS n FROM {schema}.outbox")
    outcome.left = int(left[0]["n"])
    return outcome


def analyse(drill: Drill, outcome: Outcome) -> None:
    """Assert the drill's guarantees (see the module docstring)."""
    calls, claims = outcome.calls, outcome.claims
    summary = (
        f"{len(calls)} calls in {outcome.seconds:.1f} s; runner {outcome.killed_pid} killed with "
        f"{outcome.killed_in_flight} calls in flight"
    )
    killed = [c for c in calls if c["ended_ms"] is None]
    assert killed, f"the kill interrupted no call: {summary}"
    assert all(int(c["pid"]) == outcome.killed_pid for c in killed), summary

    # One outcome per job; nothing left behind; a job re-ran only after a lost lease.
    ids = [job_id for ids in outcome.job_ids.values() for job_id in ids]
    assert len(set(ids)) == len(ids) == drill.hot_jobs + drill.cold_actors * drill.jobs_per_actor
    assert outcome.left == 0
    assert outcome.letters == [], summary
    missing = [i for i in ids if outcome.receipts.get(i) != 1]
    assert not missing, f"{len(missing)} jobs without exactly one route receipt: {missing[:5]}"
    per_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in calls:
        per_job[str(call["job_id"])].append(call)
    call_at = {(str(c["job_id"]), int(c["attempt"])): c for c in calls}
    taken_over = set()
    for claim in claims:
        job_id, attempt = str(claim["intent_id"]), int(claim["attempts"])
        if attempt > 1:
            # No call failed in this drill: a retry only takes over an attempt whose runner died
            # (before, during or after its call, but before its settle), or, on a starved
            # machine, one its runner interrupted at its local deadline.
            taken_over.add((job_id, attempt - 1))
            earlier = call_at.get((job_id, attempt - 1))
            assert (
                earlier is None
                or int(earlier["pid"]) == outcome.killed_pid
                or earlier["outcome"] == "interrupted"
            ), (claim, earlier)
    assert all((str(c["job_id"]), int(c["attempt"])) in taken_over for c in killed), summary

    # The cap: at most two live attempts per actor. A call counts from its start to its end; an
    # attempt of the killed runner that never settled counts from its claim (or call) until its
    # lease ended, whether or not its call had finished.
    claimed_at = {(str(c["intent_id"]), int(c["attempts"])): float(c["at_ms"]) for c in claims}
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for call in calls:
        key = (str(call["job_id"]), int(call["attempt"]))
        end = outcome.leases[key] if key in taken_over else float(call["ended_ms"])
        spans[str(call["actor_id"])].append((float(call["started_ms"]), end))
    actor_of = {str(c["intent_id"]): str(c["actor_id"]) for c in claims}
    for key in taken_over - set(call_at):  # claimed by the killed runner, never called
        spans[actor_of[key[0]]].append((claimed_at[key], float(outcome.leases[key])))
    over = {actor: max_live(its) for actor, its in spans.items()}
    assert max(over.values()) <= 2, {a: n for a, n in over.items() if n > 2}
    assert over[HOT] == 2, "the hot actor never ran two attempts at once"
    for key in taken_over:
        later = call_at.get((key[0], key[1] + 1))
        assert later is None or float(later["started_ms"]) >= outcome.leases[key], (key, later)
        assert claimed_at[(key[0], key[1] + 1)] >= outcome.leases[key], key

    # FIFO: an actor's first attempts were claimed in ready order, one claim after another, and
    # no call of a younger job started before every older job of its actor had been claimed.
    firsts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for claim in claims:
        if int(claim["attempts"]) == 1:
            firsts[str(claim["actor_id"])].append(claim)
    for actor, its in firsts.items():
        by_claim: dict[int, list[int]] = {}
        for claim in its:  # in log order: one claim transaction after another per actor
            by_claim.setdefault(int(claim["xid"]), []).append(int(claim["ready_at_ms"]))
        for before, after in itertools.pairwise(by_claim.values()):
            assert max(before) < min(after), (actor, before, after)
        assert len(its) == len(outcome.job_ids[actor]), actor
    ready_of = {str(c["intent_id"]): int(c["ready_at_ms"]) for c in claims}
    for call in calls:
        if int(call["attempt"]) != 1:
            continue
        actor, job_id = str(call["actor_id"]), str(call["job_id"])
        older = [i for i in outcome.job_ids[actor] if ready_of[i] < ready_of[job_id]]
        late = [i for i in older if claimed_at[(i, 1)] > float(call["started_ms"])]
        assert not late, (actor, call, late)

    # No head-of-line blocking: cold jobs were claimed while the hot queue was still long. Cold
    # actors the kill touched wait for its lease by design, so the hot share is measured at the
    # last first claim of the others.
    first_claim = {
        str(c["intent_id"]): float(c["at_ms"]) for c in claims if int(c["attempts"]) == 1
    }
    touched = {actor_of[job_id] for job_id, _ in taken_over}
    cold_ids = [i for actor, ids in outcome.job_ids.items() if actor != HOT for i in ids]
    untouched = [i for i in cold_ids if actor_of[i] not in touched]
    last_cold = max(first_claim[i] for i in untouched)
    hot_by_then = sum(1 for i in outcome.job_ids[HOT] if first_claim[i] <= last_cold)
    assert hot_by_then <= drill.hot_share * drill.hot_jobs, (
        f"the last cold job was first claimed after {hot_by_then} of {drill.hot_jobs} hot jobs"
    )
    waits = sorted(first_claim[i] - ready_of[i] for i in cold_ids)
    assert waits[-1] <= drill.cold_bound * 1000, (
        f"cold jobs waited up to {waits[-1]:.0f} ms for their first claim (median "
        f"{waits[len(waits) // 2]:.0f} ms)"
    )


def describe(drill: Drill, outcome: Outcome) -> str:
    """One line on what the drill measured (printed by the tests; shown with ``-s``)."""
    claims = outcome.claims
    first_claim = {
        str(c["intent_id"]): float(c["at_ms"]) for c in claims if int(c["attempts"]) == 1
    }
    ready_of = {str(c["intent_id"]): int(c["ready_at_ms"]) for c in claims}
    cold_ids = [i for actor, ids in outcome.job_ids.items() if actor != HOT for i in ids]
    if not cold_ids or any(i not in first_claim for i in cold_ids):
        return "incomplete drill"
    actor_of = {str(c["intent_id"]): str(c["actor_id"]) for c in claims}
    touched = {actor_of[str(c["intent_id"])] for c in claims if int(c["attempts"]) > 1}
    untouched = [i for i in cold_ids if actor_of[i] not in touched] or cold_ids
    last_cold = max(first_claim[i] for i in untouched)
    hot_by_then = sum(1 for i in outcome.job_ids[HOT] if first_claim.get(i, 1e18) <= last_cold)
    waits = sorted(first_claim[i] - ready_of[i] for i in cold_ids)
    killed = sum(1 for c in outcome.calls if c["ended_ms"] is None)
    retries = sum(1 for c in claims if int(c["attempts"]) > 1)
    return (
        f"{len(outcome.calls)} calls in {outcome.seconds:.1f} s; killed {killed} calls "
        f"({outcome.killed_in_flight} seen in flight), {retries} takeovers; cold first claims "
        f"waited median {waits[len(waits) // 2]:.0f} ms, max {waits[-1]:.0f} ms; "
        f"{hot_by_then}/{drill.hot_jobs} hot jobs claimed by the last first claim of the "
        f"{len(untouched)} cold jobs of actors the kill did not touch"
    )
