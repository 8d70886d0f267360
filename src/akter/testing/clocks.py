"""``ManualClock``: a local monotonic clock that moves only when a test advances it.

Give it to a runtime (``Runtime(local_clock=...)``, or ``akter_test(..., local_clock=...)``) and
job attempts measure their local lease deadline on it: a test reaches the deadline with
``await clock.advance(seconds)`` instead of sleeping, and can read when the next sleeper wakes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from akter._local_clock import LocalClock


class ManualClock(LocalClock):
    """A monotonic clock for tests: ``now()`` starts at ``start`` and moves by ``advance``."""

    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The clock's current value, in seconds."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by at least ``seconds``."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), wake))
        await wake

    def next_wake(self) -> float | None:
        """When the earliest waiting sleeper wakes (``None``: nobody sleeps)."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move the clock ahead and wake every sleeper whose time has come (in time order)."""
        if seconds < 0:
            raise ValueError("A monotonic clock never moves back.")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, wake = heapq.heappop(self._sleepers)
            if not wake.done():
                wake.set_result(None)
        await asyncio.sleep(0)  # let the woken sleepers run

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
