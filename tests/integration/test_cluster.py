"""The testing toolkit's cluster: ``ActorTest(..., runners=3)``, ``kill(i)`` and ``restart(i)``.

A kill is a process death simulated in-process (design §2.3, semantics §10.4 and §8): the
killed runner's connections die on the server (its open transaction rolls back), nothing is
released, settled or unregistered, and the survivors take its work over once the leases end.
Every runtime runs with ``relay=False``: each pass is the test's own (``run_pass``, ``drain``,
``advance``), so which runner claims what is decided by the test, never by a background poll.
Assertions read durable rows; ``RUNS`` counts handler runs per command id in this process.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel, Field

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: Handler runs per command id in this process (a replayed receipt runs nothing).
RUNS: Tally[str] = Tally()
#: Job executor calls as (job id, attempt).
CALLS: list[tuple[str, int]] = []
#: Singleton loop starts, by runner id.
LOOPS: list[str] = []


class Control:
    """What the test lets the job executor and the singleton loop do."""

    def __init__(self) -> None:
        self.executing = asyncio.Event()
        self.hold_first = True
        self.loop_started = asyncio.Event()


CONTROL = [Control()]


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RUNS.clear()
    CALLS.clear()
    LOOPS.clear()
    CONTROL[0] = Control()
    yield


class Book(BaseModel):
    n: int = 0
    done: list[str] = Field(default_factory=list)


class Piece(BaseModel):
    n: int


class Counter(akter.Actor[Book], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        RUNS[self.command_id] += 1
        self.state.n += k
        return self.state.n

    @akter.command
    async def peek(self, k: int) -> int:
        """A command whose turn writes its receipt and nothing else (the state is unchanged)."""
        RUNS[self.command_id] += 1
        return self.state.n + k

    @akter.command
    async def forward(self, target: str, k: int) -> None:
        self.send(Counter.add, target, k)

    @akter.command
    async def order(self, n: int) -> str:
        return self.enqueue(Counter.work, Piece(n=n))

    @akter.job(attempts=3, backoff=(0.01, 0.04), timeout=30)
    async def work(call: akter.JobCall, payload: Piece) -> int:
        CALLS.append((call.job_id, call.attempt))
        control = CONTROL[0]
        if control.hold_first:
            control.executing.set()
            await asyncio.Event().wait()  # until the runner dies
        return payload.n * 10

    @work.on_success
    async def worked(self, result: int) -> None:
        RUNS[self.command_id] += 1
        self.state.n += result
        self.state.done.append(self.command_id)


class Keeper(akter.Actor[Book], singleton=True):
    @akter.command
    async def noop(self) -> int:
        return self.state.n

    async def run(self) -> None:
        LOOPS.append(self.runtime._runners.runner_id)
        CONTROL[0].loop_started.set()
        await asyncio.Event().wait()


# --- helpers ----------------------------------------------------------------------------------


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def receipts(t: ActorTest, command_id: str) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT actor_id, command, outcome FROM {schema}.receipts WHERE command_id = %(id)s",
        {"id": command_id},
    )


async def runner_rows(t: ActorTest) -> dict[str, dict[str, Any]]:
    rows = await t.rows(
        "SELECT runner_id::text AS runner_id, heartbeat_at_ms, draining FROM {schema}.runners"
    )
    return {r["runner_id"]: r for r in rows}


def session_name(runtime: akter.Runtime) -> str:
    """The application_name the harness gave the runtime's connections."""
    return str(psycopg.conninfo.conninfo_to_dict(runtime.database_url)["application_name"])


async def sessions(t: ActorTest, name: str) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT pid, state FROM pg_stat_activity WHERE application_name = %(name)s",
        {"name": name},
    )


def past(ms: int) -> timedelta:
    """A little more than ``ms`` milliseconds."""
    return timedelta(milliseconds=ms + 1000)


# --- the cluster --------------------------------------------------------------------------------


async def test_cluster_runners_share_the_schema_and_the_clock(akter_test: Make) -> None:
    async with akter_test([Counter], relay=False) as t:
        runtimes = await t.cluster(runners=3)
        assert runtimes is t.runtimes and len(runtimes) == 3
        assert len({rt._runners.runner_id for rt in runtimes}) == 3
        assert {rt.schema for rt in runtimes} == {t.schema}
        await t.advance(timedelta(hours=1))
        assert {rt._clock.offset_ms for rt in runtimes} == {3_600_000}
        assert await t.get(Counter, "c", runner=2).add(2) == 2
        assert await t.get(Counter, "c", runner=1).add(3) == 5
        assert (await t.inspect(t.get(Counter, "c"))).version == 2
        live = await t.runtimes[0]._runners.live()
        assert {r.runner_id for r in live} == {rt._runners.runner_id for rt in runtimes}


