"""The line of turns waiting for a shared write, observable by tests (``turn.shared``).

``Line.of(engine)`` replaces the writer's line with one that says when a turn joins it, so that
a test holding the writer (``pause_next("before_shared_write")``) waits for the turns behind
it to queue, in a known order, without sleeping.
"""

from __future__ import annotations

import asyncio
import collections

from akter._engine.turn.engine import TurnEngine
from akter._engine.turn.shared import _Waiting


class Line(collections.deque[_Waiting]):
    """A writer's line that sets :attr:`joined` whenever a turn joins it."""

    def __init__(self) -> None:
        super().__init__()
        self.joined = asyncio.Event()

    @classmethod
    def of(cls, engine: TurnEngine) -> Line:
        line = cls()
        line.extend(engine.shared._waiting)
        engine.shared._waiting = line
        return line

    def append(self, item: _Waiting) -> None:
        super().append(item)
        self.joined.set()

    async def reach(self, count: int, within: float = 10.0) -> None:
        """Wait until ``count`` turns wait in the line."""
        async with asyncio.timeout(within):
            while len(self) < count:
                self.joined.clear()
                await self.joined.wait()
