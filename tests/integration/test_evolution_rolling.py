"""Rolling deploys (evolution E4): adjacent versions of an actor type run side by side.

Issue 38, findings 5 and 6. A newer deploy that only adds a defaulted field (EVO-01, the same
state version) writes rows the older code's model would drop a key of. While a runner with the
newer model is live, the older runner answers such a row with ``StateTooNew`` (retryable: the
caller's retry reaches the newer runner) instead of the loss guard's ``Defect``; a row that
would really lose data keeps the ``Defect``. An in-process handle answers ``StateTooNew`` at
once: no retry on the same runtime can succeed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._evolution import declared_paths
from akter.http.problems import status_of
from akter.testing import ActorTest
from tests._support.polling import until

Make = Callable[..., ActorTest]


async def snapshot(t: ActorTest) -> dict[str, list[dict[str, Any]]]:
    """Every durable row a turn could write, with the actor rows' xmin (a rewrite changes it)."""
    out: dict[str, list[dict[str, Any]]] = {}
    out["actors"] = await t.rows(
        "SELECT a.*, a.xmin::text AS xmin FROM {schema}.actors a ORDER BY a::text"
    )
    for table in ("receipts", "outbox", "events"):
        out[table] = await t.rows(f"SELECT x.* FROM {{schema}}.{table} x ORDER BY x::text")
    return out


class NoteV1(BaseModel):
    n: int = 0


class Item(BaseModel):
    sku: str = ""


class ItemV2(BaseModel):
    sku: str = ""
    gift: bool = False


class NoteV2(BaseModel):
    n: int = 0
    note: str = ""


class BasketV1(BaseModel):
    n: int = 0
    items: list[Item] = []


class BasketV2(BaseModel):
    n: int = 0
    items: list[ItemV2] = []


class PadV1(akter.Actor[NoteV1], name="Pad", access=akter.public):
    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


class PadV2(akter.Actor[NoteV2], name="Pad", access=akter.public):
    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n

    @akter.command
    async def write(self, note: str) -> int:
        self.state.n += 1
        self.state.note = note
        return self.state.n


class BasketOld(akter.Actor[BasketV1], name="Basket", access=akter.public):
    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


class BasketNew(akter.Actor[BasketV2], name="Basket", access=akter.public):
    @akter.command
    async def gift(self) -> int:
        self.state.n += 1
        self.state.items = [ItemV2(sku="a", gift=True), ItemV2(sku="b")]
        return self.state.n


class Other(akter.Actor[NoteV2], name="Other", access=akter.public):
    """A type named differently: its fields explain nothing about ``Pad`` rows."""

    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


def test_declared_paths_name_nested_models_and_list_items() -> None:
    assert declared_paths(NoteV2) == frozenset({"n", "note"})
    assert declared_paths(BasketV2) == frozenset({"n", "items", "items[].sku", "items[].gift"})


async def test_EVO_04_an_older_runner_answers_a_row_with_an_added_field_StateTooNew(
    akter_test: Make,
) -> None:
    """Finding 5: v2 adds ``note: str = ""``; v1 runs beside it and refuses retryably."""
    async with akter_test([PadV1]) as t:  # v1 runs first, then v2 is rolled out beside it
        old = t.runtime
        assert await old.get(PadV1, "q").bump() == 1
        new = await t.add_runtime([PadV2])
        assert await new.get(PadV2, "p").write("hello") == 1  # written by the newer code
        before = await snapshot(t)
        cid = await old.mint_command_id()
        with pytest.raises(akter.ActorError) as info:
            await old.call(PadV1, "p", "bump", {}, command_id=cid, retry=False)
        error = info.value
        assert error.reason == "StateTooNew" and error.retryable, error
        assert error.retry_after is not None and status_of(error) == 503
        assert "Pad/'p'" in error.message and "'note'" in error.message
        assert await snapshot(t) == before
        # The caller's retry with the same id reaches the newer runner and applies once.
        assert await new.call(PadV2, "p", "bump", {}, command_id=cid, retry=False) == 2
        assert await new.call(PadV2, "p", "bump", {}, command_id=cid, retry=False) == 2
        # A row the older code wrote is still served by it, and stays readable by the newer.
        assert await old.get(PadV1, "q").bump() == 2
        assert await new.get(PadV2, "q").write("x") == 3
        rows = await t.rows("SELECT state FROM {schema}.actors WHERE actor_id = 'p'")
        assert rows[0]["state"] == {"n": 2, "note": "hello"}


