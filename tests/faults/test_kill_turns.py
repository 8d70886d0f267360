"""Turns under real process death and real concurrency (conformance TU-01, TU-03–TU-05, kill).

A child process (``tests.faults.child``) runs a second runner on the test's schema. It is killed
with SIGKILL while a turn is held at a fault point, so PostgreSQL — not akter — decides what
survives: the open transaction of a turn killed before ``COMMIT`` must vanish, a committed one
must replay. Ordering comes from the child's protocol lines, pauses and the server's own view of
lock waits, never from sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

from akter.testing import ActorTest
from akter.testing.harness import Inspection
from tests._support.citus import ON_CITUS
from tests._support.locks import until_lock_waiter
from tests.faults.actors import Counter
from tests.faults.child_process import ChildProcess, start_module

pytestmark = [pytest.mark.kill, pytest.mark.timeout(60)]

MakeTest = Callable[..., ActorTest]


class Child(ChildProcess):
    """A runner in a child process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "child")

    async def request(self, request: dict[str, Any]) -> None:
        """Write one request line."""
        await self.send(json.dumps(request))

    async def results(self) -> dict[str, int]:
        """Read one answer of ``serve-commands``: command id → returned total, all successes."""
        answer = json.loads(await self.line())
        failed = [r for r in answer["results"] if "error" in r]
        assert not failed, failed
        return {str(r["cid"]): int(r["ok"]) for r in answer["results"]}

    async def add(self, calls: dict[str, int]) -> dict[str, int]:
        """Run ``Counter.add`` calls (command id → k) concurrently in the child."""
        await self.request({"calls": [{"cid": cid, "k": k} for cid, k in calls.items()]})
        return await self.results()


@asynccontextmanager
async def child(t: ActorTest, *argv: str) -> AsyncIterator[Child]:
    """Start ``python -m tests.faults.child MODE URL SCHEMA ...``; always killed on exit."""
    mode, *rest = argv
    async with Child(
        await start_module("tests.faults.child", mode, t.database_url, t.schema, *rest)
    ) as running:
        yield running


async def counts(t: ActorTest) -> dict[str, int]:
    """Rows per durable table of the test's (fresh) schema."""
    rows = await t.rows(
        "SELECT (SELECT count(*) FROM {schema}.actors) AS actors,"
        " (SELECT count(*) FROM {schema}.receipts) AS receipts,"
        " (SELECT count(*) FROM {schema}.events) AS events,"
        " (SELECT count(*) FROM {schema}.outbox) AS outbox"
    )
    return {name: int(n) for name, n in rows[0].items()}


def applied_by(rows: Inspection) -> list[str]:
    """The command ids the durable state says were applied, in order."""
    assert rows.state is not None
    return [str(cid) for cid in rows.state["applied"]]


def assert_applied_once(rows: Inspection, results: dict[str, int]) -> None:
    """Each command id applied exactly once, and its caller got the total of its own turn."""
    assert rows.state is not None
    applied = applied_by(rows)
    assert sorted(applied) == sorted(results)
    assert {r["command_id"]: r["outcome"] for r in rows.receipts} == {
        cid: {"ok": total} for cid, total in results.items()
    }
    assert [e["command_id"] for e in rows.events] == applied
    assert [e["seq"] for e in rows.events] == list(range(1, len(applied) + 1))
    assert [e["payload"]["total"] for e in rows.events] == [results[cid] for cid in applied]
    assert len(rows.outbox) == len(applied)
    assert rows.state["total"] == (results[applied[-1]] if applied else 0)


# --- SIGKILL at a fault point -------------------------------------------------------------------


