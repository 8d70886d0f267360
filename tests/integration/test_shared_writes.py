"""Several actors' warm turns in one write (issue 45; docs/internals/shared-flights.md).

Each test holds the writer at ``before_shared_write`` so that the turns behind it queue, then
releases it: the next write carries them together, in the order they queued. What is checked
is the design page's rules: each turn stays its own transaction (a failed guard in the middle
of a write leaves its neighbours committed; the turn after it, which met the failed
transaction, is sent again), a crash before the write sends nothing, and every acknowledged
call matches the rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import akter
from akter._engine.turn.engine import TurnEngine
from akter._engine.turn.shared import SharedWriter, _Waiting
from akter._store.pipeline import Answer, TurnPipeline
from akter._store.pool import Connection
from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS
from tests._support.shared_line import Line
from tests.integration.actors import Counter, Tally

pytestmark = [
    pytest.mark.timeout(60),
    # Citus turns keep two flights (the lock and the receipts are two statements there).
    pytest.mark.skipif(ON_CITUS, reason="warm turns share writes on plain PostgreSQL only"),
]

Make = Callable[..., ActorTest]


@pytest.fixture(autouse=True)
def no_kept_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every warm turn shares writes (no mailbox keeps a connection of its own)."""
    monkeypatch.setattr(TurnEngine, "shared_writes", True)
    monkeypatch.setattr(TurnEngine, "hold_connections", False)


