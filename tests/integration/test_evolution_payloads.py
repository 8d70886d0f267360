"""Conformance EVO-08 (evolution.md E3, E4): payload versions of rows in flight.

Rows are written by a runtime with the old code (version 0) and delivered by a second runtime
on the same schema with the new code (version 1 and a payload migration): intents, timers,
schedule ticks and jobs. A row at a payload version above a runner's code is left due for a
newer runner, its attempts unchanged. The old and new code are two classes with one stored
name (``name=``), as two deployments of one application would be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: What the job executors below received, in order.
EXECUTED: list[dict[str, Any]] = []


@pytest.fixture(autouse=True)
def executed() -> Iterator[list[dict[str, Any]]]:
    EXECUTED.clear()
    yield EXECUTED
    EXECUTED.clear()


class Ledger(BaseModel):
    cents: int = 0
    got: list[dict[str, Any]] = []


# --- the receiver: v0 takes amount (whole euros), v1 takes cents ---------------------------------


class AccountV0(akter.Actor[Ledger], name="Account", access=akter.public):
    @akter.command
    async def deposit(self, amount: int) -> int:
        self.state.cents += amount * 100
        self.state.got.append({"amount": amount})
        return self.state.cents


class AccountV1(akter.Actor[Ledger], name="Account", access=akter.public):
    @akter.command(version=1)
    async def deposit(self, cents: int, currency: str = "EUR") -> int:
        self.state.cents += cents
        self.state.got.append({"cents": cents, "currency": currency})
        return self.state.cents

    @deposit.migrate_payload(from_version=0)
    def _cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100}


# --- senders of each version ------------------------------------------------------------------


class Empty(BaseModel):
    n: int = 0


class PayerV0(akter.Actor[Empty], name="Payer", access=akter.public):
    @akter.command
    async def pay(self, to: str, amount: int) -> None:
        self.send(AccountV0.deposit, to, amount)

    @akter.command
    async def pay_later(self, to: str, amount: int) -> None:
        self.later(after=timedelta(seconds=30)).send(AccountV0.deposit, to, amount)


class PayerV1(akter.Actor[Empty], name="Payer", access=akter.public):
    @akter.command
    async def pay(self, to: str, cents: int) -> None:
        self.send(AccountV1.deposit, to, cents)


# --- a schedule tick: v1 is at payload version 1 (ticks carry no arguments: the chain runs on {})

#: The stored tick payloads the v1 chain migrated.
MIGRATED_TICKS: list[dict[str, Any]] = []


class MeterV0(akter.Actor[Ledger], name="Meter", access=akter.public):
    @akter.command
    async def start(self) -> int:
        return self.state.cents

    @akter.schedule(every=timedelta(minutes=1))
    @akter.command
    async def tick(self) -> int:
        self.state.got.append({"v": 0})
        return 0


class MeterV1(akter.Actor[Ledger], name="Meter", access=akter.public):
    @akter.command
    async def start(self) -> int:
        return self.state.cents

    @akter.schedule(every=timedelta(minutes=1))
    @akter.command(version=1)
    async def tick(self) -> int:
        self.state.got.append({"v": 1})
        return 1

    @tick.migrate_payload(from_version=0)
    def _seen(old: dict[str, Any]) -> dict[str, Any]:
        MIGRATED_TICKS.append(dict(old))  # a test probe: real migrations are pure
        return old


# --- jobs: v0 payload {amount}, v1 payload {cents} --------------------------------------------


class ChargeV0(BaseModel):
    amount: int


class ChargeV1(BaseModel):
    cents: int


class ShopV0(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.command
    async def buy(self, amount: int) -> str:
        return self.enqueue(ShopV0.charge, ChargeV0(amount=amount))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5)
    async def charge(call: akter.JobCall, payload: ChargeV0) -> int:
        EXECUTED.append({"v": 0, **payload.model_dump()})
        return payload.amount


class ShopV1(akter.Actor[Empty], name="Shop", access=akter.public):
    @akter.command
    async def buy(self, cents: int) -> str:
        return self.enqueue(ShopV1.charge, ChargeV1(cents=cents))

    @akter.job(attempts=2, backoff=(0.01, 0.02), timeout=5, version=1)
    async def charge(call: akter.JobCall, payload: ChargeV1) -> int:
        EXECUTED.append({"v": 1, **payload.model_dump()})
        return payload.cents

    @charge.migrate_payload(from_version=0)
    def _cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100}


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def state(t: ActorTest, actor_type: str, actor_id: str) -> dict[str, Any] | None:
    rows = await t.rows(
        "SELECT state, state_version FROM {schema}.actors"
        " WHERE actor_type = %(type)s AND actor_id = %(id)s",
        {"type": actor_type, "id": actor_id},
    )
    return dict(rows[0]["state"]) if rows else None


# --- staging stores the payload version -------------------------------------------------------


async def test_EVO08_staging_stores_the_target_commands_payload_version(akter_test: Make) -> None:
    async with akter_test([PayerV1, ShopV1], relay=False) as t:
        await t.get(PayerV1, "p").pay("a1", 250)
        await t.get(ShopV1, "s").buy(7)
        rows = await outbox(t)
        assert sorted((r["kind"], r["command"], r["payload_version"]) for r in rows) == [
            ("intent", "deposit", 1),
            ("job", "charge", 1),
        ]


# --- intents and timers -----------------------------------------------------------------------


async def test_EVO08_an_intent_and_a_timer_staged_at_v0_are_migrated_by_v1_code(
    akter_test: Make,
) -> None:
    async with akter_test([PayerV0]) as t:
        await t.get(PayerV0, "p").pay("a1", 3)
        await t.get(PayerV0, "p").pay_later("a1", 5)
        staged = await outbox(t)
        assert [(r["command"], r["payload_version"]) for r in staged] == [
            ("deposit", 0),
            ("deposit", 0),
        ]
        assert all(r["target_type"] == "Account" for r in staged)
        await t.add_runtime([AccountV1])
        await t.advance(timedelta(seconds=31))  # the timer falls due; both are delivered
        account = await state(t, "Account", "a1")
        assert account is not None
        assert account["got"] == [
            {"cents": 300, "currency": "EUR"},
            {"cents": 500, "currency": "EUR"},
        ]
        assert account["cents"] == 800
        assert await outbox(t) == []


async def test_EVO08_an_intent_at_a_newer_payload_version_is_left_due_for_a_newer_runner(
    akter_test: Make,
) -> None:
    async with akter_test([PayerV1]) as t:
        await t.get(PayerV1, "p").pay("a1", 250)
        [before] = await outbox(t)
        assert before["payload_version"] == 1 and before["attempts"] == 0
        await t.add_runtime([AccountV0])  # an older runner: it knows version 0 only
        await t.drain()
        [after] = await outbox(t)
        assert after["attempts"] == 0, "the released claim must not count an attempt"
        assert after["parked_at_ms"] is None
        assert (after["payload"], after["payload_version"]) == (before["payload"], 1)
        assert "PayloadTooNew" in str(after["last_error"])
        assert await state(t, "Account", "a1") is None  # nothing delivered, nothing written
        # The older runner goes; a runner with the new code serves the row.
        await t.kill(1)
        await t.add_runtime([AccountV1])
        await t.advance(timedelta(seconds=2))
        account = await state(t, "Account", "a1")
        assert account is not None and account["got"] == [{"cents": 250, "currency": "EUR"}]
        assert await outbox(t) == []


# --- schedule ticks ---------------------------------------------------------------------------


async def test_EVO08_a_schedule_tick_written_at_v0_is_migrated_then_rewritten_at_v1(
    akter_test: Make,
) -> None:
    async with akter_test([MeterV0], relay=False) as t:
        await t.get(MeterV0, "m").start()  # the first commit writes the tick
        [tick] = await outbox(t)
        assert (tick["command"], tick["payload_version"]) == ("tick", 0)
        await t.kill(0)
        await t.add_runtime([MeterV1])
        MIGRATED_TICKS.clear()
        await t.advance(timedelta(minutes=1))
        meter = await state(t, "Meter", "m")
        assert meter is not None and meter["got"] == [{"v": 1}]
        assert MIGRATED_TICKS == [{}]  # the v0 tick went through the chain
        [next_tick] = await outbox(t)
        assert next_tick["payload_version"] == 1  # rewritten by the v1 code
        await t.advance(timedelta(minutes=1))
        meter = await state(t, "Meter", "m")
        assert meter is not None and meter["got"] == [{"v": 1}, {"v": 1}]
        assert MIGRATED_TICKS == [{}]  # a v1 tick needs no migration


# --- jobs -------------------------------------------------------------------------------------


async def test_EVO08_a_job_enqueued_at_v0_is_migrated_by_v1_code(akter_test: Make) -> None:
    async with akter_test([ShopV0], jobs=[]) as t:  # this runner executes no job
        await t.get(ShopV0, "s").buy(4)
        [job] = await outbox(t)
        assert (job["kind"], job["payload_version"]) == ("job", 0)
        await t.add_runtime([ShopV1], jobs=None)
        await t.drain()
        assert EXECUTED == [{"v": 1, "cents": 400}]
        assert await outbox(t) == []
        assert await t.rows("SELECT * FROM {schema}.dead_letters") == []


async def test_EVO08_a_job_at_a_newer_payload_version_is_left_due_with_its_attempts(
    akter_test: Make,
) -> None:
    async with akter_test([ShopV1], jobs=[]) as t:
        await t.get(ShopV1, "s").buy(9)
        [before] = await outbox(t)
        await t.add_runtime([ShopV0], jobs=None)  # older code executes the job type at version 0
        await t.drain()
        assert EXECUTED == []
        [after] = await outbox(t)
        for column in ("attempts", "ambiguous", "maybe_applied", "running", "payload"):
            assert after[column] == before[column], column
        assert after["parked_at_ms"] is None and after["payload_version"] == 1
        assert "PayloadTooNew" in str(after["last_error"])
        await t.kill(1)
        await t.add_runtime([ShopV1], jobs=None)
        await t.advance(timedelta(seconds=2))
        assert EXECUTED == [{"v": 1, "cents": 9}]
        assert await outbox(t) == []
