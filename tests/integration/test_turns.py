"""Conformance: identity (ID-*) and turns (TU-*) on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import akter
from akter._engine.turn import engine as turn_engine
from akter._ids import bucket, payload_hash, placement_key, routing_key
from akter.testing import ActorTest
from tests._support import policy_override, until, until_pending
from tests._support.citus import ON_CITUS
from tests.integration.actors import (
    _ESCAPED,
    _RUNTIME,
    ALL,
    RUNS,
    Counter,
    Planner,
    Shop,
    Task,
    TooBig,
)

#: Every test runs with warm turns in one flight and in two (rule 7 of one-flight-turn.md).
pytestmark = pytest.mark.usefixtures("turn_mode")

Make = Callable[..., ActorTest]


def reason(exc: pytest.ExceptionInfo[akter.ActorError]) -> tuple[str, str | None]:
    return exc.value.reason, exc.value.code


async def count(t: ActorTest, table: str) -> int:
    rows = await t.rows(f"SELECT count(*) AS n FROM {{schema}}.{table}")
    return int(rows[0]["n"])


# --- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tenant", ["", "x" * 129, "a/b", "ünï"])
async def test_ID01_invalid_tenant_refused_before_any_turn(akter_test: Make, tenant: str) -> None:
    async with akter_test(ALL) as t:
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Counter, "c", tenant=tenant).add(1)
        assert reason(exc) == ("InvalidInput", None)
        assert exc.value.field == "tenant"
        assert await count(t, "actors") == 0
        assert await count(t, "receipts") == 0


async def test_ID02_rows_carry_the_routing_key(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.get(Counter, "c1", tenant="acme").stage_everything(1)
        expected = routing_key(placement_key("tenant", "acme", "Counter", "c1"))
        assert expected == 2472398586103912953
        for table in ("actors", "receipts", "events", "outbox"):
            rows = await t.rows(f"SELECT DISTINCT routing_key FROM {{schema}}.{table}")
            assert [r["routing_key"] for r in rows] == [expected], table
        buckets = await t.rows("SELECT DISTINCT bucket FROM {schema}.outbox")
        assert [r["bucket"] for r in buckets] == [bucket(expected)] == [34]


async def test_ID03_retried_parent_mints_the_same_children(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        planner = t.get(Planner, "p1", tenant="acme")
        cid = await t.runtime.mint_command_id()
        t.crash_next("before_commit")
        # The crash is retried by the handle with the same id: the children are minted again.
        ids = await planner.with_command_id(cid).plan(1)
        again = await planner.with_command_id(cid).plan(1)
        assert ids == again
        rows = await t.rows("SELECT target_id, caller FROM {schema}.outbox ORDER BY target_id")
        assert {r["target_id"] for r in rows} <= set(ids)  # the relay may have started
        assert all('"mint"' in r["caller"] for r in rows)
        await t.drain()
        for child_id, k in zip(ids, (1, 2), strict=True):
            child = await t.inspect(akter.ActorRef("acme", "Task", child_id))
            assert child.created and child.version == 1 and len(child.receipts) == 1
            assert child.state is not None and child.state["n"] == k
        # A forged proof (an external call to the minted id) is refused without a receipt.
        forged = t.get(Task, "0c5a337c-0560-8eb1-b010-902d673172c7", tenant="acme")
        with pytest.raises(akter.ActorError) as exc:
            await forged.start(1)
        assert reason(exc) == ("Unauthorized", "access_denied")
        assert not (await t.inspect(forged)).exists


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("nonsense", "malformed"),
        ("v2.1.86400001.0190a3b4-5c6d-4e7f-8a9b-0c1d2e3f4a5b", "version"),
        ("v1.1.2.0190a3b4-5c6d-4e7f-8a9b-0c1d2e3f4a5b", "window"),
    ],
)
async def test_ID04_invalid_command_ids(akter_test: Make, raw: str, code: str) -> None:
    async with akter_test(ALL) as t:
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Counter, "c").with_command_id(raw).add(1)
        assert reason(exc) == ("InvalidCommandId", code)
        assert not exc.value.retryable
        assert await count(t, "receipts") == 0


async def test_ID04_future_command_id_is_retryable(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        now = await t.now_ms()
        issued = now + 600_000  # ten minutes ahead of the database clock
        raw = f"v1.{issued}.{issued + 86_400_000}.{uuid.uuid4()}"
        counter = t.get(Counter, "c")
        with pytest.raises(akter.ActorError) as exc:
            await counter.with_command_id(raw).add(1)
        # Far beyond clock-estimate jitter: the handle raises the retryable `future` refusal at
        # once, with its retry_after, instead of retrying it into a Timeout (hardening 8).
        assert reason(exc) == ("InvalidCommandId", "future")
        assert exc.value.retryable
        assert exc.value.retry_after is not None and 590 <= exc.value.retry_after <= 600
        assert await count(t, "receipts") == 0
        await t.advance(700)
        assert await counter.with_command_id(raw).add(1) == 1


async def test_ID05_created_ids_are_uuid7_and_write_nothing(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        handle = await t.create(Counter)
        assert uuid.UUID(handle.id).version == 7
        assert await count(t, "actors") == 0
        await handle.add(1)
        assert (await t.inspect(handle)).version == 1


async def test_ID07_payload_hash_and_argument_forms(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        cid = await t.runtime.mint_command_id()
        assert await counter.with_command_id(cid).add(1200) == 1200
        assert await counter.with_command_id(cid).add(k=1200) == 1200  # keyword: replay
        receipt = (await t.inspect(counter)).receipts[0]
        assert receipt["payload_hash"] == payload_hash({"k": 1200})
        assert payload_hash({"cents": 1200}) == (
            "a38935fe39cd91a77caf5ea1957950f439246b5d23bc461b5e630268849fe2f1"
        )
        cid2 = await t.runtime.mint_command_id()
        await counter.with_command_id(cid2).add_all([1, 2], {"a": 1, "b": 2})
        assert await counter.with_command_id(cid2).add_all([1, 2], {"b": 2, "a": 1}) == 1203
        with pytest.raises(akter.ActorError) as exc:
            await counter.with_command_id(cid2).add_all([2, 1], {"a": 1, "b": 2})
        assert exc.value.reason == "CommandConflict"
        assert (await t.inspect(counter)).state == {
            "n": 1203,
            "applied": [cid],
            "data": "",
            "tags": {},
        }


# --- turns ------------------------------------------------------------------------------------


async def test_TU01_two_runtimes_share_one_actor(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        second = await t.add_runtime()
        a = t.runtime.get(Counter, "c")
        b = second.get(Counter, "c")
        await a.add(0)
        await b.add(0)  # both runtimes now have the actor cached
        results = await asyncio.gather(
            *[a.add(1) for _ in range(100)], *[b.add(1) for _ in range(100)]
        )
        assert sorted(results)[-1] == 200
        assert len(set(results)) == 200
        row = await t.inspect(a)
        assert row.state is not None and row.state["n"] == 200
        # One version per state-changing batch: batching keeps it at or below the command count.
        assert 2 <= row.version <= 202


async def test_TU02_first_commit_creates_and_refusals_leave_no_row(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        await t.get(Counter, "c").add(1)
        row = await t.inspect(t.get(Counter, "c"))
        assert (row.version, row.created) == (1, True)
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Shop, "never").spend(1)
        assert exc.value.reason == "NotCreated"
        assert not (await t.inspect(t.get(Shop, "never"))).exists


@pytest.mark.parametrize("point", ["before_handler", "before_commit"])
async def test_TU03_crash_before_commit_writes_nothing(akter_test: Make, point: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "c3")
        RUNS.pop("stage:c3", None)
        t.crash_next(point)
        retry = t.pause_next(point)  # the handle's retry, after the crash
        cid = await t.runtime.mint_command_id()
        call = asyncio.create_task(counter.with_command_id(cid).stage_everything(5))
        await retry.wait()
        # The crashed attempt left nothing behind.
        for table in ("receipts", "events", "outbox"):
            assert await count(t, table) == 0, table
        retry.release()
        assert await call == 5
        assert RUNS["stage:c3"] == (2 if point == "before_commit" else 1)
        row = await t.inspect(counter)
        assert len(row.receipts) == 1 and row.receipts[0]["command_id"] == cid
        assert len(row.events) == 1
        assert sorted(o["kind"] for o in row.outbox) == ["intent", "intent", "job"]
        assert row.version == 1


async def test_TU03_crash_leaves_no_rows(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(counter.stage_everything(5))
        await pause.wait()
        # While paused before commit, another connection sees nothing of the turn.
        assert await count(t, "outbox") == 0
        assert await count(t, "events") == 0
        pause.release()
        await call


async def test_TU04_crash_after_commit_replays(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        cid = await t.runtime.mint_command_id()
        t.crash_next("after_commit")
        assert await counter.with_command_id(cid).add(7) == 7
        row = await t.inspect(counter)
        assert row.state is not None and row.state["applied"] == [cid]
        assert row.version == 1
        assert t.runtime.hooks.fired == [("after_commit", "crash")]


async def test_TU06_conflicting_reuse_of_an_id(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        cid = await t.runtime.mint_command_id()
        await counter.with_command_id(cid).add(1)
        for call in (counter.with_command_id(cid).add(2), counter.with_command_id(cid).take(1)):
            with pytest.raises(akter.ActorError) as exc:
                await call
            assert exc.value.reason == "CommandConflict"
        row = await t.inspect(counter)
        assert row.state is not None and row.state["n"] == 1
        assert len(row.receipts) == 1 and row.receipts[0]["command"] == "add"


async def test_TU07_receipts_are_private_to_their_caller(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        cid = await t.runtime.mint_command_id()
        with akter.as_caller(akter.User("alice")):
            await counter.with_command_id(cid).add(3)
        with akter.as_caller(akter.User("mallory")), pytest.raises(akter.ActorError) as exc:
            await counter.with_command_id(cid).add(3)
        assert reason(exc) == ("Unauthorized", "receipt_access_denied")
        assert exc.value.message.endswith("belongs to another caller.")
        row = await t.inspect(counter)
        assert row.state is not None and row.state["n"] == 3
        assert row.receipts[0]["caller_key"] == '["User","alice"]'


async def test_TU08_declared_failure_commits_only_its_receipt(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:  # outbox snapshots: nothing may deliver
        counter = t.get(Counter, "c")
        await counter.add(10)
        await counter.stage_everything(1)  # a job keyed "w" and a timer keyed "remind" pending
        before = await t.inspect(counter)
        cid = await t.runtime.mint_command_id()
        with pytest.raises(TooBig) as first:
            await counter.with_command_id(cid).busy_then_fail(5)
        with pytest.raises(TooBig) as replay:
            await counter.with_command_id(cid).busy_then_fail(5)
        assert first.value == replay.value and replay.value.fields == {"limit": 0, "asked": 5}
        after = await t.inspect(counter)
        assert after.state == before.state and after.version == before.version
        assert after.events == before.events
        assert after.outbox == before.outbox
        failure = [r for r in after.receipts if r["command_id"] == cid]
        assert failure[0]["outcome"] == {"error": "TooBig", "fields": {"limit": 0, "asked": 5}}
        assert await counter.caught(2) == 13
        assert len((await t.inspect(counter)).events) == 2


@pytest.mark.parametrize("kind", ["boom", "unlisted", "big", "events", "return", "state-type"])
async def test_TU09_defects_roll_back(
    akter_test: Make, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        await counter.add(1)
        caplog.set_level(logging.ERROR, logger="akter.turn")
        with pytest.raises(akter.ActorError) as exc:
            await counter.defect(kind)
        assert exc.value.reason == "Defect"
        messages = [r.getMessage() for r in caplog.records]
        assert [m.partition(": ")[0] for m in messages] == ["Deterministic actor defect"]
        assert messages[0].startswith("Deterministic actor defect: Counter/'c' command defect")
        row = await t.inspect(counter)
        assert len(row.receipts) == 1 and row.version == 1 and row.events == []
        assert await counter.add(1) == 2


async def test_TU09_internal_command_from_a_user_is_a_defect(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        with pytest.raises(akter.ActorError) as exc:
            await counter.secret()
        assert reason(exc) == ("InvalidInput", "unknown_member")
        for caller in (akter.User("u"), akter.Anonymous()):
            result = await t.runtime.deliver(
                counter.ref, "secret", {}, await t.runtime.mint_command_id(), caller
            )
            assert isinstance(result.error, akter.ActorError)
            assert result.error.reason == "Defect"
        assert await count(t, "receipts") == 0


async def test_TU09_stored_state_failing_validation(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        await counter.add(1)
        await t.rows('UPDATE {schema}.actors SET state = \'{"n": "bad"}\', version = version + 1')
        with pytest.raises(akter.ActorError) as exc:
            await counter.add(1)
        assert exc.value.reason == "Defect" and "fails validation" in exc.value.message
        assert len((await t.inspect(counter)).receipts) == 1


async def test_TU10_request_reply_and_escaped_capabilities(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        _RUNTIME[:] = [t.runtime]
        counter = t.get(Counter, "c")
        with pytest.raises(akter.ActorError) as exc:
            await counter.call_other()
        assert exc.value.reason == "Defect" and "request/reply inside a turn" in exc.value.message
        assert await counter.from_task() == "escaped"
        await counter.escape()
        with pytest.raises(akter.CapabilityEscaped):
            _ESCAPED[-1].state.n += 1
        with pytest.raises(akter.CapabilityEscaped):
            _ESCAPED[-1].send(Counter.add, "x", 1)
        assert await count(t, "outbox") == 0


async def test_TU11_creation_gate(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        shop = t.get(Shop, "s")
        with pytest.raises(akter.ActorError) as exc:
            await shop.spend(1)
        assert exc.value.reason == "NotCreated"
        assert not (await t.inspect(shop)).exists
        with pytest.raises(TooBig):
            await shop.open(-1)
        row = await t.inspect(shop)
        assert row.exists and not row.created and len(row.receipts) == 1
        assert await shop.open(10) == 10
        row = await t.inspect(shop)
        assert row.created and row.version == 1 and len(row.receipts) == 2
        assert await shop.spend(3) == 7


async def test_TU12_execution_timeout_rolls_back_and_retries(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "timeout")
        RUNS.pop("slow", None)
        slow = akter.Policy(execution_timeout=0.3, delivery_timeout=5)
        with policy_override(Counter, slow):
            assert await counter.slow_once("slow") == 1
        assert RUNS["slow"] == 2
        row = await t.inspect(counter)
        assert row.version == 1 and len(row.receipts) == 1


async def test_TU14_lock_wait_then_retry(akter_test: Make, akter_db: str) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        await counter.add(1)
        cid = await t.runtime.mint_command_id()
        with policy_override(Counter, akter.Policy(lock_wait=0.1, delivery_timeout=0.6)):
            async with await psycopg.AsyncConnection.connect(akter_db) as holder:
                await holder.execute(
                    t.substitute(
                        "SELECT 1 FROM {schema}.actors"
                        " WHERE routing_key = %(rk)s AND actor_id = 'c' FOR UPDATE"
                    ),
                    {"rk": t.runtime.routing_key(counter.ref)},
                )
                with pytest.raises(akter.ActorError) as exc:
                    await counter.with_command_id(cid).add(1)
                assert exc.value.reason == "Timeout" and exc.value.command_id == cid
                if ON_CITUS and exc.value.code == "outcome_unknown":
                    # On Citus an attempt (its lock wait plus a coordinator hop per statement)
                    # can still be waiting at the deadline: "it may still commit" is then the
                    # honest answer. Nothing commits while the row is held either way.
                    assert "may still commit" in exc.value.message
                else:
                    assert "ActorUnavailable" in exc.value.message
                assert len((await t.inspect(counter)).receipts) == 1
            assert await counter.with_command_id(cid).add(1) == 2
        assert len((await t.inspect(counter)).receipts) == 2


async def test_TU15_batches_isolate_declared_failures(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        await counter.add(10)
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(counter.add(1))
        await pause.wait()
        calls = [counter.add(1), counter.add(1), counter.take(100), counter.add(1), counter.add(1)]
        tasks = [asyncio.create_task(c) for c in calls]
        await until_pending(t.runtime, 6)  # the five are in the mailbox behind the paused turn
        version_before = (await t.inspect(counter)).version
        pause.release()
        await first
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[2], TooBig)
        assert [r for i, r in enumerate(results) if i != 2] == [12, 13, 14, 15]
        row = await t.inspect(counter)
        # The paused turn and then one batch of five: two state-changing transactions.
        assert row.version == version_before + 2
        assert len(row.receipts) == 7


async def test_TU15_defect_in_a_batch_reruns_one_by_one(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(counter.add(1))
        await pause.wait()
        calls = [counter.add(1), counter.add(1), counter.defect("boom"), counter.add(1)]
        tasks = [asyncio.create_task(c) for c in calls]
        await until_pending(t.runtime, 5)
        pause.release()
        await first
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[2], akter.ActorError) and results[2].reason == "Defect"
        assert [results[0], results[1], results[3]] == [2, 3, 4]
        assert len((await t.inspect(counter)).receipts) == 4


async def test_TU15_duplicate_id_in_the_mailbox_replays(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(counter.add(1))
        await pause.wait()
        cid = await t.runtime.mint_command_id()
        tasks = [asyncio.create_task(counter.with_command_id(cid).add(5)) for _ in range(2)]
        await until_pending(t.runtime, 3)
        pause.release()
        await first
        assert await asyncio.gather(*tasks) == [6, 6]
        row = await t.inspect(counter)
        assert row.state is not None and row.state["n"] == 6


async def test_TU16_expired_ids(akter_test: Make) -> None:
    async with akter_test(ALL, retry_window=60) as t:
        counter = t.get(Counter, "c")
        fresh = await t.runtime.mint_command_id()
        committed = await t.runtime.mint_command_id()
        assert await counter.with_command_id(committed).add(1) == 1
        assert await counter.with_command_id(committed).add(1) == 1  # before expiry: replay
        await t.advance(61)
        for cid in (fresh, committed):
            with pytest.raises(akter.ActorError) as exc:
                await counter.with_command_id(cid).add(1)
            assert exc.value.reason == "CommandExpired"
        row = await t.inspect(counter)
        assert row.state is not None and row.state["n"] == 1 and len(row.receipts) == 1


async def test_TU17_queries(akter_test: Make, akter_db: str) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        await counter.add(4)
        async with await psycopg.AsyncConnection.connect(akter_db) as holder:
            await holder.execute(
                t.substitute(
                    "SELECT 1 FROM {schema}.actors"
                    " WHERE routing_key = %(rk)s AND actor_id = 'c' FOR UPDATE"
                ),
                {"rk": t.runtime.routing_key(counter.ref)},
            )
            assert await asyncio.wait_for(counter.value(), 1.0) == 4
        with pytest.raises(akter.ReadOnlyError):
            await counter.scribble()
        whole = await counter.whole()  # returning the read-only view itself is fine
        assert whole.n == 4 and len(await counter.applied()) == 1
        whole.n = 5  # the caller's copy is its own
        assert await counter.value() == 4
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Shop, "none").left()
        assert exc.value.reason == "NotCreated"
        assert await t.get(Counter, "fresh").value() == 0


async def test_TU17_runner_at_capacity_and_timeout(akter_test: Make) -> None:
    async with akter_test(ALL, max_resident_actors=1) as t:
        counter = t.get(Counter, "a")
        pause = t.pause_next("before_commit")
        held = asyncio.create_task(counter.add(1))
        await pause.wait()
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Counter, "b").with_command_id(await t.runtime.mint_command_id()).add(1)
        # Retried until the delivery timeout: the last refusal was RunnerAtCapacity.
        assert exc.value.reason == "Timeout" and "RunnerAtCapacity" in exc.value.message
        assert not (await t.inspect(t.get(Counter, "b"))).exists
        pause.release()
        assert await held == 1


async def test_TU17_paused_turn_times_out_then_replays(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        with policy_override(Counter, akter.Policy(delivery_timeout=0.3)):
            counter = t.get(Counter, "c")
            cid = await t.runtime.mint_command_id()
            pause = t.pause_next("before_commit")
            with pytest.raises(akter.ActorError) as exc:
                await counter.with_command_id(cid).add(9)
            assert exc.value.reason == "Timeout" and exc.value.command_id == cid
            pause.release()
        assert await counter.with_command_id(cid).add(9) == 9
        row = await t.inspect(counter)
        assert row.state is not None and row.state["applied"] == [cid]


async def test_bad_input_is_refused_before_any_turn(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "c")
        with pytest.raises(akter.ActorError) as exc:
            await counter.add("many")  # type: ignore[arg-type]
        assert reason(exc) == ("InvalidInput", None) and exc.value.field == "k"
        assert "'k'" in exc.value.message
        with pytest.raises(akter.ActorError) as exc:
            await counter.add(1, 2)  # type: ignore[call-arg]
        assert exc.value.reason == "InvalidInput"
        with pytest.raises(akter.ActorError) as exc:
            await t.runtime.call(Counter, "c", "nope", {})
        assert reason(exc) == ("InvalidInput", "unknown_member")
        with pytest.raises(akter.ActorError) as exc:
            await t.runtime.call("Ghost", "c", "add", {"k": 1})
        assert reason(exc) == ("InvalidInput", "unknown_type")
        with pytest.raises(akter.ActorError) as exc:
            await t.runtime.call(Counter, "c", "add", {"k": 1, "extra": 2})
        assert exc.value.reason == "InvalidInput" and exc.value.field == "extra"
        with pytest.raises(akter.ActorError) as exc:
            await t.get(Counter, "bad\x00id").add(1)
        assert exc.value.field == "id"
        # Text PostgreSQL cannot store is refused before the turn, not retried as unavailable.
        for command, bad in (
            ("add_all", {"ks": [1], "meta": {"a\x00": 1}}),
            ("defect", {"kind": "lone \ud800 surrogate"}),
        ):
            with pytest.raises(akter.ActorError) as exc:
                await t.runtime.call(Counter, "c", command, bad)
            assert exc.value.reason == "InvalidInput" and not exc.value.retryable
        assert await count(t, "actors") == 0 and await count(t, "receipts") == 0
        assert await t.runtime.call(Counter, "c", "add", {"k": 2}) == 2


def _mailbox_workers(name: str) -> set[asyncio.Task[object]]:
    return {task for task in asyncio.all_tasks() if task.get_name() == f"akter.mailbox {name}"}


async def test_a_sequential_callers_next_command_joins_the_running_mailbox_worker(
    akter_test: Make,
) -> None:
    # The worker looks once more, one loop iteration after its queue empties: the caller its
    # results woke runs in that iteration, and a command it sends at once is taken by the same
    # worker (no task of its own). It then leaves, and the idle activation can hibernate.
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "linger")
        assert await counter.add(1) == 1
        [worker] = _mailbox_workers("Counter/linger")  # still looking
        for k in range(2, 6):
            assert await counter.add(1) == k
            assert _mailbox_workers("Counter/linger") == {worker}
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert worker.done() and not _mailbox_workers("Counter/linger")
        assert t.runtime._dispatcher.hibernate(force=True) == 1
        # A command after the worker left starts a new one.
        assert await counter.add(1) == 6
        assert _mailbox_workers("Counter/linger") - {worker}


def _requests(t: ActorTest) -> int:
    """How many connections the callers' pool was asked for so far."""
    return t.runtime._dispatcher.engine.store.pool.get_stats().get("requests_num", 0)


