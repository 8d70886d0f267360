"""An idle relay's poll asks ``any_due`` instead of running its claims (issue 13, goal 5).

The background loop runs with a short poll. After a pass that claimed nothing, each poll runs
one ``any_due`` statement and no claim while nothing is due; a timer that comes due with no wake
(the clock moves, nothing commits) is still found by the next poll and delivered once. The
gateway's methods are wrapped to count calls; every statement still runs on PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from akter._engine.loop import idle
from akter._engine.loop.idle import IDLE_POLLS
from akter.testing import ActorTest
from tests._support import until
from tests._support.counting import count_calls
from tests.integration.relay_actors import ALL, RUNS, Receiver, Sender, reset

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    reset()
    yield
    reset()


async def received(t: ActorTest, actor_id: str) -> list[Any]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Receiver' AND actor_id = %(id)s",
        {"id": actor_id},
    )
    return list(rows[0]["state"]["received"]) if rows else []


async def test_idle_polls_ask_any_due_and_a_timer_due_without_a_wake_is_delivered(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, poll=0.02) as t:
        if t.on_citus:
            pytest.skip("counts the plain claim path")
        relay = t.runtime._relay
        calls = count_calls(relay._outbox, ["any_due", "claim"])
        await t.get(Sender, "idle-s1").send_then("idle-r1", 1, "ok")  # now + a 60 s timer
        await until(lambda: received(t, "idle-r1"), what="the immediate intent delivered")

        # Idle (after one poll that claimed nothing): polls ask, and claim nothing.
        await until(lambda: calls["any_due"] >= 1, what="a first idle poll")
        claims = calls["claim"]
        asked = calls["any_due"]
        await until(lambda: calls["any_due"] >= asked + 5, what="five idle polls")
        assert calls["claim"] == claims
        timers = await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'intent'")
        assert len(timers) == 1

        # The clock moves past the timer; nothing commits, so only a poll can find it.
        for runtime in t.runtimes:
            runtime._clock.offset_ms += 61_000

        async def both_delivered() -> bool:
            return len(await received(t, "idle-r1")) == 2

        await until(both_delivered, what="the timer delivered by a poll")
        assert calls["claim"] > claims
        await relay.wait_idle()
        assert await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'intent'") == []
        assert sorted(RUNS.values()) == [1, 1]  # each delivery ran its handler once


# --- notify=True: an idle relay sleeps until the next due row ---------------------------------


def probes_before_each_claim(relay: Any, calls: Counter[str]) -> list[int]:
    """From now on, the count of ``next_due`` probes at each intent claim of ``relay``."""
    seen: list[int] = []
    claim = relay._outbox.claim

    def counted(*args: Any, **kw: Any) -> Any:
        seen.append(calls["next_due"])
        return claim(*args, **kw)

    relay._outbox.claim = counted
    return seen


def heard_wakes(loop: Any) -> list[bool]:
    """From now on, for each wake ``loop`` hears: whether its passes then follow it."""
    following: list[bool] = []
    heard = loop._channel._heard

    def noted() -> None:
        following.append(loop._idle.following)
        heard()

    loop._channel._heard = noted
    return following


async def test_next_due_names_the_first_unparked_due_time(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        if t.on_citus:
            pytest.skip("the probe answers 0 on Citus (the claims run)")
        outbox = t.runtime._relay._outbox
        assert await outbox.next_due() is None  # no row at all

        await t.get(Sender, "nd-s1").send_then("nd-r1", 1, "ok")  # now, and a 60 s timer
        assert (await outbox.next_due() or 0) <= 0  # the immediate intent is due
        await t.drain()  # delivers it; the timer stays
        wait_ms = await outbox.next_due()
        assert wait_ms is not None and 55_000 < wait_ms <= 60_000

        # A parked row is never due: only the timer's due time counts.
        await t.rows(
            "UPDATE {schema}.outbox SET parked_at_ms = 1, due_at_ms = 0 WHERE kind = 'intent'"
        )
        assert await outbox.next_due() is None
        await t.rows("UPDATE {schema}.outbox SET parked_at_ms = NULL WHERE kind = 'intent'")
        assert (await outbox.next_due() or 0) <= 0


async def test_with_notify_an_idle_relay_sleeps_until_the_next_due_row_bounded(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, notify=True, poll=0.05) as t:
        if t.on_citus:
            pytest.skip("counts the plain claim path")
        relay = t.runtime._relay
        loop = t.runtime._loop
        calls = count_calls(relay._outbox, ["any_due", "next_due", "claim"])
        await t.get(Sender, "nq-s1").send_then("nq-r1", 1, "ok")  # now + a 60 s timer
        await until(lambda: received(t, "nq-r1"), what="the immediate intent delivered")

        # Idle: the probe is next_due (never any_due), and the wait it sets is the bound
        # (IDLE_POLLS polls), not the timer's 60 s and not one poll.
        # (A poll wait is poll × uniform[0.9, 1.1]; the bound is exact.)
        await until(
            lambda: calls["next_due"] >= 2 and loop._idle.next_wait() == IDLE_POLLS * 0.05,
            what="an idle probe setting the bounded sleep",
        )
        assert calls["any_due"] == 0

        # The clock passes the timer and nothing commits: the bounded sleep still finds it.
        for runtime in t.runtimes:
            runtime._clock.offset_ms += 61_000

        async def both_delivered() -> bool:
            return len(await received(t, "nq-r1")) == 2

        await until(both_delivered, what="the timer delivered after a bounded sleep")
        await relay.wait_idle()
        assert sorted(RUNS.values()) == [1, 1]


async def test_with_notify_another_runners_commit_wakes_a_sleeping_relay(
    akter_test: Make,
) -> None:
    # Runner A hosts only the receiver and sleeps (nothing due, no bound reached: poll 1 s, so
    # up to 10 s); runner B's commit reaches it by NOTIFY, not by a poll.
    async with akter_test([Receiver], notify=True) as t:
        if t.on_citus:
            pytest.skip("counts the plain claim path")
        relay = t.runtime._relay
        loop = t.runtime._loop
        calls = count_calls(relay._outbox, ["next_due"])
        b = await t.add_runtime([Sender], relay=False)
        # B's start may wake A once more; wait until A's latest idle probe set the long sleep
        # (exactly the bound: a poll wait is poll × uniform[0.9, 1.1]).
        await until(
            lambda: calls["next_due"] >= 1 and loop._idle.next_wait() == IDLE_POLLS * 1.0,
            what="A asleep after an idle probe",
            within=5,
        )
        probes = calls["next_due"]
        probes_at_claims = probes_before_each_claim(relay, calls)

        await b.get(Sender, "nw-s1").send_to("nw-r1", 1)
        await until(lambda: received(t, "nw-r1"), what="A delivering B's intent", within=5)
        # Claimed by a woken pass: A asked no idle probe first (a poll would have; the passes
        # that follow B's wake probe, but only after the claim).
        assert probes_at_claims[0] == probes


async def test_with_notify_an_operator_retry_in_another_process_wakes_a_sleeping_relay(
    akter_test: Make,
) -> None:
    # An operator's runtime (as `akter outbox retry` starts one: no relay) retries a parked
    # timer; the wake it sends and awaits reaches runner A, asleep with nothing due.
    async with akter_test(ALL, notify=True) as t:
        if t.on_citus:
            pytest.skip("counts the plain claim path")
        relay = t.runtime._relay
        loop = t.runtime._loop
        calls = count_calls(relay._outbox, ["next_due"])
        await t.get(Sender, "op-s1").send_then("op-r1", 1, "ok")  # now + a 60 s timer
        await until(lambda: received(t, "op-r1"), what="the immediate intent delivered")
        # Started first: a runtime's start may wake A once.
        operator = await t.add_runtime(ALL, relay=False, maintenance=False)
        [timer] = await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'intent'")
        await t.rows("UPDATE {schema}.outbox SET parked_at_ms = 1, last_error = 'probe'")
        relay.wake()  # one pass sees nothing due at all: A sleeps the whole bound
        await until(
            lambda: loop._idle.next_wait() == IDLE_POLLS * 1.0 and calls["next_due"] >= 1,
            what="A asleep with nothing due",
        )
        probes = calls["next_due"]
        probes_at_claims = probes_before_each_claim(relay, calls)

        assert await operator.outbox.retry([timer["intent_id"]]) == 1

        async def both_delivered() -> bool:
            return len(await received(t, "op-r1")) == 2

        await until(both_delivered, what="the retried timer delivered", within=5)
        assert probes_at_claims[0] == probes  # by the wake, not by the bounded sleep's end


# --- notify=True: following another runner's wake (issue 13, goal 3) -----------------------------


async def test_with_notify_a_commit_inside_another_runners_notify_window_is_found_by_a_probe(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A runner coalesces its NOTIFYs to one per 50 ms, so a commit right after one has none of
    # its own yet. Runner A (the receiver) follows B's wake with probing passes for the window;
    # here the window is 5 s and B sends no second NOTIFY at all, so only a probe can find
    # B's second commit before A's 10 s sleep ends.
    monkeypatch.setattr(idle, "FOLLOW_FOR_S", 5.0)
    async with akter_test([Receiver], notify=True) as t:
        if t.on_citus:
            pytest.skip("counts the plain claim path")
        relay = t.runtime._relay
        loop = t.runtime._loop
        calls = count_calls(relay._outbox, ["next_due", "claim"])
        b = await t.add_runtime([Sender], relay=False)
        await until(
            lambda: not loop._idle.following and loop._idle.next_wait() == IDLE_POLLS * 1.0,
            what="A asleep (done following B's start)",
            within=15,
        )
        following = heard_wakes(loop)

        await b.get(Sender, "fw-s1").send_to("fw-r1", 1)
        await until(lambda: received(t, "fw-r1"), what="A delivering B's first intent", within=5)
        assert following == [True]  # A heard B's wake and follows it
        monkeypatch.setattr(b._loop, "poke_others", lambda: None)  # B's next commit: no NOTIFY
        probes, claims = calls["next_due"], calls["claim"]

        await b.get(Sender, "fw-s1").send_to("fw-r2", 1)
        await until(lambda: received(t, "fw-r2"), what="a probe finding B's intent", within=4)
        assert following == [True]  # no wake brought it
        assert calls["next_due"] > probes and calls["claim"] == claims + 1
        # Probes that found nothing due claimed nothing; once the window ends A sleeps again.
        await until(
            lambda: not loop._idle.following and loop._idle.next_wait() == IDLE_POLLS * 1.0,
            what="A asleep again after the window",
            within=15,
        )
        assert calls["claim"] == claims + 1


async def test_with_notify_a_runners_own_wakes_start_no_probing_passes(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every runner hears its own NOTIFYs; its commits already woke its relay in-process, so
    # they must not start 100 probes a second. An operator's wake (another process) does.
    monkeypatch.setattr(idle, "FOLLOW_FOR_S", 5.0)
    async with akter_test(ALL, notify=True) as t:
        loop = t.runtime._loop
        following = heard_wakes(loop)
        sender = t.get(Sender, "ow-s1")

        def heard(n: int) -> Callable[[], bool]:
            return lambda: len(following) >= n

        for k in range(1, 4):
            await sender.send_to("ow-r1", k)
            await until(heard(k), what="its own wake heard", within=5)
        assert following == [False, False, False]
        assert not loop._idle.following

        operator = await t.add_runtime(ALL, relay=False, maintenance=False)
        await operator._relay.announce()
        await until(lambda: len(following) > 3, what="the operator's wake heard", within=5)
        # (On Citus no wake is followed: the probe is no cheaper than a claim there.)
        followed = not t.on_citus
        assert following[3:] and all(f is followed for f in following[3:])


async def test_with_notify_passes_follow_another_runners_wake_only_where_probes_are_cheap(
    akter_test: Make,
) -> None:
    # On Citus the idle probe answers "due" without asking (next_due is 0), so a probing pass
    # would be a full multi-shard claim every 10 ms: there, a wake from another runner is
    # followed by its one woken pass only. On plain PostgreSQL it is followed.
    async with akter_test([Receiver], notify=True) as t:
        loop = t.runtime._loop
        following = heard_wakes(loop)
        b = await t.add_runtime([Sender], relay=False)
        await b.get(Sender, "cw-s1").send_to("cw-r1", 1)
        await until(lambda: received(t, "cw-r1"), what="A delivering B's intent", within=5)
        assert following  # A heard B's wake
        if t.on_citus:
            assert not any(following) and not loop._idle.following
        else:
            assert any(following)


# --- jobs-only wakes (issue 13, goal 4) ----------------------------------------------------------


async def test_a_stream_of_jobs_only_wakes_skips_intent_claims_but_never_starves_them(
    akter_test: Make,
) -> None:
    # A runner that keeps committing job rows wakes its relay for job claims only, faster than
    # it polls. Those passes skip the intent claim, but they never stand in for a poll: a timer
    # that comes due with no wake is still delivered within about a poll.
    async with akter_test(ALL, poll=0.2) as t:
        relay = t.runtime._relay
        passes = count_calls(t.runtime._jobs, ["run_pass"])
        claims = count_calls(relay._outbox, ["claim"])
        await t.get(Sender, "jw-s1").send_then("jw-r1", 1, "ok")  # now + a 60 s timer
        await until(lambda: received(t, "jw-r1"), what="the immediate intent delivered")

        stop = asyncio.Event()

        async def jobs_only_wakes() -> None:
            while not stop.is_set():
                relay.wake_jobs()
                await asyncio.sleep(0.01)  # a steady stream of wakes, not an ordering

        stream = asyncio.create_task(jobs_only_wakes())
        try:
            before = passes["run_pass"], claims["claim"]
            await until(lambda: passes["run_pass"] >= before[0] + 40, what="40 passes")
            job_passes = passes["run_pass"] - before[0]
            intent_claims = claims["claim"] - before[1]
            # At most one full pass per poll (0.2 s) among 40+ passes 10 ms apart.
            assert intent_claims * 4 <= job_passes, (intent_claims, job_passes)

            # The clock moves past the timer; nothing commits a due intent, so only the full
            # passes the stream still leaves can find it.
            for runtime in t.runtimes:
                runtime._clock.offset_ms += 61_000

            async def both_delivered() -> bool:
                return len(await received(t, "jw-r1")) == 2

            await until(both_delivered, what="the timer delivered under the stream")
        finally:
            stop.set()
            await stream
        assert sorted(RUNS.values()) == [1, 1]
