"""A frozen claimer holds a capped type's lock (issue 17, adversarial: a frozen process).

The claim of a job type with ``concurrency=`` locks the type's ``job_limits`` row for its
transaction (docs/flow-control.md F2). A runner frozen inside that transaction (SIGSTOP, a VM
stall, a stuck event loop) keeps the lock. Two bounds keep that from wedging the deployment:

- a claimer waits at most ``GROUP_LOCK_WAIT`` for the lock, then leaves the type for a later pass
  and claims every other type in the same pass (before, it waited without bound, holding the
  runner's pass lock, so no job of any type started on it);
- the claim's transaction ends itself on the server if its session sits idle inside it for
  ``CLAIM_IDLE_BOUND`` (``idle_in_transaction_session_timeout``), so a frozen holder's lock is
  given back without its process.

The frozen holder is a raw connection that takes the lock and goes silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import psycopg
import pytest

from akter._store.gateway import jobs as jobs_gateway
from akter.testing import ActorTest
from tests.integration.flow_actors import LIVE, STARTS, Lanes, Slots

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    STARTS.clear()
    LIVE.reset()
    LIVE.gate.set()  # capped calls return at once
    yield
    STARTS.clear()


async def test_a_claimer_leaves_a_locked_type_for_later_and_claims_the_others(
    akter_test: Make,
) -> None:
    async with akter_test([Slots, Lanes], relay=False) as t:
        await t.get(Slots, "s").fill(2)
        await t.get(Lanes, "l").fill(2, "free")
        await t.runtime._jobs.run_pass()  # the first pass records the type's job_limits row
        await t.wait_idle()
        STARTS.clear()
        await t.get(Slots, "s").fill(2)
        await t.get(Lanes, "l").fill(2, "more")
        async with await psycopg.AsyncConnection.connect(t.database_url) as frozen:
            await frozen.execute(
                f"SELECT 1 FROM {t.schema}.job_limits"
                " WHERE actor_type = 'Slots' AND job = 'capped' FOR UPDATE"
            )
            async with asyncio.timeout(15):  # unbounded before: the pass never returned
                await t.runtime._jobs.run_pass()
            await t.wait_idle()
            assert sorted(tag for _, tag in STARTS) == ["more-0", "more-1"]
            left = await t.rows(
                "SELECT count(*) AS n FROM {schema}.outbox WHERE command = 'capped'"
                " AND NOT running AND attempts = 0"
            )
            assert left == [{"n": 2}]  # untouched, still due
            await frozen.rollback()
        await t.runtime._jobs.run_pass()
        await t.wait_idle()
        assert sorted(tag for _, tag in STARTS) == ["more-0", "more-1", "s-0", "s-1"]


async def test_the_claim_settings_end_a_holder_that_goes_silent_inside_its_transaction(
    akter_test: Make,
) -> None:
    """The settings statement every type and group claim begins with, with a short bound."""
    async with akter_test([Slots], relay=False) as t:
        q = t.runtime._store.queries
        await t.get(Slots, "s").fill(1)
        await t.runtime._jobs.run_pass()
        await t.wait_idle()
        assert jobs_gateway.CLAIM_IDLE_BOUND == "10000ms"
        lock = f"SELECT 1 FROM {q.schema}.job_limits WHERE job = 'capped' FOR UPDATE"
        async with (
            await psycopg.AsyncConnection.connect(t.database_url) as frozen,
            await psycopg.AsyncConnection.connect(t.database_url) as successor,
        ):
            await frozen.execute(
                q["job_group_settings"], {"lock_timeout": "1000ms", "idle_bound": "500ms"}
            )
            await frozen.execute(lock)
            async with asyncio.timeout(20):  # the server ends the silent holder's session
                await successor.execute(lock)
            await successor.rollback()
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await frozen.execute("SELECT 1")


async def test_the_group_lock_statement_carries_its_own_lock_wait_and_idle_bound(
    akter_test: Make,
) -> None:
    """The settings ride in the group lock's own statement: in force before it waits.

    ``job_group_lock_bounded`` is a capped group's claim and wake on plain PostgreSQL.
    """
    async with akter_test([Slots], relay=False) as t:
        if t.on_citus:
            pytest.skip("on Citus the settings are a SET LOCAL of their own before the lock")
        q = t.runtime._store.queries
        await t.get(Slots, "s").fill(1)  # the actor row exists
        ref = t.get(Slots, "s").ref
        group = {"rk": t.runtime.routing_key(ref), "tenant": ref.tenant, "type": ref.type}
        group["id"] = ref.id
        actor_lock = (
            f"SELECT 1 FROM {q.schema}.actors WHERE routing_key = %(rk)s AND tenant_id = "
            "%(tenant)s AND actor_type = %(type)s AND actor_id = %(id)s FOR UPDATE"
        )
        bounded = {**group, "lock_timeout": "200ms", "idle_bound": "500ms"}
        async with (
            await psycopg.AsyncConnection.connect(t.database_url) as holder,
            await psycopg.AsyncConnection.connect(t.database_url) as claimer,
            await psycopg.AsyncConnection.connect(t.database_url) as successor,
        ):
            # A turn holds the actor row and never lets go inside this block: only the lock
            # wait the statement set for itself can end the claimer's wait.
            await holder.execute(actor_lock, group)
            with pytest.raises(psycopg.errors.LockNotAvailable):
                async with asyncio.timeout(15):
                    await claimer.execute(q["job_group_lock_bounded"], bounded)
            await claimer.rollback()
            await holder.rollback()
            # Now it takes the lock, goes silent inside its transaction, and the server ends it.
            cur = await claimer.execute(q["job_group_lock_bounded"], bounded)
            assert await cur.fetchall() == [(1,)]
            async with asyncio.timeout(20):
                await successor.execute(actor_lock, group)
            await successor.rollback()
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await claimer.execute("SELECT 1")


async def test_a_batched_group_claim_skips_held_groups_and_a_frozen_one_is_ended_by_its_bound(
    akter_test: Make,
) -> None:
    """``job_groups_lock_skip``: never waits for a held group, and bounds its own idleness.

    A batch of group claims (docs/flow-control.md F2.9) takes only the locks nobody holds, so
    it cannot wait on an actor row at all; the idle bound it sets first ends a claimer frozen
    between its two round trips, and the locks it took come back without its process.
    """
    async with akter_test([Slots], relay=False) as t:
        if t.on_citus:
            pytest.skip("batched group claims run on plain PostgreSQL only")
        q = t.runtime._store.queries
        refs = []
        for name in ("a", "b"):
            await t.get(Slots, name).fill(1)  # the actor rows exist
            refs.append(t.get(Slots, name).ref)
        groups = [
            {"rk": t.runtime.routing_key(r), "tenant": r.tenant, "type": r.type, "id": r.id}
            for r in refs
        ]
        batch = {
            "rks": [g["rk"] for g in groups],
            "tenants": [g["tenant"] for g in groups],
            "types": [g["type"] for g in groups],
            "ids": [g["id"] for g in groups],
            "lock_timeout": "200ms",
            "idle_bound": "500ms",
        }
        actor_lock = (
            f"SELECT 1 FROM {q.schema}.actors WHERE routing_key = %(rk)s AND tenant_id = "
            "%(tenant)s AND actor_type = %(type)s AND actor_id = %(id)s FOR UPDATE"
        )
        async with (
            await psycopg.AsyncConnection.connect(t.database_url) as holder,
            await psycopg.AsyncConnection.connect(t.database_url) as claimer,
            await psycopg.AsyncConnection.connect(t.database_url) as successor,
        ):
            # A turn holds "a" and never lets go inside this block: the batch skips it at once.
            await holder.execute(actor_lock, groups[0])
            async with asyncio.timeout(5):
                cur = await claimer.execute(q["job_groups_lock_skip"], batch)
            assert await cur.fetchall() == [(2,)]
            await holder.rollback()
            # The claimer now holds "b" and goes silent inside its transaction: the server ends
            # it, and a turn of "b" gets the row.
            async with asyncio.timeout(20):
                await successor.execute(actor_lock, groups[1])
            await successor.rollback()
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await claimer.execute("SELECT 1")
