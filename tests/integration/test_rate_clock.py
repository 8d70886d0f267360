"""A rate bucket's clock never moves back (flow-control F3.3).

Runners read the database clock through their own offset (``Clock.offset_ms``: a test's
``advance``, a drill's skew), so two takes of one bucket may carry clocks out of order. The
bucket refills by the time elapsed since its last take; were a take with an earlier clock to set
the bucket's time back, the next take would count that interval twice and grant tokens that no
time has earned.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

import akter
from akter._store.gateway.job_flow import FlowGateway, TokenWant
from akter._store.pool import Clock
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Tally(BaseModel):
    done: int = 0


class Meter(akter.Actor[Tally], access=akter.public):
    @akter.command
    async def noop(self) -> None:
        return None


#: One token a minute, burst one: within the test no time earns a token.
WANT = TokenWant("Meter", "call", 0, "k", per_ms=1 / 60_000, burst=1.0, n=1)


async def test_a_take_with_an_earlier_clock_does_not_refill_the_bucket(akter_test: Make) -> None:
    async with akter_test([Meter]) as t:
        store = t.runtime._store
        now, behind = Clock(store), Clock(store)
        behind.offset_ms = -600_000  # a runner whose clock reads ten minutes behind
        first = await FlowGateway(store, now).take_tokens([WANT], horizon_ms=0)
        assert [take.granted for take in first.values()] == [1]  # the burst
        late = await FlowGateway(store, behind).take_tokens([WANT], horizon_ms=0)
        assert [take.granted for take in late.values()] == [0]
        again = await FlowGateway(store, now).take_tokens([WANT], horizon_ms=0)
        # Milliseconds passed since the first take: nothing was earned.
        assert [take.granted for take in again.values()] == [0]
        (bucket,) = await t.rows("SELECT at_ms, tokens FROM {schema}.rate_buckets")
        assert bucket["tokens"] < 0.01
