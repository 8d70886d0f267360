"""A warm turn in one round trip, and each check of its guard (issue 45).

docs/internals/one-flight-turn.md: a warm activation runs its handlers first, on the cached state
and the runner's clock estimate, then sends ``BEGIN``, ``turn_guard``, the writes and ``COMMIT``
in one flight. Each failed check (``AK001`` … ``AK004``) aborts that flight, and the batch runs
again as the two-flight turn: the rows and the caller's answer are the two-flight turn's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from pydantic import BaseModel, Field

import akter
from akter._store.pipeline import TurnPipeline
from akter.testing import ActorTest

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

    @akter.query
    async def total(self) -> int:
        return self.state.total


@contextmanager
def counted_syncs() -> Iterator[list[int]]:
    """Count the turn pipelines' Syncs (one per round trip of a turn)."""
    count = [0]
    original = TurnPipeline.sync

    async def sync(self: TurnPipeline, meanwhile: Callable[[], None] | None = None) -> None:
        count[0] += 1
        await original(self, meanwhile)

    TurnPipeline.sync = sync  # type: ignore[method-assign]
    try:
        yield count
    finally:
        TurnPipeline.sync = original  # type: ignore[method-assign]


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


@pytest.mark.parametrize("turn_mode", ["one_flight", "two_flights"], indirect=True)
async def test_a_warm_single_command_turn_is_one_sync(akter_test: Make, turn_mode: str) -> None:
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "wire")
        with counted_syncs() as cold:
            assert await book.add(1) == 1  # a first command: cold, two flights
        with counted_syncs() as warm:
            assert await book.add(2) == 3
            assert await book.with_command_id(await t.runtime.mint_command_id()).add(3) == 6
        assert cold == [2]
        assert warm == ([2] if turn_mode == "one_flight" else [4])
        assert not fallbacks(t)
        state, receipts, events = await rows_of(t, "wire")
        assert state["total"] == 6 and len(receipts) == 3 and events == 3


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


async def test_a_retried_committed_id_replays_after_the_guard(akter_test: Make) -> None:
    # AK002: a pinned id that already has a receipt: the speculative run is discarded, the
    # fallback replays the receipt; no second effect.
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "again")
        await book.add(1)
        cid = await t.runtime.mint_command_id()
        assert await book.with_command_id(cid).add(5) == 6
        assert await book.with_command_id(cid).add(5) == 6
        assert fallbacks(t) == {"AK002": 1}
        state, receipts, events = await rows_of(t, "again")
        assert state["total"] == 6 and state["applied"].count(cid) == 1  # type: ignore[attr-defined]
        assert len(receipts) == 2 and events == 2
        replays = t.runtime._engine.metrics.value(
            "akter.turns", actor_type="Book", outcome="replay"
        )
        assert replays == 1


async def test_an_id_expired_on_the_database_clock_is_refused_after_the_guard(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # AK003: the database clock stepped past the id's expiry and the runner's estimate has not
    # seen it yet: the guard refuses, and the two-flight turn answers "expired", writing nothing.
    async with akter_test([Book], relay=False, retry_window=60) as t:
        book = t.get(Book, "expired")
        await book.add(1)
        cid = await t.runtime.mint_command_id()
        await t.advance(61)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        monkeypatch.setattr(clock, "estimate", lambda: estimate() - 61_000)
        with pytest.raises(akter.ActorError) as raised:
            await book.with_command_id(cid).add(5)
        monkeypatch.undo()
        assert raised.value.reason == "CommandExpired"
        assert fallbacks(t) == {"AK003": 1}
        state, receipts, events = await rows_of(t, "expired")
        assert state["total"] == 1 and len(receipts) == 1 and events == 1


@pytest.mark.parametrize("step_ms", [-5_000, 5_000], ids=["forward", "back"])
async def test_a_clock_step_makes_the_guard_fall_back(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch, step_ms: int
) -> None:
    # AK004: the estimate is behind the database clock by more than the bound (the clock stepped
    # forward unseen) or ahead of it (stepped back): the handler's now is not the commit's.
    async with akter_test([Book], relay=False) as t:
        book = t.get(Book, "step")
        await book.add(1)
        clock = t.runtime._engine.clock
        estimate = clock.estimate
        # Minted on the lower of the two clocks, as a runner's own minted id would be.
        cid = None if step_ms < 0 else await t.runtime.mint_command_id()
        monkeypatch.setattr(clock, "estimate", lambda: estimate() + step_ms)
        cid = cid or await t.runtime.mint_command_id()
        assert await book.with_command_id(cid).add(2) == 3
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


async def test_an_id_near_its_expiry_takes_two_flights(akter_test: Make) -> None:
    # An id that expires within the bound of the estimate is decided on the database clock.
    async with akter_test([Book], relay=False, retry_window=2) as t:
        book = t.get(Book, "near")
        await book.add(1)
        cid = await t.runtime.mint_command_id()
        assert await book.with_command_id(cid).add(1) == 2
        assert fallbacks(t) == {"estimate": 1}
