"""Conformance: intents, timers and the relay (RL-01 … RL-15, semantics §3 and §1.4).

Most tests run with ``relay=False`` so that every pass is the test's own
(``t.runtime._relay.run_pass()``, ``t.drain()`` or ``t.advance()``); the rest use the background
loop on purpose (polling, wakeups, backlogs). Ordering comes from fault-point pauses, a lock held
by another connection and LISTEN barriers — never from sleeps. Assertions read durable rows:
outbox columns against the framework clock, the receiver's receipts (command id = intent id,
caller key) and the receiver's state, which records every delivery it committed.

Clock brackets: a relay statement computes ``now`` once from ``statement_timestamp()``; reading
the framework clock before and after the statement bounds that ``now``, so a due time written by
the statement is checked as ``before + wait <= due_at_ms <= after + wait``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

import akter
from akter.testing import ActorTest
from tests._support import until
from tests.integration.relay_actors import (
    ALL,
    LOOPING,
    REVOKED,
    RUNS,
    Gate,
    NotSent,
    Receiver,
    Sender,
    reset,
)

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: The default claim lease: max(execution_timeout + lock_wait) over the types, + 5 s.
LEASE_MS = 37_000
MAX_BACKOFF_MS = 256_000
WINDOW_MS = 86_400_000
#: Bucket of tenant "default" (placement "tenant"): every row the test senders write.
DEFAULT_BUCKET = 53


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    reset()
    yield
    reset()


# --- helpers ----------------------------------------------------------------------------------


def ms(n: int) -> timedelta:
    """A duration of ``n`` milliseconds (``advance`` takes seconds or a timedelta)."""
    return timedelta(milliseconds=n)


def claim_wait(attempts_before: int, lease: int = LEASE_MS, cap: int = MAX_BACKOFF_MS) -> int:
    """Semantics §3.3: a claim leases the row for max(lease, min(1 s × 2^min(a, 31), cap))."""
    return max(lease, min(1000 << min(attempts_before, 31), cap))


def failure_wait(attempts: int, cap: int = MAX_BACKOFF_MS) -> int:
    """Semantics §3.3: a failed delivery waits min(1 s × 2^(attempts − 1), cap)."""
    return min(1000 << (attempts - 1), cap)


def caller_key(source: str, principal: str | None = None, sender: str = "s1") -> str:
    """The receipt caller key of work ``Sender/<sender>`` caused (semantics §1.6)."""
    key = ["System", source, ["default", "Sender", sender], principal]
    return json.dumps(key, separators=(",", ":"))


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def only_row(t: ActorTest) -> dict[str, Any]:
    rows = await outbox(t)
    assert len(rows) == 1, rows
    return rows[0]


async def receipts(t: ActorTest, actor_type: str = "Receiver") -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT actor_id, command_id, command, caller_key, outcome FROM {schema}.receipts"
        " WHERE actor_type = %(type)s ORDER BY command_id",
        {"type": actor_type},
    )


async def received(t: ActorTest, actor_id: str, actor_type: str = "Receiver") -> list[Any]:
    """The deliveries a receiver committed, from its durable state (``[]`` without a row)."""
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = %(type)s AND actor_id = %(id)s",
        {"type": actor_type, "id": actor_id},
    )
    return list(rows[0]["state"]["received"]) if rows else []


async def dead_letters(t: ActorTest) -> int:
    rows = await t.rows("SELECT count(*) AS n FROM {schema}.dead_letters")
    return int(rows[0]["n"])


async def one_pass(t: ActorTest, runtime: int = 0) -> tuple[int, int, int]:
    """One relay pass on a runtime, its deliveries awaited: (claimed, clock before, after)."""
    relay = t.runtimes[runtime]._relay
    before = await t.now_ms()
    claimed = await relay.run_pass()
    await relay.wait_idle()
    return claimed, before, await t.now_ms()


def move_clock(t: ActorTest, by_ms: int) -> None:
    """Move every runtime's framework clock like ``advance``, without its drain.

    Used where a delivery is held at a pause: the drain of ``advance`` would wait for it.
    """
    for runtime in t.runtimes:
        runtime._clock.offset_ms += by_ms


def parse_id(intent_id: str) -> tuple[int, int]:
    """``v1.<issued>.<expires>.<uuid4>`` → (issued, expires), checking the format (§1.3)."""
    match = re.fullmatch(r"v1\.([1-9][0-9]{0,14})\.([1-9][0-9]{0,14})\.([0-9a-f-]{36})", intent_id)
    assert match, intent_id
    assert uuid.UUID(match.group(3)).version == 4
    return int(match.group(1)), int(match.group(2))


# --- RL-01 / RL-02: staging is transactional ---------------------------------------------------


@pytest.mark.parametrize("ending", ["declared", "defect", "crash"])
async def test_RL01_intent_of_a_turn_that_does_not_commit_is_never_delivered(
    akter_test: Make, ending: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        committed: list[str] = []
        if ending == "declared":
            with pytest.raises(NotSent):
                await sender.send_then("r1", 1, "declared")
            # The failure receipt commits; the intent and the timer it staged do not.
            assert [r["outcome"] for r in await receipts(t, "Sender")] == [
                {"error": "NotSent", "fields": {"why": "declared"}}
            ]
        elif ending == "defect":
            with pytest.raises(akter.ActorError) as exc:
                await sender.send_then("r1", 1, "defect")
            assert exc.value.reason == "Defect"
            assert await receipts(t, "Sender") == []
        else:
            t.crash_next("before_commit")
            retry = t.pause_next("before_commit")  # the handle's retry, after the crash
            call = asyncio.create_task(sender.send_then("r1", 1, "ok"))
            await retry.wait()
            assert await outbox(t) == []  # the crashed attempt left nothing to deliver
            assert await receipts(t, "Sender") == []
            retry.release()
            await call
            committed = sorted(r["intent_id"] for r in await outbox(t))
            assert len(committed) == 2  # the retry's intent and timer
        assert len(await outbox(t)) == len(committed)
        await t.advance(3600)  # every timer is due; every due row is delivered
        assert await outbox(t) == []
        # Only committed rows (the crash case: its retry's) ever reached the receiver.
        assert [r["command_id"] for r in await receipts(t)] == committed
        assert sorted(RUNS) == committed and set(RUNS.values()) <= {1}
        assert sorted(d["cid"] for d in await received(t, "r1")) == committed


async def test_RL02_intent_invisible_until_commit_then_delivered_as_internal_command(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        other = await t.add_runtime()
        sender = t.get(Sender, "s1")
        held = t.pause_next("before_commit")
        with akter.as_caller(akter.User("alice")):
            call = asyncio.create_task(sender.send_internal("r1", 5))
        await held.wait()
        assert await outbox(t) == []  # staged, not committed: invisible to other connections
        assert await other._relay.run_pass() == 0  # and to other runners' claims
        held.release()
        sent_at = await call

        row = await only_row(t)
        assert {k: row[k] for k in ("kind", "target_type", "target_id", "command", "payload")} == {
            "kind": "intent",
            "target_type": "Receiver",
            "target_id": "r1",
            "command": "take_internal",
            "payload": '{"k":5}',
        }
        assert (row["actor_type"], row["actor_id"], row["tenant_id"]) == ("Sender", "s1", "default")
        assert row["bucket"] == DEFAULT_BUCKET == row["routing_key"] >> 56
        assert row["attempts"] == 0 and row["timer_key"] is None
        assert row["due_at_ms"] == row["scheduled_at_ms"] >= sent_at
        assert json.loads(row["caller"]) == {
            "kind": "System",
            "source": "actor",
            "ref": {"tenant": "default", "type": "Sender", "id": "s1"},
            "on_behalf_of": "alice",
        }

        claimed, _, _ = await one_pass(t, runtime=1)
        assert claimed == 1
        assert await outbox(t) == []  # delivered, then deleted under its claim token
        key = caller_key("actor", "alice")
        # An internal command (absent from handles and HTTP) reached by the relay, with the
        # intent id as its command id and the sender's attribution as its caller.
        assert await receipts(t) == [
            {
                "actor_id": "r1",
                "command_id": row["intent_id"],
                "command": "take_internal",
                "caller_key": key,
                "outcome": {"ok": 5},
            }
        ]
        [delivery] = await received(t, "r1")
        assert delivery["cid"] == row["intent_id"] and delivery["caller"] == key
        assert RUNS == {row["intent_id"]: 1}
        assert other._relay.delivered == 1 and t.runtime._relay.delivered == 0


# --- RL-03: injected crashes around the delivery ------------------------------------------------


async def test_RL03_crash_after_claim_waits_for_the_lease_then_delivers_once(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.get(Sender, "s1").send_to("r1", 3)
        staged = await only_row(t)
        t.crash_next("after_claim")
        claimed, before, after = await one_pass(t)
        assert claimed == 1
        claim = await only_row(t)
        token = claim["due_at_ms"]
        assert claim["attempts"] == 1
        assert before + LEASE_MS <= token <= after + LEASE_MS
        assert RUNS == {} and await receipts(t) == []

        # Up to 2 s before the claim token nothing is delivered: the row stays claimed.
        await t.advance(ms(token - await t.now_ms() - 2000))
        assert await outbox(t) == [claim]
        assert RUNS == {} and await receipts(t) == []

        # Once the lease ended: one more claim (attempts = 2) under the same intent id.
        second = t.pause_next("after_claim")
        delivering = asyncio.create_task(t.advance(2))
        info = await second.wait()
        assert info["intent_id"] == staged["intent_id"]
        reclaimed = await only_row(t)
        assert reclaimed["attempts"] == 2 and reclaimed["due_at_ms"] > token
        assert reclaimed["scheduled_at_ms"] == staged["scheduled_at_ms"]
        second.release()
        await delivering

        assert await outbox(t) == []
        assert [r["command_id"] for r in await receipts(t)] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}
        assert [d["cid"] for d in await received(t, "r1")] == [staged["intent_id"]]


async def test_RL03_crash_before_outbox_delete_replays_the_receipt(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.get(Sender, "s1").send_to("r1", 3)
        staged = await only_row(t)
        t.crash_next("before_outbox_delete")
        claimed, _, _ = await one_pass(t)
        assert claimed == 1
        # The receiver committed; the row was not deleted and stays claimed.
        claim = await only_row(t)
        assert claim["attempts"] == 1 and claim["due_at_ms"] > await t.now_ms()
        committed = await receipts(t)
        assert [r["command_id"] for r in committed] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}
        before = await t.rows("SELECT version, state FROM {schema}.actors WHERE actor_id = 'r1'")
        assert t.runtime._relay.delivered == 0

        await t.advance(ms(claim["due_at_ms"] - await t.now_ms() + 1))

        # Redelivered after the lease: a replay of the receipt, no second transition.
        assert await outbox(t) == []
        assert await receipts(t) == committed
        assert RUNS == {staged["intent_id"]: 1}
        after = await t.rows("SELECT version, state FROM {schema}.actors WHERE actor_id = 'r1'")
        assert after == before and after[0]["version"] == 1
        assert t.runtime._relay.delivered == 1 and t.runtime._relay.retried == 0


# --- RL-06: several runners ---------------------------------------------------------------------


async def test_RL06_three_runners_deliver_300_intents_each_once(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False, pass_limit=100) as t:  # three runners share
        await t.add_runtime()
        await t.add_runtime()
        targets = [f"r{i % 30}" for i in range(300)]
        await t.get(Sender, "s1").send_many(targets, 1)
        staged = {r["intent_id"]: r["target_id"] for r in await outbox(t)}
        assert len(staged) == 300

        await t.drain()  # each round, the three runners claim in turn

        assert await outbox(t) == []
        delivered = [rt._relay.delivered for rt in t.runtimes]
        # A row claimed twice would have been delivered (and counted) twice: 300 in all means
        # each row was held by one runner per lease.
        assert sum(delivered) == 300 and min(delivered) > 0, delivered
        assert [rt._relay.retried for rt in t.runtimes] == [0, 0, 0]
        rows = await receipts(t)
        assert {r["command_id"]: r["actor_id"] for r in rows} == staged
        assert {r["caller_key"] for r in rows} == {caller_key("actor")}
        assert RUNS == dict.fromkeys(staged, 1)
        for target in sorted(set(targets)):
            cids = [d["cid"] for d in await received(t, target)]
            assert sorted(cids) == sorted(c for c, tg in staged.items() if tg == target)


async def test_RL06_settle_under_an_expired_claim_token_changes_nothing(
    akter_test: Make, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False) as t:
        b = await t.add_runtime()
        await t.get(Sender, "s1").send_to("r1", 4)
        staged = await only_row(t)

        held_a = t.pause_next("after_claim")
        assert await t.runtime._relay.run_pass() == 1
        await held_a.wait()
        claim_a = await only_row(t)

        # A's lease ends while its delivery is held; B claims the row again.
        move_clock(t, LEASE_MS + 1000)
        held_b = t.pause_next("after_claim", runtime=1)
        assert await b._relay.run_pass() == 1
        await held_b.wait()
        claim_b = await only_row(t)
        assert claim_b["attempts"] == 2 and claim_b["due_at_ms"] > claim_a["due_at_ms"]
        assert claim_b["scheduled_at_ms"] == staged["scheduled_at_ms"]

        # A delivers late: the receiver commits once, A's delete under its old token hits nothing.
        held_a.release()
        await t.runtime._relay.wait_idle()
        assert await outbox(t) == [claim_b]
        assert [r["command_id"] for r in await receipts(t)] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}

        # The same statement, run directly with A's token, affects 0 rows.
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            cur = await conn.execute(
                t.runtime._store.queries["settle_intents"],
                {
                    "rks": [staged["routing_key"]],
                    "intent_ids": [staged["intent_id"]],
                    "tokens": [claim_a["due_at_ms"]],
                },
            )
            assert cur.rowcount == 0
        assert await outbox(t) == [claim_b]

        # B's delivery replays the receipt and deletes the row under its own token.
        held_b.release()
        await b._relay.wait_idle()
        assert await outbox(t) == []
        assert [r["command_id"] for r in await receipts(t)] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}
        assert (t.runtime._relay.delivered, b._relay.delivered) == (1, 1)


# --- RL-07 / RL-08: backoff and leases ----------------------------------------------------------


@pytest.mark.parametrize(("receiver", "claims"), [("defect", 10), ("gated", 4)])
async def test_RL07_failing_receiver_backs_off_and_is_never_dead_lettered(
    akter_test: Make, caplog: pytest.LogCaptureFixture, receiver: str, claims: int
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.relay")
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        if receiver == "defect":
            await sender.send_boom(["r1"], 1)
            reason = "Defect"
        else:
            await sender.send_gated("g1", 1)
            reason = "NotCreated"
        staged = await only_row(t)
        for attempts in range(1, claims + 1):
            due = (await only_row(t))["due_at_ms"]
            before = await t.now_ms()
            wait = max(0, due - before)
            await t.advance(ms(wait))  # the row is due: one claim, one failed delivery
            after = await t.now_ms()
            row = await only_row(t)
            assert row["intent_id"] == staged["intent_id"]
            assert row["attempts"] == attempts
            backoff = failure_wait(attempts)
            assert before + wait + backoff <= row["due_at_ms"] <= after + backoff, attempts
            assert row["scheduled_at_ms"] == staged["scheduled_at_ms"]
            assert reason in row["last_error"]
        assert failure_wait(claims) == (MAX_BACKOFF_MS if claims == 10 else 8000)
        assert await dead_letters(t) == 0
        failures = [
            r
            for r in caplog.records
            if r.getMessage().partition(": ")[0] == "Outbox delivery failed; retrying with backoff"
        ]
        assert len(failures) == claims == t.runtime._relay.retried
        assert await receipts(t) == [] and await receipts(t, "Gate") == []
        if receiver == "defect":
            assert RUNS == {staged["intent_id"]: claims}
            return
        # Once the gated receiver exists, the next delivery succeeds.
        await t.get(Gate, "g1").open()
        row = await only_row(t)
        await t.advance(ms(row["due_at_ms"] - await t.now_ms()))
        assert await outbox(t) == []
        assert [r["command_id"] for r in await receipts(t, "Gate") if r["command"] == "take"] == [
            staged["intent_id"]
        ]


async def test_RL07_stuck_rows_do_not_block_newer_ones(akter_test: Make) -> None:
    # The background loop (poll 1 s) and 4 delivery slots; 20 stuck rows are due first.
    async with akter_test(ALL, delivery_concurrency=4) as t:
        sender = t.get(Sender, "s1")
        await sender.send_boom([f"b{i}" for i in range(20)], 1)
        sent_at = await sender.send_to("r1", 1)

        async def delivered() -> bool:
            return bool(await receipts(t))

        await until(delivered, within=5)
        [delivery] = await received(t, "r1")
        latency = delivery["now"] - sent_at
        # A pass within the poll, plus the passes that work through the stuck rows ahead of it
        # four slots at a time: on Citus each pass scans every shard (hundreds of ms here).
        bound = 3000 if t.on_citus else 1100
        assert latency <= bound, f"the newer row waited {latency} ms"
        stuck = [r for r in await outbox(t) if r["command"] == "boom"]
        assert len(stuck) == 20 and sum(r["attempts"] for r in stuck) >= 1
        assert await dead_letters(t) == 0


@pytest.mark.parametrize(
    ("attempts", "options", "wait"),
    [
        (0, {}, 37_000),
        (5, {}, 37_000),
        (6, {}, 64_000),
        (12, {}, 256_000),
        (30, {"max_backoff": ms(2**31 - 1)}, 2**31 - 1),
        (40, {"max_backoff": ms(2**31 - 1)}, 2**31 - 1),
        (3, {"claim_lease": 1}, 8_000),
    ],
    ids=["a0", "a5", "a6", "a12", "a30-max", "a40-max", "a3-lease1s"],
)
async def test_RL08_claim_lease_and_redelivery_window(
    akter_test: Make, attempts: int, options: dict[str, Any], wait: int
) -> None:
    async with akter_test(ALL, relay=False, **options) as t:
        lease = 1000 if "claim_lease" in options else LEASE_MS
        cap = 2**31 - 1 if "max_backoff" in options else MAX_BACKOFF_MS
        assert claim_wait(attempts, lease, cap) == wait
        await t.get(Sender, "s1").send_to("r1", 1)
        await t.rows("UPDATE {schema}.outbox SET attempts = %(a)s", {"a": attempts})
        staged = await only_row(t)

        t.crash_next("after_claim")  # the settle dies with the runner
        claimed, before, after = await one_pass(t)
        assert claimed == 1
        claim = await only_row(t)
        token = claim["due_at_ms"]
        assert claim["attempts"] == attempts + 1
        assert before + wait <= token <= after + wait
        assert claim["scheduled_at_ms"] == staged["scheduled_at_ms"]

        # The next delivery comes in (wait − 2 s, wait] after the claim.
        await t.advance(ms(token - await t.now_ms() - 2000))
        assert await outbox(t) == [claim]
        assert RUNS == {}
        await t.advance(2)
        assert await outbox(t) == []
        assert RUNS == {staged["intent_id"]: 1}
        [delivery] = await received(t, "r1")
        assert delivery["now"] >= token


# --- RL-09: skip locked -------------------------------------------------------------------------


async def test_RL09_locked_rows_are_skipped_not_waited_for(akter_test: Make, akter_db: str) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        for i in range(4):
            await sender.send_to(f"r{i}", 1)
        rows = sorted(await outbox(t), key=lambda r: (r["due_at_ms"], r["intent_id"]))
        locked, free = rows[:3], rows[3]
        async with await psycopg.AsyncConnection.connect(akter_db) as holder:
            for row in locked:  # one row per statement, named by its routing key (Citus)
                await holder.execute(
                    t.substitute(
                        "SELECT 1 FROM {schema}.outbox"
                        " WHERE routing_key = %(rk)s AND intent_id = %(id)s FOR UPDATE"
                    ),
                    {"rk": row["routing_key"], "id": row["intent_id"]},
                )
            # The pass neither waits for the locks nor gives up: it takes the fourth row.
            claimed = await asyncio.wait_for(t.runtime._relay.run_pass(), 5.0)
            await t.runtime._relay.wait_idle()
            assert claimed == 1
            assert [r["command_id"] for r in await receipts(t)] == [free["intent_id"]]
            assert await outbox(t) == sorted(
                locked, key=lambda r: (r["scheduled_at_ms"], r["intent_id"])
            )
            await holder.rollback()
        claimed, _, _ = await one_pass(t)
        assert claimed == 3
        assert await outbox(t) == []
        assert sorted(r["command_id"] for r in await receipts(t)) == sorted(
            r["intent_id"] for r in rows
        )
        assert RUNS == {r["intent_id"]: 1 for r in rows}


# --- RL-10 / RL-11 / RL-12: timers ---------------------------------------------------------------


async def test_RL10_timers_deliver_once_when_due_even_after_access_is_revoked(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        with akter.as_caller(akter.User("alice")):
            sent = await sender.remind("r1", 1, after=3600)
            at_ms = sent + 7_200_000
            await sender.remind("r2", 2, at_ms=at_ms)
            committed = await t.now_ms()
        REVOKED.add("alice")
        with akter.as_caller(akter.User("alice")), pytest.raises(akter.ActorError) as exc:
            await sender.send_to("r3", 1)
        assert (exc.value.reason, exc.value.code) == ("Unauthorized", "access_denied")

        rows = {r["target_id"]: r for r in await outbox(t)}
        assert sorted(rows) == ["r1", "r2"]
        relative, absolute = rows["r1"], rows["r2"]
        assert sent + 3_600_000 <= relative["due_at_ms"] <= committed + 3_600_000
        assert absolute["due_at_ms"] == at_ms
        for row in rows.values():
            assert row["scheduled_at_ms"] == row["due_at_ms"] and row["attempts"] == 0
            assert json.loads(row["caller"])["source"] == "timer"
            assert json.loads(row["caller"])["on_behalf_of"] == "alice"

        await t.advance(ms(relative["due_at_ms"] - await t.now_ms() - 2000))
        assert len(await outbox(t)) == 2 and await receipts(t) == []
        await t.advance(2)
        assert [r["target_id"] for r in await outbox(t)] == ["r2"]
        await t.advance(ms(at_ms - await t.now_ms() - 2000))
        assert [r["target_id"] for r in await outbox(t)] == ["r2"]
        await t.advance(2)
        assert await outbox(t) == []

        key = caller_key("timer", "alice")
        assert {(r["actor_id"], r["command_id"], r["caller_key"]) for r in await receipts(t)} == {
            ("r1", relative["intent_id"], key),
            ("r2", absolute["intent_id"], key),
        }
        assert RUNS == {relative["intent_id"]: 1, absolute["intent_id"]: 1}
        for target, row in rows.items():
            [delivery] = await received(t, target)
            assert delivery["now"] >= row["due_at_ms"]  # never before due


async def test_RL10_relative_delays_count_from_the_commit(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        held = t.pause_next("before_commit")
        call = asyncio.create_task(t.get(Sender, "s1").remind("r1", 1, after=60))
        await held.wait()
        # The turn's answer has arrived (its clock is pinned). Hold the turn until both clocks
        # have moved on 200 ms: the database's, and this process's monotonic clock, which the
        # commit clock counts the time since the answer on. Holding on one of them only would
        # let a wall-clock step or a slow admission answer fail the test, not the code.
        reached = time.monotonic()
        holding_since = await t.now_ms()

        async def moved_on() -> bool:
            return time.monotonic() - reached >= 0.2 and await t.now_ms() >= holding_since + 200

        await until(moved_on)
        held.release()
        turn_now = await call
        after = await t.now_ms()
        row = await only_row(t)
        assert turn_now <= holding_since
        # ``commit_clock``: the turn's reading plus the local time since its answer arrived,
        # which includes the whole hold. Counted from the turn's reading instead, the delay
        # would fall short of this by the 200 ms (1 ms: a float's rounding of the hold).
        assert row["due_at_ms"] >= turn_now + 200 + 60_000 - 1
        # And the commit clock is a lower bound: never ahead of the database clock.
        assert row["due_at_ms"] <= after + 60_000


async def test_RL10_intent_and_timer_ids_follow_the_framework_id_rule(akter_test: Make) -> None:
    """Semantics §1.4: ``v1.<now>.<max(due, now) + slack + window>.<uuid4>``.

    ``slack`` is the sender's ``execution_timeout`` (Sender: 10 s; receivers: 30 s) for
    relative delays, else 0.
    """
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        start = await t.now_ms()
        immediate = await sender.send_to("r1", 1)
        relative = await sender.remind("r2", 1, after=3600)
        future_at = start + 7_200_000
        absolute = await sender.remind("r3", 1, at_ms=future_at)
        past_at = start - 60_000
        past = await sender.remind("r4", 1, at_ms=past_at)
        ids = {r["target_id"]: (r["intent_id"], r["due_at_ms"]) for r in await outbox(t)}
        assert parse_id(ids["r1"][0]) == (immediate, immediate + WINDOW_MS)
        assert parse_id(ids["r3"][0]) == (absolute, future_at + WINDOW_MS)
        assert parse_id(ids["r4"][0]) == (past, past + WINDOW_MS)  # max(due, now) = now
        assert ids["r4"][1] == past_at  # a past `at` is due at once
        assert parse_id(ids["r2"][0]) == (relative, relative + 3_600_000 + 10_000 + WINDOW_MS)
        # The past timer is delivered by the next pass, without moving the clock.
        await t.drain()
        assert sorted(r["actor_id"] for r in await receipts(t)) == ["r1", "r4"]


async def test_RL11_keyed_timer_restaged_replaced_and_cancelled(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        await sender.remind("r1", 1, after=60, key="k")
        first = await only_row(t)
        second_at = await sender.remind("r1", 2, after=120, key="k")
        row = await only_row(t)
        assert row["intent_id"] != first["intent_id"]
        assert (row["payload"], row["timer_key"]) == ('{"k":2}', "k")
        assert second_at + 120_000 <= row["due_at_ms"] <= await t.now_ms() + 120_000

        with pytest.raises(NotSent):
            await sender.cancel("k", fail=True)
        assert await outbox(t) == [row]  # a failed turn cancels nothing
        await sender.cancel("k")
        assert await outbox(t) == []
        await t.advance(3600)
        assert await receipts(t) == [] and RUNS == {}


async def test_RL11_within_a_turn_the_last_staging_wins(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        staged_at = await sender.restage("r1", "a", False)
        row = await only_row(t)
        assert (row["timer_key"], row["payload"]) == ("a", '{"k":2}')
        assert row["due_at_ms"] >= staged_at + 120_000
        await sender.restage("r1", "b", True)  # staged twice, then cancelled: nothing
        assert await outbox(t) == [row]
        await sender.restage("r1", "a", True)  # also deletes the earlier turn's pending "a"
        assert await outbox(t) == []


async def test_RL11_timer_cancelled_after_its_claim_is_still_delivered_once(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        await sender.remind("r1", 7, after=60, key="k")
        staged = await only_row(t)
        held = t.pause_next("after_claim")
        delivering = asyncio.create_task(t.advance(61))
        info = await held.wait()
        assert info["intent_id"] == staged["intent_id"]
        await sender.cancel("k")  # the committed turn deletes the claimed row
        assert await outbox(t) == []
        held.release()
        await delivering
        # Delivered once anyway; its settle matched nothing and nothing came back.
        assert await outbox(t) == []
        assert [r["command_id"] for r in await receipts(t)] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}
        assert (t.runtime._relay.delivered, t.runtime._relay.retried) == (1, 0)


async def test_RL12_reserved_or_long_keys_raise_at_the_call(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        sender = t.get(Sender, "s1")
        keys = ["$x", "$job:x", "$cron:x", "x" * 201, ""]
        refused = await sender.bad_keys(keys)
        calls = ["later", "cancel_timer", "enqueue", "cancel_job"]
        assert refused == [f"{call}:{key}" for key in keys for call in calls]
        assert await outbox(t) == []  # the handler caught every error: nothing was staged
        await sender.remind("r1", 1, after=60, key="k" * 200)  # 200 characters are fine
        assert (await only_row(t))["timer_key"] == "k" * 200


# --- RL-13: wakeups -----------------------------------------------------------------------------


def notify_tasks() -> list[asyncio.Task[Any]]:
    """The runtime's pending wake notifications (named tasks, semantics §2.7)."""
    return [
        task
        for task in asyncio.all_tasks()
        if task.get_name() == "akter.relay.notify" and not task.done()
    ]


