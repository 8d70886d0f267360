"""Actors with workflows for the workflow tests (WF-*), with counters of what really ran.

``CALLS`` counts handler and step executions in this process (a replayed step must not add to
it); the fake provider scripts the job steps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel

import akter
from akter.testing.provider import FakeProvider

CALLS: Counter[str] = Counter()
PROVIDER = FakeProvider()


class Shipped(BaseModel):
    tracking: str


class Note(BaseModel):
    text: str


class OutOfStock(akter.DeclaredError, tag="WfOutOfStock"):
    sku: str


class StockState(BaseModel):
    reserved: dict[str, int] = {}
    left: int = 3


class Stock(akter.Actor[StockState]):
    @akter.command(errors=[OutOfStock])
    async def reserve(self, order: str, qty: int = 1) -> int:
        CALLS[f"reserve:{order}"] += 1
        if self.state.left < qty:
            raise OutOfStock(sku=self.id)
        self.state.left -= qty
        self.state.reserved[order] = self.state.reserved.get(order, 0) + qty
        return self.state.left

    @akter.query
    async def left(self) -> int:
        return self.state.left


class Charge(BaseModel):
    order: str
    cents: int


class OrderState(BaseModel):
    marks: list[str] = []
    outcomes: list[akter.WorkflowOutcome[str]] = []
    started: list[str] = []


def compute_fee(cents: int) -> int:
    CALLS["fee"] += 1
    return cents // 10


async def flaky(name: str) -> str:
    CALLS[f"flaky:{name}"] += 1
    if CALLS[f"flaky:{name}"] < 3:
        raise RuntimeError(f"flaky {name} failed")
    return f"ok:{name}"


async def always_fails() -> int:
    CALLS["always_fails"] += 1
    raise RuntimeError("nope")


class Order(akter.Actor[OrderState]):
    @akter.command
    async def mark(self, text: str) -> int:
        CALLS[f"mark:{self.id}:{text}"] += 1
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.command
    async def begin(self, sku: str, key: str | None = None) -> str:
        run_id = self.start_workflow(Order.three, sku, key=key)
        self.state.started.append(run_id)
        return run_id

    @akter.command(errors=[OutOfStock])
    async def begin_then_fail(self, sku: str) -> str:
        self.start_workflow(Order.three, sku)
        raise OutOfStock(sku=sku)

    @akter.command
    async def ship(self, run_id: str, tracking: str) -> None:
        self.signal_workflow(run_id, Shipped(tracking=tracking))

    @akter.command
    async def stop_run(self, run_id: str) -> None:
        self.cancel_workflow(run_id)

    @akter.query
    async def marks(self) -> list[str]:
        return self.state.marks

    @akter.query
    async def outcomes(self) -> list[akter.WorkflowOutcome[str]]:
        return self.state.outcomes

    @akter.job(attempts=2, backoff=(0.01, 0.01), timeout=5)
    async def charge(call: akter.JobCall, payload: Charge) -> str:
        return str(await PROVIDER(call))

    @akter.workflow
    async def three(wf: akter.Workflow, sku: str) -> str:
        """Three command steps (WF-01)."""
        await wf.get(Order, wf.ref.id).mark("reserving")
        left = await wf.get(Stock, sku).reserve(wf.ref.id)
        await wf.get(Order, wf.ref.id).mark(f"left {left}")
        return f"reserved, {left} left"

    @akter.workflow(timeout=timedelta(days=7))
    async def fulfil(wf: akter.Workflow, sku: str, cents: int) -> str:
        """The spec's example: commands, a job, a signal wait with a timeout, a step, a sleep."""
        await wf.get(Order, wf.ref.id).mark("reserving")
        await wf.get(Stock, sku).reserve(wf.ref.id)
        charge_id = await wf.job(Order.charge, Charge(order=wf.ref.id, cents=cents))
        shipped = await wf.wait(Shipped, timeout=timedelta(hours=48))
        if shipped is None:
            await wf.get(Order, wf.ref.id).mark("refund")
            return "refunded"
        fee = await wf.step(compute_fee, cents)
        await wf.sleep(timedelta(days=1))
        await wf.get(Order, wf.ref.id).mark(f"closed {shipped.tracking} fee {fee}")
        return charge_id

    @fulfil.on_complete
    async def fulfilled(self, outcome: akter.WorkflowOutcome[str]) -> None:
        CALLS[f"on_complete:{outcome.run_id}"] += 1
        self.state.outcomes.append(outcome)

    @akter.workflow
    async def sleeper(wf: akter.Workflow, hours: int) -> str:
        await wf.sleep(timedelta(hours=hours))
        return "woke"

    @akter.workflow
    async def waiter(wf: akter.Workflow, n: int, timeout_s: float = 3600) -> list[str]:
        got: list[str] = []
        for _ in range(n):
            note = await wf.wait(Note, timeout=timedelta(seconds=timeout_s))
            got.append("timeout" if note is None else note.text)
        return got

    @akter.workflow
    async def local(wf: akter.Workflow) -> list[str]:
        first = await wf.step(flaky, "a", attempts=5, backoff=(0.001, 0.002))
        stamp = wf.now()
        ident = wf.uuid4()
        roll = wf.random()
        await wf.get(Order, wf.ref.id).mark(f"{stamp.isoformat()} {ident} {roll}")
        return [first, stamp.isoformat(), str(ident), str(roll)]

    @akter.workflow
    async def failing(wf: akter.Workflow) -> int:
        return await wf.step(always_fails, attempts=2, backoff=(0.001, 0.001))

    @akter.workflow
    async def declared(wf: akter.Workflow, sku: str) -> int:
        return await wf.get(Stock, sku).reserve(wf.ref.id, 100)

    @akter.workflow
    async def paid(wf: akter.Workflow, cents: int) -> str:
        try:
            return await wf.job(Order.charge, Charge(order=wf.ref.id, cents=cents))
        except akter.JobDeadLettered as exc:
            return f"dead:{exc.letter.ambiguous}"
        except akter.JobCancelled as exc:
            return f"cancelled:{exc.report.outcome.kind}"

    @akter.workflow
    async def compensating(wf: akter.Workflow) -> str:
        await wf.get(Order, wf.ref.id).mark("reserve")
        try:
            await wf.wait(Shipped)
        except akter.WorkflowCancelled:
            await wf.get(Order, wf.ref.id).mark("compensate")
            raise
        return "shipped"

    @compensating.on_complete
    async def compensated(self, outcome: akter.WorkflowOutcome[str]) -> None:
        CALLS[f"on_complete:{outcome.run_id}"] += 1
        self.state.outcomes.append(outcome)