async def test_EVO_04_an_added_field_of_a_list_items_model_is_also_a_newer_writer(
    akter_test: Make,
) -> None:
    async with akter_test([BasketOld]) as t:
        new = await t.add_runtime([BasketNew])
        await new.get(BasketNew, "b").gift()
        before = await snapshot(t)
        with pytest.raises(akter.ActorError) as info:
            await t.runtime.call(BasketOld, "b", "bump", {}, retry=False)
        assert info.value.reason == "StateTooNew", info.value
        assert await snapshot(t) == before


async def test_a_row_that_would_really_lose_data_keeps_its_Defect_beside_other_runners(
    akter_test: Make,
) -> None:
    """No newer live model declares the key: the loss guard refuses as before (not retryable)."""
    async with akter_test([PadV1]) as t:
        await t.get(PadV1, "p").bump()
        rows = await t.rows("SELECT state FROM {schema}.actors WHERE actor_id = 'p'")
        # A key no model of Pad declares (a field removed without a migration, say).
        await t.rows(
            "UPDATE {schema}.actors SET state = %(s)s::jsonb, version = version + 1"
            " WHERE actor_id = 'p'",
            {"s": json.dumps({**rows[0]["state"], "legacy": 1})},
        )
        await t.add_runtime([Other])  # a live runner, but of another type
        await t.add_runtime([PadV2])  # a live, newer runner of Pad, whose model lacks 'legacy'
        before = await snapshot(t)
        with pytest.raises(akter.ActorError) as info:
            await t.runtime.call(PadV1, "p", "bump", {}, retry=False)
        assert info.value.reason == "Defect" and not info.value.retryable
        assert "'legacy'" in info.value.message and "migrate_state" in info.value.message
        assert await snapshot(t) == before


async def test_a_field_removed_without_a_migration_is_a_Defect_while_the_older_code_runs(
    akter_test: Make,
) -> None:
    """The other direction: v2 drops ``note``; v1, older, still declares it: a real loss."""
    async with akter_test([PadV2]) as t:
        await t.get(PadV2, "p").write("hello")
        new = await t.add_runtime([PadV1])  # PadV1's model is recorded after PadV2's
        before = await snapshot(t)
        with pytest.raises(akter.ActorError) as info:
            await new.call(PadV1, "p", "bump", {}, retry=False)
        assert info.value.reason == "Defect" and "'note'" in info.value.message
        assert await snapshot(t) == before


async def test_once_the_newer_runner_is_gone_the_older_one_refuses_with_the_loss_guard(
    akter_test: Make,
) -> None:
    """The newer-writer answer holds while the two versions run together, not after."""
    async with akter_test([PadV1]) as t:
        new = await t.add_runtime([PadV2])
        await new.get(PadV2, "p").write("hello")
        with pytest.raises(akter.ActorError) as info:
            await t.runtime.call(PadV1, "p", "bump", {}, retry=False)
        assert info.value.reason == "StateTooNew"
        await new.stop()  # the newer runner leaves the registry
        with pytest.raises(akter.ActorError) as gone:
            await t.runtime.call(PadV1, "p", "bump", {}, retry=False)
        assert gone.value.reason == "Defect" and "'note'" in gone.value.message


