"""``watching``: follow a query watch in the background of a test and wait for its values.

::

    async with watching(t.get(Account, "a").balance) as seen:
        await t.get(Account, "a").deposit(5)
        await seen.until(5)          # the watch yielded 5 (bounded wait, never a sleep)
    assert seen.values == [0, 5]

The watch is read by a task of its own from the start (its first value, the one now, is
awaited before the block runs), so the test's commits race nothing; leaving the block closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class Watching(Generic[R]):
    """The values a watch yielded so far, and a bounded wait for the next ones."""

    def __init__(self) -> None:
        #: Every value yielded, in order.
        self.values: list[R] = []
        #: What ended the watch (a refusal), once it ended.
        self.error: BaseException | None = None
        self._changed = asyncio.Condition()

    async def _add(self, value: R) -> None:
        async with self._changed:
            self.values.append(value)
            self._changed.notify_all()

    async def until(self, expected: R | Callable[[R], bool], *, within: float = 10.0) -> R:
        """The first value yielded (already, or within ``within`` s) that is or satisfies it.

        Raises:
            TimeoutError: No such value came in time.
        """

        def match(value: R) -> bool:
            return bool(expected(value)) if callable(expected) else value == expected

        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(
                lambda: any(match(v) for v in self.values) or self.error is not None
            )
        if self.error is not None and not any(match(v) for v in self.values):
            raise self.error
        return next(v for v in self.values if match(v))


@contextlib.asynccontextmanager
async def watching(
    query: Any, *args: Any, within: float = 10.0, **kwargs: Any
) -> AsyncIterator[Watching[Any]]:
    """Watch ``query`` (a handle's watchable query) with its arguments while the block runs."""
    seen: Watching[Any] = Watching()
    values: AsyncIterator[Any] = query.watch(*args, **kwargs)
    first = asyncio.Event()

    async def read() -> None:
        try:
            async for value in values:
                await seen._add(value)
                first.set()
        except Exception as exc:
            seen.error = exc
            first.set()
            async with seen._changed:
                seen._changed.notify_all()

    task = asyncio.create_task(read(), name="akter.testing.watching")
    try:
        async with asyncio.timeout(within):
            await first.wait()
        if seen.error is not None and not seen.values:
            raise seen.error
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        close = getattr(values, "aclose", None)
        if close is not None:
            await close()
