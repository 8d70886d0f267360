"""The relay under real process death and real concurrency (RL-04 … RL-07, RL-13; kill).

A child process (``tests.faults.relay_child``) runs a runner hosting ``Receiver`` on the test's
database and schema; the parent hosts ``Sender`` and stages the intents. The child is SIGKILLed
while a delivery holds at a fault point, so only what PostgreSQL committed survives: a claim is
a due time in the future (nothing is locked), and the receiver's receipt turns a redelivery into
a replay. Ordering comes from the child's protocol lines and fault-point pauses; waiting for the
outcome polls durable rows under a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from akter._engine.hooks import Hooks
from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.relay_actors import RUNS, Receiver, Sender

pytestmark = [pytest.mark.kill, pytest.mark.timeout(90)]

MakeTest = Callable[..., ActorTest]

#: The child's claim lease in the kill tests (seconds): short, so the lease really ends.
CHILD_LEASE_S = 3
#: The parent's default claim lease for a runtime hosting only Receiver: 30 s + 2 s + 5 s.
LEASE_MS = 37_000


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


class Child(ChildProcess):
    """A relay runner in a child process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "relay child")

    async def stop(self) -> dict[str, int]:
        """End the child's input: it stops gracefully and reports its relay counters."""
        self.end_input()
        word, stats = (await self.line()).split(" ", 1)
        assert word == "STOPPED", word
        assert await self.proc.wait() == 0
        return {str(k): int(v) for k, v in json.loads(stats).items()}


@asynccontextmanager
async def relay_child(t: ActorTest, *options: str) -> AsyncIterator[Child]:
    """Start ``python -m tests.faults.relay_child URL SCHEMA OPTIONS``; killed on exit."""
    proc = await start_module("tests.faults.relay_child", t.database_url, t.schema, *options)
    async with Child(proc) as running:
        assert await running.line() == "READY"
        yield running


# --- durable rows -------------------------------------------------------------------------------


