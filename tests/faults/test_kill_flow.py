"""Flow-control drills across runner processes (issue 17).

A concurrency cap under a SIGKILL, and a rate limit shared by two runners.

Child runners (``tests.faults.jobs_child``) execute ``Paced`` jobs of
:mod:`tests.faults.jobs_actors`; every call is logged durably with the database clock
(``job_calls``) and every claim or renewal by the outbox trigger (``job_leases``), so the checks
read the database alone, after the children are gone.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests.faults.jobs_actors import ACTORS, DB_MS, NO_LEASE_LOG, RECORDER, Paced, install
from tests.faults.jobs_drill import JobsChild, call_log, lease_ends, max_live, spawn

MakeTest = Callable[..., ActorTest]

pytestmark = pytest.mark.skipif(
    ON_CITUS,
    reason=f"{NO_LEASE_LOG} (test_flow_race.py and test_flow_control.py cover flow control there)",
)

OPTIONS = (
    *("--lease", "3", "--cancel-check", "1", "--claim-lease", "3", "--poll", "0.05"),
    *("--concurrency", "8", "--pool", "8"),
)


@asynccontextmanager
async def drill(
    akter_test: MakeTest, runners: int
) -> AsyncIterator[tuple[ActorTest, list[JobsChild]]]:
    """A parent that only enqueues, and ``runners`` READY child runners (closed on exit)."""
    async with akter_test(ACTORS, relay=False, jobs=[], lease=3, cancel_check=1) as t:
        await install(t.database_url, t.schema)
        RECORDER.configure(t.database_url, t.schema)
        children = [await spawn(t, *OPTIONS) for _ in range(runners)]
        try:
            for child in children:
                await child.expect("READY")
            yield t, children
        finally:
            for child in children:
                await child.close()
            await RECORDER.close()


async def drained(t: ActorTest, within: float) -> None:
    """Until the outbox is empty (routes delivered too), or fail."""
    deadline = time.monotonic() + within
    while await t.rows("SELECT 1 FROM {schema}.outbox LIMIT 1"):
        if time.monotonic() > deadline:
            left = await t.rows("SELECT kind, count(*) FROM {schema}.outbox GROUP BY kind")
            pytest.fail(f"the outbox did not drain in {within} s: {left}")
        await asyncio.sleep(0.1)  # polling an observable condition


async def one_receipt_each(t: ActorTest, ids: list[str]) -> None:
    rows = await t.rows(
        "SELECT command_id, count(*) AS n FROM {schema}.receipts"
        " WHERE command_id = ANY(%(ids)s) GROUP BY command_id",
        {"ids": ids},
    )
    counts = {str(r["command_id"]): int(r["n"]) for r in rows}
    missing = [i for i in ids if counts.get(i) != 1]
    assert not missing, f"{len(missing)} jobs without exactly one route receipt: {missing[:5]}"
    assert await t.rows("SELECT job_id FROM {schema}.dead_letters") == []


async def kill_mid_long_call(t: ActorTest, children: list[JobsChild], within: float) -> int:
    """SIGKILL a runner in the middle of a long call that started moments ago; its pid."""
    deadline = time.monotonic() + within
    while True:
        rows = await t.rows(
            "SELECT pid FROM {schema}.job_calls WHERE tag = 'long' AND ended_ms IS NULL"
            f" AND started_ms > {DB_MS} - 300"
        )
        pids = {int(r["pid"]) for r in rows}
        victim = next((c for c in children if c.pid in pids), None)
        if victim is not None:
            await victim.kill()
            return victim.pid
        if time.monotonic() > deadline:
            pytest.fail("no long call ever ran")
        await asyncio.sleep(0.005)  # polling an observable condition


def slot_spans(
    calls: list[dict[str, Any]], claims: list[dict[str, Any]], leases: dict[tuple[str, int], int]
) -> list[tuple[float, float]]:
    """Each attempt's hold on a slot.

    Its call, or until its lease end if its runner died (from its claim when it never called).
    """
    called = {(str(c["job_id"]), int(c["attempt"])) for c in calls}
    spans = [
        (
            float(c["started_ms"]),
            float(c["ended_ms"])
            if c["ended_ms"] is not None
            else float(leases[(str(c["job_id"]), int(c["attempt"]))]),
        )
        for c in calls
    ]
    for claim in claims:
        key = (str(claim["intent_id"]), int(claim["attempts"]))
        if key not in called:
            spans.append((float(claim["at_ms"]), float(leases[key])))
    return spans


@pytest.mark.kill
@pytest.mark.timeout(180)
async def test_concurrency_cap_holds_across_three_runners_and_a_kill(akter_test: MakeTest) -> None:
    async with drill(akter_test, 3) as (t, children):
        ids: list[str] = []
        for i in range(12):
            ids += await t.get(Paced, f"p{i}").fill_slots(30, 0.03, long=1 if i % 3 == 0 else -1)
        killed = await kill_mid_long_call(t, children, 60)
        await drained(t, 120)
        calls = await call_log(t)
        claims = await t.rows(
            "SELECT * FROM {schema}.job_leases WHERE claimed AND command = 'slots' ORDER BY id"
        )
        leases = await lease_ends(t)
        dead = [c for c in calls if c["ended_ms"] is None]
        assert dead and all(int(c["pid"]) == killed for c in dead), dead
        spans = slot_spans(calls, claims, leases)
        assert max_live(spans) == 3, f"{max_live(spans)} attempts held the job at one instant"
        # The killed runner's slots came back once its leases ended: its attempts were retried
        # after the lease, and three attempts ran at once again after the last of them.
        freed = max(float(leases[(str(c["job_id"]), int(c["attempt"]))]) for c in dead)
        for call in dead:
            key = (str(call["job_id"]), int(call["attempt"]))
            retry = [
                float(c["at_ms"])
                for c in claims
                if (str(c["intent_id"]), int(c["attempts"])) == (key[0], key[1] + 1)
            ]
            assert retry and retry[0] >= leases[key], (call, retry)
        later = [s for s in spans if s[0] >= freed]
        assert max_live(later) == 3, f"after the lease ended, at most {max_live(later)} at once"
        await one_receipt_each(t, ids)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_rate_holds_across_two_runners_for_thirty_seconds(akter_test: MakeTest) -> None:
    """Rate(50, per=1 s), burst 50: every window within the bucket, then 45-55 starts/s."""
    async with drill(akter_test, 2) as (t, _children):
        ids: list[str] = []
        for i in range(16):
            ids += await t.get(Paced, f"r{i}").fill_paced(97)  # 1,552: the burst + 30 s
        await drained(t, 120)
        calls = [c for c in await call_log(t) if c["job"] == "paced"]
        await one_receipt_each(t, ids)
    assert len(calls) == len(ids) == 1552
    per_job = Counter(str(c["job_id"]) for c in calls)
    assert set(per_job) == set(ids) and set(per_job.values()) == {1}, "a job ran twice"
    assert {int(c["attempt"]) for c in calls} == {1}
    assert len({int(c["pid"]) for c in calls}) == 2, "both runners took tokens"
    starts = sorted(float(c["started_ms"]) for c in calls)
    # The bucket's rule (flow-control F3.3) in every window: at most 50 + 50 · T starts in any
    # T seconds, with 50 ms for the recorder's own delay (a pooled insert on the database clock).
    worst = max(
        (j - i + 1) - (50 + 50 * (starts[j] - starts[i] + 50) / 1000)
        for i in range(len(starts))
        for j in range(i, min(len(starts), i + 400))
    )
    assert worst <= 0, f"a window holds {worst:.1f} starts more than the bucket allows"
    # The burst: the 50 tokens of a full bucket plus what refilled while the first claims took
    # them. Tokens are booked at most a second ahead, by claims of at most 8 slots per runner,
    # so the burst may take a few seconds to spend; from then on tokens are taken at 50/s.
    first = starts[0] + 5000
    windows = []
    for w in range(4):  # 20 s of windows after the burst
        lo, hi = first + w * 5000, first + (w + 1) * 5000
        windows.append(sum(1 for s in starts if lo <= s < hi) / 5)
    print(f"rate drill: starts/s per 5-s window after the burst: {windows}")
    assert all(45 <= rate <= 55 for rate in windows), windows
