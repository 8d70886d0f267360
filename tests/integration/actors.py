"""Actors shared by the integration tests."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import akter


class Tally(BaseModel):
    n: int = 0
    applied: list[str] = []
    data: str = ""
    tags: dict[str, int] = {}


class Noted(akter.Event):
    k: int


class TooBig(akter.DeclaredError):
    limit: int
    asked: int


class NotListed(akter.DeclaredError):
    why: str


class Sink(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def put(self, k: int) -> int:
        self.state.n += k
        return self.state.n


RUNS: dict[str, int] = {}


def ran(key: str) -> None:
    RUNS[key] = RUNS.get(key, 0) + 1


class Counter(akter.Actor[Tally], access=akter.public, delivery_timeout=5):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        self.state.applied.append(self.command_id)
        return self.state.n

    @akter.command
    async def add_all(self, ks: list[int], meta: dict[str, int] | None = None) -> int:
        self.state.n += sum(ks)
        return self.state.n

    @akter.command(errors=[TooBig])
    async def take(self, k: int) -> int:
        if k > self.state.n:
            raise TooBig(limit=self.state.n, asked=k)
        self.state.n -= k
        return self.state.n

    @akter.command(errors=[TooBig])
    async def busy_then_fail(self, k: int) -> int:
        """Stages every kind of work, then fails with a declared error."""
        self.state.n += k
        self.emit(Noted(k=k))
        self.send(Sink.put, "s1", k)
        self.later(after=60, key="remind").send(Sink.put, "s1", k)
        self.enqueue(Counter.work, Job(k=k), key="w")
        self.cancel_job("other")
        raise TooBig(limit=0, asked=k)

    @akter.command
    async def stage_everything(self, k: int) -> int:
        ran(f"stage:{self.id}")
        self.state.n += k
        self.emit(Noted(k=k))
        self.send(Sink.put, "s1", k)
        self.later(after=60, key="remind").send(Sink.put, "s1", k)
        self.enqueue(Counter.work, Job(k=k), key="w")
        return self.state.n

    @akter.command
    async def caught(self, k: int) -> int:
        try:
            raise TooBig(limit=0, asked=k)
        except TooBig:
            pass
        self.state.n += k
        self.emit(Noted(k=k))
        return self.state.n

    @akter.command(errors=[TooBig])
    async def defect(self, kind: str) -> int:
        if kind == "boom":
            raise RuntimeError("boom")
        if kind == "unlisted":
            raise NotListed(why="not declared")
        if kind == "big":
            self.state.data = "x" * 70_000
        if kind == "events":
            for _ in range(3):
                self.emit(Noted(k=1))
                self.state.data = ""
            self.emit(_Huge(blob="y" * 1_100_000))
        if kind == "return":
            return "not an int"  # type: ignore[return-value]
        if kind == "state-type":
            self.state.n = "nope"  # type: ignore[assignment]
        return self.state.n

    @akter.command
    async def call_other(self) -> int:
        # A request/reply call from inside a turn is a defect.
        await _RUNTIME[0].get(Sink, "s1").put(1)
        return 0

    @akter.command
    async def escape(self) -> int:
        _ESCAPED.append(self)
        return 0

    @akter.command
    async def from_task(self) -> str:
        async def other() -> None:
            self.send(Sink.put, "s1", 1)

        try:
            await asyncio.create_task(other())
        except akter.CapabilityEscaped:
            return "escaped"
        return "not escaped"

    @akter.command
    async def slow_once(self, key: str) -> int:
        ran(key)
        if RUNS[key] == 1:
            await asyncio.sleep(5)
        self.state.n += 1
        return self.state.n

    @akter.command(internal=True)
    async def secret(self) -> int:
        return 1

    @akter.query
    async def value(self) -> int:
        return self.state.n

    @akter.query
    async def whole(self) -> Tally:
        return self.state

    @akter.query
    async def applied(self) -> list[str]:
        return self.state.applied

    @akter.query
    async def scribble(self) -> int:
        self.state.n = 99
        return 0

    @akter.job(attempts=2)
    async def work(call: akter.JobCall, payload: Job) -> int:
        return payload.k


class Job(BaseModel):
    k: int


class _Huge(akter.Event):
    blob: str


class Shop(akter.Actor[Tally], access=akter.public):
    @akter.command(creates=True, errors=[TooBig])
    async def open(self, budget: int) -> int:
        if budget < 0:
            raise TooBig(limit=0, asked=budget)
        self.state.n = budget
        return budget

    @akter.command
    async def spend(self, k: int) -> int:
        self.state.n -= k
        return self.state.n

    @akter.query
    async def left(self) -> int:
        return self.state.n


class Planner(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def plan(self, k: int) -> list[str]:
        first = self.create(Task.start, k)
        second = self.create(Task.start, k + 1)
        return [first.id, second.id]


class Task(akter.Actor[Tally], access=akter.public):
    @akter.command(creates=True)
    async def start(self, k: int) -> int:
        self.state.n = k
        return k


_RUNTIME: list[akter.Runtime] = []
_ESCAPED: list[Counter] = []

ALL = [Counter, Sink, Shop, Planner, Task]