async def test_RL13_wake_notifications_follow_visible_commits_only(
    akter_test: Make, akter_db: str
) -> None:
    async with (
        akter_test(ALL, notify=True, relay=False) as t,
        await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as probe,
    ):
        channel = sql.Identifier(f"{t.schema}_wake")
        await listener.execute(sql.SQL("LISTEN {}").format(channel))
        sender = t.get(Sender, "s1")
        markers = iter(range(100))

        async def next_notification() -> psycopg.Notify:
            async for notification in listener.notifies(timeout=5.0, stop_after=1):
                return notification
            pytest.fail("no notification within 5 s")

        async def nothing_sent_so_far() -> None:
            # Notifications arrive in commit order: one sent before this marker comes first.
            marker = f"marker-{next(markers)}"
            await probe.execute(sql.SQL("NOTIFY {}, {}").format(channel, sql.Literal(marker)))
            notification = await next_notification()
            assert notification.payload == marker, f"unexpected {notification}"

        # A rolled-back turn (a defect after staging) notifies no one.
        with pytest.raises(akter.ActorError):
            await sender.send_then("r1", 1, "defect")
        assert notify_tasks() == []
        await nothing_sent_so_far()

        # Held before its commit: no notification yet.
        held = t.pause_next("before_commit")
        cid = await t.runtime.mint_command_id()
        call = asyncio.create_task(sender.with_command_id(cid).send_to("r1", 1))
        await held.wait()
        await nothing_sent_so_far()
        held.release()
        await call
        notification = await next_notification()
        assert notification.payload == "" and notification.pid != probe.info.backend_pid
        # When it arrives, the commit is visible to any other connection.
        assert len(await outbox(t)) == 1
        await asyncio.gather(*notify_tasks())

        # A replay writes nothing (the batch ends with ROLLBACK): no notification either.
        await sender.with_command_id(cid).send_to("r1", 1)
        with pytest.raises(akter.ActorError):
            await sender.send_then("r1", 1, "defect")
        assert notify_tasks() == []
        await nothing_sent_so_far()
        assert len(await outbox(t)) == 1