def test_runners_is_validated() -> None:
    with pytest.raises(ValueError, match="runners"):
        ActorTest([Counter], database_url="postgresql://nowhere", runners=0)


# --- kill mid-turn ----------------------------------------------------------------------------


async def test_kill_mid_turn_commits_nothing_and_the_retry_elsewhere_runs_once(
    akter_test: Make,
) -> None:
    async with akter_test([Counter], runners=3, relay=False) as t:
        name = session_name(t.runtimes[1])
        held = t.pause_next("before_commit", runtime=1)
        call = asyncio.create_task(t.get(Counter, "c1", runner=1).add(5))
        await held.wait()
        # The turn's transaction is open on runner 1 (it holds the actor's row lock).
        assert "idle in transaction" in {s["state"] for s in await sessions(t, name)}

        await t.kill(1)
        assert t.killed(1) and t.live_runtimes == [t.runtimes[0], t.runtimes[2]]
        # The server saw every connection of runner 1 die; the transaction rolled back.
        assert await sessions(t, name) == []
        with pytest.raises(akter.ActorError) as caught:
            await call
        error = caught.value
        assert error.reason == "ActorUnavailable" and error.retryable
        assert error.command_id is not None
        gone = await t.inspect(t.get(Counter, "c1"))
        assert not gone.exists and gone.receipts == []
        assert RUNS[error.command_id] == 1  # the handler ran; its turn never committed

        # The caller retries with the same id through runner 0: it commits once.
        retried = t.get(Counter, "c1", runner=0).with_command_id(error.command_id)
        assert await retried.add(5) == 5
        again = t.get(Counter, "c1", runner=2).with_command_id(error.command_id)
        assert await again.add(5) == 5  # a replay of the receipt
        done = await t.inspect(t.get(Counter, "c1"))
        assert (done.version, done.state) == (1, {"n": 5, "done": []})
        assert [r["command_id"] for r in done.receipts] == [error.command_id]
        assert RUNS[error.command_id] == 2

        # The dead runner refuses new calls; nothing of it runs any more.
        with pytest.raises(akter.ConfigurationError):
            await t.get(Counter, "c2", runner=1).add(1)
        assert not (await t.inspect(t.get(Counter, "c2"))).exists


@pytest.mark.parametrize("command", ["add", "peek"])
async def test_a_turn_that_waited_for_the_lock_sees_the_receipt_its_holder_committed(
    akter_test: Make, command: str
) -> None:
    # The receipt probe runs after the row lock is granted, in a snapshot taken then: a probe
    # in the snapshot of a statement that started before the wait would miss the receipt that
    # the lock's holder committed, and run the command twice. ``peek`` commits a receipt and
    # leaves the actor row as it was, so nothing on the row says that a receipt came.
    async with akter_test([Counter], runners=2, relay=False) as t:
        for runner in (0, 1):  # both caches warm: each turn takes the warm lock statement
            assert await t.get(Counter, "c1", runner=runner).add(1) == runner + 1
        command_id = await t.runtimes[0].mint_command_id()
        held = t.pause_next("before_commit", runtime=0)
        first = asyncio.create_task(
            getattr(t.get(Counter, "c1", runner=0).with_command_id(command_id), command)(5)
        )
        await held.wait()  # runner 0's turn holds the actor's row lock, its receipt unwritten
        second = asyncio.create_task(
            getattr(t.get(Counter, "c1", runner=1).with_command_id(command_id), command)(5)
        )
        name = session_name(t.runtimes[1])
        # On Citus the row lock waits on the worker that holds the actor's shard.
        waits = (
            "SELECT 1 FROM citus_lock_waits WHERE blocked_statement LIKE '%%FOR UPDATE%%'"
            if t.on_citus
            else "SELECT 1 FROM pg_stat_activity WHERE application_name = %(name)s"
            " AND wait_event_type = 'Lock'"
        )
        for _ in range(1000):  # until runner 1's turn waits on the row lock
            waiting = await t.rows(waits, {"name": name})
            if waiting:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("runner 1's turn never waited on the row lock")
        held.release()
        assert await first == await second == 7
        assert RUNS[command_id] == 1  # the waiter replayed the receipt; it ran nothing
        book = await t.inspect(t.get(Counter, "c1"))
        assert book.state is not None and book.state["n"] == (7 if command == "add" else 2)
        assert [r["command_id"] for r in book.receipts].count(command_id) == 1


