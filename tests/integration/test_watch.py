"""Query watches (docs/guides/live.md) on a real PostgreSQL: values, coalescing, order, limits."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import akter
from akter.testing import ActorTest, watching
from tests._support.polling import until
from tests.integration.live_actors import ACTORS, REVOKED, RUNS, Account

Make = Callable[..., ActorTest]
WITHIN = 5.0


async def next_value(values: AsyncIterator[Any], within: float = WITHIN) -> Any:
    async with asyncio.timeout(within):
        return await anext(values)


async def test_a_watch_yields_now_then_after_each_changing_commit(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        account = t.get(Account, "a")
        values = account.balance.watch()
        try:
            assert await next_value(values) == 0  # no row yet: the default state's value
            assert await account.deposit(5) == 5
            assert await next_value(values) == 5
            # A commit that leaves the value as it was yields nothing; the next change does.
            await account.touch()
            await account.deposit(2)
            assert await next_value(values) == 7
            assert t.runtime.live.watching == 1
        finally:
            await values.aclose()  # type: ignore[attr-defined]
        assert t.runtime.live.watching == 0
        # A query with arguments watches the value for those arguments.
        above = account.above.watch(6)
        assert await next_value(above) is True
        await above.aclose()  # type: ignore[attr-defined]


async def test_a_query_not_declared_watchable_is_refused_by_name(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        with pytest.raises(akter.ActorError) as refused:
            t.get(Account, "a").plain.watch()  # type: ignore[attr-defined]
        assert refused.value.code == "not_watchable"
        assert t.runtime.live.watching == 0


async def test_a_watch_across_two_runners(akter_test: Make) -> None:
    # The other runner's commits reach the watch through the live channel (notify=True): the
    # 60 s poll cannot be what delivers them.
    async with akter_test(ACTORS, poll=60, notify=True, watch_min_interval=0.001) as t:
        other = await t.add_runtime()
        values = t.get(Account, "a").balance.watch()
        try:
            assert await next_value(values) == 0
            remote = other.get(Account, "a")
            for expected in (3, 6, 9):
                await remote.deposit(3)
                assert await next_value(values, 3.0) == expected
        finally:
            await values.aclose()  # type: ignore[attr-defined]


async def test_a_watch_across_runners_without_notify_polls(akter_test: Make) -> None:
    async with akter_test(ACTORS, poll=0.2, watch_min_interval=0.001) as t:
        other = await t.add_runtime()
        values = t.get(Account, "a").balance.watch()
        try:
            assert await next_value(values) == 0
            await other.get(Account, "a").deposit(4)
            started = time.monotonic()
            assert await next_value(values) == 4
            assert time.monotonic() - started < 0.2 + 1.0  # within one poll, and the read
        finally:
            await values.aclose()  # type: ignore[attr-defined]


async def test_a_slow_watcher_is_coalesced_and_never_goes_back(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.05) as t:
        account = t.get(Account, "a")
        values = account.balance.watch()
        try:
            assert await next_value(values) == 0
            # The watcher does not read while 30 commits land (from two runners' worth of
            # concurrent callers): its next value is the newest, never an older one.
            await asyncio.gather(*[account.deposit(1) for _ in range(30)])
            seen = [await next_value(values)]
            assert seen == [30]
            # Then a stream of commits faster than the interval: fewer values than commits, each
            # newer than the last, ending at the final balance.
            writer = asyncio.create_task(_deposits(account, 40))
            while seen[-1] < 70:
                seen.append(await next_value(values))
            await writer
            assert seen == sorted(seen) and len(set(seen)) == len(seen)
            assert len(seen) < 41  # coalesced: 40 commits, fewer values
        finally:
            await values.aclose()  # type: ignore[attr-defined]


async def _deposits(account: Account, n: int) -> None:
    for _ in range(n):
        await account.deposit(1)


async def test_watch_intervals_are_at_least_the_minimum(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.2) as t:
        account = t.get(Account, "a")
        values = account.balance.watch()
        try:
            await next_value(values)
            arrivals: list[tuple[float, int]] = []
            writer = asyncio.create_task(_deposits(account, 15))
            while not arrivals or arrivals[-1][1] < 15:
                value = await next_value(values)
                arrivals.append((time.monotonic(), value))
            await writer
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(arrivals)]
            assert all(gap >= 0.19 for gap in gaps), gaps
        finally:
            await values.aclose()  # type: ignore[attr-defined]


async def test_revoked_access_ends_the_watch_within_the_recheck(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_recheck=0.3) as t:
        values = _as_user(t.get(Account, "a").balance.watch(), "alice")
        try:
            assert await next_value(values) == 0
            REVOKED.add("alice")
            revoked = time.monotonic()
            with pytest.raises(akter.ActorError) as refused:
                await next_value(values)
            assert refused.value.code == "access_denied"
            assert time.monotonic() - revoked < 0.3 + 1.0
            assert t.runtime.live.watching == 0
        finally:
            REVOKED.discard("alice")
            await values.aclose()  # type: ignore[attr-defined]


async def _as_user(values: AsyncIterator[Any], subject: str) -> AsyncIterator[Any]:
    with akter.as_caller(akter.User(subject)):
        async for value in values:
            yield value


async def test_watcher_limits_are_refused_by_name(akter_test: Make) -> None:
    async with akter_test(ACTORS, max_watchers=3, max_watchers_per_actor=2) as t:
        async with contextlib.AsyncExitStack() as stack:

            async def open_watch(actor_id: str) -> None:
                values = t.get(Account, actor_id).balance.watch()
                stack.push_async_callback(values.aclose)  # type: ignore[attr-defined]
                await next_value(values)

            await open_watch("a")
            await open_watch("a")
            with pytest.raises(akter.ActorError) as per_actor:
                await open_watch("a")
            assert (per_actor.value.reason, per_actor.value.code) == (
                "RunnerAtCapacity",
                "too_many_actor_watchers",
            )
            await open_watch("b")
            with pytest.raises(akter.ActorError) as per_runner:
                await open_watch("c")
            assert per_runner.value.code == "too_many_watchers"
            assert per_runner.value.retryable
            assert t.runtime.live.watching == 3
        assert t.runtime.live.watching == 0


async def test_a_stopping_runtime_ends_its_watches(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        other = await t.add_runtime()
        values = other.get(Account, "a").balance.watch()
        assert await next_value(values) == 0
        await other.stop()
        with pytest.raises(StopAsyncIteration):
            await next_value(values)


async def test_the_test_kit_follows_a_watch(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        account = t.get(Account, "a")
        async with watching(account.above, 4) as seen:
            await account.deposit(5)
            assert await seen.until(True) is True
            assert seen.values == [False, True]
        assert t.runtime.live.watching == 0
        with pytest.raises(akter.ActorError) as refused:
            async with watching(account.plain):
                pass
        assert refused.value.code == "not_watchable"


async def test_a_watch_waits_out_a_full_pool_and_reads_again(akter_test: Make) -> None:
    # One pooled connection, held by a turn paused before its commit: the watch's recheck finds
    # the pool full (pool_exhausted, retryable), waits, and reads the committed value later.
    async with akter_test(
        ACTORS, pool_size=1, query_pool_wait=0.05, watch_recheck=0.05, watch_min_interval=0.001
    ) as t:
        account = t.get(Account, "a")
        async with watching(account.balance) as seen:
            pause = t.pause_next("before_commit")
            deposit = asyncio.create_task(account.deposit(5))
            await pause.wait()
            await until(lambda: t.runtime.live.retried_reads >= 2, within=5)
            pause.release()
            assert await deposit == 5
            assert await seen.until(5) == 5
            assert seen.error is None and seen.values == [0, 5]


async def test_alike_watches_share_their_reads(akter_test: Make) -> None:
    # Ten watches of one query, arguments and caller: a commit wakes all ten, one reads.
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        account = t.get(Account, "a")
        async with contextlib.AsyncExitStack() as stack:
            seen = [await stack.enter_async_context(watching(account.counted)) for _ in range(10)]
            RUNS.clear()
            await account.deposit(5)
            for one in seen:
                assert await one.until(5) == 5
            assert RUNS["counted"] == 1
            # Another caller's watch is not alike: it reads for itself (its access is its own).
            with akter.as_caller(akter.User("carol")):
                other = await stack.enter_async_context(watching(account.counted))
            assert other.values == [5] and RUNS["counted"] == 2
