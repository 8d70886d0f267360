"""An idle relay's poll asks ``any_due`` instead of running its claims (issue 13, goal 5).

The background loop runs with a short poll. After a pass that claimed nothing, each poll runs
one ``any_due`` statement and no claim while nothing is due; a timer that comes due with no wake
(the clock moves, nothing commits) is still found by the next poll and delivered once. The
gateway's methods are wrapped to count calls; every statement still runs on PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support import until
from tests.integration.relay_actors import ALL, RUNS, Sender, reset

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    reset()
    yield
    reset()


def count_calls(gateway: Any, names: list[str]) -> Counter[str]:
    """Wrap ``names`` of ``gateway`` so that each call is counted (then run as before)."""
    calls: Counter[str] = Counter()
    for name in names:
        original = getattr(gateway, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        setattr(gateway, name, counted)
    return calls


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
        if t.runtime.store.strategy == "citus":
            pytest.skip("counts the plain claim path")
        relay = t.runtime.relay
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
            runtime.clock.offset_ms += 61_000

        async def both_delivered() -> bool:
            return len(await received(t, "idle-r1")) == 2

        await until(both_delivered, what="the timer delivered by a poll")
        assert calls["claim"] > claims
        await relay.wait_idle()
        assert await t.rows("SELECT intent_id FROM {schema}.outbox WHERE kind = 'intent'") == []
        assert sorted(RUNS.values()) == [1, 1]  # each delivery ran its handler once