@contextmanager
def recorded_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The actor ids of each shared write, in the order the write carried them."""
    writes: list[list[str]] = []
    read = SharedWriter._read

    async def recording(self: SharedWriter, pipe: TurnPipeline, sent: list[_Waiting]) -> bool:
        writes.append([w.ref.id for w in sent])
        return await read(self, pipe, sent)

    monkeypatch.setattr(SharedWriter, "_read", recording)
    yield writes


async def warm(t: ActorTest, ids: list[str]) -> None:
    """One turn each (the cold one): their next turns are warm."""
    for actor in ids:
        assert await t.get(Counter, actor).add(1) == 1


async def moved_in_line(t: ActorTest, prefix: str, *, moved: str) -> Line:
    """Runner 0 with one write at a time and its line observed, and four warm actors.

    ``prefix``'s hold, a, b and c; ``moved``'s row moved on by runner 1 (runner 0's guard for
    it fails).
    """
    t.runtime._engine.shared.connections = 1
    line = Line.of(t.runtime._engine)
    await warm(t, [f"{prefix}-{name}" for name in ("hold", "a", "b", "c")])
    assert await t.get(Counter, f"{prefix}-{moved}", runner=1).add(100) == 101
    return line


async def behind_a_held_write(
    t: ActorTest, line: Line, hold: str, calls: list[Callable[[], Awaitable[Any]]]
) -> list[Any]:
    """``hold``'s turn holds the writer while ``calls`` queue behind it, in order; released.

    The outcomes (an exception is returned, not raised) of ``hold``'s turn and each call.
    """
    held = t.pause_next("before_shared_write")
    first = asyncio.create_task(t.get(Counter, hold).add(1))
    await held.wait()
    tasks = []
    for n, call in enumerate(calls, start=1):
        tasks.append(asyncio.ensure_future(call()))
        await line.reach(n)  # in this order
    held.release()
    return await asyncio.gather(first, *tasks, return_exceptions=True)


async def test_turns_behind_a_busy_writer_share_its_next_write(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with akter_test([Counter], relay=False) as t:
        t.runtime._engine.shared.connections = 1
        line = Line.of(t.runtime._engine)
        ids = [f"share-{i}" for i in range(5)]
        await warm(t, ids)
        with recorded_writes(monkeypatch) as writes:
            held = t.pause_next("before_shared_write")
            first = asyncio.create_task(t.get(Counter, ids[0]).add(10))
            await held.wait()
            rest = [asyncio.create_task(t.get(Counter, i).add(10)) for i in ids[1:]]
            await line.reach(4)
            held.release()
            assert await asyncio.gather(first, *rest) == [11] * 5
        assert writes == [ids[:1], ids[1:]]
        for actor in ids:
            rows = await t.inspect(t.get(Counter, actor))
            assert rows.state is not None and rows.state["n"] == 11
            assert len(rows.receipts) == 2
        size = t.runtime.metrics.histogram("akter.turn.shared_write")
        assert (size.count, size.sum) == (2, 5)


async def test_a_failed_guard_in_the_middle_of_a_write_leaves_its_neighbours_committed(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # b's row moved on another runner: its guard fails (AK001) in the middle of the write. a
    # commits; c met the failed transaction b left (25P02 at its BEGIN, nothing of it ran) and
    # is sent again, alone; b runs again in two flights on the moved row.
    async with akter_test([Counter], relay=False, runners=2) as t:
        engine = t.runtime._engine
        line = await moved_in_line(t, "mid", moved="b")
        with recorded_writes(monkeypatch) as writes:
            outcomes = await behind_a_held_write(
                t,
                line,
                "mid-hold",
                [
                    lambda: t.get(Counter, "mid-a").add(10),
                    lambda: t.get(Counter, "mid-b").add(10),
                    lambda: t.get(Counter, "mid-c").add(10),
                ],
            )
            assert outcomes == [2, 11, 111, 11]
        assert writes == [["mid-hold"], ["mid-a", "mid-b", "mid-c"], ["mid-c"]]
        assert engine.fallbacks == {"AK001": 1}
        for actor, n, turns in [("mid-a", 11, 2), ("mid-b", 111, 3), ("mid-c", 11, 2)]:
            rows = await t.inspect(t.get(Counter, actor))
            assert rows.state is not None and rows.state["n"] == n
            assert len(rows.state["applied"]) == len(rows.receipts) == turns


async def test_a_crash_before_the_write_sends_nothing_and_the_retries_commit_once(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with akter_test([Counter], relay=False) as t:
        t.runtime._engine.shared.connections = 1
        ids = ["crash-a", "crash-b"]
        await warm(t, ids)
        with recorded_writes(monkeypatch) as writes:
            t.crash_next("before_shared_write")
            results = await asyncio.gather(*(t.get(Counter, i).add(10) for i in ids))
        assert results == [11, 11]  # the handles' retries, after an unsent failure
        # Nothing was read from the crashed write (its turns were answered unsent, their caches
        # dropped, and their retries ran cold, in two flights, on connections of their own);
        # a turn that queued behind it went in a write of its own, once.
        crashed = [a for a in ids if all(a not in write for write in writes)]
        assert crashed and sorted(crashed + [a for w in writes for a in w]) == ids
        for actor in ids:
            rows = await t.inspect(t.get(Counter, actor))
            assert rows.state is not None and rows.state["n"] == 11
            assert len(rows.state["applied"]) == len(rows.receipts) == 2


class Hasty(akter.Actor[Tally], execution_timeout=0.3):
    """A turn that gives up after 300 ms: long enough to queue, short enough to time out."""

    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        self.state.applied.append(self.command_id)
        return self.state.n


async def test_a_turn_that_times_out_in_line_was_never_sent_and_says_so(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer is held past the Hasty turn's execution timeout: the turn gives up while it
    # waits in line, so nothing of it reached the server. It is answered "not committed" (not
    # outcome_unknown), the released write does not send it, and its retry commits once.
    async with akter_test([Counter, Hasty], relay=False) as t:
        engine = t.runtime._engine
        engine.shared.connections = 1
        line = Line.of(engine)
        await warm(t, ["line-hold"])
        assert await t.get(Hasty, "line-late").add(1) == 1
        with recorded_writes(monkeypatch) as writes:
            held = t.pause_next("before_shared_write")
            hold = asyncio.create_task(t.get(Counter, "line-hold").add(1))
            await held.wait()
            late = asyncio.create_task(
                t.runtime.call(Hasty, "line-late", "add", {"k": 10}, retry=False)
            )
            await line.reach(1)
            with pytest.raises(akter.ActorError) as raised:
                await late
            held.release()
            assert await hold == 2
        error = raised.value
        assert error.reason == "ActorUnavailable" and error.code is None, error
        assert "was not committed" in str(error)
        assert writes == [["line-hold"]]  # the late turn was dropped from the line, unsent
        assert error.command_id is not None
        handle = t.get(Hasty, "line-late").with_command_id(error.command_id)
        assert await handle.add(10) == 11
        rows = await t.inspect(t.get(Hasty, "line-late"))
        assert rows.state is not None and rows.state["n"] == 11
        assert len(rows.state["applied"]) == len(rows.receipts) == 2


async def test_a_full_pool_refuses_a_shared_turn_by_name_and_its_retry_commits_once(
    akter_test: Make,
) -> None:
    # Every pooled connection is taken (by the test): a warm turn's write waits pool_wait for
    # one, then the turn is refused as pool_exhausted, nothing sent (not outcome_unknown). Its
    # retry with the same id, once a connection is free, commits once.
    async with akter_test([Counter], relay=False, pool_size=2, pool_wait=0.3) as t:
        await warm(t, ["full"])
        pool = t.runtime._store.pool
        taken = [await pool.getconn() for _ in range(2)]
        try:
            with pytest.raises(akter.ActorError) as raised:
                await t.runtime.call(Counter, "full", "add", {"k": 10}, retry=False)
        finally:
            for conn in taken:
                await pool.putconn(conn)
        error = raised.value
        assert (error.reason, error.code, error.retryable) == (
            "ActorUnavailable",
            "pool_exhausted",
            True,
        )
        assert error.command_id is not None
        assert await t.get(Counter, "full").with_command_id(error.command_id).add(10) == 11
        rows = await t.inspect(t.get(Counter, "full"))
        assert rows.state is not None and rows.state["n"] == 11
        assert len(rows.state["applied"]) == len(rows.receipts) == 2


async def test_a_writer_stopped_mid_write_answers_unknown_and_discards_its_connection(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    # A's write holds the only write (paused); B queues for the writer task that starts after
    # it. B's guard then waits for its row, locked by another session, so B's write is on the
    # wire, unanswered, when the writer is stopped (the runtime's close): B is answered
    # outcome_unknown, the connection with answers owed is discarded, never pooled, and
    # nothing of B committed (its retry with the same id commits once).
    async with akter_test([Counter], relay=False) as t:
        engine = t.runtime._engine
        engine.shared.connections = 1
        line = Line.of(engine)
        await warm(t, ["stop-a", "stop-b"])
        pool = t.runtime._store.pool
        async with await psycopg.AsyncConnection.connect(t.database_url) as blocker:
            await blocker.execute(
                f"SELECT 1 FROM {t.schema}.actors WHERE actor_id = 'stop-b' FOR UPDATE"
            )
            held = t.pause_next("before_shared_write")
            first = asyncio.create_task(t.get(Counter, "stop-a").add(1))
            await held.wait()
            late = asyncio.create_task(
                t.runtime.call(Counter, "stop-b", "add", {"k": 10}, retry=False)
            )
            await line.reach(1)
            held.release()
            assert await first == 2

            async def waiting_for_the_lock() -> bool:
                cur = await blocker.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 1

            await until(waiting_for_the_lock, what="B's guard waiting for its row")
            handed_out = pool.handed_out
            await engine.shared.aclose()
            with pytest.raises(akter.ActorError) as raised:
                await late
            assert pool.handed_out == handed_out - 1  # given back, closed: not pooled broken
            # Closed by the writer first ("discarding closed connection"), not handed back with
            # answers owed for the pool to find ("closing returned connection").
            assert "closing returned connection" not in caplog.text
            await blocker.rollback()
        error = raised.value
        assert (error.reason, error.code) == ("ActorUnavailable", "outcome_unknown"), error
        assert error.command_id is not None
        assert await t.get(Counter, "stop-b").with_command_id(error.command_id).add(10) == 11
        rows = await t.inspect(t.get(Counter, "stop-b"))
        assert rows.state is not None and rows.state["n"] == 11
        assert len(rows.state["applied"]) == len(rows.receipts) == 2


async def test_two_tenants_same_actor_id_in_one_write_each_commit_only_their_own_row(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another tenant's actor of the same type and id shares the write: each segment's guard and
    # writes address its own tenant's row, so each commits its own value, once, and neither
    # sees the other's.
    async with akter_test([Counter], relay=False) as t:
        engine = t.runtime._engine
        engine.shared.connections = 1
        line = Line.of(engine)
        await warm(t, ["tenant-hold"])
        for tenant, k in (("acme", 1), ("globex", 100)):
            assert await t.get(Counter, "same", tenant=tenant).add(k) == k
        with recorded_writes(monkeypatch) as writes:
            held = t.pause_next("before_shared_write")
            hold = asyncio.create_task(t.get(Counter, "tenant-hold").add(1))
            await held.wait()
            calls = []
            for n, (tenant, k) in enumerate((("acme", 10), ("globex", 1000)), start=1):
                calls.append(asyncio.create_task(t.get(Counter, "same", tenant=tenant).add(k)))
                await line.reach(n)
            held.release()
            assert await asyncio.gather(hold, *calls) == [2, 11, 1100]
        assert writes == [["tenant-hold"], ["same", "same"]]
        for tenant, n in (("acme", 11), ("globex", 1100)):
            rows = await t.inspect(t.get(Counter, "same", tenant=tenant))
            assert rows.state is not None and rows.state["n"] == n
            assert len(rows.state["applied"]) == len(rows.receipts) == 2


async def test_a_parameter_that_cannot_be_dumped_fails_its_own_turn_and_no_other(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # b's segment holds a parameter psycopg cannot dump, after its BEGIN and guard: a ROLLBACK
    # ends what of b was queued and b fails, nothing of it committed. The write's answers stay
    # with their own turns: c, whose guard fails (its row moved on another runner), is told so
    # and runs again in two flights; it is not handed b's answers as its own "committed".
    async with akter_test([Counter], relay=False, runners=2) as t:
        engine = t.runtime._engine
        line = await moved_in_line(t, "dump", moved="c")
        write = SharedWriter._write
        poisoned: list[str] = []

        async def poisoning(self: SharedWriter, conn: Connection, share: list[_Waiting]) -> bool:
            for waiting in share:
                if waiting.ref.id == "dump-b" and not poisoned:
                    poisoned.append(waiting.ref.id)
                    bad = (Answer(None), "SELECT %(x)s", {"x": object()}, False)
                    waiting.segment.recorded.insert(2, bad)
            return await write(self, conn, share)

        monkeypatch.setattr(SharedWriter, "_write", poisoning)
        with recorded_writes(monkeypatch) as writes:
            failing = t.runtime.call
            hold, a, b, c = await behind_a_held_write(
                t,
                line,
                "dump-hold",
                [
                    lambda: t.get(Counter, "dump-a").add(10),
                    lambda: failing(Counter, "dump-b", "add", {"k": 10}, retry=False),
                    lambda: t.get(Counter, "dump-c").add(10),
                ],
            )
            assert hold == 2
        assert poisoned == ["dump-b"]
        assert (a, c) == (11, 111)
        assert isinstance(b, akter.ActorError), b
        assert (b.reason, b.code) == ("ActorUnavailable", None), b  # known not committed
        assert "was not committed" in str(b)
        assert writes[:2] == [["dump-hold"], ["dump-a", "dump-b", "dump-c"]]
        assert engine.fallbacks == {"AK001": 1}
        rows = await t.inspect(t.get(Counter, "dump-b"))
        assert rows.state is not None and rows.state["n"] == 1  # nothing of b committed
        assert len(rows.state["applied"]) == len(rows.receipts) == 1
        assert b.command_id is not None
        assert await t.get(Counter, "dump-b").with_command_id(b.command_id).add(10) == 11
        for actor, n, turns in [("dump-a", 11, 2), ("dump-b", 11, 2), ("dump-c", 111, 3)]:
            rows = await t.inspect(t.get(Counter, actor))
            assert rows.state is not None and rows.state["n"] == n
            assert len(rows.state["applied"]) == len(rows.receipts) == turns