async def test_RL13_polling_alone_delivers_across_runners_within_1_1_s(
    akter_test: Make,
) -> None:
    # Runner A hosts only the sender, runner B only the receiver; no NOTIFY anywhere, and
    # A's commit wakes only A's relay: B finds the row by polling (poll = 1 s ± 10 %).
    async with akter_test([Sender], notify=False) as t:
        b = await t.add_runtime([Receiver])
        latencies = []
        for i in range(3):
            sent_at = await t.get(Sender, "s1").send_to(f"r{i}", 1)

            async def delivered(target: str = f"r{i}") -> bool:
                return bool(await received(t, target))

            await until(delivered, within=5)
            [delivery] = await received(t, f"r{i}")
            latencies.append(delivery["now"] - sent_at)
        print(f"RL-13 polling latencies (ms): {latencies}")
        # 1.1 s of poll wait plus the pass and the receiver's admission.
        assert max(latencies) <= 1100 + 150, latencies

        # The receipt is visible before B's relay deletes the row and counts the delivery.
        async def settled() -> bool:
            return b._relay.delivered == 3 and await outbox(t) == []

        await until(settled, within=5, what="runner B settling its three deliveries")
        assert t.runtime._relay.delivered == 0
        assert {r["caller_key"] for r in await receipts(t)} == {caller_key("actor")}


