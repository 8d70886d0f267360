"""ManualClock: sleepers wake exactly when the clock is advanced past their time."""

from __future__ import annotations

import asyncio

import pytest

from akter.testing import ManualClock


async def test_sleepers_wake_in_time_order_once_advanced_past_their_time() -> None:
    clock = ManualClock(start=10.0)
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("b", 2.0), ("a", 1.0))]
    await asyncio.sleep(0)
    assert clock.next_wake() == 11.0
    await clock.advance(0.999)
    assert woke == [] and clock.now() == pytest.approx(10.999)
    await clock.advance(0.001)
    await asyncio.sleep(0)
    assert woke == ["a"] and clock.next_wake() == 12.0
    await clock.advance(5)
    await asyncio.gather(*tasks)
    assert woke == ["a", "b"] and clock.next_wake() is None


async def test_a_cancelled_sleeper_is_forgotten_and_the_clock_never_moves_back() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(1))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.next_wake() is None
    with pytest.raises(ValueError, match="never moves back"):
        await clock.advance(-1)
    await clock.sleep(0)  # a zero sleep returns at once
