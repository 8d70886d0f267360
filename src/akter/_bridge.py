"""A coroutine handed from a caller thread to an event loop, chained to a future both ways.

What ``akter.SyncRuntime.run`` schedules on its loop thread (``loop.call_soon_threadsafe``): like
``asyncio.run_coroutine_threadsafe``, but the task runs in the caller's ``contextvars`` context,
and a future the caller cancelled before the loop took it never starts its coroutine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def spawn(
    loop: asyncio.AbstractEventLoop,
    awaitable: Coroutine[Any, Any, T],
    context: contextvars.Context,
    future: concurrent.futures.Future[T],
) -> None:
    """On the loop: run ``awaitable`` as a task in ``context``; chain it to ``future`` both ways.

    The caller's cancel (a timeout, Ctrl-C) cancels the task; the task's end settles the future.
    """
    if future.cancelled():
        awaitable.close()
        return
    task = loop.create_task(awaitable, context=context)

    def settle(done: asyncio.Task[T]) -> None:
        if done.cancelled():
            future.cancel()
            return
        try:
            if (error := done.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result())
        except concurrent.futures.InvalidStateError:  # the caller cancelled it meanwhile
            pass

    def cancel(f: concurrent.futures.Future[T]) -> None:
        if f.cancelled():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has ended: so has the task
                pass

    task.add_done_callback(settle)
    future.add_done_callback(cancel)
