"""A singleton loop's commands are fenced on its lease in the database (semantics §8.2).

The loop guard stops a ``run()`` loop before its lease can end only while the process runs; a
paused process resumes its loop body before its guard. So every command the loop sends through
``self.runtime`` handles carries the loop's lease (owner, epoch), and its turn checks the
``singletons`` row before the handler and holds it ``FOR KEY SHARE`` in its commit flight, so that
either the command commits before a successor owns the lease, or it is refused with
``LeaseLost`` and writes nothing. The owner's own refreshes and contenders for a live lease do
not wait for fenced turns; only a takeover (which locks the row ``FOR UPDATE`` first) waits, and
only for commit flights, which never wait for the client.

The runner's own lease refreshes are stopped here once the loop runs: the tests drive the lease
themselves, with the real ``acquire_singleton`` statement run for a second runner id on a clock
moved past the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from pydantic import BaseModel

import akter
from akter._engine.turn import writes
from akter.context import LoopLease
from akter.handles import FencedRuntime
from akter.http.problems import status_of
from akter.runtime import Runtime
from akter.testing import ActorTest
from tests._support.citus import ON_CITUS
from tests._support.locks import until_lock_waiter

Make = Callable[..., ActorTest]

#: Why the server-clock fence test does not run on Citus: the lease's shard is on a worker,
#: whose clock is not the coordinator's that wrote the lease, so the check there keeps the
#: turn's own estimate of the coordinator's clock.
CLIENT_FENCE_CLOCK = "on Citus the held fence compares with the turn's coordinator-clock estimate"

#: Far enough past the default 35 s lease that any lease written before has ended.
PAST_LEASE_MS = 36_000


class Total(BaseModel):
    total: int = 0


@dataclass
class Loop:
    """One runner's ``Fenced`` loop, driven by the test: orders in, results out."""

    started: asyncio.Queue[LoopLease] = field(default_factory=asyncio.Queue)
    orders: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    results: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    runtimes: list[Any] = field(default_factory=list)


LOOPS: dict[str, Loop] = {}