# --- RL-14: graceful shutdown -------------------------------------------------------------------


async def test_RL14_graceful_stop_releases_the_claim_for_another_runner(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, relay=False) as t:
        stopping = await t.add_runtime()
        await t.get(Sender, "s1").send_to("r1", 1)
        staged = await only_row(t)
        held = t.pause_next("after_claim", runtime=1)
        assert await stopping._relay.run_pass() == 1
        await held.wait()
        claim = await only_row(t)
        assert claim["attempts"] == 1 and claim["due_at_ms"] > await t.now_ms()

        await stopping.stop()

        released = await only_row(t)
        assert released["attempts"] == 1
        assert released["due_at_ms"] <= await t.now_ms()
        assert released["scheduled_at_ms"] == staged["scheduled_at_ms"]
        assert RUNS == {} and await receipts(t) == []

        # The other runner delivers at once: no lease to wait for.
        claimed, _, _ = await one_pass(t)
        assert claimed == 1
        assert await outbox(t) == []
        assert [r["command_id"] for r in await receipts(t)] == [staged["intent_id"]]
        assert RUNS == {staged["intent_id"]: 1}


# --- RL-15: claims at scale, drains -------------------------------------------------------------

_FILL_JOBS = """
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, caller, due_at_ms, scheduled_at_ms, ready_at_ms)
SELECT k.rk, 'job-' || g, (k.rk >> 56)::smallint, 'job', 'default', 'Foreign',
       'f' || mod(g, 100), 'Foreign', 'f' || mod(g, 100), 'work', '{}',
       '{"kind":"System","source":"job","ref":null,"on_behalf_of":null}', d.due, d.due, d.due
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN %(bucket)s::int IS NULL THEN ((mod(g, 256) - 128)::bigint << 56) + g
                ELSE (%(bucket)s::bigint << 56) + g END AS rk
) AS k
CROSS JOIN LATERAL (SELECT {schema}.now_ms(0) - 10000 + mod(g, 1000) AS due) AS d
"""

