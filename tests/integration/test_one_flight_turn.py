"""A warm turn in one round trip, and each check of its guard (issue 45).

docs/internals/one-flight-turn.md: a warm activation runs its handlers first, on the cached state
and the runner's clock estimate, then sends ``BEGIN``, ``turn_guard``, the writes and ``COMMIT``
in one flight. Each failed check (``AK001`` … ``AK004``) aborts that flight, and the batch runs
again as the two-flight turn: the rows and the caller's answer are the two-flight turn's.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from pydantic import BaseModel, Field

import akter
from akter._engine.turn.types import Activation
from akter._store.pipeline import Answer, Segment, TurnPipeline
from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS

Make = Callable[..., ActorTest]

#: Handler runs per actor id, in memory (a speculative run that fell back counts too).
RUNS: collections.Counter[str] = collections.Counter()


class Ledger(BaseModel):
    total: int = 0
    applied: list[str] = Field(default_factory=list)


class Added(akter.Event, tag="oneflight.Added"):
    k: int
    total: int


class Book(akter.Actor[Ledger], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        RUNS[self.id] += 1
        self.state.total += k
        self.state.applied.append(self.command_id)
        self.emit(Added(k=k, total=self.state.total))
        return self.state.total

    @akter.command
    async def pass_on(self, to: str, k: int) -> None:
        self.send(Book.add, to, k)

    @akter.query
    async def total(self) -> int:
        return self.state.total


#: A warm turn takes one flight on plain PostgreSQL only (Citus keeps two: the guard is never sent).
plain_only = pytest.mark.skipif(ON_CITUS, reason="one flight on plain PostgreSQL only")


def one_flight_here(turn_mode: str) -> bool:
    """Whether the warm turn takes one flight in this mode on this server."""
    return turn_mode != "two_flights" and not ON_CITUS


@contextmanager
def counted_syncs() -> Iterator[list[int]]:
    """Count the turn pipelines' Syncs (one per round trip of a turn).

    A turn's segment in a shared write (``turn.shared``) is its round trip: it counts as one.
    """
    count = [0]
    original, queue = TurnPipeline.sync, TurnPipeline.queue

    async def sync(self: TurnPipeline, meanwhile: Callable[[], None] | None = None) -> None:
        count[0] += 1
        await original(self, meanwhile)

    def queued(self: TurnPipeline, segment: Segment) -> None:
        count[0] += 1
        queue(self, segment)

    TurnPipeline.sync = sync  # type: ignore[method-assign]
    TurnPipeline.queue = queued  # type: ignore[method-assign]
    try:
        yield count
    finally:
        TurnPipeline.sync = original  # type: ignore[method-assign]
        TurnPipeline.queue = queue  # type: ignore[method-assign]


def fallbacks(t: ActorTest, runner: int = 0) -> collections.Counter[str]:
    return t.runtimes[runner]._engine.fallbacks


async def rows_of(t: ActorTest, actor: str) -> tuple[dict[str, object], list[str], int]:
    (row,) = await t.rows(
        "SELECT state, version FROM {schema}.actors WHERE actor_id = %(id)s", {"id": actor}
    )
    receipts = await t.rows(
        "SELECT command_id FROM {schema}.receipts WHERE actor_id = %(id)s", {"id": actor}
    )
    (events,) = await t.rows(
        "SELECT count(*) AS n FROM {schema}.events WHERE actor_id = %(id)s", {"id": actor}
    )
    state = row["state"]
    assert isinstance(state, dict)
    return state, sorted(str(r["command_id"]) for r in receipts), int(events["n"])


@pytest.mark.parametrize("turn_mode", ["shared", "one_flight", "two_flights"], indirect=True)
async def test_a_warm_single_command_turn_is_one_sync(akter_test: Make, turn_mode: str) -> None:
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "wire")
        with counted_syncs() as cold:
            assert await book.add(1) == 1  # a first command: cold, two flights
        with counted_syncs() as warm:
            assert await book.add(2) == 3
        with counted_syncs() as pinned:  # an id that may have a receipt: probed, two flights
            assert await book.with_command_id(await t.runtime.mint_command_id()).add(3) == 6
        assert cold == [2] and pinned == [2]
        assert warm == ([1] if one_flight_here(turn_mode) else [2])
        assert not fallbacks(t)
        state, receipts, events = await rows_of(t, "wire")
        assert state["total"] == 6 and len(receipts) == 3 and events == 3


@plain_only
async def test_another_runners_commit_makes_the_guard_fall_back(akter_test: Make) -> None:
    # AK001: runner 0's cache is at version 1; runner 1 commits version 2; runner 0's warm turn
    # ran on version 1, its guard refuses, and the two-flight turn runs on version 2.
    async with akter_test([Book], relay=False, runners=2) as t:
        RUNS.clear()
        assert await t.get(Book, "moved").add(1) == 1
        assert await t.get(Book, "moved", runner=1).add(10) == 11
        with counted_syncs() as syncs:
            assert await t.get(Book, "moved").add(100) == 111
        assert fallbacks(t) == {"AK001": 1}
        assert syncs == [1 + 1 + 2]  # the guarded flight, its rollback, then two flights
        assert RUNS["moved"] == 4  # 1 + 1 + the speculative run and its re-run
        state, receipts, events = await rows_of(t, "moved")
        assert state["total"] == 111 and len(state["applied"]) == 3  # type: ignore[arg-type]
        assert len(receipts) == 3 and events == 3
        # The fallback's admission refreshed the cache: the next turn is warm again.
        assert await t.get(Book, "moved").add(1000) == 1111
        assert fallbacks(t) == {"AK001": 1}


async def test_a_retried_committed_id_replays_without_running_its_handler(
    akter_test: Make,
) -> None:
    # A pinned id may have a receipt: its turn takes two flights and replays, and the handler
    # does not run, not even speculatively (tests/integration/test_cluster.py, test_relay.py).
    async with akter_test([Book], relay=False) as t:
        RUNS.clear()
        book = t.get(Book, "again")
        await book.add(1)
        cid = await t.runtime.mint_command_id()
        assert await book.with_command_id(cid).add(5) == 6
        with counted_syncs() as syncs:
            assert await book.with_command_id(cid).add(5) == 6
        assert syncs == [2] and RUNS["again"] == 2 and not fallbacks(t)
        state, receipts, events = await rows_of(t, "again")
        assert state["total"] == 6 and state["applied"].count(cid) == 1  # type: ignore[attr-defined]
        assert len(receipts) == 2 and events == 2


async def test_the_guard_refuses_an_id_with_a_receipt(akter_test: Make) -> None:
    # AK002, as a defence (the engine gives the guard no id that may have a receipt): called
    # with a committed id, the guard aborts its transaction; with a fresh one it passes.
    async with akter_test([Book], relay=False) as t:
        if t.on_citus:
            pytest.skip("Citus turns keep two flights")
        book = t.get(Book, "receipted")
        cid = await t.runtime.mint_command_id()
        await book.with_command_id(cid).add(1)
        (row,) = await t.rows(
            "SELECT routing_key, tenant_id, actor_type, version FROM {schema}.actors"
            " WHERE actor_id = 'receipted'"
        )
        call = (
            "SELECT {schema}.turn_guard(%(rk)s, %(tenant)s, %(type)s, 'receipted', %(v)s,"
            " %(ids)s, ARRAY[]::bigint[], {schema}.now_ms(0), 2000, 0, '1s', '5s',"
            " 'idle_in_transaction_session_timeout', '6s', NULL) AS now_ms"
        )
        params = {
            "rk": row["routing_key"],
            "tenant": row["tenant_id"],
            "type": row["actor_type"],
            "v": row["version"],
        }
        with pytest.raises(psycopg.Error) as raised:
            await t.rows(call, {**params, "ids": [cid]})
        assert raised.value.sqlstate == "AK002"
        with pytest.raises(psycopg.Error) as stale:
            await t.rows(call, {**params, "ids": [], "v": row["version"] - 1})
        assert stale.value.sqlstate == "AK001"
        (passed,) = await t.rows(call, {**params, "ids": ["never-used"]})
        assert passed["now_ms"] > 0


@plain_only
async def test_an_id_expired_on_the_database_clock_is_refused_after_the_guard(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # AK003: the database clock stepped forward past the id's expiry, unseen by the runner's
    # estimate (which minted the id): the guard refuses, and the two-flight turn answers
    # CommandExpired, writing nothing.
    async with akter_test([Book], relay=False, retry_window=60) as t:
        book = t.get(Book, "expired")
        await book.add(1)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        monkeypatch.setattr(clock, "estimate", lambda: estimate() - 61_000)
        with pytest.raises(akter.ActorError) as raised:
            await book.add(5)
        monkeypatch.undo()
        assert raised.value.reason == "CommandExpired"
        assert fallbacks(t) == {"AK003": 1}
        state, receipts, events = await rows_of(t, "expired")
        assert state["total"] == 1 and len(receipts) == 1 and events == 1


@plain_only
@pytest.mark.parametrize("step_ms", [-5_000, 300], ids=["forward", "back"])
async def test_a_clock_step_makes_the_guard_fall_back(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch, step_ms: int
) -> None:
    # AK004: the estimate is behind the database clock by more than the bound (the clock stepped
    # forward unseen) or ahead of it (stepped back): the handler's now is not the commit's. The
    # handle mints its id on the estimate: after a step back it is issued in the database's
    # future, and the two-flight turn answers "future" until the clock reaches it (the handle
    # retries), as it always did.
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "step")
        await book.add(1)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        monkeypatch.setattr(clock, "estimate", lambda: estimate() + step_ms)
        assert await book.add(2) == 3
        monkeypatch.undo()
        assert fallbacks(t) == {"AK004": 1}
        (row,) = await t.rows(
            "SELECT updated_at_ms, {schema}.now_ms(0) AS now FROM {schema}.actors"
            " WHERE actor_id = 'step'"
        )
        # Stamped with the admission's clock, not the stepped estimate.
        assert 0 <= row["now"] - row["updated_at_ms"] < 2_000
        state, receipts, events = await rows_of(t, "step")
        assert state["total"] == 3 and len(receipts) == 2 and events == 2


@plain_only
async def test_an_id_near_its_expiry_takes_two_flights(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An id that expires within the bound of the estimate is decided on the database clock.
    async with akter_test([Book], relay=False, retry_window=60) as t:
        book = t.get(Book, "near")
        await book.add(1)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        # The handle mints the id 59 s back: it expires within a second of the estimate.
        minted = iter([estimate() - 59_000])
        monkeypatch.setattr(clock, "estimate", lambda: next(minted, None) or estimate())
        assert await book.add(1) == 2
        monkeypatch.undo()
        assert fallbacks(t) == {"estimate": 1}


@plain_only
async def test_an_id_issued_just_after_the_estimate_lifts_the_handlers_now(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under load a turn's answer read late anchors its clock reading late, and the estimate
    # moves back a little: an id minted just before, on the higher estimate, is issued "after"
    # it. The issue time was a lower bound of the database clock too, so the handlers' now is
    # lifted to it and the turn stays one flight (it used to fall back as "estimate").
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "lifted")
        await book.add(1)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        minted = iter([estimate()])  # the handle mints its id on the first reading
        monkeypatch.setattr(clock, "estimate", lambda: next(minted, None) or estimate() - 50)
        with counted_syncs() as syncs:
            assert await book.add(2) == 3
        monkeypatch.undo()
        assert not fallbacks(t)
        assert syncs == [1]
        state, receipts, events = await rows_of(t, "lifted")
        assert state["total"] == 3 and len(receipts) == 2 and events == 2


# --- relay deliveries -------------------------------------------------------------------------


async def intents(t: ActorTest) -> list[dict[str, object]]:
    return await t.rows("SELECT * FROM {schema}.outbox WHERE kind = 'intent'")


@pytest.mark.parametrize("turn_mode", ["shared", "one_flight", "two_flights"], indirect=True)
async def test_a_first_delivery_to_a_warm_actor_is_one_sync(
    akter_test: Make, turn_mode: str
) -> None:
    # The relay's first attempt at an intent a turn wrote: no earlier attempt, so its turn may
    # take the one flight (Request.first_delivery), its id probed by the guard.
    async with akter_test([Book], relay=False) as t:
        RUNS.clear()
        await t.get(Book, "dst").add(1)  # cold: the activation is cached from here on
        await t.get(Book, "src").pass_on("dst", 2)
        [row] = await intents(t)
        with counted_syncs() as syncs:
            assert await t.runtime._relay.run_pass() == 1
            await t.runtime._relay.wait_idle()
        assert syncs == ([1] if one_flight_here(turn_mode) else [2])
        assert not fallbacks(t) and await intents(t) == []
        state, receipts, events = await rows_of(t, "dst")
        assert state == {"total": 3, "applied": [state["applied"][0], row["intent_id"]]}  # type: ignore[index]
        assert row["intent_id"] in receipts and events == 2 and RUNS["dst"] == 2


@plain_only
async def test_a_first_delivery_its_redelivery_raced_replays(akter_test: Make) -> None:
    # Runner 0 claims the intent (attempt 1) and stalls before delivering it; its lease runs
    # out, runner 1 claims it again (attempt 2: two flights) and commits it. When runner 0's
    # first delivery goes on, on a cache that is current again, its guard finds the receipt
    # (AK002): the speculative run is discarded and the fallback replays the stored outcome.
    async with akter_test([Book], relay=False, runners=2) as t:
        RUNS.clear()
        dst = t.get(Book, "raced")
        await dst.add(1)
        await t.get(Book, "src").pass_on("raced", 2)
        [row] = await intents(t)
        held = t.pause_next("after_claim")
        assert await t.runtimes[0]._relay.run_pass() == 1
        await held.wait()
        await t.rows(  # the claim's lease ran out (named by its routing key, as on Citus)
            "UPDATE {schema}.outbox SET due_at_ms = 0"
            " WHERE routing_key = %(rk)s AND intent_id = %(id)s",
            {"rk": row["routing_key"], "id": row["intent_id"]},
        )
        assert await t.runtimes[1]._relay.run_pass() == 1
        await t.runtimes[1]._relay.wait_idle()
        assert await intents(t) == []
        assert await dst.add(10) == 13  # runner 0 falls back (AK001): its cache is current again
        assert fallbacks(t) == {"AK001": 1}
        held.release()
        await t.runtimes[0]._relay.wait_idle()
        assert fallbacks(t) == {"AK001": 1, "AK002": 1}
        # The delivery's effects once: 1 + 2 + 10, its id applied and receipted once.
        state, receipts, events = await rows_of(t, "raced")
        applied = state["applied"]
        assert state["total"] == 13 and isinstance(applied, list)
        assert applied.count(row["intent_id"]) == 1 and receipts.count(str(row["intent_id"])) == 1
        assert len(receipts) == 3 and events == 3
        # Handler runs: add(1); the redelivery; add(10) speculative and again; runner 0's
        # speculative first delivery, discarded (the replay runs no handler).
        assert RUNS["raced"] == 5


async def warm_and_idle(t: ActorTest, actor: str) -> Activation:
    """``Book`` ``actor``'s activation after one turn, its mailbox worker ended.

    Its connection went back: its next turn is warm and finds no connection kept.
    """
    assert await t.get(Book, actor).add(1) == 1
    [box] = [b for k, b in t.runtime._dispatcher._boxes.items() if k[2] == actor]
    if box.worker is not None:
        await asyncio.wait_for(box.worker, 5)
    return box.activation


@plain_only
async def test_a_sequential_caller_keeps_the_connection_its_lone_shared_write_took(
    akter_test: Make,
) -> None:
    # The runtime's defaults. The mailbox gave its connection back (its worker ended); the next
    # warm turn finds the shared writer idle and writes alone, on a connection checked out for
    # it. The mailbox keeps that one (docs/internals/shared-flights.md), so the caller's next
    # turns skip the pool, as after a turn on a connection of its own.
    async with akter_test([Book], relay=False) as t:
        counter = t.get(Book, "again")
        act = await warm_and_idle(t, "again")
        assert act.held is None
        pool = t.runtime._dispatcher.engine.store.pool
        before = pool.get_stats().get("requests_num", 0)
        for k in range(2, 12):
            assert await counter.add(1) == k
        assert pool.get_stats().get("requests_num", 0) == before + 1
        assert act.held is not None
        writes = t.runtime.metrics.histogram("akter.turn.shared_write")
        assert writes.count == 1  # the first; the others ran on the kept connection


@plain_only
async def test_a_lone_shared_write_whose_parameter_cannot_be_dumped_gives_its_connection_back(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runtime's defaults: a warm turn on a mailbox that kept no connection is written alone
    # by the shared writer. Its segment holds a parameter the driver cannot dump: the turn fails
    # as not committed, the connection goes back to the pool (not to the mailbox: the turn did
    # not commit), and the retry with the same id commits once.
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "lone-dump")
        act = await warm_and_idle(t, "lone-dump")
        pool = t.runtime._dispatcher.engine.store.pool
        handed_out = pool.handed_out
        queue = TurnPipeline.queue

        def poisoned(self: TurnPipeline, segment: Segment) -> None:
            segment.recorded.insert(2, (Answer(None), "SELECT %(x)s", {"x": object()}, False))
            monkeypatch.setattr(TurnPipeline, "queue", queue)
            queue(self, segment)

        monkeypatch.setattr(TurnPipeline, "queue", poisoned)
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Book, "lone-dump", "add", {"k": 10}, retry=False)
        error = raised.value
        assert (error.reason, error.code) == ("ActorUnavailable", None), error
        assert act.held is None
        await until(lambda: pool.handed_out == handed_out, what="the connection back in the pool")
        assert error.command_id is not None
        assert await book.with_command_id(error.command_id).add(10) == 11
        state, receipts, events = await rows_of(t, "lone-dump")
        assert state["total"] == 11 and len(receipts) == events == 2