def skip_if_shared(turn_mode: str) -> None:
    """A test of the connection a mailbox keeps: the ``shared`` turn mode keeps none."""
    if turn_mode == "shared":
        pytest.skip("the shared turn mode keeps no connection per mailbox")


def _activation(t: ActorTest, name: str) -> Any:
    [box] = [b for k, b in t.runtime._dispatcher._boxes.items() if "/".join(k[1:]) == name]
    return box.activation


async def test_a_sequential_callers_turns_keep_their_connection_out_of_the_pool(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch, turn_mode: str
) -> None:
    # Each next command joins the worker that ran the last, and its turn runs on the
    # connection that worker kept: no putconn and getconn between the two, and its socket
    # stays watched by the event loop (no registration per turn).
    skip_if_shared(turn_mode)
    loop = asyncio.get_running_loop()
    watches: list[int] = []
    add_reader = loop.add_reader

    def counted(fd: Any, callback: Any, *args: Any) -> None:
        watches.append(fd)
        add_reader(fd, callback, *args)

    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "kept")
        assert await counter.add(1) == 1
        act = _activation(t, "Counter/kept")
        fd = act.held[0].pgconn.socket
        before = _requests(t)
        monkeypatch.setattr(loop, "add_reader", counted)
        for k in range(2, 12):
            assert await counter.add(1) == k
        assert _requests(t) == before
        assert fd not in watches
        assert act.held is not None
        # The worker leaves one loop iteration later and gives the connection back, unwatched.
        [worker] = _mailbox_workers("Counter/kept")
        await asyncio.wait_for(worker, 5)
        assert act.held is None
        assert not loop.remove_reader(fd)
        stats = t.runtime._dispatcher.engine.store.pool.get_stats()
        assert stats["pool_available"] == stats["pool_size"]