_FILL_FOREIGN_INTENTS = """
INSERT INTO {schema}.outbox
    (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id, target_type,
     target_id, command, payload, caller, due_at_ms, scheduled_at_ms)
SELECT (%(bucket)s::bigint << 56) + g, 'foreign-' || g, %(bucket)s, 'intent', 'default',
       'Elsewhere', 'e1', 'Foreign', 'f' || g, 'take', '{}',
       '{"kind":"System","source":"actor","ref":null,"on_behalf_of":null}', d.due, d.due
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (SELECT {schema}.now_ms(0) - 10000 + g AS due) AS d
"""


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def check_plan(plan: dict[str, Any]) -> None:
    nodes = list(plan_nodes(plan))
    scans = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes]
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] == "outbox"], scans
    assert any(index == "outbox_due" for _, _, index in scans), scans


async def test_RL15_claim_plan_uses_the_due_index_with_10000_job_rows(
    akter_test: Make, akter_db: str
) -> None:
    async with akter_test(ALL, relay=False, jobs=[]) as t:  # no local executor
        if t.on_citus:
            pytest.skip("the plain one-statement claim's plan; Citus claims by a scan per shard")
        await t.rows(_FILL_JOBS, {"n": 10_000, "bucket": None})
        await t.get(Sender, "s1").send_to("r1", 1)
        await t.rows("ANALYZE {schema}.outbox")
        statement = t.runtime._store.queries["claim_intents"]
        params: dict[str, Any] = {
            "off": 0,
            "types": sorted(t.runtime.definitions),
            "probe": 32,
            "free": 16,
            "lease": LEASE_MS,
            "max_backoff": MAX_BACKOFF_MS,
        }
        async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
            # The custom plan, parameters inlined as literals.
            literal = psycopg.AsyncClientCursor(conn).mogrify(statement, params)
            cur = await conn.execute(f"EXPLAIN (FORMAT JSON) {literal}".encode())
            check_plan((await cur.fetchone())[0][0]["Plan"])  # type: ignore[index]

            # The generic plan a prepared statement settles on after a few executions.
            names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
            numbered = re.sub(
                r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement
            )
            types = ", ".join("text[]" if n == "types" else "bigint" for n in names)
            await conn.execute(f"PREPARE relay_claim ({types}) AS {numbered}".encode())
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            args = ", ".join(
                "ARRAY[" + ", ".join(f"'{v}'" for v in params[n]) + "]::text[]"
                if n == "types"
                else str(params[n])
                for n in names
            )
            cur = await conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE relay_claim ({args})".encode())
            check_plan((await cur.fetchone())[0][0]["Plan"])  # type: ignore[index]

        # The claim itself takes the one intent and leaves every job row alone.
        claimed, _, _ = await one_pass(t)
        assert claimed == 1
        assert len(await receipts(t)) == 1
        untouched = await t.rows(
            "SELECT count(*) AS n FROM {schema}.outbox"
            " WHERE kind = 'job' AND attempts = 0 AND NOT running"
        )
        assert untouched[0]["n"] == 10_000 == len(await outbox(t))


