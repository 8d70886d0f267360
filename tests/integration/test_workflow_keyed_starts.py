"""A start from a turn is part of the turn (issue 38, finding 4; the workflows spec, W1).

``self.start_workflow(...)`` writes the run in the turn's own commit flight: the run exists
exactly when the turn commits (no relay delivery in between), and a turn that rolls back
starts nothing. With ``key=``, at most one run per (actor, workflow, key) is live: a start of
a live key, in the same turn, a later command of the same batch, a later turn or one racing it
on another runner, starts nothing and returns the live run's id itself (a turn that meets the
key only in its commit flight is run once more, knowing the live runs).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import akter
from akter._store.gateway.workflows import live_key_taken
from akter.testing import ActorTest
from tests._support.barriers import until_pending
from tests._support.locks import until_lock_waiter

pytestmark = pytest.mark.timeout(60)


class Go(BaseModel):
    note: str = ""


class Refused(akter.DeclaredError, tag="refused"):
    pass


class ShopState(BaseModel):
    runs: list[str] = []


class Shop(akter.Actor[ShopState]):
    @akter.command
    async def begin(self, key: str | None = None) -> str:
        run_id = self.start_workflow(Shop.hold, "x", key=key)
        self.state.runs.append(run_id)
        return run_id

    @akter.command
    async def touch(self) -> None:
        self.state.runs = list(self.state.runs)

    @akter.command
    async def begin_twice(self, key: str) -> list[str]:
        return [
            self.start_workflow(Shop.hold, "first", key=key),
            self.start_workflow(Shop.hold, "second", key=key),
        ]

    @akter.command
    async def begin_keys(self, keys: list[str]) -> list[str]:
        return [self.start_workflow(Shop.hold, key, key=key) for key in keys]

    @akter.command(errors=[Refused])
    async def begin_then_refuse(self, key: str) -> str:
        self.start_workflow(Shop.hold, "x", key=key)
        raise Refused()

    @akter.workflow
    async def hold(wf: akter.Workflow, label: str) -> str:
        go = await wf.wait(Go)
        return f"{label}:{go.note if go else ''}"


async def runs(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT run_id, run_key, status, input FROM {schema}.workflows ORDER BY started_at_ms"
    )


async def test_keyed_start_from_a_turn_exists_when_the_turn_commits(akter_test: Any) -> None:
    async with akter_test([Shop]) as t:
        # Held right after COMMIT, before the turn answers or wakes anyone.
        gate = t.pause_next("after_commit")
        call = asyncio.create_task(t.get(Shop, "s-1").begin("k"))
        await gate.wait()
        rows = await runs(t)
        assert [(r["run_key"], r["status"]) for r in rows] == [("k", "runnable")]
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []  # no relay hop
        status = await t.runtime.workflow_run(rows[0]["run_id"]).status()
        assert status.status == "runnable" and status.key == "k"
        gate.release()
        run_id = await call
        assert run_id == rows[0]["run_id"]
        # The id resolves at once, through workflow_run, status and result.
        run = t.runtime.workflow_run(run_id)
        await t.drain()
        await run.signal(Go(note="now"))
        assert await run.result(timeout=10) == "x:now"

        # A turn that rolls back starts nothing.
        with pytest.raises(Refused):
            await t.get(Shop, "s-2").begin_then_refuse("k")
        assert len(await runs(t)) == 1


async def test_second_keyed_start_returns_the_live_run(akter_test: Any) -> None:
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-3")
        # The same turn: the second start returns the first one's id and starts nothing.
        first, again = await shop.begin_twice("k")
        assert again == first
        assert [r["run_id"] for r in await runs(t)] == [first]

        # A later turn, while the run is live: it starts nothing and returns the live run's id
        # itself (the handler's own return value and state carry it; nothing names it by an
        # alias).
        later = await shop.begin("k")
        assert later == first
        assert [r["run_id"] for r in await runs(t)] == [first]
        assert await t.rows("SELECT run_id FROM {schema}.workflow_aliases") == []
        state = (await t.inspect(shop)).state
        assert state["runs"][-1] == first  # the handler saw the live id, and stored it
        await t.drain()
        await t.runtime.workflow_run(first).signal(Go(note="one"))
        assert await t.runtime.workflow_run(first).result(timeout=10) == "first:one"

        # Once it ended, the key starts a new run.
        fresh = await shop.begin("k")
        assert (await t.runtime.workflow_run(fresh).status()).run_id == fresh != first
        assert len(await runs(t)) == 2

        # Another key, and no key, start runs of their own.
        other = await shop.begin("other")
        unkeyed = await shop.begin(None)
        assert len({fresh, other, unkeyed}) == 3
        assert len(await runs(t)) == 4


async def test_keyed_starts_in_one_batch_return_one_id(akter_test: Any) -> None:
    """Several commands of one batch: a later command's start of a key returns the earlier's."""
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-7")
        await shop.touch()

        async def one_batch(*calls: Any) -> list[Any]:
            """Run ``calls`` as one batch, queued behind a turn held before its commit."""
            gate = t.pause_next("before_commit")
            head = asyncio.create_task(shop.touch())
            await gate.wait()
            tasks = [asyncio.create_task(c) for c in calls]
            await until_pending(t.runtime, 1 + len(calls))
            batch = t.pause_next("before_commit")  # the queued batch's (first) commit
            gate.release()
            await head
            assert len((await batch.wait())["batch"]) == len(calls)  # one batch
            batch.release()
            return list(await asyncio.gather(*tasks, return_exceptions=True))

        # No run of the key yet: a start whose command failed stages nothing; the next start in
        # the batch starts the run, and a later one returns its id.
        refused, first, again, other = await one_batch(
            shop.begin_then_refuse("b"), shop.begin("b"), shop.begin("b"), shop.begin("c")
        )
        assert isinstance(refused, Refused)
        assert again == first != other
        assert sorted((r["run_key"], r["run_id"]) for r in await runs(t)) == [
            ("b", first),
            ("c", other),
        ]

        # The key is live: every start of it in a later batch returns the live run's id, beside
        # a start of a new key, which starts its run.
        later, later_again, fresh = await one_batch(
            shop.begin("b"), shop.begin("b"), shop.begin("d")
        )
        assert later == later_again == first
        assert fresh not in (first, other)
        assert sorted((r["run_key"], r["run_id"]) for r in await runs(t)) == sorted(
            [("b", first), ("c", other), ("d", fresh)]
        )
        state = (await t.inspect(shop)).state
        assert state["runs"] == [first, first, other, first, first, fresh]
        assert await t.rows("SELECT run_id FROM {schema}.workflow_aliases") == []


async def test_two_runners_racing_one_key_start_one_run(akter_test: Any) -> None:
    async with akter_test([Shop]) as t:
        second = await t.add_runtime([Shop])
        await t.get(Shop, "s-4").touch()
        await second.get(Shop, "s-4").touch()  # both runners warm: each turn locks the row
        # Runner 0's turn holds the actor's lock, paused before its commit flight ...
        gate = t.pause_next("before_commit")
        a = asyncio.create_task(t.get(Shop, "s-4").begin("k"))
        await gate.wait()
        # ... while runner 1's turn of the same actor, starting the same key, waits for it.
        b = asyncio.create_task(second.get(Shop, "s-4").begin("k"))
        await until_lock_waiter(t, ".actors")
        gate.release()
        ids = [await a, await b]
        rows = await runs(t)
        assert len(rows) == 1
        live = rows[0]["run_id"]
        for run_id in ids:
            assert (await t.runtime.workflow_run(run_id).status()).run_id == live
        assert ids == [live, live]  # the turn that committed first started it; both hold it
        assert await t.rows("SELECT run_id FROM {schema}.workflow_aliases") == []


async def test_a_start_whose_turn_crashed_is_one_run_or_none(akter_test: Any) -> None:
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-5")
        # Crashed before COMMIT: the attempt wrote nothing; the retry under the same command id
        # starts the one run.
        t.crash_next("before_commit")
        first = await shop.with_command_id(await t.runtime.mint_command_id()).begin("k")
        assert [r["run_id"] for r in await runs(t)] == [first]
        # Crashed after COMMIT (the answer lost): the retry replays the receipt, the same id,
        # and no second run.
        t.crash_next("after_commit")
        second = await shop.with_command_id(await t.runtime.mint_command_id()).begin(None)
        assert [r["run_id"] for r in await runs(t)] == [first, second]
        assert t.runtime.hooks.fired == [("before_commit", "crash"), ("after_commit", "crash")]
        assert (await t.runtime.workflow_run(second).status()).run_id == second


async def test_a_keyed_start_racing_an_uncommitted_one_returns_it_after_a_rerun(
    akter_test: Any,
) -> None:
    """A start by another transaction (older code's relay delivery) holds the key, uncommitted."""
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-6")
        await shop.touch()
        (actor,) = await t.rows("SELECT routing_key FROM {schema}.actors WHERE actor_id = 's-6'")
        side = await psycopg.AsyncConnection.connect(t.database_url)
        try:
            await side.execute(
                t.substitute(
                    "INSERT INTO {schema}.workflows (routing_key, run_id, tenant_id, actor_type,"
                    " actor_id, workflow, run_key, input, input_hash, caller, status,"
                    " wake_at_ms, started_at_ms, updated_at_ms) VALUES (%(rk)s, 'side-run',"
                    " 'default', 'Shop', 's-6', 'hold', 'k', '{\"label\": \"side\"}', 'x',"
                    " '{}', 'suspended', NULL, 0, 0)"
                ),
                {"rk": actor["routing_key"]},
            )
            call = asyncio.create_task(shop.begin("k"))
            # The turn's start waits on the key's unique index for the side transaction ...
            await until_lock_waiter(t, "INSERT INTO", ".workflows")
            await side.commit()
        finally:
            await side.close()
        # ... which then holds the key: the turn re-runs once knowing it, and returns its id.
        run_id = await call
        assert run_id == "side-run"
        assert [r["run_id"] for r in await runs(t)] == ["side-run"]


async def test_a_crash_around_the_keyed_start_retry_leaves_one_run(akter_test: Any) -> None:
    """The turn that met a live key re-runs knowing it: a crash before or after that re-run."""
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-8")
        first = await shop.begin("k")
        # Crashed between the refused commit and the re-run: nothing of the turn committed; the
        # caller's retry (same command id) meets the key again, re-runs, and names the run.
        t.crash_next("before_keyed_start_retry")
        again = await shop.with_command_id(await t.runtime.mint_command_id()).begin("k")
        assert again == first
        # Crashed after the re-run's COMMIT (the answer lost): the retry replays its receipt.
        t.crash_next("after_commit")
        command_id = await t.runtime.mint_command_id()
        replayed = await shop.with_command_id(command_id).begin("k")
        assert replayed == first
        assert t.runtime.hooks.fired == [
            ("before_keyed_start_retry", "crash"),
            ("after_commit", "crash"),
        ]
        assert [r["run_id"] for r in await runs(t)] == [first]
        receipts = (await t.inspect(shop)).receipts
        assert [r["command_id"] for r in receipts].count(command_id) == 1
        assert (await t.inspect(shop)).state["runs"] == [first, first, first]


async def test_only_a_live_key_violation_reruns_a_batch(akter_test: Any) -> None:
    """A batch re-runs on the live-key index's violation, never on another unique key's.

    On Citus a worker's violation comes back without its constraint's name (its message names
    the shard's index), and an ``INSERT ... SELECT`` one as ``XX000`` (Citus writes its rows
    with COPY): both are read by the index their message names. One that names nothing at all
    re-runs the batch too.
    """
    async with akter_test([Shop]) as t:
        await t.get(Shop, "s-9").begin("k")
        (row,) = await t.rows("SELECT * FROM {schema}.workflows")
        insert = t.substitute(
            "INSERT INTO {schema}.workflows (routing_key, run_id, tenant_id, actor_type,"
            " actor_id, workflow, run_key, input, input_hash, caller, status, wake_at_ms,"
            " started_at_ms, updated_at_ms) VALUES (%(rk)s, %(run_id)s, 'default', 'Shop',"
            " 's-9', 'hold', 'k', '{}', 'x', '{}', 'suspended', NULL, 0, 0)"
        )
        errors: list[psycopg.Error] = []
        async with await psycopg.AsyncConnection.connect(t.database_url) as conn:
            for run_id in ("another", row["run_id"]):  # the live key; then the primary key
                with pytest.raises(psycopg.errors.UniqueViolation) as caught:
                    await conn.execute(insert, {"rk": row["routing_key"], "run_id": run_id})
                await conn.rollback()
                errors.append(caught.value)
        # The form wf_start_in_turn takes: rows from unnest (on Citus: through the coordinator).
        select = t.substitute(
            "INSERT INTO {schema}.workflows (routing_key, run_id, tenant_id, actor_type,"
            " actor_id, workflow, run_key, input, input_hash, caller, status, wake_at_ms,"
            " started_at_ms, updated_at_ms) SELECT %(rk)s, r, 'default', 'Shop', 's-9', 'hold',"
            " 'k', '{}', 'x', '{}', 'suspended', NULL, 0, 0 FROM unnest(%(ids)s::text[]) AS r"
        )
        async with await psycopg.AsyncConnection.connect(t.database_url) as conn:
            with pytest.raises(psycopg.Error) as caught_select:
                await conn.execute(select, {"rk": row["routing_key"], "ids": ["yet-another"]})
            await conn.rollback()
        errors.append(caught_select.value)
        assert [live_key_taken(e) for e in errors] == [True, False, True]
        assert await t.rows("SELECT run_id FROM {schema}.workflows") == [{"run_id": row["run_id"]}]
        assert live_key_taken(psycopg.errors.UniqueViolation("no constraint named"))
        assert not live_key_taken(psycopg.errors.SerializationFailure("40001"))


async def test_a_rerun_that_meets_another_live_key_is_retried_by_its_caller(
    akter_test: Any,
) -> None:
    """One re-run per turn: a key taken again under it answers ActorUnavailable (retryable)."""
    async with akter_test([Shop]) as t:
        shop = t.get(Shop, "s-10")
        (live,) = await shop.begin_keys(["k"])
        (actor,) = await t.rows("SELECT routing_key FROM {schema}.actors WHERE actor_id = 's-10'")
        seen: list[int] = []

        def second(info: dict[str, Any]) -> bool:
            seen.append(1)
            return len(seen) == 2  # the re-run's commit (the first attempt met key k)

        gate = t.pause_next("before_commit", second)
        call = asyncio.create_task(shop.begin_keys(["k", "j"]))
        await gate.wait()
        # Under the re-run, which knows k's run and stages j's, another transaction starts j.
        async with await psycopg.AsyncConnection.connect(t.database_url) as side:
            await side.execute(
                t.substitute(
                    "INSERT INTO {schema}.workflows (routing_key, run_id, tenant_id, actor_type,"
                    " actor_id, workflow, run_key, input, input_hash, caller, status,"
                    " wake_at_ms, started_at_ms, updated_at_ms) VALUES (%(rk)s, 'side-j',"
                    " 'default', 'Shop', 's-10', 'hold', 'j', '{\"label\": \"j\"}', 'x',"
                    " '{}', 'suspended', NULL, 0, 0)"
                ),
                {"rk": actor["routing_key"]},
            )
        gate.release()
        # The re-run fails too (retryable, nothing written); the caller's retry is a new turn,
        # whose own re-run knows both keys.
        assert await call == [live, "side-j"]
        assert sorted(r["run_id"] for r in await runs(t)) == sorted([live, "side-j"])