def nul_text() -> str:
    CALLS["nul_text"] += 1
    return "a\x00b"


def huge_text() -> str:
    return "x" * (1 << 20)


class Careless(akter.Actor[OrderState]):
    """Workflows that misuse control flow: the engine must not be fooled."""

    @akter.command
    async def mark(self, text: str) -> int:
        CALLS[f"careless:{self.id}:{text}"] += 1
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.workflow
    async def swallows(wf: akter.Workflow) -> str:
        try:
            await wf.wait(Shipped)
        except BaseException:
            pass
        await wf.get(Careless, wf.ref.id).mark("after the wait")
        return "ran past its suspension"

    @akter.workflow
    async def parallel(wf: akter.Workflow) -> list[int]:
        mine = wf.get(Careless, wf.ref.id)
        return list(await asyncio.gather(mine.mark("x"), mine.mark("y")))

    @akter.workflow
    async def capped(wf: akter.Workflow) -> str:
        first = await wf.job(Careless.ship, Charge(order="1", cents=1))
        second = await wf.job(Careless.ship, Charge(order="2", cents=2))
        return f"{first} {second}"

    @akter.workflow
    async def nan_result(wf: akter.Workflow) -> float:
        return float("nan")

    @akter.workflow
    async def nul_step(wf: akter.Workflow) -> str:
        return await wf.step(nul_text)

    @akter.workflow
    async def huge_step(wf: akter.Workflow) -> str:
        return await wf.step(huge_text)

    @akter.job(per_actor=1)
    async def ship(call: akter.JobCall, payload: Charge) -> str:
        return f"shipped {payload.order}"


ALL = [Order, Stock, Careless]
