"""Runners under real process death (conformance RN-01 and RN-04, kill).

RN-01: runner processes (``tests.faults.runner_child``) host the ``Beacon`` singleton, whose loop
writes a beat stamped with the database clock every 50 ms; a trigger logs every write of the
lease row (``tests.faults.runner_drill``). The loop's owner is SIGKILLed and the beats show that
exactly one survivor starts the loop, only after the dead owner's lease, and that no two loops
ever beat at once. The timings are production's divided by ten (lease 3.5 s, refresh 1 s, stop
margin 0.5 s); the stop margin is a module constant, scaled in the children and here.

The freeze case SIGSTOPs the owner past its lease and resumes it once a successor runs. Its loop
body runs before its guard on resume, so the runners host ``FencedBeacon``, whose beats are
commands fenced on the loop's lease: the resumed step's beat must be refused, and no beat of the
frozen run may commit after the successor's acquisition.

The stalled-refresh cases run in this process: the owner's lease statement is replaced by one
that hangs (or fails) on the server, so the real refresh path stalls and only the loop guard can
stop the loop in time.

Hardening finding 7: a child runner (``runner_child --tally``) is SIGSTOPped inside a turn, holding
an actor row lock; the server must end that transaction within the turn's bound, so a command
from another runner succeeds meanwhile, and the resumed turn must be refused without applying.

RN-04: a child owns an embedded PostgreSQL in a temporary directory and runs a command load; it
is SIGKILLed (alone, or with the whole server), and the next start on the same directory must
show every acknowledged command, replay retries from their receipts and deliver the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import akter
from akter._engine import runners as runners_module
from akter._engine.turn import SERVER_BOUND_GRACE_MS
from akter._store.embedded import EmbeddedPostgres, shutdown
from akter.actor import definition_of
from akter.testing import ActorTest
from tests._support import until
from tests._support.citus import ON_CITUS
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.runner_actors import BEAT, LATER_S, Beacon, Inbox, Ledger, Tally
from tests.faults.runner_drill import (
    NO_LEASE_LOG,
    SCALED,
    Analysis,
    Timing,
    analyse,
    db_now,
    fetch,
    freeze_drill,
    prepare,
    singleton_drill,
    wait_for_run,
)

pytestmark = [pytest.mark.kill, pytest.mark.timeout(120)]

MakeTest = Callable[..., ActorTest]


def assert_rn01(analysis: Analysis, kills: int, timing: Timing) -> None:
    """RN-01 over a kill drill: one loop, one successor per kill after the lease, no overlap."""
    assert analysis.problems() == []
    assert len(analysis.kills) == kills
    # Before the first kill, with three runners contending, one runner ran the loop.
    before = [r for r in analysis.runs if r.first_ms < analysis.kills[0].kill_ms]
    assert len({r.runner_id for r in before}) == 1, before
    for kill in analysis.kills:
        assert kill.new_runners == 1
        assert kill.successor is not None and kill.successor.runner_id != kill.victim
        assert kill.after_lease_ms is not None and kill.after_lease_ms >= 0  # after the lease
        takeover = kill.takeover_ms
        assert kill.lease_left_ms is not None and takeover is not None
        # The survivors poll every refresh: the takeover comes within one refresh of the lease
        # end (plus the time to start a loop and write a beat).
        assert takeover <= kill.lease_left_ms + timing.refresh_ms + 2_000
    # Every beat happened under an unexpired lease of its own runner.
    assert analysis.min_slack_ms is not None and analysis.min_slack_ms > 0


# --- RN-01: SIGKILL of the loop's owner ----------------------------------------------------------


@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
async def test_RN01_one_loop_among_three_runners_one_successor_per_sigkill(
    akter_test: MakeTest,
) -> None:
    async with akter_test([], maintenance=False) as t:
        analysis = await singleton_drill(t.database_url, t.schema, kills=3, timing=SCALED)
    assert_rn01(analysis, 3, SCALED)


@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_RN01_twenty_sigkills_of_the_owner(akter_test: MakeTest) -> None:
    async with akter_test([], maintenance=False) as t:
        analysis = await singleton_drill(t.database_url, t.schema, kills=20, timing=SCALED)
    assert_rn01(analysis, 20, SCALED)


# --- RN-01: SIGSTOP of the loop's owner past its lease, fenced beats ------------------------------


@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
async def test_RN01_frozen_owner_commits_no_fenced_beat_after_its_successor_acquired(
    akter_test: MakeTest,
) -> None:
    async with akter_test([], maintenance=False) as t:
        analysis, freezes = await freeze_drill(
            t.database_url, t.schema, rounds=2, timing=SCALED, fenced=True
        )
    assert analysis.problems() == []
    assert len(freezes) == 2
    for freeze in freezes:
        assert freeze.successor.runner_id != freeze.victim
        # The successor's acquisition came after the freeze, and before its loop's first beat.
        assert freeze.acquired_ms is not None
        assert freeze.stop_ms < freeze.acquired_ms <= freeze.successor.first_ms
        frozen = [r for r in analysis.runs if r.run_id == freeze.run_id]
        assert len(frozen) == 1 and frozen[0].runner_id == freeze.victim
        # Every beat the frozen run committed came before its successor acquired the lease; the
        # step it resumed into after SIGCONT was refused (LeaseLost) and wrote nothing.
        assert frozen[0].last_ms < freeze.acquired_ms, (frozen[0], freeze.acquired_ms)
        assert freeze.after_takeover_ms == [] and freeze.stale_beats_ms == []


# --- RN-01: an owner whose refreshes stall -------------------------------------------------------

#: The owner's lease statement, replaced on its runtime only: it hangs, or fails, on the server.
LEASE_ROUNDS = ("renew_singletons", "acquire_singleton")
STALLS = {
    "hang": "SELECT pg_sleep(3600) WHERE %(runner_id)s::text IS NOT NULL",
    "error": "SELECT 1 / 0 WHERE %(runner_id)s::text IS NOT NULL",
}


async def beacon_runtime(t: ActorTest, timing: Timing) -> akter.Runtime:
    """Start a runner hosting ``Beacon`` with the drill's tunables set before it starts."""
    runtime = akter.Runtime(
        [Beacon], database_url=t.database_url, schema=t.schema, maintenance=False, relay=False
    )
    runtime._runners.lease_ms = timing.lease_ms
    runtime._runners.refresh_ms = timing.refresh_ms
    runtime._runners.heartbeat_ms = timing.heartbeat_ms
    await runtime.start()
    t.runtimes.append(runtime)
    return runtime