class Fenced(akter.Actor[Total], singleton=True):
    @akter.command
    async def bump(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @akter.query
    async def total(self) -> int:
        return self.state.total

    async def run(self) -> None:
        loop = LOOPS.setdefault(self.lease.owner, Loop())
        loop.runtimes.append(self.runtime)
        loop.started.put_nowait(self.lease)
        handle = self.runtime.get(Fenced)
        while True:
            n = await loop.orders.get()
            try:
                result: object = await handle.bump(n)
            except akter.ActorError as exc:
                result = exc
            loop.results.put_nowait(result)


@pytest.fixture(autouse=True)
def fresh_loops() -> None:
    LOOPS.clear()


async def owned_loop(t: ActorTest) -> tuple[Loop, LoopLease]:
    """Wait for the first runtime's loop, then stop its background lease refreshes."""
    runtime = t.runtime
    for _ in range(1000):
        if runtime._runners.runner_id in LOOPS:
            break
        await asyncio.sleep(0.01)  # polling an observable condition, not ordering by time
    loop = LOOPS[runtime._runners.runner_id]
    lease = await asyncio.wait_for(loop.started.get(), 10)
    await hold_refreshes(runtime)
    return loop, lease


async def hold_refreshes(runtime: Runtime) -> None:
    """Cancel the runner's lease task (it sleeps between refreshes): the test drives leases."""
    for task in runtime._runners._tasks:
        if task.get_name() == "akter.runners.leases":
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def order(loop: Loop, n: int) -> object:
    """Have the loop send ``bump(n)`` through its fenced handle; its result or its error."""
    loop.orders.put_nowait(n)
    return await asyncio.wait_for(loop.results.get(), 30)


async def lease_row(t: ActorTest) -> dict[str, Any]:
    rows = await t.rows(
        "SELECT owner::text AS owner, lease_until_ms, acquired_at_ms, routing_key"
        " FROM {schema}.singletons"
        " WHERE actor_type = 'Fenced'"
    )
    assert len(rows) == 1
    return rows[0]


async def acquire_as(
    t: ActorTest, runner_id: str, ahead_ms: int, *, application_name: str = "fence-test"
) -> list[dict[str, Any]]:
    """Run the real ``acquire_singleton`` for another runner, on a clock ``ahead_ms`` ahead."""
    async with await psycopg.AsyncConnection.connect(
        t.database_url, autocommit=True, application_name=application_name
    ) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await run_acquire(
            t,
            cur,
            {
                "off": t.runtime._clock.offset_ms + ahead_ms,
                "actor_type": "Fenced",
                "runner_id": runner_id,
                "lease_ms": t.runtime._runners.lease_ms,
                "skew_ms": t.runtime._clock.skew_ms(t.runtime._runners.lease_ms),
            },
        )
        return await cur.fetchall()


async def run_acquire(t: ActorTest, cur: Any, params: dict[str, Any]) -> None:
    """The real lease round's statements (one clock reading, the takeover lock, the upsert)."""
    q = t.runtime._store.queries
    await cur.execute(q["clock_now"], params)
    now = await cur.fetchone()
    params = {
        **params,
        "now": now["now_ms"] if isinstance(now, dict) else now[0],
        "rk": t.runtime._runners.lease_key(params["actor_type"]),
    }
    await cur.execute(q["singleton_takeover"], params)
    await cur.execute(q["acquire_singleton"], params)


def lease_lost(result: object) -> akter.ActorError:
    assert isinstance(result, akter.ActorError), result
    assert result.reason == "LeaseLost" and not result.retryable, result
    assert status_of(result) == 409
    assert result.command_id is not None
    return result


async def test_a_fenced_command_from_the_loop_commits_while_the_lease_is_held(
    akter_test: Make,
) -> None:
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        row = await lease_row(t)
        # self.lease is the acquisition that started the loop.
        assert lease == LoopLease(
            "Fenced", t.runtime._runners.runner_id, row["acquired_at_ms"], row["routing_key"]
        )
        # The lease row carries the routing key of the singleton's actor (0008).
        assert row["routing_key"] == t.runtime.routing_key(t.get(Fenced).ref)
        assert row["owner"] == lease.owner
        assert isinstance(loop.runtimes[0], FencedRuntime) and loop.runtimes[0].lease == lease
        assert await order(loop, 2) == 2
        assert await order(loop, 3) == 5
        seen = await t.inspect(t.get(Fenced))
        assert seen.state == {"total": 5} and len(seen.receipts) == 2
        # Unfenced callers are unaffected, and queries from anywhere need no fence.
        assert await t.get(Fenced).bump(1) == 6
        assert await t.get(Fenced).total() == 6


@pytest.mark.parametrize("how", ["taken", "expired"])
async def test_a_command_from_a_loop_that_lost_its_lease_is_refused_and_writes_nothing(
    akter_test: Make, how: str
) -> None:
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        assert await order(loop, 1) == 1
        before = await t.inspect(t.get(Fenced))
        if how == "taken":
            # Another runner's acquisition, once the lease has ended on its clock.
            successor = str(uuid.uuid4())
            assert await acquire_as(t, successor, PAST_LEASE_MS)
            assert (await lease_row(t))["owner"] == successor
        else:
            # Nobody took it over, but the lease has ended.
            t.runtime._clock.offset_ms += PAST_LEASE_MS
        # The loop runs on (the guard measures local time since the refresh was sent) ...
        refused = lease_lost(await order(loop, 10))
        assert refused.command_id is not None and str(lease.epoch) in refused.message
        # ... but its command changed nothing and wrote no receipt: the id stays unused.
        after = await t.inspect(t.get(Fenced))
        assert after.state == before.state == {"total": 1}
        assert after.version == before.version
        assert [r["command_id"] for r in after.receipts] == [
            r["command_id"] for r in before.receipts
        ]
        assert refused.command_id not in {r["command_id"] for r in after.receipts}
        # Unfenced commands are not affected.
        assert await t.get(Fenced).bump(100) == 101
        if how == "expired":
            # The owner refreshes its own lease again: same acquisition, same epoch, so the same
            # loop's commands commit again (nobody else held the lease in between).
            runners = t.runtime._runners
            await runners._refresh(runners._leases["Fenced"])
            assert (await lease_row(t))["acquired_at_ms"] == lease.epoch
            assert loop.started.empty()  # the loop was not restarted
            assert await order(loop, 1000) == 1101


async def test_an_owner_that_takes_its_lease_back_restarts_its_loop_on_the_new_epoch(
    akter_test: Make,
) -> None:
    async with akter_test([Fenced], maintenance=False) as t:
        loop, first = await owned_loop(t)
        assert await acquire_as(t, str(uuid.uuid4()), PAST_LEASE_MS)
        # Past the successor's lease too: the old owner acquires again, a new acquisition.
        t.runtime._clock.offset_ms += 2 * PAST_LEASE_MS
        runners = t.runtime._runners
        await runners._refresh(runners._leases["Fenced"])
        second = await asyncio.wait_for(loop.started.get(), 10)
        row = await lease_row(t)
        assert second.owner == first.owner == row["owner"]
        assert second.epoch == row["acquired_at_ms"] != first.epoch
        # The loop fenced on the old epoch was stopped; the new one's commands commit.
        assert len(loop.runtimes) == 2
        assert await order(loop, 7) == 7


async def test_a_fenced_command_refused_in_a_batch_leaves_the_others_alone(
    akter_test: Make,
) -> None:
    async with akter_test([Fenced], maintenance=False) as t:
        loop, _ = await owned_loop(t)
        assert await acquire_as(t, str(uuid.uuid4()), PAST_LEASE_MS)
        first = t.pause_next("before_handler")
        batch = t.pause_next("before_commit", lambda info: len(info["batch"]) == 2)
        one = asyncio.create_task(t.get(Fenced).bump(1))
        await first.wait()
        # Queued behind the paused turn: an unfenced command and the stale loop's command.
        two = asyncio.create_task(t.get(Fenced).bump(10))
        loop.orders.put_nowait(100)
        for _ in range(1000):
            if t.runtime._dispatcher.pending == 3:
                break
            await asyncio.sleep(0.005)  # polling an observable condition, not ordering by time
        assert t.runtime._dispatcher.pending == 3
        first.release()
        info = await batch.wait()
        assert [r.fence is not None for r in info["batch"]] == [False, True]
        batch.release()
        assert await one == 1 and await two == 11
        refused = lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        seen = await t.inspect(t.get(Fenced))
        assert seen.state == {"total": 11}
        assert len(seen.receipts) == 2
        assert refused.command_id not in {r["command_id"] for r in seen.receipts}


async def test_a_fenced_turn_paused_before_commit_holds_off_no_takeover_and_is_refused(
    akter_test: Make,
) -> None:
    # A process frozen between a fenced turn's flights holds no lock on the lease row (psycopg's
    # pipeline ends with a Flush, so the server's idle-in-transaction timeout never fires): a
    # successor takes over at once, and the frozen turn's commit flight then fails its held
    # check, so its retry is refused with LeaseLost and nothing is written.
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(5)
        await before_commit.wait()
        successor = str(uuid.uuid4())
        rows = await asyncio.wait_for(acquire_as(t, successor, PAST_LEASE_MS), 10)
        assert [r["owner"] for r in rows] == [successor]
        before_commit.release()
        lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        seen = await t.inspect(t.get(Fenced))
        assert not seen.exists and seen.receipts == []
        assert (await lease_row(t))["owner"] == successor != lease.owner


async def test_a_fenced_turn_meeting_an_uncommitted_acquire_waits_and_is_refused(
    akter_test: Make,
) -> None:
    async with (
        akter_test([Fenced], maintenance=False) as t,
        await psycopg.AsyncConnection.connect(t.database_url) as successor,
    ):
        loop, lease = await owned_loop(t)
        # A successor's acquisition, not yet committed: it holds the lease row.
        runner = str(uuid.uuid4())
        cur = successor.cursor()
        await run_acquire(
            t,
            cur,
            {
                "off": t.runtime._clock.offset_ms + PAST_LEASE_MS,
                "actor_type": "Fenced",
                "runner_id": runner,
                "lease_ms": t.runtime._runners.lease_ms,
                "skew_ms": t.runtime._clock.skew_ms(t.runtime._runners.lease_ms),
            },
        )
        assert [str(r[0]) for r in await cur.fetchall()] == [runner]
        loop.orders.put_nowait(3)
        # The commit flight's hold waits for the row (on Citus in the lease's shard, on a worker).
        waiting = await until_lock_waiter(t, ".singletons", "FOR KEY SHARE")
        assert waiting == 1  # the fenced turn's check waits for the acquisition's outcome
        assert loop.results.empty()
        await successor.commit()
        # It re-reads the row the successor committed: another owner, so the command is refused.
        lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        seen = await t.inspect(t.get(Fenced))
        assert not seen.exists and seen.receipts == []  # not even the actor row was written
        assert (await lease_row(t))["owner"] == runner != lease.owner


async def test_a_takeover_waiting_for_a_fenced_turn_gives_up_at_its_lock_wait(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lease round waits for the old owner's fenced turns at most its lock wait, so one stuck
    # lease row cannot hold up a runner's other leases. On Citus the row lock waits on the worker
    # that holds the lease's shard, where the coordinator's lock_timeout does not reach.
    async with akter_test([Fenced], maintenance=False) as t:
        _, lease = await owned_loop(t)
        rk = t.runtime._runners.lease_key("Fenced")
        hold = t.substitute(
            "SELECT 1 FROM {schema}.singletons"
            " WHERE routing_key = %(rk)s AND actor_type = 'Fenced' FOR KEY SHARE"
        )
        async with await psycopg.AsyncConnection.connect(t.database_url) as fenced:
            await fenced.execute(hold, {"rk": rk})  # what a fenced commit flight holds
            past = t.runtime._clock.offset_ms + PAST_LEASE_MS
            monkeypatch.setattr(t.runtime._clock, "offset_ms", past)
            round_ = t.runtime._runners._gateway.acquire_singleton(
                "Fenced",
                rk,
                str(uuid.uuid4()),  # a successor, on a clock past the lease
                lease_ms=t.runtime._runners.lease_ms,
                skew_ms=t.runtime._clock.skew_ms(t.runtime._runners.lease_ms),
                lock_wait_ms=200,
            )
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await asyncio.wait_for(round_, 10)  # without the bound: until the COMMIT
        assert (await lease_row(t))["owner"] == lease.owner  # the failed round wrote nothing


async def test_refreshes_and_contenders_for_a_live_lease_never_wait_for_a_fenced_turn(
    akter_test: Make,
) -> None:
    # A loop that keeps fenced turns in flight must not starve its own lease refresh, and
    # other runners' lease rounds must not queue behind it (review finding, 2026-11-30).
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(7)
        await before_commit.wait()  # the fenced turn holds the lease row FOR KEY SHARE
        old_until = (await lease_row(t))["lease_until_ms"]
        # The owner refreshes (same runner id, its clock 1 s on): extended at once, same epoch.
        refreshed = await asyncio.wait_for(acquire_as(t, lease.owner, 1_000), 5)
        assert [r["owner"] for r in refreshed] == [lease.owner]
        assert refreshed[0]["acquired_at_ms"] == lease.epoch
        assert refreshed[0]["lease_until_ms"] > old_until
        # A contender while the lease is live: refused at once, without waiting on the row.
        contender = await asyncio.wait_for(acquire_as(t, str(uuid.uuid4()), 0), 5)
        assert contender == []
        before_commit.release()
        assert await asyncio.wait_for(loop.results.get(), 30) == 7
        assert (await t.inspect(t.get(Fenced))).state == {"total": 7}


async def test_a_fenced_turn_idling_past_its_lease_end_is_ended_so_a_takeover_proceeds(
    akter_test: Make,
) -> None:
    # A process frozen inside a fenced turn holds the lease row. The server ends that session
    # once it idles past the lease's end, so a successor takes over about when the lease ends,
    # not after execution_timeout (30 s) — and the frozen turn never commits.
    async with akter_test([Fenced], maintenance=False, singleton_lease=2) as t:
        loop, _ = await owned_loop(t)
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(4)
        await before_commit.wait()  # idle in transaction, holding the lease row FOR KEY SHARE
        lease_until = (await lease_row(t))["lease_until_ms"]
        successor = str(uuid.uuid4())
        rows: list[dict[str, Any]] = []
        started = time.monotonic()
        while not rows:
            assert time.monotonic() - started < 15, "no takeover"
            rows = await asyncio.wait_for(acquire_as(t, successor, 0), 15)
            if not rows:
                await asyncio.sleep(0.05)  # polling an observable condition, not ordering by time
        assert rows[0]["owner"] == successor
        assert rows[0]["acquired_at_ms"] >= lease_until
        assert rows[0]["acquired_at_ms"] - lease_until < 3_000  # not held until execution_timeout
        before_commit.release()
        seen = await t.inspect(t.get(Fenced))
        assert not seen.exists and seen.receipts == []  # the frozen turn never committed


@pytest.mark.skipif(ON_CITUS, reason=CLIENT_FENCE_CLOCK)
async def test_a_fenced_commit_checks_its_lease_at_the_servers_clock_not_a_stale_estimate(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process frozen after it estimated the commit's clock, and before its commit flight ran,
    # resumes with that estimate: the lease ended meanwhile and nobody took it over. The held
    # check reads the server's own clock, so the command is refused, not committed after its
    # lease (CI, 2026-12-04: RN-01's freeze drill saw a fenced beat 5 s past its lease's end).
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        stale = 10_000  # how far the frozen process's estimate is behind the server's clock
        monkeypatch.setattr(writes, "commit_clock", lambda now_ms, arrived_at: now_ms - stale)
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(6)
        await before_commit.wait()
        # The lease ends at the server's clock; owner and epoch stay: no successor yet.
        await t.rows(
            "UPDATE {schema}.singletons SET lease_until_ms = {schema}.now_ms(0) - 1"
            " WHERE actor_type = 'Fenced'"
        )
        ended = await lease_row(t)
        before_commit.release()
        lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        seen = await t.inspect(t.get(Fenced))
        assert not seen.exists and seen.receipts == []
        assert await lease_row(t) == ended and ended["owner"] == lease.owner


# --- issue 38, finding 9: the commit flight reads the clock --------------------------------------


async def test_frozen_singleton_owner_cannot_commit_after_its_lease(akter_test: Make) -> None:
    # An owner frozen between its fenced turn's flights (handlers done, commit flight not yet
    # sent) while its lease ends on the framework clock: nobody has taken the lease over, so
    # only the commit flight's own clock reading can tell. Its offset moved meanwhile (the
    # manual clock): the commit flight reads the clock as it runs, not at the admission's
    # offset, so the command is refused with LeaseLost and writes nothing.
    async with akter_test([Fenced], maintenance=False) as t:
        loop, lease = await owned_loop(t)
        assert await order(loop, 1) == 1
        before = await t.inspect(t.get(Fenced))
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(5)
        await before_commit.wait()  # admitted: its lease was current at the admission's clock
        t.runtime._clock.offset_ms += PAST_LEASE_MS  # the lease ends while the owner is frozen
        ended = await lease_row(t)
        before_commit.release()
        refused = lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        after = await t.inspect(t.get(Fenced))
        assert after.state == before.state == {"total": 1} and after.version == before.version
        assert [r["command_id"] for r in after.receipts] == [
            r["command_id"] for r in before.receipts
        ]
        assert refused.command_id not in {r["command_id"] for r in after.receipts}
        assert await lease_row(t) == ended and ended["owner"] == lease.owner


async def test_a_fenced_commit_on_citus_reads_the_coordinators_clock_in_its_flight(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On Citus the held check runs in the lease's shard, on a worker, whose clock is not the
    # coordinator's that wrote the lease: it compares with the turn's estimate only. The commit
    # flight also reads the coordinator's clock (a statement on no table runs there), so a
    # process frozen after it estimated the commit's clock is refused. Here the Citus variant
    # of the held check is served on plain PostgreSQL, where the coordinator is the server.
    async with akter_test([Fenced], maintenance=False) as t:
        queries = t.runtime._store.queries
        monkeypatch.setitem(
            queries._statements, "hold_singleton_fence", queries["citus_hold_singleton_fence"]
        )
        loop, lease = await owned_loop(t)
        # The frozen process's estimate of the commit's clock: far enough behind that even the
        # offset moved below does not bring it past the lease's end.
        stale = 10 * PAST_LEASE_MS
        monkeypatch.setattr(writes, "commit_clock", lambda now_ms, arrived_at: now_ms - stale)
        before_commit = t.pause_next("before_commit")
        loop.orders.put_nowait(6)
        await before_commit.wait()
        t.runtime._clock.offset_ms += PAST_LEASE_MS  # the lease ends while the owner is frozen
        ended = await lease_row(t)
        before_commit.release()
        lease_lost(await asyncio.wait_for(loop.results.get(), 30))
        seen = await t.inspect(t.get(Fenced))
        assert not seen.exists and seen.receipts == []
        assert await lease_row(t) == ended and ended["owner"] == lease.owner