async def test_a_connection_is_kept_no_longer_than_its_limit(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch, turn_mode: str
) -> None:
    # Past HOLD_MAX_S since the pool gave it, the connection goes back after the batch (the
    # pool's own checks and lifetime then apply to it), and the next batch asks again.
    skip_if_shared(turn_mode)
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "limit")
        assert await counter.add(1) == 1
        monkeypatch.setattr(turn_engine, "HOLD_MAX_S", 0.0)
        before = _requests(t)
        for k in range(2, 7):
            assert await counter.add(1) == k
        # The first of them ran on the connection kept before; each gave its own back.
        assert _requests(t) == before + 4


async def test_a_kept_connection_goes_to_a_waiting_turn_at_the_next_batch_end(
    akter_test: Make,
) -> None:
    # With one pooled connection, a busy actor's worker keeps it only while nobody waits: the
    # other actor's turn, waiting in the pool, gets it when the busy actor's batch ends.
    async with akter_test(ALL, relay=False, pool_size=1) as t:
        busy, other = t.get(Counter, "busy"), t.get(Counter, "other")
        call: asyncio.Task[int] | None = None
        done_after: int | None = None
        for k in range(1, 41):
            assert await busy.add(1) == k
            if k == 3:
                call = asyncio.create_task(other.add(1))
            elif call is not None and call.done() and done_after is None:
                done_after = k
        assert call is not None and await call == 1
        # Waiting from the busy actor's fourth command: its fourth batch gives the connection
        # back, the fifth waits for it (a worker keeping it to the end would finish all 40).
        assert done_after is not None and done_after <= 6


