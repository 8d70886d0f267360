# ruff: noqa: F841  (the sketch binds results only to pin their types)
"""The typing sketch of the design (spec/typing-sketch/user.py) against the real package.

Adapted only in its import (``import akter`` instead of ``akter_stub``). ``mypy --strict`` must
report exactly the two deliberate errors at the end of ``main``.
"""

from __future__ import annotations

from pydantic import BaseModel

import akter


class OrderState(BaseModel):
    status: str = "new"
    charge_id: str | None = None


class Charge(BaseModel):
    order: str
    cents: int


class Stock(BaseModel):
    n: int = 0


class Inventory(akter.Actor[Stock]):
    @akter.command
    async def reserve(self, qty: int) -> int:
        self.state.n += qty
        return self.state.n


class Order(akter.Actor[OrderState]):
    @akter.command(creates=True)
    async def place(self, cents: int) -> str:
        self.state.status = "charging"
        self.enqueue(Order.charge, Charge(order=self.id, cents=cents), key="charge")
        self.send(Inventory.reserve, "sku", 2)
        self.later(after=5, key="r").send(Inventory.reserve, "sku", qty=1)
        return self.state.status

    @akter.job(attempts=4, per_actor=1)
    async def charge(call: akter.JobCall, req: Charge) -> str:
        return f"ch-{call.job_id}-{req.cents}"

    @charge.on_success
    async def charged(self, charge_id: str) -> None:
        self.state.charge_id = charge_id

    @charge.on_dead_letter
    async def charge_failed(self, letter: akter.DeadLetter) -> None:
        self.state.status = "failed"

    @akter.query
    async def status(self) -> str:
        return self.state.status


async def main(rt: akter.Runtime) -> None:
    order = rt.get(Order, "o-1", tenant="acme")
    s: str = await order.place(1200)
    s2: str = await order.with_command_id("x").place(1200)
    st: str = await order.status()
    bad: int = await order.place(1)  # should be an error
    await order.place("x")  # should be an error
