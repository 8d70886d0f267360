"""Subscriptions under SIGKILL (the subscriptions spec S1–S3): the kill drill.

Three child runners (``tests.faults.subscription_child``) each host the sources and the
subscribers: their loops make orders pay (routed to four warehouses; some of those turns roll
back after emitting) and users post (followed by inboxes from the start), and their
subscriptions lanes deliver, in the same processes. While the events flow, a child picked at
random is SIGKILLed (mid source turn, mid delivery, mid settle) every second
(:data:`KILL_EVERY_S`) and replaced by a fresh runner that joins once it is ready. Once
:data:`EVENTS` events have committed the producers are stopped, two fresh runners deliver the
rest, and a checker compares every subscriber's state with the sources' event logs: each
committed event applied exactly once per subscription and subscriber, in cursor order, none
from a rolled-back turn (``tests.faults.subscription_drill_actors`` says how a subscriber's
tally makes that exact).

``AKTER_DRILL_EVENTS`` sets how many events flow (default 10,000, the issue's drill; a run's
figures on the test machine are in docs/benchmarks.md, "Subscriptions").
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from akter.testing import ActorTest
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.subscription_child import ROLLED_BACK, USERS, WAREHOUSES
from tests.faults.subscription_drill_actors import ACTORS, TallyInbox, Track, chain

pytestmark = [pytest.mark.kill, pytest.mark.slow, pytest.mark.timeout(1200)]

MakeTest = Callable[..., ActorTest]

EVENTS = int(os.environ.get("AKTER_DRILL_EVENTS", "10000"))
#: Runners at the start; a killed one's replacement joins them once it is ready.
RUNNERS = 3
#: Seconds between two SIGKILLs (the victim is picked at random among the ready runners).
KILL_EVERY_S = 1.0
#: SIGKILLs a run makes at least: the sources commit a few hundred events a second on the test
#: machine, and a replacement takes a second or two to start.
MIN_KILLS = max(EVENTS // 1000, 1)
INBOXES = 8
#: The longest the event count may stand still while the producers run.
STALL_WITHIN = 60.0
#: How long the fresh runners get to deliver everything once the killing stops.
SETTLE_WITHIN = 300.0


async def spawn(t: ActorTest, seed: int | None) -> ChildProcess:
    args = [t.database_url, t.schema] + ([] if seed is None else [str(seed)])
    proc = await start_module("tests.faults.subscription_child", *args)
    child = ChildProcess(proc, "subscription child")
    await child.ready()
    return child


async def committed(t: ActorTest) -> int:
    rows = await t.rows(
        "SELECT count(*) AS n FROM {schema}.events WHERE actor_type IN ('Order', 'User')"
    )
    return int(rows[0]["n"])


async def settled(t: ActorTest) -> None:
    """Until every feed delivered its head (or fail)."""
    deadline = time.monotonic() + SETTLE_WITHIN
    while time.monotonic() < deadline:
        rows = await t.rows(
            "SELECT count(*) AS n FROM {schema}.subscription_feeds"
            " WHERE head > done OR parked IS NOT NULL"
        )
        if rows[0]["n"] == 0:
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"feeds still undelivered after {SETTLE_WITHIN} s")


async def test_kill_drill_every_committed_event_applied_once_in_order(
    akter_test: MakeTest,
) -> None:
    rng = random.Random(40)
    started = time.monotonic()
    async with akter_test(ACTORS, relay=False) as t:
        follows = {f"i{i}": {f"u{i % USERS}", f"u{(i + 1) % USERS}"} for i in range(INBOXES)}
        for inbox, users in follows.items():
            for user in sorted(users):
                await t.get(TallyInbox, inbox).follow(user)
        children = [await spawn(t, rng.randrange(2**31)) for _ in range(RUNNERS)]
        starting: list[asyncio.Task[ChildProcess]] = []
        ended: list[ChildProcess] = []  # their stderr counts the source turns rolled back
        kills, made = 0, 0
        try:
            next_kill = last_moved = time.monotonic()
            next_kill += KILL_EVERY_S
            last = 0
            while made < EVENTS:
                await asyncio.sleep(0.2)  # a poll of the count, not an ordering
                made = await committed(t)
                if made > last:
                    last, last_moved = made, time.monotonic()
                elif time.monotonic() - last_moved > STALL_WITHIN:
                    pytest.fail(f"no event committed for {STALL_WITHIN} s at {made}")
                children += [await task for task in starting if task.done()]
                starting = [task for task in starting if not task.done()]
                if time.monotonic() >= next_kill and children and made < EVENTS:
                    victim = children.pop(rng.randrange(len(children)))
                    await victim.kill()  # mid source turn, mid delivery: wherever it is
                    await victim.close()
                    ended.append(victim)
                    # The replacement starts while the others go on (it takes a second or two).
                    starting.append(asyncio.create_task(spawn(t, rng.randrange(2**31))))
                    kills += 1
                    next_kill = time.monotonic() + KILL_EVERY_S
            produced = time.monotonic()
            children += await asyncio.gather(*starting)
            starting = []
            for child in children:  # the producers stop; their stop drains their turns
                child.end_input()
                await child.close(grace=30)
            ended += children
            children = [await spawn(t, None), await spawn(t, None)]
            await settled(t)
        finally:
            for task in starting:
                task.cancel()  # a child still starting is closed by ChildProcess.ready
            await asyncio.gather(*starting, return_exceptions=True)
            for child in children:
                child.end_input()
                await child.close(grace=10)
        rolled_back = sum(c.stderr.decode().count(ROLLED_BACK) for c in ended)
        print(
            f"\n{await committed(t)} events, {kills} SIGKILLs, {rolled_back} turns rolled back;"
            f" produced in {produced - started:.0f} s,"
            f" all delivered after {time.monotonic() - started:.0f} s"
        )
        assert kills >= MIN_KILLS
        assert rolled_back > 0  # the checker's "none from a rolled-back turn" was put to test
        await check(t, follows)


def expected_tracks(log: list[tuple[int, int]]) -> Track:
    """The tally of a source's events ``(cursor, n)`` applied once each, in cursor order."""
    track = Track()
    for cursor, n in log:
        track = Track(last=cursor, count=track.count + 1, chain=chain(track.chain, cursor, n))
    return track