async def test_an_in_process_handle_answers_StateTooNew_at_once(akter_test: Make) -> None:
    """Finding 6: no retry on this runtime can succeed, so the handle does not spin."""
    async with akter_test([PadV1]) as t:
        new = await t.add_runtime([PadV2])
        await new.get(PadV2, "p").write("hello")
        started = time.monotonic()
        with pytest.raises(akter.ActorError) as info:
            await t.get(PadV1, "p").bump()  # retries allowed: the delivery timeout is 30 s
        elapsed = time.monotonic() - started
        error = info.value
        assert error.reason == "StateTooNew" and error.retryable, error
        assert error.retry_after is not None and error.retry_after > 0
        assert elapsed < 5.0, elapsed
        assert (await t.rows("SELECT state FROM {schema}.actors"))[0]["state"]["n"] == 1


class PadV3(akter.Actor[NoteV2], name="Pad", access=akter.public):
    """State version 1: a migration (the rows of ``PadV1`` and ``PadV2`` read through it)."""

    @akter.migrate_state(from_version=0)
    def _v0(old: dict[str, Any]) -> dict[str, Any]:
        return old

    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


async def test_an_in_process_handle_answers_a_newer_state_version_at_once(
    akter_test: Make,
) -> None:
    """Finding 6 over a state version above the code's: refused at once, retryable."""
    async with akter_test([PadV3]) as t:
        await t.get(PadV3, "p").bump()  # stored at state version 1
        old = await t.add_runtime([PadV2])
        started = time.monotonic()
        with pytest.raises(akter.ActorError) as info:
            await old.get(PadV2, "p").bump()
        elapsed = time.monotonic() - started
        assert info.value.reason == "StateTooNew" and info.value.retryable, info.value
        assert info.value.retry_after == 1.0
        assert elapsed < 5.0, elapsed
        # The newer runner serves the caller's retry.
        assert await t.get(PadV3, "p").bump() == 2


class BinV1(akter.Actor[NoteV1], name="Bin", access=akter.public):
    @akter.command
    async def put(self) -> int:
        self.state.n += 1
        return self.state.n


class BinV2(akter.Actor[NoteV1], name="Bin", access=akter.public):
    @akter.command
    async def put(self) -> int:
        self.state.n += 1
        return self.state.n

    @akter.command
    async def put_new(self) -> int:  # a command the older code does not declare
        self.state.n += 10
        return self.state.n


class BinSender(akter.Actor[NoteV1], name="BinSender", access=akter.public):
    @akter.command
    async def poke(self, target: str) -> None:
        self.send(BinV2.put_new, target)


async def test_an_intent_to_a_command_a_live_newer_runner_declares_waits_for_it(
    akter_test: Make,
) -> None:
    """A rolling deploy adds a command: the older relay leaves its intents due, never parks."""
    async with akter_test([BinV1, BinSender], relay=True, poll=0.05) as t:
        new = await t.add_runtime([BinV2, BinSender], relay=False)
        await new.get(BinSender, "s").poke("b")
        rows = await until(
            lambda: t.rows("SELECT attempts, last_error, parked_at_ms FROM {schema}.outbox"),
            holds=lambda rs: bool(rs) and "CommandTooNew" in str(rs[0]["last_error"]),
            what="the older relay to hand the intent back",
        )
        assert rows[0]["attempts"] == 0 and rows[0]["parked_at_ms"] is None
        await t.add_runtime([BinV2, BinSender], relay=True, poll=0.05)
        await until(
            lambda: t.rows("SELECT 1 FROM {schema}.outbox"),
            holds=lambda rs: rs == [],
            what="the newer runner to deliver the intent",
            within=30,
        )
        assert await new.get(BinV2, "b").put() == 11


async def test_an_intent_to_a_command_no_live_runner_declares_is_parked(
    akter_test: Make,
) -> None:
    async with akter_test([BinV2, BinSender], relay=False) as t:
        await t.get(BinSender, "s").poke("b")
        await t.runtime.stop()
        await t.add_runtime([BinV1, BinSender], relay=True, poll=0.05)
        rows = await until(
            lambda: t.rows("SELECT parked_at_ms, last_error FROM {schema}.outbox"),
            holds=lambda rs: bool(rs) and rs[0]["parked_at_ms"] is not None,
            what="the older relay to park the intent",
        )
        assert "UnknownCommand" in rows[0]["last_error"]
