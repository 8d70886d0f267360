"""The actor of the job stream kill drill (no tests here): a job that streams, then may hang.

The same class runs in the parent test process and in its child runner
(``tests.faults.stream_child``).
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

import akter


class Tale(BaseModel):
    chunks: int = 3
    hang_first: bool = True


class Told(BaseModel):
    attempts: list[int] = Field(default_factory=list)


class Teller(akter.Actor[Told], access=akter.public):
    @akter.command
    async def tell(self, chunks: int = 3) -> str:
        return self.enqueue(Teller.recite, Tale(chunks=chunks))

    @akter.query
    async def told(self) -> list[int]:
        return self.state.attempts

    @akter.job(attempts=3, timeout=60)
    async def recite(call: akter.JobCall, tale: Tale) -> int:
        for i in range(tale.chunks):
            call.stream(f"attempt {call.attempt} chunk {i}")
        if call.attempt == 1 and tale.hang_first:
            await asyncio.Event().wait()  # its runner is SIGKILLed here
        return call.attempt

    @recite.on_success
    async def recited(self, attempt: int) -> None:
        self.state.attempts.append(attempt)


ACTORS = [Teller]
