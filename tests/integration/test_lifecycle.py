"""Graceful drain (RN-02), readiness, and background-task supervision."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

STARTED: list[tuple[str, int]] = []
GATE = asyncio.Event()


class Paid(BaseModel):
    n: int = 0
    routed: list[str] = []


class Charge(BaseModel):
    cents: int


class Shop(akter.Actor[Paid], access=akter.public, delivery_timeout=2):
    @akter.command
    async def buy(self, cents: int) -> str:
        return self.enqueue(Shop.charge, Charge(cents=cents))

    @akter.command
    async def note(self) -> int:
        self.state.n += 1
        return self.state.n

    @akter.job(attempts=3, timeout=60)
    async def charge(call: akter.JobCall, req: Charge) -> int:
        STARTED.append((call.job_id, call.attempt))
        if call.attempt == 1:
            await GATE.wait()  # attempt 1 never finishes: its runner drains
        return req.cents

    @charge.on_success
    async def charged(self, cents: int) -> None:
        self.state.routed.append(self.command_id)


def readiness(runtime: akter.Runtime) -> str:
    return runtime.readiness


async def test_RN02_drain_interrupts_attempts_and_finishes_turns(akter_test: Make) -> None:
    STARTED.clear()
    async with akter_test([Shop], relay=False, lease=3, cancel_check=1) as t:
        other = await t.add_runtime()
        first = t.runtime
        shop = t.get(Shop, "s")
        job_id = await shop.buy(100)
        await first._relay.run_pass()  # attempt 1 starts on the first runner
        for _ in range(100):
            if STARTED:
                break
            await asyncio.sleep(0.01)
        assert STARTED == [(job_id, 1)]
        # A turn in flight when the drain starts finishes; new external commands are refused.
        pause = t.pause_next("before_commit")
        in_flight = asyncio.create_task(shop.note())
        await pause.wait()
        assert readiness(first) == "ready"
        stopping = asyncio.create_task(first.stop())
        for _ in range(100):
            if readiness(first) == "draining":
                break
            await asyncio.sleep(0.01)
        assert readiness(first) == "draining"
        with pytest.raises(akter.ActorError) as exc:
            await first.get(Shop, "s2").with_command_id(await other.mint_command_id()).note()
        assert exc.value.reason in ("ActorUnavailable", "Timeout")
        pause.release()
        assert await in_flight == 1
        report = await stopping
        t.runtimes.remove(first)
        assert report == akter.DrainReport("clean", 0, 1, 0)
        assert readiness(first) == "drained"
        [row] = await t.rows("SELECT running, ambiguous, attempts FROM {schema}.outbox")
        assert row == {"running": True, "ambiguous": True, "attempts": 1}
        # After the lease the other runner runs attempt 2 and routes once.
        await t.advance(4)
        assert STARTED == [(job_id, 1), (job_id, 2)]
        state = (await t.inspect(shop)).state
        assert state is not None and state["routed"] == [job_id]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []


async def test_a_dead_background_task_fails_the_runtime_loudly(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Shop]) as t:
        runtime = t.runtime

        async def broken() -> None:
            raise RuntimeError("relay bug")

        task = runtime.supervise(asyncio.create_task(broken(), name="akter.test.broken"))
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        assert runtime.readiness == "failed"
        assert "Background task stopped unexpectedly; the runtime has failed" in caplog.messages
        with pytest.raises(akter.ConfigurationError, match="relay bug"):
            await t.get(Shop, "s").note()
        runtime._supervisor.fatal = None  # let the harness stop it