async def test_kill_fails_queued_callers_with_a_retryable_error(akter_test: Make) -> None:
    async with akter_test([Counter], runners=2, relay=False) as t:
        held = t.pause_next("before_commit", runtime=1)
        handle = t.get(Counter, "q", runner=1)
        first = asyncio.create_task(handle.add(1))
        await held.wait()
        queued = [asyncio.create_task(handle.add(k)) for k in (2, 3)]
        await asyncio.sleep(0)  # one step each: they queue behind the held turn
        assert t.runtimes[1]._dispatcher.pending == 3
        await t.kill(1)
        results = await asyncio.gather(first, *queued, return_exceptions=True)
        for result in results:
            assert isinstance(result, akter.ActorError)
            assert result.reason == "ActorUnavailable" and result.retryable
        assert not (await t.inspect(t.get(Counter, "q"))).exists


async def test_kill_ends_a_caller_retrying_on_the_dead_runner(akter_test: Make) -> None:
    async with akter_test([Counter], runners=2, relay=False) as t:
        crashed = asyncio.Event()

        def crash(info: dict[str, Any]) -> bool:
            crashed.set()
            return True

        # The first try crashes (a retryable error): the caller backs off to retry the same id.
        t.crash_next("before_commit", crash, runtime=1)
        call = asyncio.create_task(t.get(Counter, "b", runner=1).add(1))
        await crashed.wait()
        await t.kill(1)
        # It does not retry on the dead runner until its delivery timeout: it gets the error.
        async with asyncio.timeout(10):
            with pytest.raises(akter.ActorError) as caught:
                await call
        assert caught.value.reason == "ActorUnavailable" and caught.value.retryable
        assert caught.value.command_id is not None
        retried = t.get(Counter, "b").with_command_id(caught.value.command_id)
        assert await retried.add(1) == 1


# --- kill with claimed intents ----------------------------------------------------------------


@pytest.mark.parametrize("point", ["after_claim", "before_outbox_delete"])
async def test_kill_with_a_claimed_intent_a_survivor_delivers_once(
    akter_test: Make, point: str
) -> None:
    async with akter_test([Counter], runners=3, relay=False) as t:
        await t.get(Counter, "s", runner=1).forward("r", 3)
        [staged] = await outbox(t)
        intent_id = staged["intent_id"]
        held = t.pause_next(point, runtime=1)
        assert await t.runtimes[1]._relay.run_pass() == 1
        await held.wait()
        [claimed] = await outbox(t)
        assert claimed["attempts"] == 1 and claimed["due_at_ms"] > staged["due_at_ms"]
        delivered_before = point == "before_outbox_delete"
        assert RUNS[intent_id] == int(delivered_before)

        await t.kill(1)
        # No release: the claim (its token) stays until its lease ends.
        assert await outbox(t) == [claimed]
        await t.drain()
        assert await outbox(t) == [claimed]
        assert [r["outcome"] is not None for r in await receipts(t, intent_id)] == (
            [True] if delivered_before else []
        )

        await t.advance(past(t.runtimes[0].config.claim_lease_ms))
        assert await outbox(t) == []
        receiver = await t.inspect(t.get(Counter, "r"))
        assert receiver.state == {"n": 3, "done": []} and receiver.version == 1
        assert [r["command_id"] for r in receiver.receipts] == [intent_id]
        assert RUNS[intent_id] == 1  # delivered exactly once (a redelivery replays)
        survivors = t.runtimes[0]._relay.delivered + t.runtimes[2]._relay.delivered
        assert survivors == 1


# --- kill with a running job attempt ----------------------------------------------------------


async def test_kill_with_a_running_attempt_a_survivor_takes_it_over_after_the_lease(
    akter_test: Make,
) -> None:
    async with akter_test([Counter], runners=3, relay=False, lease=3) as t:
        job_id = await t.get(Counter, "j", runner=1).order(7)
        assert await t.runtimes[1]._relay.run_pass() == 1
        await asyncio.wait_for(CONTROL[0].executing.wait(), 10)
        [running] = await outbox(t)
        assert running["running"] and running["attempts"] == 1

        await t.kill(1)
        # Not settled, not released: the attempt stays running (ambiguous) until its lease ends.
        [after] = await outbox(t)
        assert (after["running"], after["attempts"], after["due_at_ms"]) == (
            True,
            1,
            running["due_at_ms"],
        )
        await t.drain()  # a live lease is never taken over
        [still] = await outbox(t)
        assert still["attempts"] == 1 and still["running"]
        assert CALLS == [(job_id, 1)]

        CONTROL[0].hold_first = False
        await t.advance(past(3_000))
        assert CALLS == [(job_id, 1), (job_id, 2)]
        assert await outbox(t) == []
        shop = await t.inspect(t.get(Counter, "j"))
        assert shop.state == {"n": 70, "done": [job_id]}  # the success route ran once
        assert [r["command"] for r in await receipts(t, job_id)] == ["worked"]
        assert RUNS[job_id] == 1
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []


# --- kill of a singleton owner ----------------------------------------------------------------


async def test_kill_of_the_singleton_owner_hands_the_loop_over_after_the_lease(
    akter_test: Make,
) -> None:
    async with akter_test([Keeper], runners=3, relay=False) as t:
        await asyncio.wait_for(CONTROL[0].loop_started.wait(), 10)
        query = (
            "SELECT owner::text AS owner, lease_until_ms, acquired_at_ms FROM {schema}.singletons"
            " WHERE actor_type = 'Keeper'"
        )
        [held] = await t.rows(query)
        ids = [rt._runners.runner_id for rt in t.runtimes]
        owner = ids.index(held["owner"])
        assert LOOPS == [held["owner"]] and t.runtimes[owner]._runners.owns("Keeper")

        await t.kill(owner)
        # The lease is not released: it stays until it ends; nobody else runs the loop.
        assert await t.rows(query) == [held]
        assert held["lease_until_ms"] > await t.now_ms()
        await t.advance(0)
        assert not any(rt._runners.owns("Keeper") for rt in t.live_runtimes)
        assert await t.rows(query) == [held]

        CONTROL[0].loop_started.clear()
        await t.advance(past(held["lease_until_ms"] - await t.now_ms()))
        owners = [rt for rt in t.live_runtimes if rt._runners.owns("Keeper")]
        assert len(owners) == 1
        await asyncio.wait_for(CONTROL[0].loop_started.wait(), 10)
        successor = owners[0]._runners.runner_id
        assert LOOPS == [held["owner"], successor] and successor != held["owner"]
        [taken] = await t.rows(query)
        assert taken["owner"] == successor
        assert taken["acquired_at_ms"] >= held["lease_until_ms"]
        # The singleton still answers through any live runner.
        assert await t.get(Keeper, runner=(owner + 1) % 3).noop() == 0


# --- runner rows: liveness, restart -----------------------------------------------------------


async def test_a_killed_runner_row_stays_until_liveness_then_restart_registers_anew(
    akter_test: Make,
) -> None:
    async with akter_test([Counter], runners=3, relay=False) as t:
        ids = [rt._runners.runner_id for rt in t.runtimes]
        dead = ids[2]
        await t.kill(2)
        assert set(await runner_rows(t)) == set(ids)  # not unregistered
        assert (await runner_rows(t))[dead]["draining"] is False
        live = await t.runtimes[0]._runners.live()
        assert {r.runner_id for r in live} == set(ids)  # its heartbeat is still young

        await t.advance(timedelta(seconds=20))
        assert dead in {r.runner_id for r in await t.runtimes[1]._runners.live()}
        await t.advance(timedelta(seconds=16))  # 36 s since its last heartbeat
        for survivor in t.live_runtimes:
            assert [r.runner_id for r in await survivor._runners.live()] == ids[:2]
        assert dead in await runner_rows(t)  # expired, kept until pruned (1 h)

        new = await t.restart(2)
        assert t.runtimes[2] is new and not t.killed(2)
        assert new._runners.runner_id not in ids
        assert new._clock.offset_ms == t.runtimes[0]._clock.offset_ms
        assert set(await runner_rows(t)) == {*ids, new._runners.runner_id}
        live = await t.runtimes[0]._runners.live()
        assert {r.runner_id for r in live} == {ids[0], ids[1], new._runners.runner_id}
        assert await t.get(Counter, "x", runner=2).add(4) == 4


async def test_restart_of_a_live_runner_stops_it_gracefully(akter_test: Make) -> None:
    async with akter_test([Counter], runners=2, relay=False) as t:
        old = t.runtimes[1]
        new = await t.restart(1)
        assert old.readiness == "drained" and new.readiness == "ready"
        rows = await runner_rows(t)
        assert set(rows) == {t.runtimes[0]._runners.runner_id, new._runners.runner_id}


async def test_kill_and_restart_every_runner(akter_test: Make) -> None:
    async with akter_test([Counter], runners=2, relay=False) as t:
        assert await t.get(Counter, "k").add(1) == 1
        await t.kill(0)
        await t.kill(1)
        assert t.live_runtimes == []
        with pytest.raises(RuntimeError, match="killed"):
            await t.kill(0)
        await t.restart(0)
        assert await t.get(Counter, "k").add(1) == 2
        assert (await t.inspect(t.get(Counter, "k"))).version == 2