@pytest.mark.skipif(ON_CITUS, reason=NO_LEASE_LOG)
@pytest.mark.parametrize("stall", sorted(STALLS))
async def test_RN01_owner_whose_refreshes_stall_stops_its_loop_before_its_lease_ends(
    akter_test: MakeTest, monkeypatch: pytest.MonkeyPatch, stall: str
) -> None:
    timing = SCALED
    monkeypatch.setattr(runners_module, "STOP_MARGIN_MS", timing.margin_ms)
    monkeypatch.setitem(BEAT, "s", timing.beat_ms / 1000)
    within = (timing.lease_ms + 3 * timing.refresh_ms) / 1000 + 10
    async with (
        akter_test([], maintenance=False) as t,
        await psycopg.AsyncConnection.connect(t.database_url, autocommit=True) as conn,
    ):
        await prepare(t.database_url, t.schema)
        for _ in range(3):
            await beacon_runtime(t, timing)
        first = await wait_for_run(conn, t.schema, 0, within)
        owner = next(rt for rt in t.runtimes if rt._runners.runner_id == first.runner_id)
        lease = owner._runners._leases["Beacon"]
        assert owner._runners.owns("Beacon")
        assert [rt._runners.owns("Beacon") for rt in t.runtimes].count(True) == 1

        stall_ms = await db_now(conn)
        for name in LEASE_ROUNDS:  # an owner renews in one statement, else runs a full round
            monkeypatch.setitem(owner._store.queries._statements, name, STALLS[stall])
        running = lease.task
        assert running is not None
        # Not owns(): that turns False already when the guard fires, before the loop ends.
        await until(
            running.done, within=within, what="the stalled owner's loop stopping", interval=0.005
        )
        assert not owner._runners.owns("Beacon")
        stopped_mono = next(at for what, at in reversed(lease.events) if what == "stopped")
        # The guard measures from the last refresh that succeeded, by its send time; "stopped"
        # is when the cancelled loop body had ended.
        guard_s = stopped_mono - lease.confirmed_at
        assert (
            (timing.lease_ms - timing.margin_ms) / 1000 - 0.05 <= guard_s < timing.lease_ms / 1000
        ), (guard_s, lease.events)

        successor = await wait_for_run(conn, t.schema, stall_ms, within)
        assert successor.runner_id != owner._runners.runner_id
        await asyncio.sleep(2 * timing.refresh_ms / 1000)  # nobody else starts meanwhile
        if stall == "error":
            # The owner's database comes back: its refreshes now find another owner.
            for name in LEASE_ROUNDS:
                monkeypatch.setitem(
                    owner._store.queries._statements, name, t.runtime._store.queries[name]
                )
            await asyncio.sleep(2 * timing.refresh_ms / 1000)
            assert not owner._runners.owns("Beacon")
        end_ms = await db_now(conn)
        beats, leases = await fetch(t.database_url, t.schema)

    analysis = analyse(beats, leases, end_ms=end_ms)
    assert analysis.problems() == [], [
        (r.runner_id[:8], r.first_ms, r.last_ms) for r in analysis.runs
    ]
    owned = [w for w in leases if w.owner == owner._runners.runner_id]
    lease_end = owned[-1].lease_until_ms
    # The stalled owner beat no more once its lease had ended (the guard check above is the
    # stop itself: the lease ends no earlier than the send time of its last refresh + lease).
    mine = [b for b in beats if b.runner_id == owner._runners.runner_id]
    assert {b.run_id for b in mine} == {first.run_id}
    assert mine[-1].at_ms < lease_end, (mine[-1].at_ms, lease_end)
    # One survivor took over, after the stalled owner's lease ended.
    later = [r for r in analysis.runs if r.first_ms > stall_ms]
    assert {r.runner_id for r in later} == {successor.runner_id}, later
    assert successor.first_ms >= lease_end, (successor.first_ms, lease_end)


