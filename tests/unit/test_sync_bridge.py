"""The SyncRuntime's bridge without a database.

Refusals before start, and how a call's future and its task on the loop are chained: a cancel
reaches the task; the task's end settles the future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Iterator

import pytest

import akter
from akter._bridge import spawn
from akter.sync import SyncRuntimeError

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


class Account(akter.Actor):
    @akter.command
    async def deposit(self, cents: int) -> int:
        return cents


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def test_a_runtime_that_never_started_refuses_by_name_and_closes_the_coroutine() -> None:
    rt = akter.SyncRuntime(actors=[Account], database_url="postgresql://nowhere/x")
    with pytest.raises(SyncRuntimeError) as refused:
        rt.get(Account, "a").call(Account.deposit, cents=1)
    assert refused.value.reason == "not_started"
    assert rt.stop().status == "clean"  # stopping what never started
    with pytest.raises(SyncRuntimeError) as stopped:
        rt.start()
    assert stopped.value.reason == "stopped"
    assert not rt.running


def test_the_task_runs_in_the_callers_context_and_settles_the_future(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def read() -> str:
        return MARK.get()

    token = MARK.set("caller's")
    try:
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        loop.call_soon_threadsafe(spawn, loop, read(), contextvars.copy_context(), future)
        assert future.result(timeout=5) == "caller's"
    finally:
        MARK.reset(token)

    async def fail() -> None:
        raise LookupError("the coroutine's own")

    failing: concurrent.futures.Future[None] = concurrent.futures.Future()
    loop.call_soon_threadsafe(spawn, loop, fail(), contextvars.copy_context(), failing)
    with pytest.raises(LookupError, match="the coroutine's own"):
        failing.result(timeout=5)


def test_cancelling_the_future_cancels_the_task(loop: asyncio.AbstractEventLoop) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    loop.call_soon_threadsafe(spawn, loop, wait_forever(), contextvars.copy_context(), future)
    assert started.wait(5)
    assert future.cancel()
    assert cancelled.wait(5)


def test_a_future_cancelled_before_the_loop_took_it_never_runs(
    loop: asyncio.AbstractEventLoop,
) -> None:
    ran = threading.Event()

    async def mark() -> None:
        ran.set()

    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    future.cancel()
    done = concurrent.futures.Future[None]()
    loop.call_soon_threadsafe(spawn, loop, mark(), contextvars.copy_context(), future)
    loop.call_soon_threadsafe(done.set_result, None)
    done.result(timeout=5)
    assert not ran.is_set()  # closed, not run, and no "never awaited" warning
