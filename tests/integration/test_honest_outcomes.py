"""Hardening 8 (command ids from the future) and 9 (honest timeouts), on real PostgreSQL.

A pinned command id further ahead of the database clock than a clock estimate can be is refused
as ``InvalidCommandId/future`` with its ``retry_after``, at once, not retried into a ``Timeout``;
one slightly ahead (estimate jitter) is waited for. A failure says "may or may not have
committed" (code ``outcome_unknown``) only when the commit flight was sent and not answered; a
failure before it (lock wait, handler, admission) says "it was not committed", and so does a
delivery timeout none of whose attempts left its outcome unknown (with nothing in flight).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest, Pause
from tests._support.polling import until

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Count(BaseModel):
    n: int = 0


class Tally(akter.Actor[Count], access=akter.public, lock_wait=0.1, delivery_timeout=1):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


class Slow(akter.Actor[Count], access=akter.public, execution_timeout=0.2, delivery_timeout=1):
    @akter.command
    async def add(self, k: int) -> int:
        await asyncio.sleep(5)  # outlives the execution timeout: the turn never commits
        self.state.n += k
        return self.state.n


class Hasty(akter.Actor[Count], access=akter.public, delivery_timeout=0.1):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


async def receipts(t: ActorTest, command_id: str) -> list[str]:
    rows = await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
    return [str(r["command"]) for r in rows]


def future_id(now_ms: int, ahead_ms: int, window_ms: int) -> str:
    issued = now_ms + ahead_ms
    return f"v1.{issued}.{issued + window_ms}.{uuid.uuid4()}"


# --- 8: a pinned id from the future ---------------------------------------------------------


async def test_h8_a_pinned_id_far_in_the_future_is_refused_as_future_not_a_timeout(
    akter_test: Make,
) -> None:
    async with akter_test([Tally]) as t:
        cid = future_id(await t.now_ms(), 600_000, t.runtime.config.window_ms)
        started = time.monotonic()
        with pytest.raises(akter.ActorError) as raised:
            await t.get(Tally, "a").with_command_id(cid).add(1)
        assert time.monotonic() - started < 1  # at once, not after the delivery timeout
        error = raised.value
        assert (error.reason, error.code, error.retryable) == ("InvalidCommandId", "future", True)
        assert error.command_id == cid
        assert error.retry_after is not None and 590 <= error.retry_after <= 600
        assert await receipts(t, cid) == []
        assert not (await t.inspect(t.get(Tally, "a"))).exists  # every row as it was


async def test_h8_a_pinned_id_slightly_ahead_is_waited_for_and_commits(akter_test: Make) -> None:
    async with akter_test([Tally]) as t:
        cid = future_id(await t.now_ms(), 300, t.runtime.config.window_ms)  # clock-estimate jitter
        assert await t.get(Tally, "a").with_command_id(cid).add(2) == 2
        assert await receipts(t, cid) == ["add"]


# --- 9: honest outcomes ---------------------------------------------------------------------


async def test_h9_a_turn_refused_at_the_lock_says_it_was_not_committed(akter_test: Make) -> None:
    async with akter_test([Tally]) as t:
        assert await t.get(Tally, "a").add(1) == 1
        async with await psycopg.AsyncConnection.connect(t.database_url) as holder:
            # A side transaction holds the actor row: every attempt times out at lock_wait.
            await holder.execute(
                t.substitute(
                    "SELECT 1 FROM {schema}.actors WHERE routing_key = %(rk)s"
                    " AND actor_id = 'a' FOR UPDATE"
                ),
                {"rk": t.runtime.routing_key(t.get(Tally, "a").ref)},
            )
            cid = await t.runtime.mint_command_id()
            with pytest.raises(akter.ActorError) as once:
                await t.runtime.call(Tally, "a", "add", {"k": 5}, command_id=cid, retry=False)
            assert once.value.reason == "ActorUnavailable" and once.value.code is None
            assert "it was not committed" in once.value.message
            assert "may" not in once.value.message
            await holder.rollback()
        assert await receipts(t, cid) == []
        assert (await t.inspect(t.get(Tally, "a"))).state == {"n": 1}


async def test_h9_a_delivery_timeout_after_refusals_says_it_was_not_committed(
    akter_test: Make,
) -> None:
    async with akter_test([Tally]) as t:
        # Every attempt is refused before admission (the runner drains): nothing is ever in
        # flight, so the handle's Timeout must not say the command may still commit.
        t.runtime._dispatcher.accepting = False
        cid = await t.runtime.mint_command_id()
        with pytest.raises(akter.ActorError) as retried:
            await t.get(Tally, "a").with_command_id(cid).add(5)
        t.runtime._dispatcher.accepting = True
        assert retried.value.reason == "Timeout" and retried.value.code is None
        assert "last error: ActorUnavailable" in retried.value.message
        assert "it was not committed" in retried.value.message
        assert "may" not in retried.value.message
        assert await receipts(t, cid) == []
        assert await t.get(Tally, "a").with_command_id(cid).add(5) == 5  # the retry commits


async def test_h9_a_handler_that_outlives_the_execution_timeout_was_not_committed(
    akter_test: Make,
) -> None:
    async with akter_test([Slow]) as t:
        cid = await t.runtime.mint_command_id()
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Slow, "s", "add", {"k": 1}, command_id=cid, retry=False)
        assert raised.value.reason == "ActorUnavailable" and raised.value.code is None
        assert "execution timeout" in raised.value.message
        assert "it was not committed" in raised.value.message
        assert await receipts(t, cid) == []


async def test_h9_an_unanswered_commit_says_it_may_have_committed(akter_test: Make) -> None:
    async with akter_test([Tally, Hasty]) as t:
        cid = await t.runtime.mint_command_id()
        t.crash_next("after_commit")  # the commit lands; its answer is lost with the "process"
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Tally, "a", "add", {"k": 3}, command_id=cid, retry=False)
        assert raised.value.reason == "ActorUnavailable"
        assert raised.value.code == "outcome_unknown"
        assert "may or may not have committed" in raised.value.message
        assert await receipts(t, cid) == ["add"]
        # Through the handle, with no time left to retry: a Timeout that says the same.
        other = await t.runtime.mint_command_id()
        t.crash_next("after_commit")
        with pytest.raises(akter.ActorError) as timed_out:
            await t.get(Hasty, "h").with_command_id(other).add(3)
        assert timed_out.value.reason == "Timeout"
        assert timed_out.value.code == "outcome_unknown"
        assert "may" in timed_out.value.message and "not committed" not in timed_out.value.message
        assert await receipts(t, other) == ["add"]


async def held_before_commit(t: ActorTest, k: int) -> tuple[str, Pause, asyncio.Task[int]]:
    """A call of ``Tally/a.add(k)`` whose turn is held just before its commit."""
    cid = await t.runtime.mint_command_id()
    held = t.pause_next("before_commit")
    call = asyncio.create_task(t.get(Tally, "a").with_command_id(cid).add(k))
    await held.wait()
    return cid, held, call


async def released_and_committed(t: ActorTest, cid: str, held: Pause) -> None:
    held.release()

    async def committed() -> bool:
        return await receipts(t, cid) == ["add"]

    await until(committed)


async def test_h9_a_turn_still_running_at_the_delivery_deadline_may_commit_and_does(
    akter_test: Make,
) -> None:
    # The caller's wait ends at the delivery deadline (1 s); the admitted turn is not cancelled
    # by it: it commits once released, and a retry with the same id replays its receipt.
    async with akter_test([Tally]) as t:
        cid, held, call = await held_before_commit(t, 4)
        with pytest.raises(akter.ActorError) as timed_out:
            await call
        assert timed_out.value.reason == "Timeout"
        assert timed_out.value.code == "outcome_unknown"
        assert timed_out.value.command_id == cid
        assert "did not complete within the delivery timeout" in timed_out.value.message
        assert await receipts(t, cid) == []  # still held before its commit
        await released_and_committed(t, cid, held)
        assert await t.get(Tally, "a").with_command_id(cid).add(4) == 4  # the replay
        assert (await t.inspect(t.get(Tally, "a"))).state == {"n": 4}


async def test_h9_a_cancelled_caller_gets_its_cancellation_and_the_turn_still_commits(
    akter_test: Make,
) -> None:
    async with akter_test([Tally]) as t:
        cid, held, call = await held_before_commit(t, 2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await released_and_committed(t, cid, held)
        assert (await t.inspect(t.get(Tally, "a"))).state == {"n": 2}
        # Nothing of the cancelled wait is left behind: the next call runs normally.
        assert await t.get(Tally, "a").add(1) == 3
