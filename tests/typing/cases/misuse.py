"""Misuse of the contract that must fail to type-check: each marked line, and nothing else.

A line ending in ``# E: <code>`` must get exactly one mypy error with that error code.
"""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa
from pydantic import BaseModel

import akter


class Charge(BaseModel):
    cents: int


class Refund(BaseModel):
    cents: int


class Stock(BaseModel):
    n: int = 0


class Inventory(akter.Actor[Stock]):
    @akter.command
    async def reserve(self, sku: str, qty: int) -> int:
        self.state.n += qty
        return self.state.n


shelf = sa.Table("shelf", sa.MetaData(), *akter.owner_columns(), sa.Column("n", sa.Integer))


class Order(akter.Actor[Stock], tables=[shelf]):
    @akter.command
    async def place(self, cents: int) -> str:
        self.send(Inventory.reserve, "i-1", "sku", "two")  # E: arg-type
        self.send(Inventory.reserve, "i-1", "sku")  # E: call-arg
        self.send(Inventory.reserve, "i-1", sku="a", qty=1, extra=True)  # E: call-arg
        self.later(after=5).send(Inventory.reserve, "i-1", sku="a", qty="1")  # E: arg-type
        self.enqueue(Order.charge, Refund(cents=cents))  # E: misc
        self.state.n = "many"  # E: assignment
        return 1  # E: return-value

    @akter.query
    async def peek(self: akter.QueryView[Stock]) -> int:
        self.send(Inventory.reserve, "i-1", "sku", 1)  # E: attr-defined
        self.later(after=5)  # E: attr-defined
        self.enqueue(Order.charge, Charge(cents=1))  # E: attr-defined
        self.state = Stock(n=1)  # E: misc
        self.rows(shelf).insert({"n": 1})  # E: attr-defined
        return self.state.n

    @akter.job(attempts=2)
    async def charge(call: akter.JobCall, req: Charge) -> str:
        return call.job_id

    @charge.on_success  # E: arg-type
    async def charged(self, charge_id: int) -> None:
        self.state.n = charge_id


async def main(rt: akter.Runtime) -> None:
    order = rt.get(Order, "o-1")
    await order.place(cents="1")  # E: arg-type
    await order.refund(1)  # E: attr-defined
    rt.get(Charge, "c-1")  # E: type-var
    order.job_stream("v1.1.2.x", after="3")  # E: arg-type
    async for item in order.job_stream("v1.1.2.x"):
        print(item.attempt + 1)  # E: operator


# --- evolution: migrations with the wrong signature (evolution E1, E3) -----------------------


class Evolving(akter.Actor[Stock]):
    @akter.command(version=1)
    async def deposit(self, cents: int) -> int:
        return cents

    @deposit.migrate_payload(from_version=0)  # E: arg-type
    @staticmethod
    def _bad_payload(old: int) -> dict[str, Any]:
        return {}

    @akter.migrate_state(from_version=0)  # E: arg-type
    @staticmethod
    def _bad_state(old: dict[str, Any]) -> str:
        return ""


# --- workflows: arguments and results are checked (WF-11) ---------------------------------------


class Flow(akter.Actor[Stock]):
    @akter.workflow
    async def fulfil(wf: akter.Workflow, sku: str) -> str:
        return sku


async def workflows(rt: akter.Runtime) -> None:
    handle = rt.get(Flow, "f-1")
    await handle.fulfil.start(5)  # E: arg-type
    await handle.fulfil.start("sku", extra=1)  # E: call-arg
    run = await handle.fulfil.start("sku")
    count: int = await run.result()  # E: assignment
    assert count


# --- job resources: the value must be the key's type ---------------------------------------------

MAILER = akter.Resource[int]("mailer")
akter.Resources().provide(MAILER, "many")  # E: misc


class MeterState(BaseModel):
    n: int = 0


class Meter(akter.Actor[MeterState], access=akter.public):
    @akter.query(watch=True)
    async def level(self, floor: int) -> int:
        return floor

    @akter.query
    async def plain(self) -> int:
        return 0


async def live(rt: akter.Runtime) -> None:
    meter = rt.get(Meter, "m-1")
    meter.level.watch("high")  # E: arg-type
    meter.plain.watch()  # E: attr-defined
    async for value in meter.level.watch(1):
        text: str = value  # E: assignment
        del text


# --- synchronous code: a blocking handle checks the member, its arguments and its result ------


def sync_code(rt: akter.SyncRuntime) -> None:
    order = rt.get(Order, "o-1")
    order.call(Order.place, cents="1")  # E: arg-type
    order.call(Order.place, 1, 2)  # E: call-arg
    order.call(Inventory.reserve, "sku", 1)  # E: arg-type
    wrong: int = order.call(Order.place, 1)  # E: assignment
    rt.call(Inventory.reserve, "i-1", sku="a", qty="1")  # E: arg-type
    rt.get(Flow, "f-1").start(Flow.fulfil, 5)  # E: arg-type
    rt.runtime.get(Order, "o-1").place(1)  # E: unused-coroutine
    assert wrong


# --- staging: the checked spelling checks the command's parameters -------------------------------


def staging() -> None:
    stager = akter.stage(psycopg.connect(""), Inventory, "i-1")
    stager.send(Inventory.reserve, "sku", "two")  # E: arg-type
    stager.send(Inventory.reserve, "sku")  # E: call-arg
    stager.send(Order.place, 5)  # E: arg-type
    count: int = stager.reserve(sku="a", qty=1)  # E: assignment
    assert count
