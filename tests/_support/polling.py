"""The one polling helper of the suite: wait, bounded, for an observable condition."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import pytest

T = TypeVar("T")


@overload
async def until(
    check: Callable[[], Awaitable[T]],
    *,
    within: float = 10.0,
    what: str = "the condition",
    holds: Callable[[T], bool] = bool,
    interval: float = 0.01,
) -> T: ...


@overload
async def until(
    check: Callable[[], T],
    *,
    within: float = 10.0,
    what: str = "the condition",
    holds: Callable[[T], bool] = bool,
    interval: float = 0.01,
) -> T: ...


async def until(
    check: Callable[[], Any],
    *,
    within: float = 10.0,
    what: str = "the condition",
    holds: Callable[[Any], bool] = bool,
    interval: float = 0.01,
) -> Any:
    """Poll ``check`` until what it returns holds, and return that value.

    Polling observes a condition the test cannot await directly (a durable row, a process
    state); it does not order events by time. ``check`` may be sync or async.

    Args:
        check: Observes the condition; returns the observed value.
        within: Seconds before the test fails.
        what: Names the condition in the failure message.
        holds: Decides whether the observed value satisfies the condition (truthiness unless
            given), so the failure message can show the last observed value.
        interval: Seconds between two observations.

    Returns:
        The first observed value that holds.
    """
    deadline = time.monotonic() + within
    while True:
        observed = check()
        if inspect.isawaitable(observed):
            observed = await observed
        value = observed
        if holds(value):
            return value
        if time.monotonic() > deadline:
            seen = "" if value is None or isinstance(value, bool) else f"; last seen: {value!r}"
            pytest.fail(f"{what} did not hold within {within} s{seen}")
        await asyncio.sleep(interval)
