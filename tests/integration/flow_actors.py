"""Actors of the flow-control tests (docs/flow-control.md; no tests here).

Every executor appends ``(job, tag)`` to :data:`STARTS` when its call starts, so a test reads the
order in which attempts started; ``capped`` calls hold until :data:`GATE` is set and count how
many run at once in this process (:data:`LIVE`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field

import akter

#: (job, tag) of every call, in start order.
STARTS: list[tuple[str, str]] = []


class Live:
    """Calls of ``capped`` running now in this process, and the most seen at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.gate = asyncio.Event()

    def reset(self) -> None:
        """Forget every call (the fixture calls it around each test)."""
        self.now = self.most = 0
        self.gate = asyncio.Event()


LIVE = Live()


class Item(BaseModel):
    tag: str


class Tally(BaseModel):
    seen: list[str] = Field(default_factory=list)


class Lanes(akter.Actor[Tally], access=akter.public):
    """Enqueues rows of each priority lane."""

    @akter.command
    async def fill(self, n: int, tag: str, priority: int | None = None) -> list[str]:
        """``n`` rows of ``work`` tagged ``tag-i``, at ``priority`` (default: the job's)."""
        return [
            self.enqueue(Lanes.work, Item(tag=f"{tag}-{i}"), priority=priority) for i in range(n)
        ]

    @akter.command
    async def spread(self, high: int, every: float) -> list[str]:
        """One ``aging`` and one strict low row due now, then a steady high-priority load.

        The load: ``high`` priority-9 rows of ``work`` becoming due ``every`` seconds apart.
        """
        ids = [
            self.enqueue(Lanes.aging, Item(tag="aged")),
            self.enqueue(Lanes.work, Item(tag="strict"), priority=0),
        ]
        for i in range(high):
            ids.append(
                self.enqueue(Lanes.work, Item(tag=f"high-{i}"), priority=9, after=every * (i + 1))
            )
        return ids

    @akter.command
    async def bad_priority(self, priority: Any) -> str:
        """Enqueue with a priority the caller chose (refused unless 0-9)."""
        return self.enqueue(Lanes.work, Item(tag="bad"), priority=priority)

    @akter.job(attempts=2, backoff=(0.01, 0.01))
    async def work(call: akter.JobCall, item: Item) -> None:
        STARTS.append(("work", item.tag))

    @akter.job(attempts=2, backoff=(0.01, 0.01), max_wait=2)
    async def aging(call: akter.JobCall, item: Item) -> None:
        STARTS.append(("aging", item.tag))


class Slots(akter.Actor[Tally], access=akter.public):
    """Enqueues ``capped`` jobs: at most two attempts at once across every runner."""

    @akter.command
    async def fill(self, n: int) -> list[str]:
        """``n`` rows of ``capped``."""
        return [self.enqueue(Slots.capped, Item(tag=f"{self.ref.id}-{i}")) for i in range(n)]

    @akter.command
    async def fill_paired(self, n: int) -> list[str]:
        """``n`` rows of ``paired`` (per_actor=1 and concurrency=2)."""
        return [self.enqueue(Slots.paired, Item(tag=f"{self.ref.id}-{i}")) for i in range(n)]

    @akter.job(attempts=3, backoff=(0.01, 0.01), concurrency=2)
    async def capped(call: akter.JobCall, item: Item) -> str:
        STARTS.append(("capped", item.tag))
        LIVE.now += 1
        LIVE.most = max(LIVE.most, LIVE.now)
        try:
            await LIVE.gate.wait()
        finally:
            LIVE.now -= 1
        return item.tag

    @capped.on_success
    async def capped_done(self, tag: str) -> None:
        self.state.seen.append(tag)

    @akter.job(attempts=3, backoff=(0.01, 0.01), concurrency=2, per_actor=1)
    async def paired(call: akter.JobCall, item: Item) -> str:
        STARTS.append(("paired", item.tag))
        LIVE.now += 1
        LIVE.most = max(LIVE.most, LIVE.now)
        try:
            await LIVE.gate.wait()
        finally:
            LIVE.now -= 1
        return item.tag

    @paired.on_success
    async def paired_done(self, tag: str) -> None:
        self.state.seen.append(tag)

    @akter.query
    async def seen(self) -> list[str]:
        """The tags routed back, in order."""
        return self.state.seen


def _tenant_key(call: akter.JobCall) -> str:
    return call.tenant


def _broken_key(call: akter.JobCall) -> str:
    raise ValueError(f"no key for {call.ref.id}")


class Metered(akter.Actor[Tally], access=akter.public):
    """Enqueues rate-limited jobs.

    ``metered``: 6 per minute per tenant (burst 2) and 20 per second overall; ``unkeyable``:
    its key function raises.
    """

    @akter.command
    async def fill(self, n: int) -> list[str]:
        """``n`` rows of ``metered``."""
        return [self.enqueue(Metered.metered, Item(tag=f"{self.ref.id}-{i}")) for i in range(n)]

    @akter.command
    async def fill_broken(self) -> str:
        """One row of ``unkeyable``."""
        return self.enqueue(Metered.unkeyable, Item(tag="broken"))

    @akter.job(
        attempts=2,
        backoff=(0.01, 0.01),
        rate=[akter.Rate(6, per=60, key=_tenant_key, burst=2), akter.Rate(20, per=1)],
    )
    async def metered(call: akter.JobCall, item: Item) -> str:
        STARTS.append(("metered", item.tag))
        return item.tag

    @metered.on_success
    async def metered_done(self, tag: str) -> None:
        self.state.seen.append(tag)

    @akter.job(attempts=3, backoff=(0.01, 0.01), rate=akter.Rate(10, key=_broken_key))
    async def unkeyable(call: akter.JobCall, item: Item) -> None:
        STARTS.append(("unkeyable", item.tag))

    @unkeyable.on_dead_letter
    async def unkeyable_dead(self, letter: akter.DeadLetter[Item]) -> None:
        self.state.seen.append(f"dead: {letter.cause} after {letter.attempts}")

    @akter.query
    async def seen(self) -> list[str]:
        """The tags routed back, in order."""
        return self.state.seen


class Pending(BaseModel):
    pending: list[str] = Field(default_factory=list)
    batches: list[list[str]] = Field(default_factory=list)


class Search(akter.Actor[Pending], access=akter.public):
    """The debounce recipe (docs/flow-control.md).

    A keyed timer replaced on every event, the events batched in state, flushed once ``after``
    the last one.
    """

    @akter.command
    async def typed(self, text: str) -> None:
        """One event: kept in state; the pending flush moves to 2 s from now."""
        self.state.pending.append(text)
        self.later(after=2, key="flush").send(Search.flush, self.id)

    @akter.command
    async def flush(self) -> None:
        """The debounced action: every event since the last flush, once."""
        self.state.batches.append(self.state.pending)
        self.state.pending = []

    @akter.query
    async def batches(self) -> list[list[str]]:
        """The flushed batches, in order."""
        return self.state.batches


FLOW: list[type[akter.Actor[Any]]] = [Lanes, Slots, Metered, Search]