async def test_a_connection_a_waiting_query_gets_is_no_longer_watched(akter_test: Make) -> None:
    # A batch ending while a query waits for the pool's one connection gives it back at
    # once, its socket unwatched: the query's own waits (psycopg's) register and remove the
    # same socket, and the next turn on it must register its watch again, not wait on none.
    async with akter_test(ALL, relay=False, pool_size=1) as t:
        counter = t.get(Counter, "shared")
        assert await counter.add(1) == 1
        pause = t.pause_next("before_commit")
        call = asyncio.create_task(counter.add(1))
        await pause.wait()
        read = asyncio.create_task(counter.value())
        pool = t.runtime._dispatcher.engine.store.pool
        await until(lambda: pool.getting, what="the query waiting for a connection", interval=0)
        pause.release()
        assert await call == 2
        assert await read in (1, 2)
        for k in range(3, 6):
            assert await asyncio.wait_for(counter.add(1), 10) == k


async def test_a_kept_connection_goes_back_before_a_backoff(
    akter_test: Make, turn_mode: str
) -> None:
    skip_if_shared(turn_mode)
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "backoff")
        assert await counter.add(1) == 1
        act = _activation(t, "Counter/backoff")
        assert act.held is not None
        act.backoff.next()  # as after an ActorUnavailable batch: the worker waits first
        before = _requests(t)
        assert await counter.add(1) == 2
        assert _requests(t) == before + 1  # the wait gave it back; the batch took one again