async def outbox(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox ORDER BY scheduled_at_ms, intent_id")


async def only_row(t: ActorTest) -> dict[str, Any]:
    rows = await outbox(t)
    assert len(rows) == 1, rows
    return rows[0]


async def receipts(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows(
        "SELECT actor_id, command_id, command, caller_key, outcome FROM {schema}.receipts"
        " WHERE actor_type = 'Receiver' ORDER BY command_id"
    )


async def receivers(t: ActorTest) -> dict[str, dict[str, Any]]:
    """Each receiver's actor row: ``version`` and the deliveries it committed."""
    rows = await t.rows(
        "SELECT actor_id, version, state FROM {schema}.actors WHERE actor_type = 'Receiver'"
    )
    return {
        str(r["actor_id"]): {"version": r["version"], "received": r["state"]["received"]}
        for r in rows
    }


def caller_key(sender: str = "s1") -> str:
    return json.dumps(
        ["System", "actor", ["default", "Sender", sender], None], separators=(",", ":")
    )


# --- (1) killed after the claim, before the delivery (RL-04) ------------------------------------


async def test_RL04_sigkill_after_claim_nobody_delivers_before_the_lease_ends(
    akter_test: MakeTest,
) -> None:
    async with akter_test([Sender], relay=False) as t:
        await t.get(Sender, "s1").send_to("r1", 5)
        staged = await only_row(t)
        cid = staged["intent_id"]

        lease = str(CHILD_LEASE_S)
        async with relay_child(t, "--pause", "after_claim", "--claim-lease", lease) as child:
            assert await child.line() == f"PAUSED after_claim {cid}"
            claim = await only_row(t)
            token = claim["due_at_ms"]
            assert claim["attempts"] == 1
            assert 0 < token - await t.now_ms() <= CHILD_LEASE_S * 1000
            await child.kill()

        # Another runner hosting the receiver: its first claim is held so the test can look.
        hooks = Hooks()
        reclaim = hooks.pause_next("after_claim")
        other = await t.add_runtime([Receiver], relay=True, poll=0.2, hooks=hooks)
        claimed = await other._relay.run_pass()
        checked_at = await t.now_ms()
        assert checked_at < token, "the test machine took longer than the child's lease"
        assert claimed == 0  # the dead runner's lease still holds the row
        assert await outbox(t) == [claim] and await receipts(t) == []

        info = await reclaim.wait(within=CHILD_LEASE_S + 10)
        assert info["intent_id"] == cid
        second = await only_row(t)
        assert second["attempts"] == 2  # two claims
        assert second["due_at_ms"] - LEASE_MS >= token  # claimed only once the lease ended
        assert second["scheduled_at_ms"] == staged["scheduled_at_ms"]
        reclaim.release()
        await other._relay.wait_idle()

        assert await outbox(t) == []
        assert await receipts(t) == [
            {
                "actor_id": "r1",
                "command_id": cid,
                "command": "take",
                "caller_key": caller_key(),
                "outcome": {"ok": 1},
            }
        ]
        state = (await receivers(t))["r1"]
        assert state["version"] == 1
        assert [d["cid"] for d in state["received"]] == [cid]  # one transition
        assert state["received"][0]["now"] >= token
        assert RUNS == {cid: 1}


# --- (2) killed after the receiver's commit, before the delete (RL-05) --------------------------


async def test_RL05_sigkill_before_outbox_delete_redelivery_replays_the_receipt(
    akter_test: MakeTest,
) -> None:
    async with akter_test([Sender], relay=False) as t:
        await t.get(Sender, "s1").send_to("r1", 5)
        cid = (await only_row(t))["intent_id"]

        lease = str(CHILD_LEASE_S)
        async with relay_child(
            t, "--pause", "before_outbox_delete", "--claim-lease", lease
        ) as child:
            assert await child.line() == f"PAUSED before_outbox_delete {cid}"
            await child.kill()

        # The child's receiver turn committed; its delete never ran.
        claim = await only_row(t)
        assert claim["attempts"] == 1 and claim["due_at_ms"] > await t.now_ms()
        committed = await receipts(t)
        assert [r["command_id"] for r in committed] == [cid]
        before = await receivers(t)
        assert before["r1"]["version"] == 1 and len(before["r1"]["received"]) == 1

        other = await t.add_runtime([Receiver], relay=True, poll=0.2)
        claimed = await other._relay.run_pass()
        assert await t.now_ms() < claim["due_at_ms"], "the test machine outran the child's lease"
        assert claimed == 0  # the dead runner's lease still holds the row

        async def settled() -> bool:
            return not await outbox(t)

        await until(settled, within=CHILD_LEASE_S + 10)
        await other._relay.wait_idle()
        assert other._relay.delivered == 1
        assert await receipts(t) == committed  # replayed, not re-run
        assert await receivers(t) == before  # no second transition
        assert RUNS == {}  # the handler never ran in this process


# --- (3) two runners claiming concurrently (RL-06) ----------------------------------------------


@pytest.mark.timeout(300 if ON_CITUS else 90)
async def test_RL06_two_processes_deliver_5000_intents_each_exactly_once(
    akter_test: MakeTest,
) -> None:
    async with akter_test([Sender], relay=False) as t:
        targets = [f"r{i % 250}" for i in range(5000)]
        sender = t.get(Sender, "s1")
        for i in range(0, 5000, 500):
            await sender.send_many(targets[i : i + 500], 1)
        staged = {str(r["intent_id"]): str(r["target_id"]) for r in await outbox(t)}
        assert len(staged) == 5000

        started = time.monotonic()
        async with relay_child(t) as child:
            other = await t.add_runtime([Receiver], relay=True)

            async def settled() -> bool:
                return not await outbox(t)

            # Citus drains several times slower than plain PostgreSQL on one machine (each claim
            # pass scans every shard; docs/benchmarks.md, "Citus"): the bound is a wedge check.
            await until(settled, within=240 if ON_CITUS else 60)
            await other._relay.wait_idle()
            elapsed = time.monotonic() - started
            stats = await child.stop()

        print(
            f"5000 intents in {elapsed:.1f} s: parent delivered {other._relay.delivered}, "
            f"child delivered {stats['delivered']}"
        )
        # A row claimed by both would have been delivered by both: the counts add up exactly.
        assert other._relay.delivered + stats["delivered"] == 5000
        assert other._relay.delivered > 0 and stats["delivered"] > 0
        assert other._relay.retried == 0 and stats["retried"] == 0
        rows = await receipts(t)
        assert {r["command_id"]: r["actor_id"] for r in rows} == staged
        state = await receivers(t)
        assert len(state) == 250
        for target, actor in state.items():
            cids = [d["cid"] for d in actor["received"]]
            assert len(cids) == len(set(cids)) == 20, target  # each transition exactly once
            assert set(cids) == {c for c, tg in staged.items() if tg == target}


# --- (4) a receiver failing its first attempts (RL-07) ------------------------------------------


def failure_wait(attempts: int) -> int:
    """Semantics §3.3: a failed delivery waits min(1 s × 2^(attempts − 1), 256 s)."""
    return min(1000 << (attempts - 1), 256_000)


async def test_RL07_receiver_failing_its_first_attempts_backs_off_without_blocking(
    akter_test: MakeTest,
) -> None:
    fails = 3
    async with (
        akter_test([Sender], relay=False, notify=True) as t,
        relay_child(t, "--flaky", str(fails), "--notify") as child,
    ):
        sender = t.get(Sender, "s1")
        offset = 0  # how far the child's framework clock is ahead of the parent's
        before = await t.now_ms()
        await sender.send_flaky("f1", 1)
        flaky = await only_row(t)
        cid = flaky["intent_id"]
        good: list[str] = []
        for attempts in range(1, fails + 1):
            assert await child.line() == f"RETRIED {cid} {attempts}"
            after = await t.now_ms()
            row = next(r for r in await outbox(t) if r["intent_id"] == cid)
            backoff = failure_wait(attempts)
            assert row["attempts"] == attempts
            assert before + offset + backoff <= row["due_at_ms"] <= after + offset + backoff
            assert row["scheduled_at_ms"] == flaky["scheduled_at_ms"]
            assert "Defect" in row["last_error"]

            # A newer row, due at once, is delivered while the failing one waits. Its id is
            # read from the receiver's state once delivered: the child, woken by NOTIFY, may
            # deliver and delete the row before this process could read it in the outbox.
            await sender.send_to(f"g{attempts}", 1)

            async def delivered(target: str = f"g{attempts}") -> bool:
                return target in await receivers(t)

            await until(delivered, within=5)
            [first] = (await receivers(t))[f"g{attempts}"]["received"]
            assert first["cid"] != cid
            good.append(first["cid"])
            assert next(r for r in await outbox(t) if r["intent_id"] == cid) == row

            # Move the child's clock to the failing row's due time: it is claimed again.
            before = await t.now_ms()
            step = max(1, row["due_at_ms"] - (before + offset))
            offset += step
            await child.send(f"ADVANCE {step}")
            assert await child.line() == f"ADVANCED {offset}"

        async def settled() -> bool:
            return not await outbox(t)

        await until(settled, within=10)
        rows = {r["command_id"]: r["actor_id"] for r in await receipts(t)}
        assert rows == {cid: "f1", **{g: f"g{i + 1}" for i, g in enumerate(good)}}
        state = await receivers(t)
        assert [d["cid"] for d in state["f1"]["received"]] == [cid]
        stats = await child.stop()
        assert stats == {"delivered": 1 + len(good), "retried": fails}
        assert (await t.rows("SELECT count(*) AS n FROM {schema}.dead_letters"))[0]["n"] == 0


# --- (5) cross-process wake latency (RL-13) -----------------------------------------------------


async def test_RL13_notify_wakes_another_process_well_within_the_poll(
    akter_test: MakeTest,
) -> None:
    async with (
        akter_test([Sender], notify=True) as t,
        relay_child(t, "--notify", "--poll", "5") as child,
    ):
        sender = t.get(Sender, "s1")
        latencies: list[int] = []
        walls: list[float] = []
        for i in range(5):
            sent_at = await sender.send_to(f"r{i}", 1)
            committed = time.monotonic()

            async def delivered(target: str = f"r{i}") -> bool:
                return target in await receivers(t)

            await until(delivered, within=8)
            walls.append(time.monotonic() - committed)
            [delivery] = (await receivers(t))[f"r{i}"]["received"]
            latencies.append(delivery["now"] - sent_at)
        print(
            f"RL-13 cross-process NOTIFY latency, database clock (ms): {latencies}; "
            f"observed by the parent (s): {[round(w, 3) for w in walls]}"
        )
        assert max(latencies) < 2500, latencies  # poll is 5 s: only the NOTIFY explains this
        stats = await child.stop()
        assert stats == {"delivered": 5, "retried": 0}
