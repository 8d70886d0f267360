"""Conformance: events and cursors (EV-01..EV-03) and live feeds on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

import akter
from akter.http.problems import status_of
from akter.testing import ActorTest
from tests._support import until_pending
from tests._support.citus import ON_CITUS

Make = Callable[..., ActorTest]

#: How long a test waits for an event it expects before it fails (never a sleep for ordering).
EXPECT_WITHIN = 5.0


class Step(akter.Event, tag="ev.step"):
    n: int
    note: str = ""


class Stray(akter.Event, tag="ev.stray"):
    n: int


class Ledger(BaseModel):
    n: int = 0


class Refused(akter.DeclaredError):
    n: int


#: Barriers a query waits on, by name: (reached, go). Set up by the test that uses them.
GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


def gate(name: str) -> tuple[asyncio.Event, asyncio.Event]:
    GATES[name] = (asyncio.Event(), asyncio.Event())
    return GATES[name]


class Feed(akter.Actor[Ledger], access=akter.public, events=[Step], delivery_timeout=5):
    """Every committed event is a ``Step`` whose ``n`` equals its seq: ``state.n == event_seq``."""

    @akter.command
    async def bump(self, k: int = 1, note: str = "") -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(Step(n=self.state.n, note=note))
        return self.state.n

    @akter.command(errors=[Refused])
    async def bump_then_refuse(self, k: int) -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(Step(n=self.state.n))
        raise Refused(n=k)

    @akter.command
    async def bump_then_break(self, k: int) -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(Step(n=self.state.n))
        raise RuntimeError("broken after emitting")

    @akter.command
    async def stray(self) -> int:
        self.emit(Stray(n=1))  # not declared in events=[...]: TypeError here, a defect
        return 0

    @akter.command
    async def stray_caught(self) -> str:
        try:
            self.emit(Stray(n=1))
        except TypeError as exc:
            message = str(exc)
        else:
            message = "emitted"
        self.state.n += 1
        self.emit(Step(n=self.state.n))  # the refused emit staged nothing: this one is seq n
        return message

    @akter.query
    async def snapshot(self) -> tuple[int, str]:
        return self.state.n, self.cursor

    @akter.query
    async def read_after_gate(self, name: str) -> tuple[int, str, list[str], list[int]]:
        """The state and cursor read together, then (after a concurrent commit) the events."""
        reached, go = GATES[name]
        n, cursor = self.state.n, self.cursor
        reached.set()
        await go.wait()
        records = await self.events(after=cursor)
        return n, cursor, [r.cursor for r in records], [r.event.n for r in records]

    @akter.query
    async def page(self, after: str | None, limit: int) -> list[str]:
        return [r.cursor for r in await self.events(after=after, limit=limit)]


class Loose(akter.Actor[Ledger], access=akter.public):
    """Declares no events: it may emit any ``akter.Event``."""

    @akter.command
    async def anything(self) -> int:
        self.emit(Stray(n=7))
        self.emit(Step(n=8))
        return 0

    @akter.command
    async def not_an_event(self) -> int:
        self.emit(Ledger(n=1))  # type: ignore[arg-type]
        return 0


ACTORS: list[type[akter.Actor[Ledger]]] = [Feed, Loose]


def reason(exc: pytest.ExceptionInfo[akter.ActorError]) -> str:
    return exc.value.reason


async def seqs(t: ActorTest, handle: Feed) -> list[int]:
    """The retained seqs of an actor, from its durable rows."""
    return [int(e["seq"]) for e in (await t.inspect(handle)).events]


async def event_seq(t: ActorTest, handle: Feed) -> int:
    return (await t.inspect(handle)).event_seq


class Follower:
    """A task doing ``async for record in handle.events(after=...)``, collecting records."""

    def __init__(self, handle: Feed, after: str | None = None) -> None:
        self.records: list[akter.EventRecord] = []
        self.arrived: list[float] = []  # monotonic time of each record
        self._changed = asyncio.Event()
        self._handle = handle
        self._after = after
        self.task = asyncio.create_task(self._run(), name="test follower")

    async def _run(self) -> None:
        try:
            async for record in self._handle.events(after=self._after):
                self.records.append(record)
                self.arrived.append(time.monotonic())
                self._changed.set()
        finally:
            self._changed.set()

    async def until(self, count: int, within: float = EXPECT_WITHIN) -> list[akter.EventRecord]:
        """Wait until ``count`` records arrived (fails after ``within`` seconds)."""
        deadline = time.monotonic() + within
        while len(self.records) < count and not self.task.done():
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(self.records)} of {count} events after {within} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        if len(self.records) < count:
            self.task.result()  # re-raise what ended the feed
        return self.records[:count]

    @property
    def cursors(self) -> list[int]:
        return [int(r.cursor) for r in self.records]

    async def close(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@asynccontextmanager
async def following(handle: Feed, after: str | None = None) -> AsyncIterator[Follower]:
    follower = Follower(handle, after)
    try:
        yield follower
    finally:
        if not follower.task.done():
            await follower.close()


# --- EV-01: only committed events, gap-free ---------------------------------------------------


async def test_EV01_declared_failure_and_defect_leave_no_events(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        assert await feed.bump(2) == 2
        with pytest.raises(Refused) as refused:
            await feed.bump_then_refuse(3)
        assert refused.value.fields == {"n": 3}
        with pytest.raises(akter.ActorError) as broken:
            await feed.bump_then_break(4)
        assert reason(broken) == "Defect"
        row = await t.inspect(feed)
        assert [e["seq"] for e in row.events] == [1, 2]
        assert row.event_seq == 2
        # The declared failure committed its receipt, not its events; the defect committed nothing.
        assert len(row.receipts) == 2
        # The sequence goes on without a gap: nothing was reserved for the discarded events.
        assert await feed.bump(1) == 3
        page = await feed.events()
        assert [r.cursor for r in page] == ["1", "2", "3"]
        assert [r.event.n for r in page] == [1, 2, 3]
        assert await event_seq(t, feed) == 3


async def test_EV01_rolled_back_batch_keeps_only_committed_events(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(feed.bump(1))
        await pause.wait()
        calls = [feed.bump(2), feed.bump_then_break(5), feed.bump(1), feed.bump_then_refuse(2)]
        tasks = [asyncio.create_task(c) for c in calls]
        await until_pending(t.runtime, 5)  # the four are in the mailbox behind the paused turn
        pause.release()
        assert await first == 1
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[0] == 3 and results[2] == 4
        assert isinstance(results[1], akter.ActorError) and results[1].reason == "Defect"
        assert isinstance(results[3], Refused)
        # The batch was rolled back and re-run one by one: each success's events once, in order.
        page = await feed.events()
        assert [r.cursor for r in page] == ["1", "2", "3", "4"]
        assert [r.event.n for r in page] == [1, 2, 3, 4]
        assert await seqs(t, feed) == [1, 2, 3, 4]
        assert await event_seq(t, feed) == 4


@pytest.mark.parametrize("point", ["before_handler", "before_commit", "after_commit"])
async def test_EV01_crashed_turn_leaves_no_events(akter_test: Make, point: str) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        await feed.bump(1)
        cid = await t.runtime.mint_command_id()
        t.crash_next(point)
        if point == "after_commit":
            # The commit landed; the handle's retry with the same id replays its receipt.
            assert await feed.with_command_id(cid).bump(3, note="once") == 4
            assert t.runtime.hooks.fired == [("after_commit", "crash")]
        else:
            retry = t.pause_next(point)  # the handle's retry of the crashed turn
            call = asyncio.create_task(feed.with_command_id(cid).bump(3, note="once"))
            await retry.wait()
            # While the retry is held, the crashed attempt left no event behind.
            assert await seqs(t, feed) == [1]
            assert await event_seq(t, feed) == 1
            retry.release()
            assert await call == 4
        page = await feed.events(after="1")
        assert [r.cursor for r in page] == ["2", "3", "4"]
        assert {r.command_id for r in page} == {cid}
        assert [r.event for r in page] == [Step(n=n, note="once") for n in (2, 3, 4)]
        # A retry with the same id replays: no second set of events.
        assert await feed.with_command_id(cid).bump(3, note="once") == 4
        assert await event_seq(t, feed) == 4


async def test_EV01_two_runtimes_racing_commits_are_gap_free(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        second = await t.add_runtime()
        a = t.runtime.get(Feed, "race")
        b = second.get(Feed, "race")
        await a.bump(1)
        await b.bump(1)  # both runtimes now have the actor cached: every turn is fenced
        ks = [1 + i % 3 for i in range(40)]
        results = await asyncio.gather(*[a.bump(k) for k in ks], *[b.bump(k) for k in ks])
        n = 2 + 2 * sum(ks)
        assert max(results) == n and len(set(results)) == len(results)
        row = await t.inspect(a)
        assert [e["seq"] for e in row.events] == list(range(1, n + 1))
        assert row.event_seq == n
        assert row.state == {"n": n}
        # Every event carries the state it was emitted from: no two turns interleaved.
        assert [e["payload"]["n"] for e in row.events] == list(range(1, n + 1))
        # Read back in pages from the other runtime: every event once, in order.
        cursor: str | None = None
        read: list[int] = []
        while page := await b.events(after=cursor, limit=37):
            read += [int(r.cursor) for r in page]
            cursor = page[-1].cursor
        assert read == list(range(1, n + 1))


# --- EV-02: a query's cursor ------------------------------------------------------------------


async def test_EV02_query_cursor_then_concurrent_commit(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        second = await t.add_runtime()
        feed = t.get(Feed, "f")
        await feed.bump(3)
        reached, go = gate("ev02")
        query = asyncio.create_task(feed.read_after_gate("ev02"))
        await asyncio.wait_for(reached.wait(), EXPECT_WITHIN)
        # The query holds its cursor; meanwhile two turns commit, one on another runner.
        assert await feed.bump(2) == 5
        assert await second.get(Feed, "f").bump(1) == 6
        go.set()
        n, cursor, cursors, ns = await query
        assert (n, cursor) == (3, "3")  # the cursor is the event_seq read with the state
        assert cursors == ["4", "5", "6"]  # every later event, exactly once, none earlier
        assert ns == [4, 5, 6]


async def test_EV02_handle_reads_after_a_query_cursor(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        assert await feed.snapshot() == (0, "0")
        await feed.bump(2)
        n, cursor = await feed.snapshot()
        assert (n, cursor) == (2, "2")
        await asyncio.gather(feed.bump(1), feed.bump(2))
        page = await feed.events(after=cursor)
        assert [r.cursor for r in page] == ["3", "4", "5"]
        assert [r.event.n for r in page] == [3, 4, 5]
        assert await feed.events(after="5") == []


# --- EV-03: retention gaps and unknown cursors ------------------------------------------------


async def prune(t: ActorTest, through: int) -> None:
    """Simulate a retention sweep: delete a prefix of the events (semantics §7)."""
    await t.rows("DELETE FROM {schema}.events WHERE seq <= %(through)s", {"through": through})


async def test_EV03_retention_gap_and_unknown_cursors(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        await feed.bump(5)
        await prune(t, 3)
        assert await seqs(t, feed) == [4, 5]
        assert await event_seq(t, feed) == 5  # pruning never moves the sequence
        # Resuming right at the first retained seq − 1 is fine.
        assert [r.cursor for r in await feed.events(after="3")] == ["4", "5"]
        assert await feed.events(after="5") == []
        for after in ("1", "2"):
            with pytest.raises(akter.ActorError) as gap:
                await feed.events(after=after)
            assert reason(gap) == "RetentionGap" and not gap.value.retryable
            assert status_of(gap.value) == 410
        # Through a query's view too.
        with pytest.raises(akter.ActorError) as gap:
            await feed.page("2", 10)
        assert reason(gap) == "RetentionGap"
        assert await feed.page("3", 10) == ["4", "5"]
        # A live feed never skips silently either.
        with pytest.raises(akter.ActorError) as gap:
            async for _ in feed.events(after="2"):
                pytest.fail("a feed resumed across a retention gap")
        assert reason(gap) == "RetentionGap"
        for after in ("6", "99", "x", "-1", "01", "", "1.0", " 4", "4 ", "+4", "1" * 20):
            with pytest.raises(akter.ActorError) as unknown:
                await feed.events(after=after)
            assert reason(unknown) == "UnknownCursor", after
            assert status_of(unknown.value) == 400
        # New events continue the sequence after the pruned prefix.
        assert await feed.bump(2) == 7
        assert await seqs(t, feed) == [4, 5, 6, 7]
        assert await event_seq(t, feed) == 7
        assert [r.cursor for r in await feed.events(after="5")] == ["6", "7"]


async def test_EV03_unknown_cursor_on_an_actor_without_events(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "nobody")
        assert await feed.events() == []
        assert await feed.events(after="0") == []
        with pytest.raises(akter.ActorError) as unknown:
            await feed.events(after="1")
        assert reason(unknown) == "UnknownCursor"
        assert not (await t.inspect(feed)).exists  # reading wrote nothing


async def test_EV03_no_cursor_starts_at_the_oldest_retained_event(akter_test: Make) -> None:
    # Semantics §6.2: "`after` omitted or "0" starts at the oldest retained event".
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        await feed.bump(5)
        await prune(t, 3)
        assert [r.cursor for r in await feed.events()] == ["4", "5"]
        assert [r.cursor for r in await feed.events(after="0")] == ["4", "5"]
        async with following(feed) as follower:
            assert [r.cursor for r in await follower.until(2)] == ["4", "5"]


# --- live feeds -------------------------------------------------------------------------------


async def test_live_feed_replays_then_follows_local_commits_at_once(akter_test: Make) -> None:
    # A long poll: only the in-process wake after a local commit can deliver within the wait.
    async with akter_test(ACTORS, poll=60) as t:
        feed = t.get(Feed, "f")
        await feed.bump(2)
        async with following(feed) as follower:
            assert [r.cursor for r in await follower.until(2)] == ["1", "2"]
            for expected in (3, 5, 6):
                committed = time.monotonic()
                await feed.bump(expected - len(follower.records))
                await follower.until(expected, within=2.0)
                assert follower.arrived[-1] - committed < 2.0
            assert follower.cursors == [1, 2, 3, 4, 5, 6]
            assert [r.event.n for r in follower.records] == [1, 2, 3, 4, 5, 6]
        async with following(feed, after="4") as resumed:
            assert [r.cursor for r in await resumed.until(2)] == ["5", "6"]
        assert not t.runtime._events._subscribers  # closed feeds unsubscribe


async def test_live_feed_sees_another_runtimes_commits_within_one_poll(akter_test: Make) -> None:
    poll = 0.5
    async with akter_test(ACTORS, poll=poll) as t:
        other = await t.add_runtime()
        feed = t.get(Feed, "f")
        remote = other.get(Feed, "f")
        async with following(feed) as follower:
            for expected in (1, 3):
                committed = time.monotonic()
                await remote.bump(expected - len(follower.records))
                await follower.until(expected)
                # Within one poll (± 10 % jitter of the relay does not apply to feeds) + slack,
                # which counts the remote turn itself: seconds on distributed Citus tables.
                assert follower.arrived[-1] - committed < poll + (2.0 if ON_CITUS else 0.5)
            # A burst from both runtimes at once: the feed sees each event once, in order.
            await asyncio.gather(
                *[remote.bump(1 + i % 2) for i in range(10)], *[feed.bump(1) for _ in range(10)]
            )
            total = 3 + 15 + 10
            await follower.until(total)
            # One more commit proves nothing was repeated in between: it is the next record.
            await remote.bump(1)
            await follower.until(total + 1)
            assert follower.cursors == list(range(1, total + 2))
            assert [r.event.n for r in follower.records] == list(range(1, total + 2))


async def test_live_feed_with_notify_sees_other_runtimes_at_once(akter_test: Make) -> None:
    # With notify=True a remote commit wakes the feed; the 60 s poll cannot be what delivers it.
    async with akter_test(ACTORS, poll=60, notify=True) as t:
        other = await t.add_runtime()
        feed = t.get(Feed, "f")
        async with following(feed) as follower:
            await other.get(Feed, "f").bump(2)
            assert [r.cursor for r in await follower.until(2, within=3.0)] == ["1", "2"]


async def test_live_feed_with_notify_on_a_runner_without_relay(akter_test: Make) -> None:
    # Semantics §3.5.2 and §6.5: runners with notify=True LISTEN, so a feed served by a runner
    # that only takes calls (relay=False) also sees other runners' commits at once.
    async with akter_test(ACTORS, poll=60, notify=True, relay=False) as t:
        worker = await t.add_runtime(relay=True)
        feed = t.get(Feed, "f")
        async with following(feed) as follower:
            await worker.get(Feed, "f").bump(2)
            assert [r.cursor for r in await follower.until(2, within=3.0)] == ["1", "2"]


# --- declared event types, decoding, limits ---------------------------------------------------


async def test_undeclared_event_type_is_refused_at_the_emit(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        with pytest.raises(akter.ActorError) as defect:
            await feed.stray()
        assert reason(defect) == "Defect"
        assert not (await t.inspect(feed)).exists
        # Raised at the emit call itself, so a handler can see it; it staged nothing.
        message = await feed.stray_caught()
        assert message == "Feed does not declare Stray in events=[...]."
        page = await feed.events()
        assert [(r.cursor, r.tag, r.event) for r in page] == [("1", "ev.step", Step(n=1))]
        # A type that declares no events may emit any akter.Event, but only events.
        loose = t.get(Loose, "l")
        await loose.anything()
        assert [(e["tag"], e["payload"]) for e in (await t.inspect(loose)).events] == [
            ("ev.stray", {"n": 7}),
            ("ev.step", {"n": 8, "note": ""}),
        ]
        with pytest.raises(akter.ActorError) as defect:
            await loose.not_an_event()
        assert reason(defect) == "Defect"
        assert (await t.inspect(loose)).event_seq == 2


async def test_event_records_are_decoded_to_the_declared_class(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        cid = await t.runtime.mint_command_id()
        before = await t.now_ms()
        await feed.with_command_id(cid).bump(2, note="hello")
        after = await t.now_ms()
        page = await feed.events()
        assert [type(r.event) for r in page] == [Step, Step]
        assert [r.event for r in page] == [Step(n=1, note="hello"), Step(n=2, note="hello")]
        assert {r.tag for r in page} == {"ev.step"}
        assert {r.command_id for r in page} == {cid}
        stamp = page[0].emitted_at
        assert stamp.tzinfo is not None and stamp == page[1].emitted_at  # one turn, one `now`
        low = datetime.fromtimestamp(before / 1000, tz=UTC) - timedelta(milliseconds=1)
        high = datetime.fromtimestamp(after / 1000, tz=UTC) + timedelta(milliseconds=1)
        assert low <= stamp <= high
        row = (await t.inspect(feed)).events[0]
        assert row["payload"] == {"n": 1, "note": "hello"} and row["tag"] == "ev.step"
        # The same decoded records on a live feed.
        async with following(feed) as follower:
            assert [r.event for r in await follower.until(2)] == [r.event for r in page]


@pytest.mark.parametrize("limit", [0, -1, 10_001])
async def test_limit_out_of_bounds_is_invalid_input(akter_test: Make, limit: int) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        await feed.bump(1)
        with pytest.raises(akter.ActorError) as invalid:
            await feed.events(limit=limit)
        assert reason(invalid) == "InvalidInput" and invalid.value.field == "limit"
        with pytest.raises(akter.ActorError) as invalid:
            await feed.page(None, limit)
        assert reason(invalid) == "InvalidInput"


async def test_limit_bounds_a_page(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        feed = t.get(Feed, "f")
        await feed.bump(5)
        assert [r.cursor for r in await feed.events(limit=1)] == ["1"]
        assert [r.cursor for r in await feed.events(after="1", limit=3)] == ["2", "3", "4"]
        assert len(await feed.events(limit=10_000)) == 5
        assert await feed.page("3", 1) == ["4"]
