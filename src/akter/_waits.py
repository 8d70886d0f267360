"""Bounded waits that never swallow a cancellation.

``asyncio.wait_for`` on Python 3.11 runs its awaitable in a separate task and, when the
cancellation of the waiting task arrives just as that awaitable finishes, returns the result and
drops the cancellation (CPython gh-86296, fixed in 3.12 by rebuilding ``wait_for`` on
``asyncio.timeout``). A background loop that loses its cancellation never stops, and the runtime's
``stop()`` waits for it forever. These helpers await in the calling task under
``asyncio.timeout``, which delivers every cancellation.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, within: float | None) -> bool:
    """Wait until ``event`` is set or ``within`` seconds pass; ``True`` if it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(within):
            await event.wait()
    except TimeoutError:
        return False
    return True
