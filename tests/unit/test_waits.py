"""``wait_event`` delivers a cancellation that arrives together with the event (gh-86296)."""

from __future__ import annotations

import asyncio

import pytest

from akter._waits import wait_event


async def _cancel_as_the_event_fires(wait: object) -> asyncio.Task[str]:
    event = asyncio.Event()
    parked = asyncio.Event()

    async def waiter() -> str:
        parked.set()
        await wait(event)  # type: ignore[operator]
        return "returned"

    task = asyncio.create_task(waiter())
    await parked.wait()
    await asyncio.sleep(0)  # the waiter is now suspended on the event
    event.set()  # the waiting task is now scheduled to resume with the event...
    task.cancel()  # ...and is cancelled before it does
    return task


async def test_a_cancellation_arriving_with_the_event_is_delivered() -> None:
    task = await _cancel_as_the_event_fires(lambda e: wait_event(e, 10))
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_set_event_and_timeout() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0) is True
    event.clear()
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, None) is True