async def check(t: ActorTest, follows: dict[str, set[str]]) -> None:
    """Every subscriber's tally against the sources' event logs (the drill's checker)."""
    events = await t.rows(
        "SELECT actor_type, actor_id, seq, payload FROM {schema}.events"
        " WHERE actor_type IN ('Order', 'User') ORDER BY actor_type, actor_id, seq"
    )
    routed: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    posted: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        p = e["payload"]
        if e["actor_type"] == "Order":
            routed[p["warehouse"]][e["actor_id"]].append((e["seq"], p["n"]))
        else:
            posted[e["actor_id"]].append((e["seq"], p["n"]))
    expected: dict[tuple[str, str], dict[str, Track]] = {}
    for w in range(WAREHOUSES):
        by_order = routed.get(f"w{w}", {})
        expected["TallyWarehouse", f"w{w}"] = {o: expected_tracks(v) for o, v in by_order.items()}
    for inbox, users in follows.items():
        expected["TallyInbox", inbox] = {u: expected_tracks(posted[u]) for u in users}
    rows = await t.rows(
        "SELECT actor_type, actor_id, state FROM {schema}.actors"
        " WHERE actor_type IN ('TallyWarehouse', 'TallyInbox')"
    )
    states = {(r["actor_type"], r["actor_id"]): r["state"] for r in rows}
    assert sum(len(v) for v in routed.values()) > 0 and len(posted) == USERS
    for key, tracks in expected.items():
        state = states.get(key, {"sources": {}, "violations": 0, "gaps": 0})
        assert state["violations"] == 0, f"{key} applied out of order or twice: {state}"
        assert state["gaps"] == 0, f"{key} got a retention gap"
        got = {source: Track(**track) for source, track in state["sources"].items()}
        for source in sorted(set(got) | set(tracks)):
            # A count, a last cursor and a checksum over (cursor, n) in the order applied: a
            # missed, doubled, reordered or invented (rolled-back) event changes the checksum.
            assert got.get(source) == tracks.get(source), (key, source)