async def test_RL15_foreign_rows_in_a_bucket_do_not_starve_own_intents(akter_test: Make) -> None:
    # One delivery slot: the probe is 2 rows per bucket, yet 400 older foreign rows in the
    # sender's bucket (jobs, and intents to a type no runner here hosts) are passed over.
    async with akter_test(ALL, relay=False, delivery_concurrency=1) as t:
        await t.rows(_FILL_JOBS, {"n": 200, "bucket": DEFAULT_BUCKET})
        await t.rows(_FILL_FOREIGN_INTENTS, {"n": 200, "bucket": DEFAULT_BUCKET})
        await t.get(Sender, "s1").send_to("r1", 1)
        buckets = await t.rows("SELECT DISTINCT bucket FROM {schema}.outbox")
        assert [r["bucket"] for r in buckets] == [DEFAULT_BUCKET]
        claimed, _, _ = await one_pass(t)
        assert claimed == 1
        assert [r["actor_id"] for r in await receipts(t)] == ["r1"]
        foreign = await t.rows(
            "SELECT count(*) AS n FROM {schema}.outbox"
            " WHERE attempts = 0 AND target_type = 'Foreign'"
        )
        assert foreign[0]["n"] == 400


async def test_RL15_a_backlog_of_2000_drains_in_one_advance(akter_test: Make) -> None:
    # Without the background loop every pass is the drain's own, so the outcome does not
    # depend on how the loop's wakeups interleave with the drain's rounds.
    async with akter_test(ALL, relay=False) as t:
        targets = [f"r{i % 100}" for i in range(2000)]
        sender = t.get(Sender, "s1")
        for i in range(0, 2000, 500):
            await sender.remind_many(targets[i : i + 500], 60)
        assert len(await outbox(t)) == 2000
        await t.advance(61)
        assert await outbox(t) == []
        rows = await receipts(t)
        assert len(rows) == 2000
        assert RUNS == {r["command_id"]: 1 for r in rows}


