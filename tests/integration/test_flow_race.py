"""Two runners claim one capped type at the same moment (issue 16, adversarial; both strategies).

A type with ``concurrency=`` is claimed under the lock of its ``job_limits`` row, and the live
attempts are counted after the lock (docs/flow-control.md F2). The race the lock closes: runner
A has counted no live attempt and not yet committed its claim when runner B counts too; without
the lock both would take the cap's two slots, four attempts of a type capped at two. On Citus
the claim is a scan and single-shard claims, and the lock waits on a worker: the same race,
across shards.

Runner A is held inside its claim, after its count, until runner B is seen waiting for a lock
on this schema's tables (``pg_stat_activity``; on Citus ``citus_lock_waits``, where the wait is
on a worker): an order made by a hook and an observed wait, not by sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from akter.testing import ActorTest
from tests._support import until
from tests._support.locks import lock_waiters
from tests.integration.flow_actors import FLOW, LIVE, STARTS, Slots

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    STARTS.clear()
    LIVE.reset()
    yield
    LIVE.gate.set()
    STARTS.clear()


async def test_two_runners_claiming_a_capped_type_at_once_stay_within_its_cap(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with akter_test(FLOW, relay=False, runners=2) as t:
        first, second = t.runtimes
        for i in range(3):
            await t.get(Slots, f"s{i}").fill(2)
        gateway: Any = first._jobs.gateway
        # The step of A's claim that locks the type and counts its live attempts.
        step = "_slots_citus" if first._store.strategy == "citus" else "_slots"
        counted = getattr(gateway, step)
        holding, release = asyncio.Event(), asyncio.Event()

        async def held(*args: Any) -> Any:
            slots = await counted(*args)
            if not holding.is_set():
                holding.set()  # A holds the type lock, its count made, its claim not sent
                await release.wait()
            return slots

        monkeypatch.setattr(gateway, step, held)
        a_pass = asyncio.create_task(first._jobs.run_pass())
        async with asyncio.timeout(10):
            await holding.wait()
        b_pass = asyncio.create_task(second._jobs.run_pass())

        async def blocked_or_done() -> bool:
            # Without the type lock B's pass would end here, with A's two slots taken too.
            return b_pass.done() or await lock_waiters(t) > 0

        await until(blocked_or_done, what="runner B waiting for the type lock")
        release.set()  # A claims and commits; B's count, after the lock, sees A's attempts
        claimed = [await a_pass, await b_pass]
        assert claimed == [2, 0]
        await until(lambda: LIVE.now == 2, what="two capped calls running")
        rows = await t.rows(
            "SELECT count(*) AS n FROM {schema}.outbox WHERE kind = 'job' AND running"
        )
        assert rows == [{"n": 2}]
        assert [await rt._jobs.run_pass() for rt in t.runtimes] == [0, 0]  # the cap is full
        LIVE.gate.set()
        for _ in range(20):  # each settle frees a slot: the other rows run, two at a time
            for rt in t.runtimes:
                await rt._jobs.run_pass()
                await rt._jobs.wait_idle()
            if not await t.rows("SELECT 1 FROM {schema}.outbox WHERE kind = 'job'"):
                break
        assert LIVE.most == 2
        assert sorted(tag for _, tag in STARTS) == sorted(
            f"s{i}-{j}" for i in range(3) for j in range(2)
        )