@pytest.mark.parametrize("existing", [False, True], ids=["new-actor", "existing-actor"])
async def test_sigkill_before_commit_leaves_no_trace_and_the_retry_commits_once(
    akter_test: MakeTest, existing: bool
) -> None:
    async with akter_test([Counter]) as t:
        handle = t.get(Counter, "k1")
        results: dict[str, int] = {}
        if existing:
            first = await t.runtime.mint_command_id()
            results[first] = await handle.with_command_id(first).add(1)
        before = await t.inspect(handle)
        before_counts = await counts(t)
        cid = await t.runtime.mint_command_id()

        async with child(t, "pause", "before_commit", "k1", cid, "5") as runner:
            # The child's handler has staged state, an event and an intent, and holds the lock.
            assert await runner.line() == "PAUSED before_commit"
            await runner.kill()

        after = await t.inspect(handle)
        assert after == before  # no receipt, state, version, event or outbox row
        assert after.exists is existing
        assert cid not in {r["command_id"] for r in after.receipts}
        assert await counts(t) == before_counts

        # The retry with the same id waits out the dead backend's lock and runs once.
        results[cid] = await handle.with_command_id(cid).add(5)
        assert results[cid] == (6 if existing else 5)
        committed = await t.inspect(handle)
        assert committed.version == len(results)
        assert applied_by(committed) == [*results]
        assert_applied_once(committed, results)

        # A further retry replays the receipt: same value, nothing new.
        assert await handle.with_command_id(cid).add(5) == results[cid]
        assert await t.inspect(handle) == committed


async def test_sigkill_after_commit_keeps_the_outcome_and_the_retry_replays_it(
    akter_test: MakeTest,
) -> None:
    async with akter_test([Counter]) as t:
        handle = t.get(Counter, "k2")
        cid = await t.runtime.mint_command_id()

        async with child(t, "pause", "after_commit", "k2", cid, "5") as runner:
            assert await runner.line() == "PAUSED after_commit"
            await runner.kill()

        landed = await t.inspect(handle)
        assert landed.version == 1
        assert landed.state == {"total": 5, "applied": [cid]}
        assert_applied_once(landed, {cid: 5})

        # The killed child never replied; the retry gets the stored outcome, the handler does
        # not run again (a second run would return 10 and append the id twice).
        assert await handle.with_command_id(cid).add(5) == 5
        assert await t.inspect(handle) == landed

        # The actor goes on from the committed state.
        nxt = await t.runtime.mint_command_id()
        assert await handle.with_command_id(nxt).add(2) == 7
        rows = await t.inspect(handle)
        assert rows.version == 2
        assert_applied_once(rows, {cid: 5, nxt: 7})


@pytest.mark.skipif(ON_CITUS, reason="warm turns share writes on plain PostgreSQL only")
async def test_sigkill_in_the_middle_of_a_shared_write_leaves_each_turn_whole_or_absent(
    akter_test: MakeTest,
) -> None:
    # The child's write carries a, b and c (docs/internals/shared-flights.md); c's guard waits
    # for its row, which the test holds, so the child dies with a and b committed and c's whole
    # flight, COMMIT included, in the server's hands. PostgreSQL decides what of c survives
    # once the row is free: each turn is then whole (state, receipt, event, intent) or absent,
    # none applied twice, and the actors go on from their rows.
    async with akter_test([Counter]) as t:
        ids = ["sw-a", "sw-b", "sw-c"]
        warm: dict[str, dict[str, int]] = {}
        async with await psycopg.AsyncConnection.connect(t.database_url) as blocker:
            async with child(t, "shared-write", "sw-hold", *ids) as runner:
                for cid, (actor, total) in json.loads(
                    (await runner.line()).removeprefix("WARM ")
                ).items():
                    warm[actor] = {cid: total}
                await blocker.execute(
                    f"SELECT 1 FROM {t.schema}.actors WHERE actor_id = 'sw-c' FOR UPDATE"
                )
                await runner.send("go")
                assert json.loads((await runner.line()).removeprefix("SENT ")) == 2
                await until_lock_waiter(t)  # c's guard: a's and b's segments are done
                await runner.kill()
            for actor, turns in (("sw-a", 2), ("sw-b", 2), ("sw-c", 1)):
                rows = await t.inspect(t.get(Counter, actor))
                assert len(applied_by(rows)) == turns, actor  # c waits: nothing of it yet
            await blocker.rollback()
            # Whatever the killed session's backend does with c, it ends: the row is free.
            await blocker.execute(
                f"SELECT 1 FROM {t.schema}.actors WHERE actor_id = 'sw-c' FOR UPDATE"
            )
            await blocker.rollback()
        for actor in ids:
            rows = await t.inspect(t.get(Counter, actor))
            ledger = dict(warm[actor])
            ledger.update(dict.fromkeys(applied_by(rows)[1:], 11))
            assert_applied_once(rows, ledger)  # a and b: two turns (above); c: one or two
            assert await t.get(Counter, actor).add(100) == (1 + 10 * (len(ledger) - 1)) + 100