async def test_RL15_endless_work_makes_the_drain_raise_after_100_rounds(akter_test: Make) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.get(Sender, "s1").loop(0)
        with pytest.raises(akter.DrainError, match="Outbox did not settle"):
            await t.drain()
        # Each of the 100 rounds claimed the one row the previous delivery re-staged.
        assert t.runtime._relay.delivered == 99 and t.runtime._relay.in_flight == 1
        LOOPING["on"] = False
        await t.drain()
        assert await outbox(t) == []
        # Every delivery ran the handler once (the last one in flight at the DrainError may
        # already have re-staged one more row before the loop was switched off).
        assert [k for k, v in RUNS.items() if v > 1] == ["loop"]
        assert RUNS["loop"] == 1 + t.runtime._relay.delivered
        assert t.runtime._relay.delivered in (100, 101)


# --- the delivery lane keeps up (docs/benchmarks.md, relay finding 2) ---------------------------


async def test_lane_one_held_delivery_leaves_the_other_slots_turning_over(
    akter_test: Make,
) -> None:
    # Polling is out of the picture (poll = 60 s, the first poll after 54 s): only the wakes of
    # freed slots refill the lane. One delivery is held for the whole backlog; the other three
    # slots deliver 60 intents around it, each slot refilled as soon as it frees.
    async with akter_test(ALL, delivery_concurrency=4, poll=60) as t:
        relay = t.runtime._relay
        held = t.pause_next("after_claim", lambda info: info["ref"].id == "slow")
        sender = t.get(Sender, "s1")
        await sender.send_to("slow", 1)
        await held.wait()
        await sender.send_many([f"r{i % 20}" for i in range(60)], 1)

        async def only_the_held_one_left() -> bool:
            # Deleted rows, then their deliveries' ends (a settle returns after its delete).
            return len(await outbox(t)) == 1 and relay.in_flight == 1

        await until(only_the_held_one_left, within=30)
        [row] = await outbox(t)
        assert row["target_id"] == "slow" and row["attempts"] == 1
        assert relay.delivered == 60
        rows = await receipts(t)
        assert len(rows) == 60 and RUNS == {r["command_id"]: 1 for r in rows}

        held.release()

        async def empty() -> bool:
            return await outbox(t) == []

        await until(empty)
        await relay.wait_idle()
        assert relay.delivered == 61 and relay.retried == 0
        assert [d["k"] for d in await received(t, "slow")] == [1]


