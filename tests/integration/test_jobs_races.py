"""Job races on a real PostgreSQL (JB-22, JB-25) and the lease-loss must-show.

Interleavings are forced, not hoped for: a claim or a wake is held behind a lock that a side
connection takes with the very statements akter uses (the group lock, a renewal's row update, a
claim's update), and the test waits until the server reports the blocked statement as a lock
waiter (``pg_stat_activity``) before it lets go. Attempts are held with the fake provider's gates
and with ``pause_next``; only JB-22 uses random short delays, to spread cancellations over every
phase of a job while three runtimes claim concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from akter._store.gateway import jobs as jobs_gateway
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, Step, fail, gate, hang, succeed
from tests._support import until
from tests._support.locks import lock_waiters, until_lock_waiter
from tests._support.providers import fresh_provider
from tests.integration.test_jobs_actors import ALL, PROVIDER, Hot, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


provider = fresh_provider(PROVIDER)


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY ready_at_ms, intent_id")


async def by_id(t: ActorTest) -> dict[str, dict[str, Any]]:
    return {str(r["intent_id"]): r for r in await outbox(t)}


async def letters(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.dead_letters ORDER BY dead_at_ms, job_id")


async def receipts_for(t: ActorTest, command_id: str) -> list[str]:
    rows = await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
    return [str(r["command"]) for r in rows]


async def db_now(t: ActorTest, runtime: int = 0) -> int:
    """A runtime's framework clock (database time plus its offset)."""
    return await t.runtimes[runtime]._clock.read()


@asynccontextmanager
async def side(t: ActorTest) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
    """A connection outside every runtime, in an open transaction (rolled back unless committed)."""
    conn = await psycopg.AsyncConnection.connect(t.database_url, row_factory=dict_row)
    try:
        yield conn
    finally:
        await conn.rollback()
        await conn.close()


def group_params(t: ActorTest, handle: Any, job: str) -> dict[str, Any]:
    ref = handle.ref
    return {
        "rk": t.runtime.routing_key(ref),
        "tenant": ref.tenant,
        "type": ref.type,
        "id": ref.id,
        "job": job,
    }


async def settle_all(t: ActorTest, within: float = 20.0) -> None:
    """Drain until the outbox is empty (background relays may run too)."""

    async def drained() -> list[dict[str, Any]]:
        rows = await outbox(t)
        if rows:
            await t.drain()
        return rows

    await until(
        drained, within=within, what="an empty outbox", holds=lambda rows: not rows, interval=0.02
    )


# --- JB-22: enqueue and cancel while three runners claim ----------------------------------------


