"""This process's monotonic clock: what local lease deadlines are measured and slept on.

A runner stops a job attempt before its lease could end on the server by measuring, on its own
monotonic clock, the time since the last confirmed claim or renewal was *sent*. ``LocalClock`` is
that clock; tests give a runtime a manual one (``akter.testing.ManualClock``) so that a lease
deadline is reached by advancing the clock, not by waiting for it.
"""

from __future__ import annotations

import asyncio
import time


class LocalClock:
    """``time.monotonic()`` and ``asyncio.sleep``: the real local clock."""

    def now(self) -> float:
        """Seconds on this process's monotonic clock."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock."""
        await asyncio.sleep(seconds)
