"""Conformance: schedules (SC-*), runners and singletons (RN-*), retention (RT-*)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest

Make = Callable[..., ActorTest]


class Ticks(BaseModel):
    n: int = 0
    ids: list[str] = []


class Ticked(akter.Event):
    n: int


class Meter(akter.Actor[Ticks], access=akter.public, events=[Ticked]):
    @akter.command
    async def start(self) -> int:
        return self.state.n

    @akter.schedule(every=timedelta(minutes=1))
    @akter.command
    async def tick(self) -> int:
        self.state.n += 1
        self.state.ids.append(self.command_id)
        self.emit(Ticked(n=self.state.n))
        assert isinstance(self.caller, akter.System) and self.caller.source == "cron"
        return self.state.n


class Nightly(akter.Actor[Ticks], singleton=True):
    @akter.schedule(every=timedelta(minutes=1))
    @akter.command
    async def bill(self) -> int:
        self.state.n += 1
        return self.state.n

    async def run(self) -> None:
        LOOPS.append(self.runtime._runners.runner_id)
        await asyncio.Event().wait()


LOOPS: list[str] = []


async def ticks_of(t: ActorTest) -> list[dict[str, object]]:
    return await t.rows(
        "SELECT intent_id, timer_key, due_at_ms, scheduled_at_ms, attempts FROM {schema}.outbox"
        " WHERE timer_key LIKE '$cron:%%' ORDER BY actor_type, actor_id"
    )


async def test_SC01_catch_up_collapses_into_one_tick(akter_test: Make) -> None:
    async with akter_test([Meter], relay=False) as t:
        meter = t.get(Meter, "m")
        await meter.start()  # first commit of a cold activation inserts the tick
        [tick] = await ticks_of(t)
        assert tick["timer_key"] == "$cron:@every 60000ms"
        now = await t.now_ms()
        assert int(str(tick["due_at_ms"])) == (now // 60_000 + 1) * 60_000
        await t.advance(timedelta(minutes=10))  # ten missed fire times
        row = await t.inspect(meter)
        assert row.state is not None and row.state["n"] == 1
        receipt = row.receipts[-1]
        assert receipt["command_id"] == tick["intent_id"] and receipt["command"] == "tick"
        assert '"cron"' in receipt["caller_key"]
        [after] = await ticks_of(t)
        assert after["intent_id"] != tick["intent_id"]
        now = await t.now_ms()
        assert now < int(str(after["due_at_ms"])) <= now + 60_000
        assert after["scheduled_at_ms"] == after["due_at_ms"] and after["attempts"] == 0


async def test_SC02_stale_tick_is_skipped(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test([Meter], relay=False) as t:
        meter = t.get(Meter, "m")
        await meter.start()
        caplog.set_level(logging.INFO, logger="akter.relay")
        await t.advance(timedelta(days=2))  # longer than max_schedule_lag (1 day)
        row = await t.inspect(meter)
        assert row.state is not None and row.state["n"] == 0
        assert "Schedule tick skipped: older than max_schedule_lag" in caplog.messages
        [tick] = await ticks_of(t)
        # Rewritten to the next fire after the claim's clock, not replayed from two days back.
        # A clock read after it may already be past that fire (the minute can turn between the
        # two readings: CI saw due 12 ms behind), so the bound is one period (1 min) behind.
        assert int(str(tick["due_at_ms"])) > await t.now_ms() - 60_000


async def test_SC02_removed_entry_is_backed_off_then_deleted(akter_test: Make) -> None:
    async with akter_test([Meter], relay=False) as t:
        await t.get(Meter, "m").start()
        await t.rows("UPDATE {schema}.outbox SET timer_key = '$cron:@every 5000ms'")
        await t.advance(timedelta(minutes=2))
        [young] = await ticks_of(t)
        assert young["attempts"] == 1  # backed off: a newer runner may own the entry
        await t.advance(timedelta(days=2))
        assert await ticks_of(t) == []


async def test_SC06_crash_before_rewrite_replays_once(akter_test: Make) -> None:
    async with akter_test([Meter], relay=False) as t:
        meter = t.get(Meter, "m")
        await meter.start()
        [first] = await ticks_of(t)
        t.crash_next("before_outbox_delete")
        await t.advance(timedelta(minutes=1))
        [kept] = await ticks_of(t)
        assert kept["intent_id"] == first["intent_id"]  # not rewritten: the claim is abandoned
        await t.advance(timedelta(seconds=40))  # past the claim lease
        row = await t.inspect(meter)
        assert row.state is not None and row.state["n"] == 1  # replayed, not run twice
        [rewritten] = await ticks_of(t)
        assert rewritten["intent_id"] != first["intent_id"]


async def test_SC03_singleton_ticks_once_across_runners(akter_test: Make) -> None:
    async with akter_test([Nightly], relay=False) as t:
        await t.add_runtime()
        await t.add_runtime()
        ticks = await ticks_of(t)
        assert len(ticks) == 1  # three runners started, one pending tick
        await t.advance(timedelta(minutes=1))
        row = await t.inspect(akter.ActorRef("default", "Nightly", ""))
        assert row.state is not None and row.state["n"] == 1
        assert len(row.receipts) == 1


async def test_RN_singleton_loop_runs_on_one_runner(akter_test: Make) -> None:
    LOOPS.clear()
    async with akter_test([Nightly]) as t:
        for runtime in t.runtimes:
            runtime._runners.refresh_ms = 100
        second = await t.add_runtime()
        second._runners.refresh_ms = 100
        for _ in range(100):
            if LOOPS:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # several refresh rounds: nobody else may start
        assert len(LOOPS) == 1
        owners = await t.rows(
            "SELECT owner::text AS owner FROM {schema}.singletons WHERE actor_type = 'Nightly'"
        )
        assert [o["owner"] for o in owners] == [LOOPS[0]]
        owner = next(rt for rt in t.runtimes if rt._runners.runner_id == LOOPS[0])
        other = next(rt for rt in t.runtimes if rt is not owner)
        assert owner._runners.owns("Nightly") and not other._runners.owns("Nightly")
        # A graceful stop releases the lease: the survivor takes over without waiting for it.
        await owner.stop()
        t.runtimes.remove(owner)
        for _ in range(100):
            if len(LOOPS) == 2:
                break
            await asyncio.sleep(0.05)
        assert LOOPS[1] == other._runners.runner_id


async def test_RN03_runner_rows(akter_test: Make) -> None:
    async with akter_test([Meter]) as t:
        second = await t.add_runtime(host_actors=False, jobs=[])
        live = await t.runtime._runners.live()
        assert {r.runner_id for r in live} == {
            t.runtime._runners.runner_id,
            second._runners.runner_id,
        }
        mine = next(r for r in live if r.runner_id == t.runtime._runners.runner_id)
        assert mine.actor_types == ["Meter"]
        theirs = next(r for r in live if r.runner_id == second._runners.runner_id)
        assert theirs.actor_types == []
        await second.stop()
        t.runtimes.remove(second)
        live = await t.runtime._runners.live()
        assert [r.runner_id for r in live] == [t.runtime._runners.runner_id]


async def test_RT01_receipts_kept_until_expiry_margin_and_pending_outbox(akter_test: Make) -> None:
    async with akter_test([Meter], relay=False, retry_window=60) as t:
        meter = t.get(Meter, "m")
        await meter.start()
        # keep_receipts 7 d − window 60 s is the margin: nothing goes before expiry + margin.
        await t.advance(timedelta(days=6))
        counts = await t.runtime.cleanup()
        assert counts.receipts == 0
        await t.advance(timedelta(days=1, minutes=2))
        counts = await t.runtime.cleanup()
        assert counts.receipts == 1
        assert t.runtime.metrics.value("akter.receipts.pruned", actor_type="Meter") == 1
        assert (await t.inspect(meter)).receipts == []
        # Outbox rows and the actor survive any sweep.
        assert len(await ticks_of(t)) == 1 and (await t.inspect(meter)).exists


async def test_RT02_events_pruned_as_a_prefix(akter_test: Make) -> None:
    async with akter_test([Meter], relay=False) as t:
        meter = t.get(Meter, "m")
        await meter.start()
        await t.advance(timedelta(minutes=1))
        await t.advance(timedelta(minutes=1))
        await t.advance(timedelta(days=29, hours=23, minutes=59))
        await t.advance(timedelta(minutes=1))  # one more tick, young
        assert [e["seq"] for e in (await t.inspect(meter)).events] == [1, 2, 3]
        counts = await t.runtime.cleanup()
        assert counts.events == 2
        assert [e["seq"] for e in (await t.inspect(meter)).events] == [3]
        with pytest.raises(akter.ActorError) as exc:
            await meter.events(after="1")
        assert exc.value.reason == "RetentionGap"
        assert [r.cursor for r in await meter.events(after="0")] == ["3"]
        assert [r.cursor for r in await meter.events(after="2")] == ["3"]


# --- Runtime(singleton_lease=...) ------------------------------------------------------------


class Watch(akter.Actor[Ticks], singleton=True):
    """A singleton whose loop records when it starts and stops on which runner."""

    async def run(self) -> None:
        runner = str(self.runtime._runners.runner_id)
        WATCH.append((runner, "start", time.monotonic()))
        for changed in CHANGED:
            changed.set()
        try:
            await asyncio.Event().wait()
        finally:
            WATCH.append((runner, "stop", time.monotonic()))


WATCH: list[tuple[str, str, float]] = []
CHANGED: list[asyncio.Event] = []  # set when a loop starts (the running test's event)


@pytest.mark.parametrize(
    "value",
    [0.999, 0, -1, timedelta(days=1, milliseconds=1), float("nan"), True, "35"],
)
def test_singleton_lease_is_validated(value: object) -> None:
    with pytest.raises(akter.ConfigurationError, match="singleton_lease"):
        akter.Runtime([Watch], singleton_lease=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.001, timedelta(days=367), "1", True])
def test_clock_offset_is_validated(value: object) -> None:
    with pytest.raises(akter.ConfigurationError, match="clock_offset"):
        akter.Runtime([Watch], clock_offset=value)  # type: ignore[arg-type]


def test_singleton_lease_sets_the_refresh_and_the_default_is_35_s() -> None:
    default = akter.Runtime([Watch])
    assert (default._runners.lease_ms, default._runners.refresh_ms) == (35_000, 10_000)
    assert default._clock.offset_ms == 0
    short = akter.Runtime([Watch], singleton_lease=3.5, clock_offset=timedelta(hours=2))
    assert (short._runners.lease_ms, short._runners.refresh_ms) == (3_500, 1_000)
    assert short._clock.offset_ms == 7_200_000
    assert akter.Runtime([Watch], singleton_lease=timedelta(days=1))._runners.lease_ms == 86_400_000
    assert akter.Runtime([Watch], singleton_lease=1)._runners.refresh_ms == 285


async def wait_for(check: Callable[[], bool], within: float) -> None:
    """Wait (bounded) until ``check`` holds, waking when a loop starts."""
    changed = CHANGED[0]
    deadline = time.monotonic() + within
    while not check():
        left = deadline - time.monotonic()
        assert left > 0, f"not within {within} s"
        changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), left)


async def test_short_singleton_lease_lets_a_survivor_take_over(akter_test: Make) -> None:
    WATCH.clear()
    CHANGED[:] = [asyncio.Event()]
    async with akter_test([Watch], singleton_lease=2, maintenance=False) as t:
        first = t.runtime
        await wait_for(lambda: len(WATCH) == 1, 10)
        second = await t.add_runtime()
        assert WATCH[0][0] == first._runners.runner_id
        [held] = await t.rows(
            "SELECT owner::text AS owner, lease_until_ms FROM {schema}.singletons"
            " WHERE actor_type = 'Watch'"
        )
        assert held["owner"] == first._runners.runner_id
        # The owner stops refreshing (as if its database calls hung): after one more refresh at
        # most, it stops its own loop before its 2 s lease ends; the survivor acquires after.
        first._runners.refresh_ms = 3_600_000
        stopped = time.monotonic()
        await wait_for(lambda: any(w[0] == second._runners.runner_id for w in WATCH), 10)
        took = time.monotonic() - stopped
        assert [(w[0], w[1]) for w in WATCH] == [
            (first._runners.runner_id, "start"),
            (first._runners.runner_id, "stop"),
            (second._runners.runner_id, "start"),
        ]
        assert WATCH[1][2] <= WATCH[2][2]  # never two loops at once
        assert took < 2 * 2 + 1  # within a lease, a refresh interval and the last refresh
        [taken] = await t.rows(
            "SELECT owner::text AS owner, lease_until_ms, acquired_at_ms FROM {schema}.singletons"
            " WHERE actor_type = 'Watch'"
        )
        assert taken["owner"] == second._runners.runner_id
        assert taken["acquired_at_ms"] >= held["lease_until_ms"]
        assert second._runners.owns("Watch") and not first._runners.owns("Watch")