async def test_JB22_jobs_cancelled_while_three_runners_claim_have_one_fate_each(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, poll=0.02, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        await t.add_runtime()
        rnd = random.Random(22)
        # Half the calls return at once or soon, half hang until their cancellation stops them.
        kinds = {f"j{i}": ("hang" if i % 2 else "ok") for i in range(40)}
        for tag, kind in kinds.items():
            provider.script(
                hang() if kind == "hang" else succeed(int(tag[1:]), after=0.01), key=tag
            )
        delays = [0.0, 0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3]

        async def one(i: int) -> tuple[str, str]:
            tag = f"j{i}"
            owner = t.runtimes[i % 3].get(Shop, f"s{i % 4}")
            canceller = t.runtimes[(i + 1) % 3].get(Shop, f"s{i % 4}")
            if i % 10 == 0:  # enqueued and cancelled in one turn
                return tag, await owner.buy_and_cancel(i, f"k{i}")
            job_id = await owner.buy(i, tag=tag, key=f"k{i}")
            await asyncio.sleep(rnd.choice(delays))  # spreads cancels over every phase
            await canceller.cancel(f"k{i}")
            return tag, job_id

        jobs = dict(await asyncio.gather(*(one(i) for i in range(40))))
        await settle_all(t)
        for runner in range(len(t.runtimes)):
            await t.wait_idle(runner)

        fates: dict[str, list[dict[str, Any]]] = {job_id: [] for job_id in jobs.values()}
        for s in range(4):
            for report in await t.get(Shop, f"s{s}").reports():
                fates[report["id"]].append(report)
        assert await letters(t) == []
        ran = never = 0
        for tag, job_id in jobs.items():
            calls = provider.calls_for(job_id)
            reports = fates[job_id]
            assert len(calls) <= 1, (tag, calls)  # executed at most once
            assert len(reports) <= 1, (tag, reports)  # at most one fate
            commands = {"success": "charged", "cancelled": "charge_cancelled"}
            assert await receipts_for(t, job_id) == [commands[r["route"]] for r in reports]
            if not calls:
                never += 1
                # Never called: no fate, unless an attempt was claimed and interrupted before
                # it called (then the provider may, for all the row knows, have been reached).
                assert all(r["outcome"]["kind"] == "Unknown" for r in reports), (tag, reports)
                continue
            ran += 1
            (call,) = calls
            assert len(reports) == 1, (tag, call)  # it ran: exactly one fate
            (report,) = reports
            assert report.get("outcome", {}).get("kind") != "Failed", (tag, report)
            if call.outcome == "succeeded":
                value = int(tag[1:])
                if report["route"] == "success":
                    assert report["value"] == value, (tag, report)
                else:  # finished before its cancellation was seen
                    assert (report["route"], report["outcome"], report["ambiguous"]) == (
                        "cancelled",
                        {"kind": "Succeeded", "value": value},
                        False,
                    ), (tag, report)
            else:
                assert call.outcome == "interrupted", (tag, call)
                assert (report["route"], report["outcome"]["kind"], report["ambiguous"]) == (
                    "cancelled",
                    "Unknown",
                    True,
                ), (tag, report)
        assert ran and never, (ran, never)  # both sides of the race happened
        assert sum(1 for i in range(0, 40, 10) if provider.calls_for(jobs[f"j{i}"])) == 0


# --- JB-25: the capped-group races --------------------------------------------------------------


async def enqueue_apart(t: ActorTest, hot: Hot, tags: list[str]) -> list[str]:
    """One ``Hot.one`` job per turn, the clock 5 ms apart: ready order = job id order."""
    ids: list[str] = []
    for tag in tags:
        ids += await hot.start_one([tag])
        for runtime in t.runtimes:
            runtime._clock.offset_ms += 5
    assert ids == sorted(ids)
    return ids


async def first_held(
    t: ActorTest, provider: FakeProvider, tags: list[str]
) -> tuple[Step, Any, list[str]]:
    """``Hot.one`` jobs ``tags`` enqueued apart; attempt 1 of the first claimed and held at a gate.

    The others succeed when they run. Returns the gate, the handle and the job ids.
    """
    a = gate(1)
    provider.script(a, key=tags[0])
    provider.default = succeed(2)
    hot = t.get(Hot, "h1")
    ids = await enqueue_apart(t, hot, tags)
    assert await t.runtime._jobs.run_pass() == 1
    await asyncio.wait_for(a.entered.wait(), 10)
    return a, hot, ids


async def test_JB25_a_wake_blocked_by_a_claims_group_lock_then_wakes_the_oldest_waiting_row(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        a, hot, ids = await first_held(t, provider, ["a", "b", "c", "d"])
        first, *waiting = ids
        rows = await by_id(t)
        assert all(rows[i]["waiting"] for i in waiting)

        async with side(t) as conn:
            # Another runner's claim of this group holds the group lock.
            await conn.execute(
                t.runtime._store.queries["job_group_lock"], group_params(t, hot, "one")
            )
            a.release()
            await until_lock_waiter(t, "FOR NO KEY UPDATE")  # the wake after attempt 1 blocks
            rows = await by_id(t)
            # The settle did not wait: its in-transaction wake skipped the held lock (SKIP
            # LOCKED), and the executor's own wake transaction is the one waiting.
            assert (rows[first]["kind"], rows[first]["command"]) == ("intent", "one_done")
            assert all(rows[i]["waiting"] for i in waiting)  # nothing woken yet
            await conn.commit()
        await t.wait_idle()

        now = await db_now(t)
        rows = await by_id(t)
        state = {
            i: (rows[i]["waiting"], rows[i]["running"], rows[i]["due_at_ms"] <= now)
            for i in waiting
        }
        # The oldest waiting row is due now; the younger ones still wait.
        assert state == {
            waiting[0]: (False, False, True),
            waiting[1]: (True, False, False),
            waiting[2]: (True, False, False),
        }
        await settle_all(t)
        assert [c.key for c in provider.calls] == ["a", "b", "c", "d"]
        assert [r["id"] for r in await hot.reports()] == [first, *waiting]


async def test_JB25_a_settle_with_the_group_lock_free_wakes_the_oldest_waiting_row_itself(
    akter_test: Make, provider: FakeProvider
) -> None:
    # The wake after a capped attempt rides in its settle's transaction (one round trip, issue
    # 13): the route rewrite and the wake are one transaction's tuples (same xmin), and the
    # younger rows still wait. The blocked case above shows the other branch: with the group
    # lock taken the settle commits without waiting and the executor wakes the group after.
    async with akter_test(ALL, relay=False) as t:
        a, hot, ids = await first_held(t, provider, ["a", "b", "c"])
        first, *waiting = ids
        a.release()
        await t.wait_idle()
        now = await db_now(t)
        rows = {
            str(r["intent_id"]): r
            for r in await t.rows("SELECT *, xmin::text AS tx FROM {schema}.outbox")
        }
        assert (rows[first]["kind"], rows[first]["command"]) == ("intent", "one_done")
        woken, younger = rows[waiting[0]], rows[waiting[1]]
        assert (woken["waiting"], woken["running"], woken["due_at_ms"] <= now) == (
            False,
            False,
            True,
        )
        assert woken["tx"] == rows[first]["tx"]  # woken by the settle's own transaction
        assert younger["waiting"] and younger["due_at_ms"] > now
        await settle_all(t)
        assert [c.key for c in provider.calls] == ["a", "b", "c"]
        assert [r["id"] for r in await hot.reports()] == [first, *waiting]


async def test_JB25_a_capped_settle_behind_a_claim_holding_its_row_waits_past_the_lock_wait(
    akter_test: Make, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another runner's group claim holds the running rows (job_group_lock_running) while the
    # attempt settles. The settle waits for it as an autocommit settle always did: the claims'
    # lock wait (here 100 ms) is not applied to the settle's transaction, whose own wake never
    # waits (SKIP LOCKED). Failing at the lock wait would drop a success and re-run the job.
    monkeypatch.setitem(jobs_gateway.CLAIM_SETTINGS, "lock_timeout", "100ms")
    async with akter_test(ALL, relay=False) as t:
        a, hot, ids = await first_held(t, provider, ["a", "b"])
        first, second = ids
        async with side(t) as conn:
            await conn.execute(
                t.runtime._store.queries["job_group_lock_running"], group_params(t, hot, "one")
            )
            a.release()
            await until_lock_waiter(t, "SET kind = 'intent'")  # the settle waits for the row
            held_since = time.monotonic()
            while time.monotonic() - held_since < 0.5:  # five times the claims' lock wait
                assert await lock_waiters(t, "SET kind = 'intent'") == 1, "the settle gave up"
                await asyncio.sleep(0.05)  # polling an observable condition over a span
            await conn.commit()
        await t.wait_idle()
        rows = await by_id(t)
        assert (rows[first]["kind"], rows[first]["command"]) == ("intent", "one_done")
        await settle_all(t)
        assert [(c.key, c.attempt) for c in provider.calls] == [("a", 1), ("b", 1)]
        assert [r["id"] for r in await hot.reports()] == [first, second]


@pytest.mark.parametrize("renewal", ["commits", "rolls back"])
async def test_JB25_a_claim_waits_for_an_older_attempts_renewal_and_starts_nothing_younger(
    akter_test: Make, provider: FakeProvider, renewal: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        lease = t.runtime.config.job_lease_ms
        # Runner 1's clock is just past attempt 1's lease end: only the renewal can keep it.
        await t.add_runtime()
        a, retried = gate(1), gate(3)
        provider.script(a, retried, key="a")
        provider.script(succeed(2), key="b")
        hot = t.get(Hot, "h1")
        first, second = await hot.start_one(["a", "b"])
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(a.entered.wait(), 10)
        t.runtimes[1]._clock.offset_ms += lease + 500
        lease_end = (await by_id(t))[first]["due_at_ms"]

        async with side(t) as conn:
            # Attempt 1's renewal, sent just before its lease ended, holds its row.
            cur = await conn.execute(
                t.runtime._store.queries["renew_job"],
                {
                    "rk": t.runtime.routing_key(hot.ref),
                    "job_id": first,
                    "attempt": 1,
                    "lease": lease,
                    "off": lease - 100,
                },
            )
            renewed = await cur.fetchone()
            assert renewed is not None and renewed["due_at_ms"] > await db_now(t, 1)
            claim = asyncio.create_task(t.runtimes[1]._jobs.run_pass())
            await until_lock_waiter(t, "SELECT intent_id FROM")  # job_group_lock_running
            assert not claim.done()
            if renewal == "commits":
                await conn.commit()
            else:
                await conn.rollback()
        claimed = await claim

        rows = await by_id(t)
        assert rows[second]["attempts"] == 0 and rows[second]["waiting"]  # nothing younger
        if renewal == "commits":
            # The claim saw the renewed lease: the slot is taken, nothing was claimed.
            assert claimed == 0
            assert (rows[first]["attempts"], rows[first]["running"]) == (1, True)
            assert rows[first]["due_at_ms"] == renewed["due_at_ms"] > lease_end
            assert [c.key for c in provider.calls] == ["a"]
        else:
            # No renewal: the lease ended, and the older job is re-claimed first (attempt 2).
            assert claimed == 1
            assert (rows[first]["attempts"], rows[first]["running"]) == (2, True)
            await asyncio.wait_for(retried.entered.wait(), 10)
            assert [(c.key, c.attempt) for c in provider.calls] == [("a", 1), ("a", 2)]
            retried.release()
            await t.wait_idle(runner=1)
        a.release()
        await t.wait_idle()
        await settle_all(t)
        assert await receipts_for(t, first) == ["one_done"]
        assert await receipts_for(t, second) == ["one_done"]
        assert [r["id"] for r in await hot.reports()] == [first, second]


@pytest.mark.parametrize("claim_holds", ["the group lock", "only the row"])
async def test_JB25_a_wake_racing_a_claim_of_the_oldest_waiting_row_wakes_the_next(
    akter_test: Make, provider: FakeProvider, claim_holds: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        q = t.runtime._store.queries
        lease = t.runtime.config.job_lease_ms
        a = gate(1)
        provider.script(a, key="a")
        provider.default = succeed(2)
        hot = t.get(Hot, "h1")
        first, second, third = await hot.start_one(["a", "b", "c"])
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(a.entered.wait(), 10)
        params = {
            **group_params(t, hot, "one"),
            "off": 0,
            "free": 4,
            "cap": 1,
            "max_attempts": 2,
            "lease": lease,
            "slots": None,
        }

        async with side(t) as conn:
            if claim_holds == "the group lock":
                # Another runner's claim holds the group lock ...
                await conn.execute(q["job_group_lock"], params)
                a.release()
                await until_lock_waiter(t, "FOR NO KEY UPDATE")  # ... so the wake waits ...
                # ... while that claim takes the oldest waiting row (attempt 1 has settled).
                await conn.execute(q["job_group_lock_running"], params)
                cur = await conn.execute(q["claim_capped_group"], params)
                (claimed_row,) = await cur.fetchall()
                claimed: dict[str, Any] | None = claimed_row
                assert claimed_row["intent_id"] == second
                await conn.commit()
                await t.wait_idle()
            else:
                # A claim's update holds the oldest waiting row; the wake skips it (SKIP LOCKED).
                cur = await conn.execute(
                    sql.SQL(
                        "UPDATE {schema}.outbox SET running = true, waiting = false,"
                        " attempts = 1, due_at_ms = {schema}.stmt_ms(0) + %(lease)s"
                        " WHERE routing_key = %(rk)s AND intent_id = %(id)s"
                        " RETURNING due_at_ms AS claimed_until"
                    ).format(schema=sql.Identifier(t.schema)),
                    {"lease": lease, "rk": params["rk"], "id": second},
                )
                claimed = await cur.fetchone()
                a.release()
                await t.wait_idle()  # the wake did not wait for the row
                rows = await by_id(t)
                assert rows[third]["waiting"] is False  # the next row was woken
                await conn.commit()

        assert claimed is not None
        now = await db_now(t)
        rows = await by_id(t)
        assert (rows[second]["running"], rows[second]["attempts"]) == (True, 1)
        # The wake never pulled the claimed row's lease end back.
        assert rows[second]["due_at_ms"] == claimed["claimed_until"] > now
        assert (rows[third]["waiting"], rows[third]["running"]) == (False, False)
        assert rows[third]["due_at_ms"] <= now

        # The side claim's attempt never runs; after its lease the job is taken over, in order.
        await t.advance(lease / 1000 + 1)
        await settle_all(t)
        assert [(c.key, c.attempt) for c in provider.calls] == [("a", 1), ("b", 2), ("c", 1)]
        assert [r["id"] for r in await hot.reports()] == [first, second, third]


# --- lease loss: an executor partitioned from the database --------------------------------------


class _Partitioned:
    """A statement catalogue whose lease renewal fails as if the network were down."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getitem__(self, name: str) -> Any:
        if name == "renew_job":
            return "SELECT 1 / 0 AS partitioned WHERE %(rk)s::bigint IS NOT NULL"
        return self._inner[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _partition_renewals(monkeypatch: pytest.MonkeyPatch, t: ActorTest) -> None:
    monkeypatch.setattr(t.runtime._store, "queries", _Partitioned(t.runtime._store.queries))


async def _clock_map(conn: psycopg.AsyncConnection[Any]) -> tuple[float, float]:
    """Map local monotonic seconds to database ms: (offset, uncertainty), best of 20 samples."""
    best: tuple[float, float] | None = None
    for _ in range(20):
        before = time.monotonic()
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000")
        row = await cur.fetchone()
        after = time.monotonic()
        assert row is not None
        rtt = (after - before) * 1000
        if best is None or rtt / 2 < best[1]:
            best = (float(row[0]) - (before + after) / 2 * 1000, rtt / 2)
    assert best is not None
    return best


async def test_lease_loss_a_partitioned_executor_stops_before_the_database_lease_ends(
    akter_test: Make,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        takeover_step = gate(5)
        provider.script(hang(), takeover_step)
        _partition_renewals(monkeypatch, t)  # runner 0 can claim, then never renew
        job_id = await t.get(Shop, "s1").buy(1)
        async with await psycopg.AsyncConnection.connect(t.database_url, autocommit=True) as conn:
            offset, uncertainty = await _clock_map(conn)
            with caplog.at_level(logging.WARNING, logger="akter.jobs"):
                assert await t.runtime._jobs.run_pass() == 1
                (row,) = await outbox(t)
                lease_end = int(row["due_at_ms"])
                # Runner 1 keeps trying (real time) until the database lets it take over.
                await until(
                    t.runtimes[1]._jobs.run_pass, what="runner 1 taking over", interval=0.005
                )
                await asyncio.wait_for(takeover_step.entered.wait(), 10)
                (row,) = await outbox(t)
                assert (row["attempts"], row["running"]) == (2, True)
                takeover = int(row["due_at_ms"]) - t.runtimes[1].config.job_lease_ms
                takeover_step.release()
                await t.wait_idle()
                await t.wait_idle(runner=1)
            again, _ = await _clock_map(conn)
        messages = [r.getMessage().partition(": ")[0] for r in caplog.records]
        assert messages.count("Job lease renewal failed") >= 2  # retried at every interval
        assert "Job attempt outlived its lease; interrupted" in messages
        first, second = provider.calls
        assert (first.attempt, first.outcome, second.attempt) == (1, "interrupted", 2)
        assert first.ended is not None and first.ended < second.started
        assert takeover >= lease_end  # the database handed the row over only after its lease
        await t.advance(0)
        assert await receipts_for(t, job_id) == ["charged"]
        assert abs(again - offset) < 5, "the clocks drifted apart: the comparison is void"
        # The partitioned runner stopped its attempt before the database's lease ended.
        stopped = first.ended * 1000 + offset
        assert stopped + uncertainty < lease_end, (
            f"attempt 1 was interrupted {stopped - lease_end:+.2f} ms (± {uncertainty:.2f}) "
            f"after the database lease ended at {lease_end}"
        )


async def test_lease_loss_a_late_success_after_dead_lettering_marks_it_ambiguous_and_routes_nothing(
    akter_test: Make,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        first = gate(7)
        provider.script(first, fail("declined", final=True))
        _partition_renewals(monkeypatch, t)
        settle = t.pause_next("after_execute")  # the partition also holds back its settle
        shop = t.get(Shop, "s1")
        job_id = await shop.buy(1)
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        first.release()
        await settle.wait()  # attempt 1 succeeded at the provider; nobody knows yet

        # Runner 1's clock passes the lease: attempt 2 takes over, fails finally, dead-letters.
        t.runtimes[1]._clock.offset_ms += t.runtime.config.job_lease_ms + 1000
        assert await t.runtimes[1]._jobs.run_pass() == 1
        await t.wait_idle(runner=1)
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 2, False)

        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            settle.release()  # the partition heals: the late success settles
            await t.wait_idle()
        assert "Job succeeded after it was dead-lettered" in [
            r.getMessage().partition(": ")[0] for r in caplog.records
        ]
        (letter,) = await letters(t)
        assert (letter["job_id"], letter["attempts"], letter["ambiguous"]) == (job_id, 2, True)
        await t.advance(0)
        assert await receipts_for(t, job_id) == ["charge_dead"]  # no success route
        (report,) = await shop.reports()
        assert (report["route"], report["attempts"], report["ambiguous"]) == (
            "dead_letter",
            2,
            False,  # the route carried what was known when it was sent
        )
        assert [(c.attempt, c.outcome) for c in provider.calls] == [
            (1, "succeeded"),
            (2, "failed"),
        ]
        assert await outbox(t) == []


@pytest.mark.parametrize(
    ("slots", "claimed", "deferred"),
    [(None, 1, True), (2, 1, True), (1, 1, False), (0, 0, False)],
)
async def test_JB26_a_group_claim_defers_the_rest_unless_the_deployment_cap_held_them_back(
    akter_test: Make, slots: int | None, claimed: int, deferred: bool
) -> None:
    """The claim statement's own defer (semantics §5.6 step 6), without the executor.

    ``one`` is capped per actor at 1: the claim takes the oldest row, and the group's other due
    rows start waiting (off the due index until a wake) unless the claim took every free slot
    of the type's deployment-wide cap (``slots``): then they stay due for the next pass.
    """
    async with akter_test(ALL, relay=False) as t:
        q = t.runtime._store.queries
        hot = t.get(Hot, "h1")
        ids = await hot.start_one(["a", "b", "c"])
        params = {
            **group_params(t, hot, "one"),
            "off": 0,
            "free": 4,
            "cap": 1,
            "max_attempts": 2,
            "lease": t.runtime.config.job_lease_ms,
            "slots": slots,
        }
        async with side(t) as conn:
            now = await db_now(t)
            cur = await conn.execute(q["claim_capped_group"], params)
            assert [r["intent_id"] for r in await cur.fetchall()] == ids[:claimed]
            cur = await conn.execute(
                q.substitute(
                    "SELECT intent_id, waiting, running, due_at_ms FROM {schema}.outbox"
                    " WHERE routing_key = %(rk)s AND intent_id = ANY(%(ids)s)"
                ),
                {"rk": params["rk"], "ids": ids[claimed:]},
            )
            rest = await cur.fetchall()
            assert len(rest) == 3 - claimed
            for row in rest:
                assert row["running"] is False
                assert row["waiting"] is deferred
                assert (row["due_at_ms"] > now + params["lease"] // 2) is deferred