async def test_lane_a_delete_held_by_a_lock_does_not_hold_its_slot(
    akter_test: Make, akter_db: str
) -> None:
    # One delivery slot. The first receiver commits, then the delete of its row waits for a row
    # lock held here. The slot already belongs to the next claim, so the next row is delivered
    # meanwhile; its delete queues behind the held one. Then the lane stops: at most a lane's
    # worth of delivered rows (one) may wait for their delete beyond the lane.
    async with akter_test(ALL, delivery_concurrency=1, poll=60) as t:
        relay = t.runtime._relay
        committed = t.pause_next("before_outbox_delete")
        sender = t.get(Sender, "s1")
        await sender.send_to("first", 1)
        info = await committed.wait()
        [row] = await t.rows(
            "SELECT routing_key FROM {schema}.outbox WHERE intent_id = %(id)s",
            {"id": info["intent_id"]},
        )
        async with await psycopg.AsyncConnection.connect(akter_db) as blocker:  # a transaction
            await blocker.execute(
                sql.SQL(
                    "SELECT 1 FROM {}.outbox WHERE routing_key = %s AND intent_id = %s FOR UPDATE"
                ).format(sql.Identifier(t.schema)),
                [row["routing_key"], info["intent_id"]],
            )
            await sender.send_many(["second", "third"], 2)
            committed.release()

            async def two_received() -> bool:
                return len(await receipts(t)) == 2

            await until(two_received)
            # The last row is not claimed while both deletes wait (a pass now claims nothing).
            assert await relay.run_pass() == 0
            assert relay.delivered == 0 and relay.in_flight == 2
            pending = {r["target_id"]: r["attempts"] for r in await outbox(t)}
            assert pending["first"] == 1 and sorted(pending.values()) == [0, 1, 1]
            await blocker.rollback()

        async def empty() -> bool:
            return await outbox(t) == [] and relay.in_flight == 0

        await until(empty)
        assert relay.delivered == 3 and relay.retried == 0
        rows = await receipts(t)
        assert sorted(r["actor_id"] for r in rows) == ["first", "second", "third"]
        assert RUNS == {r["command_id"]: 1 for r in rows}


async def test_lane_slots_freed_while_a_claim_is_in_flight_are_refilled_right_after_it(
    akter_test: Make, akter_db: str
) -> None:
    # Four slots, no polling (poll = 60 s). A claim is held in flight by a table lock taken
    # here; three slots free while it waits. The pass right after it refills them, although
    # the one row that claim took stays held at after_claim: no delivery ending later is needed.
    async with akter_test(ALL, delivery_concurrency=4, poll=60) as t:
        if t.on_citus:  # the claim below waits on a worker's shard
            pytest.skip("holds the plain one-statement claim on a table lock (issue 16)")
        relay = t.runtime._relay
        sender = t.get(Sender, "s1")
        deletes = [t.pause_next("before_outbox_delete") for _ in range(4)]
        await sender.send_many(["a", "b", "c", "d"], 1)  # one claim fills all four slots
        for pause in deletes:
            await pause.wait()
        behind = [f"e{i}" for i in range(8)]
        await sender.send_many(behind, 2)  # no free slot: stays due
        outbox_table = sql.Identifier(t.schema, "outbox")
        waiting_claims = sql.SQL(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE 'WITH clock AS MATERIALIZED%%' AND position({} in query) > 0"
            # The intent claim only: the pass runs the job claims beside it (they wait too).
            " AND position({} in query) > 0"
        ).format(sql.Literal(f'"{t.schema}".stmt_ms'), sql.Literal("o.kind = 'intent'"))
        async with await psycopg.AsyncConnection.connect(akter_db) as blocker:  # a transaction
            await blocker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(outbox_table))
            deletes[0].release()  # its slot frees: a claim of one row starts and waits

            async def claim_waits() -> bool:
                async with await psycopg.AsyncConnection.connect(akter_db) as probe:
                    cur = await probe.execute(waiting_claims)
                    return (await cur.fetchone()) == (1,)

            await until(claim_waits)
            for pause in deletes[1:]:
                pause.release()  # three more slots free while the claim is in flight

            async def settles_queued() -> bool:
                return sum(1 for c in relay._claims.values() if c.settling) == 4

            await until(settles_queued)
            held = t.pause_next("after_claim")  # the row that claim takes is held
            await blocker.rollback()
        first = await held.wait()
        assert first["ref"].id in behind

        async def all_but_the_held_one_delivered() -> bool:
            return len(await outbox(t)) == 1 and relay.in_flight == 1

        await until(all_but_the_held_one_delivered)
        assert len(await receipts(t)) == 4 + 7 and relay.delivered == 11
        [row] = await outbox(t)
        assert row["target_id"] == first["ref"].id
        held.release()

        async def empty() -> bool:
            return await outbox(t) == []

        await until(empty)
        await relay.wait_idle()
        assert relay.delivered == 12 and relay.retried == 0
        rows = await receipts(t)
        assert len(rows) == 12 and RUNS == {r["command_id"]: 1 for r in rows}
