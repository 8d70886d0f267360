"""Actors of the telemetry tests: intents, a timer and a job whose attempt a test can hold."""

from __future__ import annotations

from pydantic import BaseModel

import akter
from akter.testing.provider import FakeProvider

PROVIDER = FakeProvider()


class Count(BaseModel):
    n: int = 0


class Nothing(BaseModel):
    pass


class Pong(akter.Actor[Count], access=akter.public):
    @akter.command
    async def got(self, k: int) -> int:
        self.state.n += k
        return self.state.n


class Pinger(akter.Actor[Count], access=akter.public):
    @akter.command
    async def ping(self, n: int) -> int:
        """Sends ``n`` intents, one to each of ``Pong/p0`` … ``Pong/p<n-1>``."""
        for i in range(n):
            self.send(Pong.got, f"p{i}", 1)
        return n

    @akter.command
    async def remind(self, after: float) -> None:
        """Sets a timer that delivers ``Pong.got`` to ``Pong/t`` after ``after`` seconds."""
        self.later(after=after, key="reminder").send(Pong.got, "t", 1)

    @akter.command
    async def start(self) -> str:
        return self.enqueue(Pinger.hold, Nothing())

    @akter.job(attempts=2, timeout=30)
    async def hold(call: akter.JobCall, payload: Nothing) -> int:
        result: int = await PROVIDER(call)
        return result


ACTORS = [Pinger, Pong]
