"""Conformance: stable names, aliases and event versions over durable data (evolution E2, E3).

Each test runs two code versions as two sets of classes: a v1 harness writes rows and exits
keeping its schema, then a v2 harness on the same schema reads, delivers and replays them.
EVO-06 (command aliases: intents, timers, receipts, conflicts), EVO-07 (a class renamed with
``name=``, both placements) and the event part of EVO-08 (event versions, aliases, raw rows).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import akter
from akter.callers import ActorRef
from akter.testing import ActorTest

pytestmark = pytest.mark.timeout(120)


class Bal(BaseModel):
    cents: int = 0


# --- v1 ------------------------------------------------------------------------------------


class AccountV1(akter.Actor[Bal], name="Account", access=akter.public):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.command
    async def gift(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.command
    async def close(self) -> int:
        return self.state.cents


class SenderV1(akter.Actor[Bal], name="Sender", access=akter.public):
    @akter.command
    async def pay(self, cents: int) -> None:
        self.send(AccountV1.deposit, "a", cents)

    @akter.command
    async def pay_later(self, cents: int) -> None:
        self.later(after=60).send(AccountV1.deposit, "a", cents)

    @akter.command
    async def give(self, cents: int) -> None:
        self.send(AccountV1.gift, "a", cents)


# --- v2: deposit renamed to credit, gift renamed to tip with a new defaulted argument ---------


class AccountV2(akter.Actor[Bal], name="Account", access=akter.public):
    @akter.command(aliases=("deposit",))
    async def credit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.command(aliases=("gift",), version=1)
    async def tip(self, cents: int, note: str = "thanks") -> int:
        self.state.cents += cents
        return self.state.cents

    @tip.migrate_payload(from_version=0)
    def _note(old: dict[str, Any]) -> dict[str, Any]:
        return {**old, "note": "thanks"}

    @akter.command
    async def close(self) -> int:
        return self.state.cents


class SenderV2(akter.Actor[Bal], name="Sender", access=akter.public):
    @akter.command
    async def idle(self) -> None:
        return None


@asynccontextmanager
async def version(
    url: str, schema: str, actors: Sequence[type[Any]], *, keep: bool
) -> AsyncIterator[ActorTest]:
    """One code version on the shared schema (no background relay: drains deliver)."""
    async with ActorTest(
        actors, database_url=url, schema=schema, keep_schema=keep, relay=False
    ) as t:
        yield t


def fresh_schema() -> str:
    return f"akter_t_{uuid.uuid4().hex[:12]}"


async def balance(t: ActorTest, actor_id: str = "a") -> int:
    [row] = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = %(id)s",
        {"id": actor_id},
    )
    return int(row["state"]["cents"])


async def account_receipts(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT actor_id, command_id, command, payload_hash, outcome FROM {schema}.receipts"
        " WHERE actor_type = 'Account' ORDER BY command_id"
    )


async def durable(t: ActorTest) -> dict[str, list[dict[str, Any]]]:
    """Every row a refusal must leave as it was."""
    return {
        table: await t.rows(f"SELECT * FROM {{schema}}.{table} ORDER BY 1, 2, 3, 4")
        for table in ("actors", "receipts", "outbox", "events")
    }


# --- EVO-06: command aliases ----------------------------------------------------------------


async def test_EVO06_an_intent_and_a_timer_to_an_old_name_are_delivered_once(
    akter_db: str,
) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [AccountV1, SenderV1], keep=True) as v1:
        await v1.get(SenderV1, "s").pay(5)
        await v1.get(SenderV1, "s").pay_later(7)
        pending = await v1.rows("SELECT intent_id, command FROM {schema}.outbox ORDER BY due_at_ms")
        assert [r["command"] for r in pending] == ["deposit", "deposit"]

    async with version(akter_db, schema, [AccountV2, SenderV2], keep=False) as v2:
        await v2.drain()
        assert await balance(v2) == 5
        await v2.advance(61)
        assert await balance(v2) == 12
        assert await v2.rows("SELECT * FROM {schema}.outbox") == []
        receipts = await account_receipts(v2)
        # One receipt per row, under its intent id, written under the current (canonical) name.
        assert sorted(r["command_id"] for r in receipts) == sorted(r["intent_id"] for r in pending)
        assert {r["command"] for r in receipts} == {"credit"}
        await v2.advance(120)
        assert await balance(v2) == 12
        assert v2.runtime._relay.retried == 0


async def test_EVO06_an_old_receipt_replays_by_the_new_name(akter_db: str) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [AccountV1], keep=True) as v1:
        cid = await v1.runtime.mint_command_id()
        assert await v1.get(AccountV1, "b").with_command_id(cid).deposit(7) == 7
        [written] = await account_receipts(v1)
        assert written["command"] == "deposit"

    async with version(akter_db, schema, [AccountV2], keep=False) as v2:
        before = await durable(v2)
        # The same id and payload under the new name: the stored outcome, nothing run again.
        assert await v2.get(AccountV2, "b").with_command_id(cid).credit(7) == 7
        assert await durable(v2) == before
        assert await balance(v2, "b") == 7
        # A fresh call is receipted under the canonical name.
        assert await v2.get(AccountV2, "b").credit(1) == 8
        commands = sorted(r["command"] for r in await account_receipts(v2))
        assert commands == ["credit", "deposit"]


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda h: h.credit(8), "another payload under the alias's new name"),
        (lambda h: h.close(), "another command"),
        (lambda h: h.tip(7), "another renamed command with the same payload"),
    ],
)
async def test_EVO06_conflicts_are_still_detected_across_the_alias(
    akter_db: str, call: Any, why: str
) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [AccountV1], keep=True) as v1:
        cid = await v1.runtime.mint_command_id()
        assert await v1.get(AccountV1, "b").with_command_id(cid).deposit(7) == 7

    async with version(akter_db, schema, [AccountV2], keep=False) as v2:
        before = await durable(v2)
        with pytest.raises(akter.ActorError) as refused:
            await call(v2.get(AccountV2, "b").with_command_id(cid))
        assert refused.value.reason == "CommandConflict", why
        assert await durable(v2) == before


async def test_EVO06_a_redelivery_across_a_payload_migration_replays(akter_db: str) -> None:
    """A redelivery of a row whose payload now decodes differently replays its receipt.

    v1 delivered an intent and committed, but its row's delete was lost; v2 changed the
    command's payload (a migration adds a defaulted argument), so the same stored row hashes
    differently now. Delivered once, not a conflict.
    """
    schema = fresh_schema()
    async with version(akter_db, schema, [AccountV1, SenderV1], keep=True) as v1:
        await v1.get(SenderV1, "s").give(3)
        v1.crash_next("before_outbox_delete")
        assert await v1.runtime._relay.run_pass() == 1
        await v1.runtime._relay.wait_idle()
        [claimed] = await v1.rows("SELECT intent_id, due_at_ms FROM {schema}.outbox")
        [receipt] = await account_receipts(v1)
        assert receipt["command_id"] == claimed["intent_id"] and receipt["command"] == "gift"
        assert await balance(v1) == 3

    async with version(akter_db, schema, [AccountV2, SenderV2], keep=False) as v2:
        await v2.advance(max(0, int(claimed["due_at_ms"]) - await v2.now_ms()) / 1000 + 1)
        assert await v2.rows("SELECT * FROM {schema}.outbox") == []
        assert await balance(v2) == 3
        assert await account_receipts(v2) == [receipt]
        assert v2.runtime._relay.retried == 0 and v2.runtime._relay.delivered == 1


# --- EVO-07: a class renamed with name= keeps its data ----------------------------------------


class Opened(akter.Event, tag="names.Opened"):
    by: int


class Shelf(BaseModel):
    items: int = 0
    reminded: int = 0


def _shop_classes(placement: Literal["tenant", "actor"]) -> tuple[type[Any], type[Any]]:
    class Shop(akter.Actor[Shelf], access=akter.public, placement=placement, events=[Opened]):
        @akter.command
        async def stock(self, n: int) -> int:
            self.state.items += n
            self.emit(Opened(by=n))
            self.later(after=60).send(Shop.remind, self.ref.id)
            return self.state.items

        @akter.command
        async def remind(self) -> int:
            self.state.reminded += 1
            return self.state.reminded

        @akter.query
        async def items(self) -> int:
            return self.state.items

    class Store(
        akter.Actor[Shelf], name="Shop", access=akter.public, placement=placement, events=[Opened]
    ):
        @akter.command
        async def stock(self, n: int) -> int:
            self.state.items += n
            self.emit(Opened(by=n))
            return self.state.items

        @akter.command
        async def remind(self) -> int:
            self.state.reminded += 1
            return self.state.reminded

        @akter.query
        async def items(self) -> int:
            return self.state.items

    return Shop, Store


@pytest.mark.parametrize("placement", ["tenant", "actor"])
async def test_EVO07_a_class_renamed_with_name_keeps_its_data(
    akter_db: str, placement: Literal["tenant", "actor"]
) -> None:
    shop_v1, store_v2 = _shop_classes(placement)
    schema = fresh_schema()
    async with version(akter_db, schema, [shop_v1], keep=True) as v1:
        cid = await v1.runtime.mint_command_id()
        assert await v1.get(shop_v1, "x", tenant="t1").with_command_id(cid).stock(4) == 4
        keyed = await v1.rows("SELECT routing_key, actor_type FROM {schema}.actors")

    async with version(akter_db, schema, [store_v2], keep=False) as v2:
        shop = v2.get(store_v2, "x", tenant="t1")
        # The same rows under the same key: state, receipts, events, the pending timer.
        assert await v2.rows("SELECT routing_key, actor_type FROM {schema}.actors") == keyed
        assert await shop.items() == 4
        assert await shop.with_command_id(cid).stock(4) == 4  # replayed, not run again
        assert await shop.items() == 4
        page = await shop.events()
        assert [(r.tag, r.event) for r in page] == [("names.Opened", Opened(by=4))]
        await v2.advance(61)
        [row] = await v2.rows("SELECT state FROM {schema}.actors")
        assert row["state"] == {"items": 4, "reminded": 1}
        assert await v2.rows("SELECT * FROM {schema}.outbox") == []


# --- EVO-08 (events): versions, aliases, rows this code cannot decode -------------------------


class PaidV0(akter.Event, tag="names.Paid"):
    amount: int


class PaidV1(akter.Event, tag="names.Paid", version=1):
    cents: int


@PaidV1.migrate(from_version=0)
def _cents(old: dict[str, Any]) -> dict[str, Any]:
    if old["amount"] < 0:
        raise ValueError("a negative amount cannot be migrated")
    return {"cents": old.pop("amount") * 100}


class Charged(akter.Event, tag="names.Charged"):
    cents: int


class Settled(akter.Event, tag="names.Settled", aliases=("names.Charged",)):
    cents: int


class TillV1(akter.Actor[Bal], name="Till", access=akter.public, events=[PaidV0, Charged]):
    @akter.command
    async def pay(self, amount: int) -> None:
        self.emit(PaidV0(amount=amount))

    @akter.command
    async def charge(self, cents: int) -> None:
        self.emit(Charged(cents=cents))

    @akter.query
    async def paid(self) -> list[Any]:
        return [r.event for r in await self.events()]


class TillV2(akter.Actor[Bal], name="Till", access=akter.public, events=[PaidV1, Settled]):
    @akter.command
    async def pay(self, cents: int) -> None:
        self.emit(PaidV1(cents=cents))

    @akter.command
    async def settle(self, cents: int) -> None:
        self.emit(Settled(cents=cents))

    @akter.query
    async def paid(self) -> list[Any]:
        return [(r.event, r.version, r.raw) for r in await self.events()]


async def test_EVO08_events_store_their_class_version(akter_db: str) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [TillV1], keep=True) as v1:
        await v1.get(TillV1, "t").pay(2)
    async with version(akter_db, schema, [TillV2], keep=False) as v2:
        await v2.get(TillV2, "t").pay(300)
        rows = await v2.rows("SELECT seq, tag, payload, payload_version FROM {schema}.events")
        assert sorted((r["seq"], r["payload_version"]) for r in rows) == [(1, 0), (2, 1)]


async def test_EVO08_an_old_event_is_read_through_the_migration_by_every_reader(
    akter_db: str,
) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [TillV1], keep=True) as v1:
        await v1.get(TillV1, "t").pay(2)
        await v1.get(TillV1, "t").pay(-1)  # its migration raises: read raw, never wedging
        await v1.get(TillV1, "t").pay(3)

    async with version(akter_db, schema, [TillV2], keep=False) as v2:
        till = v2.get(TillV2, "t")
        expected = [
            (PaidV1(cents=200), 1, False),
            ({"amount": -1}, 0, True),
            (PaidV1(cents=300), 1, False),
        ]
        # runtime.read_events and a handle's page
        ref = ActorRef("default", "Till", "t")
        for page in (await v2.runtime.read_events(ref), await till.events()):
            assert [(r.event, r.version, r.raw) for r in page] == expected
        # a query's self.events
        assert await till.paid() == expected
        # a live feed: replays the three, then follows a new commit
        seen: list[Any] = []
        async with asyncio.timeout(10):
            async for record in till.events():
                seen.append((record.event, record.version, record.raw))
                if len(seen) == 3:
                    await till.pay(400)
                if len(seen) == 4:
                    break
        assert seen == [*expected, (PaidV1(cents=400), 1, False)]


async def test_EVO08_an_event_newer_than_the_code_is_returned_raw_and_marked(
    akter_db: str,
) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [TillV2], keep=True) as v2:
        await v2.get(TillV2, "t").pay(500)
    # The older code (a rollback) reads an event at version 1 it does not know: not guessed.
    async with version(akter_db, schema, [TillV1], keep=False) as v1:
        [record] = await v1.get(TillV1, "t").events()
        assert record.raw and record.version == 1
        assert record.event == {"cents": 500} and record.tag == "names.Paid"
        assert await v1.get(TillV1, "t").paid() == [{"cents": 500}]


async def test_EVO08_an_event_alias_decodes_rows_stored_under_the_old_tag(akter_db: str) -> None:
    schema = fresh_schema()
    async with version(akter_db, schema, [TillV1], keep=True) as v1:
        await v1.get(TillV1, "t").charge(9)
    async with version(akter_db, schema, [TillV2], keep=False) as v2:
        await v2.get(TillV2, "t").settle(10)
        page = await v2.get(TillV2, "t").events()
        # The stored tag is kept on the record; the event is the renamed class.
        assert [(r.tag, r.event, r.raw) for r in page] == [
            ("names.Charged", Settled(cents=9), False),
            ("names.Settled", Settled(cents=10), False),
        ]


def test_the_client_decodes_a_frame_through_its_own_class() -> None:
    from datetime import UTC, datetime

    from akter.actor import definition_of
    from akter.client import _event_record

    at = datetime(2026, 12, 2, tzinfo=UTC).isoformat()
    frame = {"cursor": "1", "tag": "names.Paid", "command_id": "c", "emitted_at": at}
    v2 = definition_of(TillV2)
    # A server at v0 sends the stored v0 payload: this client migrates it.
    decoded = _event_record(v2, {**frame, "event": {"amount": 1}, "version": 0})
    assert (decoded.event, decoded.version, decoded.raw) == (PaidV1(cents=100), 1, False)
    # A server at v1 sends a v1 payload to a client at v0: raw, its version visible.
    older = _event_record(definition_of(TillV1), {**frame, "event": {"cents": 1}, "version": 1})
    assert (older.event, older.version, older.raw) == ({"cents": 1}, 1, True)
    # An alias, and a frame from a server that predates versions (no "version" key).
    alias = _event_record(v2, {**frame, "tag": "names.Charged", "event": {"cents": 2}})
    assert (alias.event, alias.version) == (Settled(cents=2), 0)


async def test_EVO08_the_http_event_feed_sends_decoded_events_with_their_version(
    akter_db: str,
) -> None:
    import json

    from akter.callers import User
    from akter.http._sse import _event_frames

    schema = fresh_schema()
    async with version(akter_db, schema, [TillV1], keep=True) as v1:
        await v1.get(TillV1, "t").pay(2)
        await v1.get(TillV1, "t").pay(-1)
    async with version(akter_db, schema, [TillV2], keep=False) as v2:
        ref = ActorRef("default", "Till", "t")
        frames = _event_frames(v2.runtime, ref, None, User("alice"))
        try:
            async with asyncio.timeout(10):
                got = [await anext(frames), await anext(frames)]
        finally:
            await frames.aclose()  # type: ignore[attr-defined]  # an async generator
        data = [json.loads(f.split("data: ", 1)[1]) for f in got]
        assert [(d["tag"], d["event"], d["version"]) for d in data] == [
            ("names.Paid", {"cents": 200}, 1),  # decoded through the migration
            ("names.Paid", {"amount": -1}, 0),  # raw: its migration fails
        ]
