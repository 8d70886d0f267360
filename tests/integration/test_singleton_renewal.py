"""A runner renews the singleton leases it holds in one statement (issue 13, goal 5: idle cost).

Before, every lease cost a full round every refresh (lock timeout, clock, takeover lock, upsert:
six messages in a transaction). Now a holder extends all its leases with ``renew_singletons``;
a lease it no longer holds, and every lease it does not hold, still gets the full round.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter.testing import ActorTest
from tests._support import until
from tests._support.counting import count_calls

Make = Callable[..., ActorTest]


class Nothing(BaseModel):
    n: int = 0


class Lighthouse(akter.Actor[Nothing], singleton=True):
    @akter.command
    async def noop(self) -> None:
        return None

    async def run(self) -> None:
        await asyncio.Event().wait()


class Foghorn(akter.Actor[Nothing], singleton=True):
    @akter.command
    async def noop(self) -> None:
        return None

    async def run(self) -> None:
        await asyncio.Event().wait()


async def holder(t: ActorTest, *, refresh_ms: int) -> tuple[akter.Runtime, Counter[str]]:
    """Start a runner hosting both singletons, refreshing every ``refresh_ms``, owning both."""
    runtime = akter.Runtime(
        [Lighthouse, Foghorn],
        database_url=t.database_url,
        schema=t.schema,
        maintenance=False,
        relay=False,
    )
    runtime._runners.refresh_ms = refresh_ms
    calls = count_calls(runtime._runners._gateway, ["renew_singletons", "acquire_singleton"])
    await runtime.start()
    t.runtimes.append(runtime)
    await until(
        lambda: runtime._runners.owns("Lighthouse") and runtime._runners.owns("Foghorn"),
        what="both leases held",
    )
    return runtime, calls


async def leases(t: ActorTest) -> dict[str, dict[str, Any]]:
    rows = await t.rows(
        "SELECT actor_type, owner::text AS owner, lease_until_ms, acquired_at_ms, routing_key"
        " FROM {schema}.singletons"
    )
    return {row["actor_type"]: row for row in rows}


async def test_a_holder_renews_all_its_leases_in_one_statement_per_round(
    akter_test: Make,
) -> None:
    async with akter_test([], maintenance=False) as t:
        runtime, calls = await holder(t, refresh_ms=50)
        acquired = calls["acquire_singleton"]  # the first round: one full round per lease
        assert acquired == 2
        before = await leases(t)
        lighthouse = runtime._runners._leases["Lighthouse"]
        task = lighthouse.task

        await until(lambda: calls["renew_singletons"] >= 3, what="three renewal rounds")
        after = await leases(t)
        assert calls["acquire_singleton"] == acquired  # no full round while both are held
        for name in ("Lighthouse", "Foghorn"):
            assert after[name]["owner"] == runtime._runners.runner_id
            assert after[name]["lease_until_ms"] > before[name]["lease_until_ms"]
            # The epoch the loop is fenced on stays: renewing is not acquiring.
            assert after[name]["acquired_at_ms"] == before[name]["acquired_at_ms"]
        assert lighthouse.task is task and lighthouse.runs == 1
        assert runtime._runners.owns("Lighthouse") and runtime._runners.owns("Foghorn")


async def test_a_lease_taken_over_gets_a_full_round_and_its_loop_stops(
    akter_test: Make,
) -> None:
    async with akter_test([], maintenance=False) as t:
        runtime, calls = await holder(t, refresh_ms=50)
        # Another runner took Lighthouse over (as after a stall longer than the lease). The row
        # is named by its routing key and the owner is a parameter: Citus routes the write to
        # the lease's shard and refuses a volatile function in it.
        key = (await leases(t))["Lighthouse"]["routing_key"]
        await t.rows(
            "UPDATE {schema}.singletons SET owner = %(owner)s"
            " WHERE routing_key = %(key)s AND actor_type = 'Lighthouse'",
            {"owner": str(uuid.uuid4()), "key": key},
        )
        acquired = calls["acquire_singleton"]
        lighthouse = runtime._runners._leases["Lighthouse"]
        # Given up: not owned, then its loop's task awaited and forgotten (the lease stops
        # counting as owned first, while the cancelled loop still unwinds: CI, 2026-12-04).
        await until(
            lambda: not runtime._runners.owns("Lighthouse") and lighthouse.task is None,
            what="the taken lease given up and its loop stopped",
        )
        # The renewal missed Lighthouse, so it got a full round, which found the new owner.
        assert calls["acquire_singleton"] > acquired
        assert runtime._runners.owns("Foghorn")
        rows = await leases(t)
        assert rows["Lighthouse"]["owner"] != runtime._runners.runner_id
        assert rows["Foghorn"]["owner"] == runtime._runners.runner_id


async def test_renewal_does_not_wait_for_a_fenced_turn(akter_test: Make) -> None:
    # A fenced turn holds its lease row FOR KEY SHARE through its commit; a frozen one must
    # not stop the owner renewing (a takeover's FOR UPDATE is what waits for it).
    async with akter_test([], maintenance=False) as t:
        runtime, calls = await holder(t, refresh_ms=3_600_000)
        key = (await leases(t))["Lighthouse"]["routing_key"]
        async with await psycopg.AsyncConnection.connect(t.database_url) as conn:
            await conn.execute(
                f"SELECT 1 FROM {t.schema}.singletons"
                " WHERE routing_key = %s AND actor_type = 'Lighthouse' FOR KEY SHARE",
                (key,),
            )
            renewed = await asyncio.wait_for(runtime._runners._renew_owned(), 5)
            assert renewed == {"Lighthouse", "Foghorn"}
            await conn.rollback()
        assert calls["renew_singletons"] == 1


async def test_a_failed_renewal_leaves_every_lease_as_it_was(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with akter_test([], maintenance=False) as t:
        runtime, calls = await holder(t, refresh_ms=3_600_000)
        before = await leases(t)
        monkeypatch.setitem(
            runtime._store.queries._statements,
            "renew_singletons",
            "SELECT 1 / 0 WHERE %(runner_id)s::text IS NOT NULL",
        )
        # The failed statement is this round's attempt for both: no full round, nothing
        # written, both loops still run (their guard stops them if no round succeeds in time).
        assert await runtime._runners._renew_owned() == {"Lighthouse", "Foghorn"}
        assert calls["acquire_singleton"] == 2
        assert await leases(t) == before
        assert runtime._runners.owns("Lighthouse") and runtime._runners.owns("Foghorn")
