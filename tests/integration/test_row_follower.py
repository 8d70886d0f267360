"""Row followers (``runtime.live.follow_row``, the console's state feed) on a real PostgreSQL.

A row follower is a watch whose read is the caller's own statement: woken at once by this
runner's commits of its actor whatever the type, by other runners' commits through the live
channel only for types with a watchable query, and otherwise by the poll. It takes a watch slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests.integration.live_actors import Account

Make = Callable[..., ActorTest]


class Count(BaseModel):
    n: int = 0


class Tally(akter.Actor[Count]):
    """A type with no watchable query: the live channel never carries its commits."""

    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n


ACTORS = [Account, Tally]


def follow(runtime: akter.Runtime, ref: akter.ActorRef) -> Any:
    """A follower of ``ref``'s row, read as the console reads it."""

    async def read() -> tuple[Any, int]:
        row = await runtime.operators.actors.row(ref, 2_000)
        return (row["state"] if row else None), (row["version"] if row else 0)

    return runtime.live.follow_row(ref, read)


async def take(values: AsyncIterator[Any], within: float = 5.0) -> tuple[int, Any]:
    async with asyncio.timeout(within):
        item = await anext(values)
    return item.version, item.value


async def test_a_local_commit_of_any_type_wakes_its_follower_at_once(akter_test: Make) -> None:
    # poll=60: only the commit's wake can deliver the values in time.
    async with akter_test(ACTORS, poll=60, watch_min_interval=0.001) as t:
        tally = t.get(Tally, "x")
        watch = follow(t.runtime, tally.ref)
        values = watch.values()
        try:
            assert await take(values) == (0, None)
            await tally.add(2)
            assert await take(values, 3.0) == (1, {"n": 2})
            # Another actor's commit (same id, another tenant) does not wake it.
            await t.get(Tally, "x", tenant="acme").add(40)
            await tally.add(1)
            assert await take(values, 3.0) == (2, {"n": 3})
            assert t.runtime.live.watching == 1
        finally:
            await values.aclose()
        assert t.runtime.live.watching == 0


async def test_another_runners_commit_of_an_unwatched_type_is_read_on_the_poll(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS, poll=0.2, notify=True, watch_min_interval=0.001) as t:
        other = await t.add_runtime()
        watch = follow(t.runtime, t.get(Tally, "x").ref)
        values = watch.values()
        try:
            assert await take(values) == (0, None)
            await other.get(Tally, "x").add(5)
            assert await take(values, 3.0) == (1, {"n": 5})
        finally:
            await values.aclose()


async def test_another_runners_commit_of_a_watched_type_arrives_on_the_channel(
    akter_test: Make,
) -> None:
    # poll=60 and a 60 s recheck: the live channel is what delivers the other runner's commits.
    async with akter_test(
        ACTORS, poll=60, notify=True, watch_min_interval=0.001, watch_recheck=60
    ) as t:
        other = await t.add_runtime()
        watch = follow(t.runtime, t.get(Account, "a").ref)
        values = watch.values()
        try:
            assert (await take(values))[0] == 0
            await other.get(Account, "a").deposit(3)
            version, state = await take(values, 3.0)
            assert version == 1 and state["cents"] == 3
        finally:
            await values.aclose()


async def test_followers_take_watch_slots_and_a_failed_read_ends_one(akter_test: Make) -> None:
    async with akter_test(ACTORS, max_watchers=3, max_watchers_per_actor=2) as t:
        ref = t.get(Tally, "x").ref
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(2):
                values = follow(t.runtime, ref).values()
                stack.push_async_callback(values.aclose)
                await take(values)
            with pytest.raises(akter.ActorError) as refused:
                follow(t.runtime, ref)
            assert refused.value.code == "too_many_actor_watchers"
            assert t.runtime.live.watching == 2

        async def refuse() -> tuple[Any, int]:
            raise akter.ActorError("Unauthorized", "Access was revoked.")

        watch = t.runtime.live.follow_row(ref, refuse)
        with pytest.raises(akter.ActorError, match="revoked"):
            await take(watch.values())
        assert t.runtime.live.watching == 0