# --- Hardening finding 7: a runner frozen mid-turn ------------------------------------------------


class TallyChild(ChildProcess):
    """``runner_child --tally``: a runner hosting ``Tally`` that holds a turn on request."""

    @classmethod
    async def spawn(cls, url: str, schema: str) -> TallyChild:
        proc = await start_module("tests.faults.runner_child", url, schema, "--tally")
        child = cls(proc, "tally runner")
        await child.ready()
        return child

    async def stop(self) -> None:
        """Resume it and let it exit at end of input (SIGKILLed after 30 s)."""
        await self.close(grace=30)


async def test_h7_frozen_turn_ends_on_the_server_and_is_refused_after_resume(
    akter_test: MakeTest,
) -> None:
    policy = definition_of(Tally).policy
    lock_wait_s = policy.lock_wait / 1000
    bound_s = (policy.execution_timeout + SERVER_BOUND_GRACE_MS) / 1000
    async with akter_test([Tally], maintenance=False) as t:
        child = await TallyChild.spawn(t.database_url, t.schema)
        try:
            await child.send("HOLD x")
            held = await child.line()
            assert held.startswith("HELD "), held
            frozen_id = held.split()[1]
            # Frozen inside the turn: its transaction holds the row lock of Tally/x.
            child.freeze()
            frozen_at = time.monotonic()
            mine = await t.runtime.mint_command_id()
            handle = t.get(Tally, "x").with_command_id(mine)
            async with asyncio.timeout(lock_wait_s + bound_s + 10):  # a failure, not a hang
                applied = await handle.add()
            took = time.monotonic() - frozen_at
            # The server ended the frozen transaction within its bound; this runner's command
            # got the lock within one more lock wait (and a retry backoff of at most 0.5 s).
            assert applied == [mine]
            assert took <= bound_s + lock_wait_s + 1.5, took
            frozen = await t.inspect(handle)
            assert frozen.state == {"applied": [mine]}
            assert [r["command_id"] for r in frozen.receipts] == [mine]
        finally:
            child.resume()
        try:
            # Resumed: the frozen turn's session is gone, so its commit is refused.
            await child.send("GO")
            assert await child.line() == f"DONE {frozen_id} error ActorUnavailable"
            after = await t.inspect(handle)
            assert after.state == {"applied": [mine]}
            assert [r["command_id"] for r in after.receipts] == [mine]
            # Its retry with the same id applies it once, on the state the other runner wrote.
            await child.send(f"RETRY x {frozen_id}")
            assert await child.line() == f"DONE {frozen_id} ok {mine},{frozen_id}"
            await child.send(f"RETRY x {frozen_id}")  # and a second retry replays
            assert await child.line() == f"DONE {frozen_id} ok {mine},{frozen_id}"
            final = await t.inspect(handle)
            assert final.state == {"applied": [mine, frozen_id]}
            assert sorted(r["command_id"] for r in final.receipts) == sorted([mine, frozen_id])
        finally:
            await child.stop()
        assert child.proc.returncode == 0, await child.diagnosis()


