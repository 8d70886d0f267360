"""A warm actor's state is cached as its stored text (docs/internals/state-cache.md).

Each handler decodes its private state from the cached text exactly as a cold load decodes
the stored row; nothing a handler does reaches the cache unless its turn commits; no decoded
model outlives its turn (the collector's full passes at 64 callers were those models).
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

import akter
from akter.testing import ActorTest

pytestmark = pytest.mark.usefixtures("turn_mode")

Make = Callable[..., ActorTest]


class ShelfRefused(akter.DeclaredError):
    why: str


class Shelf(BaseModel):
    """A nested state a careless handler changes in place before it fails."""

    items: list[int] = []
    by_kind: dict[str, list[int]] = {}


class Labels(BaseModel):
    """A state whose validator normalises what it reads."""

    tags: list[str] = []

    @field_validator("tags")
    @classmethod
    def _normalise(cls, tags: list[str]) -> list[str]:
        return sorted({t.strip().lower() for t in tags})


class Doubled(BaseModel):
    """A careless model: its validator doubles ``n`` and refuses more than 100.

    So the dump of a state it read from 60 (120) is a text it refuses to read again.
    """

    n: int = 0

    @field_validator("n")
    @classmethod
    def _double(cls, n: int) -> int:
        if n > 100:
            raise ValueError("more than 100")
        return n * 2


class Doubler(akter.Actor[Doubled], access=akter.public):
    @akter.command(errors=(ShelfRefused,))
    async def refuse(self) -> None:
        raise ShelfRefused(why="takes the loaded model and writes nothing")

    @akter.command
    async def peek(self) -> int:
        return self.state.n


class Store(akter.Actor[Shelf], access=akter.public, execution_timeout=0.5):
    @akter.command
    async def put(self, k: int) -> list[int]:
        self.state.items.append(k)
        self.state.by_kind.setdefault("all", []).append(k)
        return self.state.items

    @akter.command(errors=(ShelfRefused,))
    async def put_then_refuse(self, k: int) -> None:
        self.state.items.append(k)
        self.state.by_kind.setdefault("all", []).append(k)
        raise ShelfRefused(why="after changing the state")

    @akter.command
    async def put_then_fail(self, k: int) -> None:
        self.state.items.append(k)
        self.state.by_kind["all"].append(k)
        raise RuntimeError("a defect after changing the state")

    @akter.command
    async def put_then_hang(self, k: int) -> None:
        self.state.items.append(k)
        self.state.by_kind["all"].append(k)
        await asyncio.sleep(30)  # outlives the execution timeout: never committed

    @akter.command
    async def seen(self) -> dict[str, Any]:
        return self.state.model_dump()


class Tagged(akter.Actor[Labels], access=akter.public):
    @akter.command
    async def tag(self, labels: list[str]) -> list[str]:
        self.state.tags.extend(labels)  # not validated on assignment: as the handler left it
        return self.state.tags

    @akter.command
    async def seen(self) -> list[str]:
        return self.state.tags


COMMITTED = {"items": [1], "by_kind": {"all": [1]}}


@pytest.mark.parametrize("failure", ["declared", "defect", "timeout", "crash"])
async def test_a_handler_that_changes_nested_state_and_fails_leaves_the_committed_state(
    akter_test: Make, failure: str
) -> None:
    async with akter_test([Store]) as t:
        store = t.get(Store, "s")
        assert await store.put(1) == [1]
        assert await store.seen() == COMMITTED  # warm from here
        with pytest.raises((akter.ActorError, ShelfRefused)):
            if failure == "declared":
                await store.put_then_refuse(2)
            elif failure == "defect":
                await store.put_then_fail(2)
            elif failure == "timeout":
                await t.runtime.call(Store, "s", "put_then_hang", {"k": 2}, retry=False)
            else:
                t.crash_next("before_commit")
                await t.runtime.call(Store, "s", "put", {"k": 2}, retry=False)
        # The next turn (warm, unless the failure dropped the cache) sees the committed state,
        # and the row is the committed one.
        assert await store.seen() == COMMITTED
        assert await store.put(3) == [1, 3]
        row = await t.inspect(store)
        assert row.state == {"items": [1, 3], "by_kind": {"all": [1, 3]}}


async def test_a_declared_error_in_a_batch_keeps_the_commands_before_it(
    akter_test: Make,
) -> None:
    async with akter_test([Store]) as t:
        store = t.get(Store, "s")
        await store.put(1)
        # Three commands queued behind a held turn run as one batch.
        pause = t.pause_next("before_handler")
        first = asyncio.create_task(store.put(2))
        await pause.wait()
        queued = [
            asyncio.create_task(store.put(3)),
            asyncio.create_task(store.put_then_refuse(4)),
            asyncio.create_task(store.put(5)),
        ]
        await asyncio.sleep(0)
        pause.release()
        assert await first == [1, 2]
        put3, refused, put5 = await asyncio.gather(*queued, return_exceptions=True)
        assert put3 == [1, 2, 3] and put5 == [1, 2, 3, 5]
        assert isinstance(refused, ShelfRefused)
        assert await store.seen() == {"items": [1, 2, 3, 5], "by_kind": {"all": [1, 2, 3, 5]}}


async def test_a_warm_turn_sees_what_a_cold_load_of_the_row_decodes(akter_test: Make) -> None:
    async with akter_test([Tagged]) as t:
        warm = t.get(Tagged, "a")
        # The handler's list is as it left it; what it stores is normalised by the validator.
        assert await warm.tag(["Zeta ", "alpha", "ALPHA"]) == ["Zeta ", "alpha", "ALPHA"]
        assert (await t.inspect(warm)).state == {"tags": ["alpha", "zeta"]}
        seen_warm = await warm.seen()
        await t.add_runtime()
        seen_cold = await t.get(Tagged, "a", runner=1).seen()  # a runner with no cache
        assert seen_warm == seen_cold == ["alpha", "zeta"]
        # And after another runner's write, the first runner's next turn decodes that row.
        assert await t.get(Tagged, "a", runner=1).tag(["Beta"]) == ["alpha", "zeta", "Beta"]
        assert await warm.seen() == ["alpha", "beta", "zeta"]


async def test_no_decoded_state_outlives_its_turn(akter_test: Make) -> None:
    async with akter_test([Store]) as t:
        handles = [t.get(Store, f"s{i}") for i in range(200)]
        for handle in handles:
            await handle.put(1)
        for handle in handles:  # warm turns
            await handle.put(2)
        gc.collect()
        alive = sum(1 for o in gc.get_objects() if type(o) is Shelf)
        # One per warm actor when the cache kept the decoded model; none when it keeps text.
        assert alive < 5, f"{alive} decoded states outlived their turns"
        assert (await t.inspect(handles[-1])).state == {"items": [1, 2], "by_kind": {"all": [1, 2]}}


async def test_cached_text_whose_validators_refuse_it_fails_the_command_and_keeps_the_row(
    akter_test: Make,
) -> None:
    async with akter_test([Doubler]) as t:
        doubler = t.get(Doubler, "d")
        assert await doubler.peek() == 0
        # Another writer stored n = 60: a load reads it as 120 and caches the text of 120.
        await t.rows(
            "UPDATE {schema}.actors SET state = %(s)s::jsonb, version = version + 1"
            " WHERE actor_id = 'd'",
            {"s": json.dumps({"n": 60})},
        )
        with pytest.raises(ShelfRefused):
            await doubler.refuse()  # loads the row; its handler takes the loaded model
        before = await t.inspect(doubler)
        # The next handler decodes the cached text, which its model refuses: a named defect,
        # before the handler runs, and nothing written.
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Doubler, "d", "peek", {}, retry=False)
        assert raised.value.reason == "Defect"
        assert "cannot be decoded again" in raised.value.message
        after = await t.inspect(doubler)
        assert after.state == before.state == {"n": 60}
        assert after.version == before.version
        assert len(after.receipts) == len(before.receipts)