# --- two processes on one actor -----------------------------------------------------------------


async def test_two_processes_alternating_and_racing_apply_every_command_once(
    akter_test: MakeTest,
) -> None:
    async with akter_test([Counter]) as t:
        handle = t.get(Counter, "shared")
        ks: dict[str, int] = {}
        results: dict[str, int] = {}

        async def mint(k: int) -> str:
            cid = await t.runtime.mint_command_id()
            ks[cid] = k
            return cid

        async with child(t, "serve-commands", "shared") as runner:
            assert await runner.line() == "READY"

            # Alternating: every turn finds the other runner's commit (a stale cache) at the fence.
            for i in range(20):
                cid = await mint(i + 1)
                results[cid] = await handle.with_command_id(cid).add(ks[cid])
                cid = await mint(100 + i)
                results.update(await runner.add({cid: ks[cid]}))

            # Racing: the parent's burst holds the row lock at before_commit until the child's
            # burst is seen waiting for it, then both drain concurrently.
            parent_burst = [await mint(1000 + i) for i in range(20)]
            child_burst = {await mint(2000 + i): 2000 + i for i in range(20)}
            held = t.pause_next("before_commit")
            burst = asyncio.gather(
                *(handle.with_command_id(cid).add(ks[cid]) for cid in parent_burst)
            )
            try:
                await held.wait()
                await runner.request(
                    {"calls": [{"cid": c, "k": k} for c, k in child_burst.items()]}
                )
                await until_lock_waiter(t)
            finally:
                held.release()
            results.update(zip(parent_burst, await burst, strict=True))
            results.update(await runner.results())

        rows = await t.inspect(handle)
        assert len(results) == 80
        assert_applied_once(rows, results)
        assert rows.state is not None
        assert rows.state["total"] == sum(ks.values())
        # No lost update: in the durable order, each caller saw exactly the prefix sum up to and
        # including its own command.
        running = 0
        for cid in applied_by(rows):
            running += ks[cid]
            assert results[cid] == running, cid
        # 40 alternating turns are 40 batches; each burst is at least one more.
        assert 42 <= rows.version <= 80


# --- one command id, many callers ---------------------------------------------------------------


@pytest.mark.parametrize("runtimes", [1, 2], ids=["one-runner", "two-runners"])
async def test_fifty_callers_with_one_command_id_make_one_transition(
    akter_test: MakeTest, runtimes: int
) -> None:
    async with akter_test([Counter]) as t:
        for _ in range(runtimes - 1):
            await t.add_runtime()
        cid = await t.runtime.mint_command_id()
        handles = [rt.get(Counter, "same").with_command_id(cid) for rt in t.runtimes]

        # The first turn on runner 0 holds the row lock until every caller is in flight.
        held = t.pause_next("before_commit")
        calls = asyncio.gather(*(handles[i % runtimes].add(7) for i in range(50)))
        try:
            await held.wait()
            if runtimes == 1:
                # One runner: the first caller's turn runs, the other 49 wait in its mailbox
                # (a batch never holds one id twice).
                assert t.runtime._dispatcher.pending == 50
            else:
                await until_lock_waiter(t)  # runner 1 races for the same row
        finally:
            held.release()
        assert await calls == [7] * 50

        rows = await t.inspect(handles[0])
        assert rows.version == 1
        assert rows.state == {"total": 7, "applied": [cid]}
        assert_applied_once(rows, {cid: 7})