# --- RN-04: SIGKILL of the process owning the embedded database ----------------------------------

#: Acknowledged commands before the kill.
LOAD = 150
#: Finding a server's processes reads /proc (Linux).
HAS_PROC = Path("/proc").is_dir()


def processes_of(pid: int) -> list[int]:
    """``pid`` and its direct children (a postmaster's backends and auxiliary processes)."""
    found = [pid]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ")".
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaps counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


async def kill_server(postmaster: int) -> None:
    """SIGKILL the postmaster and every child of it, as a power cut would."""
    victims = processes_of(postmaster)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await until(
        lambda: all(gone(pid) for pid in victims),
        within=15,
        what=f"server processes {victims} gone after SIGKILL",
        interval=0.05,
    )


class Load:
    """What the killed child said: command ids sent (ledger, k) and acknowledged (total)."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, int]] = {}
        self.acked: dict[str, int] = {}

    def take(self, line: str) -> None:
        """Parse one complete protocol line."""
        match line.split():
            case ["SENT", cid, ledger, k]:
                self.sent[cid] = (ledger, int(k))
            case ["OK", cid, total]:
                self.acked[cid] = int(total)
            case _:
                pytest.fail(f"unexpected line from the child: {line!r}")


async def load_then_kill(data_dir: Path, *, server_too: bool) -> tuple[Load, int]:
    """Run the loaded child, SIGKILL it after ``LOAD`` acknowledgements; returns what it said."""
    proc = await start_module(
        "tests.faults.runner_embedded", str(data_dir), stdin=asyncio.subprocess.DEVNULL
    )
    load = Load()
    async with ChildProcess(proc, "loaded runner") as child:
        ready = await child.line(90)
        assert ready.startswith("READY "), (ready, await child.diagnosis())
        postmaster = int(ready.split()[1])
        while len(load.acked) < LOAD:
            load.take(await child.line(30))
        await child.kill()  # mid-load: calls are in flight
        if server_too:
            await kill_server(postmaster)
        # Lines already written before the kill are acknowledgements too; a torn last line is
        # dropped (its reply never fully reached the caller).
        assert proc.stdout is not None
        rest = (await proc.stdout.read()).decode()
        for line in rest.split("\n")[:-1]:
            load.take(line)
    return load, postmaster


@pytest.mark.parametrize("server_too", [False, True], ids=["owner", "owner-and-server"])
async def test_RN04_sigkill_of_the_embedded_database_owner_during_load(server_too: bool) -> None:
    if server_too and not HAS_PROC:
        pytest.skip("finding the server's processes needs /proc")
    # Not pytest's tmp_path: the server runs as another OS user when we are root, and it must be
    # able to reach the directory.
    data_dir = Path(tempfile.mkdtemp(prefix="akter-rn04-"))
    try:
        load, old_postmaster = await load_then_kill(data_dir, server_too=server_too)
        in_flight = set(load.sent) - set(load.acked)
        assert len(load.acked) >= LOAD and set(load.acked) <= set(load.sent)

        # The next start on the same directory adopts the surviving server, or starts it again
        # through crash recovery.
        server = EmbeddedPostgres(data_dir)
        url = await asyncio.to_thread(server.start)
        try:
            new_postmaster = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
            assert (new_postmaster != old_postmaster) is server_too
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                cur = await conn.execute("SELECT count(*) FROM akter.outbox")
                pending = await cur.fetchone()
            assert pending is not None and pending[0] > 0  # some intents were left undelivered
            await check_recovered(url, load, in_flight)
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        with contextlib.suppress(Exception):
            shutdown(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


async def check_recovered(url: str, load: Load, in_flight: set[str]) -> None:
    """Committed state, replays and outbox delivery after the restart."""
    async with ActorTest(
        [Ledger, Inbox], database_url=url, schema="akter", keep_schema=True, poll=0.2
    ) as t:
        ledgers = sorted({ledger for ledger, _ in load.sent.values()})

        async def states() -> dict[str, Any]:
            return {lid: await t.inspect(t.get(Ledger, lid)) for lid in ledgers}

        before = await states()
        applied = Counter(cid for rows in before.values() for cid in rows.state["applied"])
        # Every acknowledged command survived, exactly once, with the outcome its caller got.
        assert all(applied[cid] == 1 for cid in load.acked)
        assert set(applied) <= set(load.sent) and max(applied.values()) == 1
        for lid, rows in before.items():
            assert rows.state is not None
            ids = rows.state["applied"]
            assert rows.state["total"] == sum(load.sent[cid][1] for cid in ids)
            assert {r["command_id"]: r["outcome"] for r in rows.receipts} == {
                cid: {"ok": total}
                for cid, total in (
                    (cid, sum(load.sent[c][1] for c in ids[: i + 1])) for i, cid in enumerate(ids)
                )
            }, lid
            for cid in ids:
                if cid in load.acked:
                    assert rows.state["total"] >= load.acked[cid]

        # Retries of acknowledged commands replay their receipts: same value, nothing changes.
        for cid, total in load.acked.items():
            ledger, k = load.sent[cid]
            assert await t.get(Ledger, ledger).with_command_id(cid).add(k) == total
        replayed = await states()
        assert {lid: r.version for lid, r in replayed.items()} == {
            lid: r.version for lid, r in before.items()
        }
        # Retries of the calls in flight at the kill: committed ones replay, the others commit.
        results = {}
        for cid in sorted(in_flight):
            ledger, k = load.sent[cid]
            results[cid] = await t.get(Ledger, ledger).with_command_id(cid).add(k)
        after = await states()
        applied = Counter(cid for rows in after.values() for cid in rows.state["applied"])
        assert set(applied) == set(load.sent) and max(applied.values()) == 1
        for cid, total in results.items():
            receipts = {r["command_id"]: r["outcome"] for r in after[load.sent[cid][0]].receipts}
            assert receipts[cid] == {"ok": total}

        # Pending outbox rows are delivered: each applied add's two intents, once each.
        await t.advance(timedelta(seconds=LATER_S + 1))
        # What is left was claimed by the dead runner: due again once its claim lease ends.
        claimed = await t.rows("SELECT attempts FROM {schema}.outbox")
        assert all(int(row["attempts"]) >= 1 for row in claimed)
        await t.advance(timedelta(milliseconds=t.runtime.config.claim_lease_ms))
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []
        for lid, rows in after.items():
            inbox = await t.inspect(t.get(Inbox, lid))
            assert inbox.state is not None
            expected = [
                f"{cid}:{when}" for cid in rows.state["applied"] for when in ("now", "later")
            ]
            assert sorted(inbox.state["notes"]) == sorted(expected), lid