async def test_a_kept_connection_whose_session_ended_fails_its_turn_which_is_retried(
    akter_test: Make, turn_mode: str
) -> None:
    # The server ends the kept connection's session between two batches: the next batch's
    # admission fails on it before anything is written, the connection is discarded, and the
    # caller's retry commits the command once.
    skip_if_shared(turn_mode)
    async with akter_test(ALL, relay=False) as t:
        counter = t.get(Counter, "ended")
        assert await counter.add(1) == 1
        act = _activation(t, "Counter/ended")
        assert act.held is not None
        pid = act.held[0].info.backend_pid
        # Blocking, so that the worker is still looking when the next command comes.
        with psycopg.connect(t.database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s::int, 5000)", [pid])
        cid = await t.runtime.mint_command_id()
        assert await counter.with_command_id(cid).add(1) == 2
        row = await t.inspect(counter)
        assert row.version == 2 and row.state is not None and row.state["n"] == 2
        assert [r["command_id"] for r in row.receipts].count(cid) == 1


async def test_a_looking_mailbox_worker_does_not_hold_its_activation_at_capacity(
    akter_test: Make,
) -> None:
    # Right after a call returns its worker is still looking for more: the activation is idle
    # all the same. At max_resident_actors the next actor's call drops it at once (no
    # RunnerAtCapacity and its retry), and the dropped worker leaves without a command.
    async with akter_test(ALL, relay=False, max_resident_actors=1) as t:
        assert await t.get(Counter, "first").add(1) == 1
        [worker] = _mailbox_workers("Counter/first")
        assert t.runtime._dispatcher.hibernate(force=True) == 1
        assert t.runtime._dispatcher.resident == 0
        assert await t.get(Counter, "second").add(2) == 2
        await asyncio.sleep(0)
        assert worker.done() and not worker.cancelled()
        assert t.runtime._dispatcher.resident == 1
        assert await t.get(Counter, "first").add(1) == 2  # reloaded from its row
