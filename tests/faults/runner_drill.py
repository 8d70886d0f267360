"""The singleton kill drill (RN-01), shared by ``test_kill_runners`` and ``bench/drills.py``.

Runner processes (``tests.faults.runner_child``) host the ``Beacon`` singleton on one schema.
Its loop writes a beat row stamped with the database clock every ~50 ms, and a trigger installed
here on akter's ``singletons`` table logs every lease write (acquire, refresh, release) with the
same clock. The drill repeatedly SIGKILLs the runner whose loop is beating, measures how long the
survivors take to start the loop again, and replaces the dead runner. Afterwards
:func:`analyse` checks, from the database alone:

- **no overlap:** ordering the loop runs by their first beat, each starts after the previous one's
  last beat;
- **every beat is leased:** at each beat, the last lease write before it names the beating runner
  and its lease has not ended (the loop guard stops a loop *before* its lease can end, so nobody
  can hold the lease and run the loop while another loop still beats);
- **exactly one successor:** one new run per kill, starting only after the dead owner's lease.

The takeover time of a kill is the successor's first beat minus the database clock read just
before ``SIGKILL``; the lease's remaining time at the kill and the acquisition are reported too.
"""

from __future__ import annotations

import asyncio
import random
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NoReturn

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from tests._support.citus import trigger_refused
from tests.faults.child_process import ChildProcess, start_module
from tests.faults.runner_actors import BEATS_DDL, FENCED_BEATS_DDL, db_ms_sql

#: Why the drills that read the lease log do not run on distributed Citus tables.
NO_LEASE_LOG = trigger_refused("the lease log", "the singletons table")

LEASE_LOG_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.lease_log (
    id bigserial PRIMARY KEY,
    at_ms bigint NOT NULL,
    op text NOT NULL,
    actor_type text NOT NULL,
    owner text,
    lease_until_ms bigint NOT NULL
);
CREATE OR REPLACE FUNCTION {schema}.log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.lease_log (at_ms, op, actor_type, owner, lease_until_ms)
    VALUES (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint, TG_OP,
            NEW.actor_type, NEW.owner::text, NEW.lease_until_ms);
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS lease_log ON {schema}.singletons;
CREATE TRIGGER lease_log AFTER INSERT OR UPDATE ON {schema}.singletons
    FOR EACH ROW EXECUTE FUNCTION {schema}.log_lease();
"""


class DrillError(AssertionError):
    """The drill could not go on: a child failed or a takeover did not happen in time."""


@dataclass(frozen=True)
class Timing:
    """Singleton tunables given to every runner, and the beat period of the loop."""

    lease_ms: int = 3_500
    refresh_ms: int = 1_000
    heartbeat_ms: int = 1_000
    margin_ms: int = 500
    beat_ms: int = 50

    def argv(self) -> list[str]:
        """The child's options."""
        return [
            f"--lease-ms={self.lease_ms}",
            f"--refresh-ms={self.refresh_ms}",
            f"--heartbeat-ms={self.heartbeat_ms}",
            f"--margin-ms={self.margin_ms}",
            f"--beat-ms={self.beat_ms}",
        ]


#: One tenth of production (lease 35 s, refresh 10 s, margin 5 s): the default of the drills.
SCALED = Timing()
#: Production values (semantics §10.5).
PRODUCTION = Timing(lease_ms=35_000, refresh_ms=10_000, heartbeat_ms=10_000, margin_ms=5_000)


# --- the schema instrument -----------------------------------------------------------------------


def _ddl(text: str, schema: str) -> sql.Composed:
    return sql.SQL(text.replace("{schema}", "{0}")).format(sql.Identifier(schema))


async def prepare(url: str, schema: str, *, fenced: bool = False) -> None:
    """Create the beat table and the lease log in ``schema`` (akter's tables must exist).

    ``fenced``: also the trigger turning ``FencedBeacon``'s committed beat events into beats.
    """
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(_ddl(BEATS_DDL, schema))
        await conn.execute(_ddl(LEASE_LOG_DDL, schema))
        if fenced:
            await conn.execute(_ddl(FENCED_BEATS_DDL, schema))


async def db_now(conn: psycopg.AsyncConnection[Any]) -> int:
    """The database clock in epoch ms."""
    cur = await conn.execute(sql.SQL("SELECT {}").format(db_ms_sql()))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Run:
    """One run of the loop: from its first beat to its last."""

    run_id: str
    runner_id: str
    first_ms: int
    last_ms: int
    beats: int


@dataclass
class Beat:
    """One beat row."""

    run_id: str
    runner_id: str
    at_ms: int


@dataclass
class LeaseWrite:
    """One logged write of the singleton row."""

    at_ms: int
    op: str
    owner: str
    lease_until_ms: int


async def fetch(
    url: str, schema: str, actor_type: str = "Beacon"
) -> tuple[list[Beat], list[LeaseWrite]]:
    """Every beat and every lease write of ``actor_type``, in order."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            sql.SQL(
                "SELECT run_id, runner_id, at_ms FROM {}.loop_beats ORDER BY at_ms, seq"
            ).format(sql.Identifier(schema))
        )
        beats = [
            Beat(str(r["run_id"]), str(r["runner_id"]), int(r["at_ms"]))
            for r in await cur.fetchall()
        ]
        await cur.execute(
            sql.SQL(
                "SELECT at_ms, op, owner, lease_until_ms FROM {}.lease_log"
                " WHERE actor_type = %s ORDER BY id"
            ).format(sql.Identifier(schema)),
            (actor_type,),
        )
        leases = [
            LeaseWrite(int(r["at_ms"]), str(r["op"]), str(r["owner"]), int(r["lease_until_ms"]))
            for r in await cur.fetchall()
        ]
    return beats, leases


# --- analysis ------------------------------------------------------------------------------------


@dataclass
class Kill:
    """One SIGKILL of the loop's owner and what followed."""

    victim: str
    kill_ms: int
    successor: Run | None = None
    #: runs that started after this kill and before the next one
    new_runs: int = 0
    #: distinct runners among them (must be exactly one: one survivor takes over)
    new_runners: int = 0
    #: the dead owner's lease end minus the kill (what the survivors had to wait at least)
    lease_left_ms: int | None = None
    #: the successor's acquisition (lease write) minus the kill
    acquire_ms: int | None = None
    #: the successor's first beat minus the dead owner's lease end (≥ 0: after the lease)
    after_lease_ms: int | None = None

    @property
    def takeover_ms(self) -> int | None:
        """The successor's first beat minus the kill."""
        return None if self.successor is None else self.successor.first_ms - self.kill_ms


@dataclass
class Analysis:
    """What the beats and the lease log say."""

    runs: list[Run]
    kills: list[Kill]
    #: (earlier run, later run) pairs whose beat intervals overlap
    overlaps: list[tuple[Run, Run]] = field(default_factory=list)
    #: beats at which the beating runner did not hold an unexpired lease
    unleased: list[tuple[Beat, LeaseWrite | None]] = field(default_factory=list)
    #: smallest (lease end − beat time) over all beats, in ms
    min_slack_ms: int | None = None
    #: smallest gap between one run's last beat and the next run's first beat, in ms
    min_gap_ms: int | None = None

    def problems(self) -> list[str]:
        """Violations of RN-01, as readable lines (empty when the drill passed)."""
        out = [
            f"overlap: run {a.run_id[:8]} of {a.runner_id[:8]} [{a.first_ms}, {a.last_ms}] and "
            f"run {b.run_id[:8]} of {b.runner_id[:8]} [{b.first_ms}, {b.last_ms}]"
            for a, b in self.overlaps
        ]
        out += [
            f"unleased beat: {b.runner_id[:8]} at {b.at_ms}, last lease write {w}"
            for b, w in self.unleased[:20]
        ]
        for i, kill in enumerate(self.kills):
            if kill.new_runners != 1:
                out.append(f"kill {i}: {kill.new_runners} runners started the loop after it")
            if kill.successor is None:
                out.append(f"kill {i}: no successor")
            elif kill.after_lease_ms is not None and kill.after_lease_ms < 0:
                out.append(f"kill {i}: successor beat {-kill.after_lease_ms} ms before lease end")
        return out

    def takeovers(self) -> list[int]:
        """Takeover times in ms, one per kill with a successor."""
        return [k.takeover_ms for k in self.kills if k.takeover_ms is not None]


def runs_of(beats: Sequence[Beat]) -> list[Run]:
    """Group beats into runs, ordered by first beat."""
    runs: dict[str, Run] = {}
    for beat in beats:
        run = runs.get(beat.run_id)
        if run is None:
            runs[beat.run_id] = Run(beat.run_id, beat.runner_id, beat.at_ms, beat.at_ms, 1)
        else:
            run.first_ms = min(run.first_ms, beat.at_ms)
            run.last_ms = max(run.last_ms, beat.at_ms)
            run.beats += 1
    return sorted(runs.values(), key=lambda r: (r.first_ms, r.last_ms))


def analyse(
    beats: Sequence[Beat],
    leases: Sequence[LeaseWrite],
    kills: Sequence[Kill] = (),
    end_ms: int | None = None,
) -> Analysis:
    """Check RN-01 over a drill's beats and lease writes (see the module docstring).

    ``end_ms`` bounds the last kill's window (runs started by the final graceful stops, which
    hand the lease over, are not successors of that kill).
    """
    runs = runs_of(beats)
    result = Analysis(runs=runs, kills=list(kills))
    for earlier, later in pairwise(runs):
        gap = later.first_ms - earlier.last_ms
        result.min_gap_ms = gap if result.min_gap_ms is None else min(result.min_gap_ms, gap)
    # Pairwise, not only neighbours: a long run may overlap several later ones.
    for i, earlier in enumerate(runs):
        for later in runs[i + 1 :]:
            if later.first_ms > earlier.last_ms:
                break
            result.overlaps.append((earlier, later))
    times = [w.at_ms for w in leases]
    for beat in beats:
        i = bisect_right(times, beat.at_ms) - 1
        write = leases[i] if i >= 0 else None
        if write is None or write.owner != beat.runner_id or write.lease_until_ms <= beat.at_ms:
            result.unleased.append((beat, write))
            continue
        slack = write.lease_until_ms - beat.at_ms
        result.min_slack_ms = (
            slack if result.min_slack_ms is None else min(result.min_slack_ms, slack)
        )
    for i, kill in enumerate(result.kills):
        until = result.kills[i + 1].kill_ms if i + 1 < len(result.kills) else end_ms
        started = [
            r for r in runs if r.first_ms > kill.kill_ms and (until is None or r.first_ms < until)
        ]
        kill.new_runs = len(started)
        kill.new_runners = len({r.runner_id for r in started})
        kill.successor = started[0] if started else None
        dead = [w for w in leases if w.owner == kill.victim]
        if dead:
            kill.lease_left_ms = dead[-1].lease_until_ms - kill.kill_ms
        if kill.successor is not None:
            successor = kill.successor
            taken = [
                w
                for w in leases
                if w.owner == successor.runner_id and kill.kill_ms < w.at_ms <= successor.first_ms
            ]
            if taken:
                kill.acquire_ms = taken[0].at_ms - kill.kill_ms
            if dead:
                kill.after_lease_ms = successor.first_ms - dead[-1].lease_until_ms
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0…1), interpolating linearly between ranks; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (pos - low))


# --- child runners -------------------------------------------------------------------------------


class RunnerProc(ChildProcess):
    """A ``tests.faults.runner_child`` process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "runner")
        self.runner_id = ""

    def fail(self, message: str) -> NoReturn:
        """A drill failure (the drill also runs outside pytest)."""
        raise DrillError(message)

    @classmethod
    async def spawn(
        cls, url: str, schema: str, timing: Timing, *, fenced: bool = False
    ) -> RunnerProc:
        """Start a child (hosting ``FencedBeacon`` if ``fenced``); returns once it is READY."""
        proc = await start_module(
            "tests.faults.runner_child",
            url,
            schema,
            *timing.argv(),
            *(["--fenced"] if fenced else []),
        )
        child = cls(proc)
        child.runner_id = (await child.ready())[0]
        return child

    async def stop(self, within: float = 30.0) -> None:
        """Graceful stop: end of input, then ``STOPPED`` and status 0."""
        self.end_input()
        line = await self.line(within)
        if line != "STOPPED" or await self.proc.wait() != 0:
            raise DrillError(f"unclean stop: {line!r} {await self.diagnosis()}")


# --- the drill -----------------------------------------------------------------------------------


async def _runs_since(conn: psycopg.AsyncConnection[Any], schema: str, after_ms: int) -> list[Run]:
    cur = await conn.execute(
        sql.SQL(
            "SELECT run_id, min(runner_id), min(at_ms), max(at_ms), count(*) FROM {}.loop_beats"
            " GROUP BY run_id HAVING min(at_ms) > %s ORDER BY 3"
        ).format(sql.Identifier(schema)),
        (after_ms,),
    )
    return [Run(str(a), str(b), int(c), int(d), int(e)) for a, b, c, d, e in await cur.fetchall()]


async def wait_for_run(
    conn: psycopg.AsyncConnection[Any], schema: str, after_ms: int, within: float
) -> Run:
    """The first loop run whose first beat is later than ``after_ms`` (polled every 10 ms)."""
    deadline = time.monotonic() + within
    while True:
        runs = await _runs_since(conn, schema, after_ms)
        if runs:
            return runs[0]
        if time.monotonic() > deadline:
            raise DrillError(f"no loop started within {within} s after {after_ms}")
        await asyncio.sleep(0.01)  # polling an observable condition, not ordering by time


async def singleton_drill(
    url: str,
    schema: str,
    *,
    kills: int,
    runners: int = 3,
    timing: Timing = SCALED,
    log: Callable[[str], None] = lambda _: None,
    seed: int = 5,
) -> Analysis:
    """Run ``runners`` children, SIGKILL the loop's owner ``kills`` times, then analyse.

    ``schema`` must hold akter's tables (start a runtime on it first). Each dead owner is replaced
    by a fresh runner once the takeover happened; the last survivors are stopped gracefully.
    Each kill, and each replacement's start, waits a random part of a refresh period first
    (seeded), so kills land at every phase of the owner's refresh cycle and the survivors' polls
    at every phase relative to it, instead of locking onto the drill's own rhythm.
    """
    rng = random.Random(seed)
    await prepare(url, schema)
    procs: dict[str, RunnerProc] = {}
    record: list[Kill] = []
    # Long enough for the lease to end, one refresh round of every survivor, and a slow start.
    within = (timing.lease_ms + 3 * timing.refresh_ms) / 1000 + 15.0
    settle = 2 * timing.refresh_ms / 1000
    try:
        for child in await asyncio.gather(
            *(RunnerProc.spawn(url, schema, timing) for _ in range(runners))
        ):
            procs[child.runner_id] = child
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            first = await wait_for_run(conn, schema, 0, within)
            log(f"loop started on {first.runner_id[:8]}")
            await asyncio.sleep(settle)  # several refresh rounds: nobody else may start
            await asyncio.sleep(rng.uniform(0, timing.refresh_ms / 1000))
            for i in range(kills):
                current = (await _runs_since(conn, schema, 0))[-1]
                victim = current.runner_id
                if victim not in procs:
                    raise DrillError(f"the loop runs on {victim}, which is not a live child")
                kill_ms = await db_now(conn)
                await procs.pop(victim).kill()
                record.append(Kill(victim=victim, kill_ms=kill_ms))
                successor = await wait_for_run(conn, schema, kill_ms, within)
                log(
                    f"kill {i + 1}/{kills}: {victim[:8]} → {successor.runner_id[:8]} "
                    f"after {successor.first_ms - kill_ms} ms"
                )
                started = time.monotonic()
                # A random start gives the replacement a random refresh phase (runners' phases
                # decide how soon after a lease ends a survivor polls).
                await asyncio.sleep(rng.uniform(0, timing.refresh_ms / 1000))
                replacement = await RunnerProc.spawn(url, schema, timing)
                procs[replacement.runner_id] = replacement
                await asyncio.sleep(max(0.0, settle - (time.monotonic() - started)))
                await asyncio.sleep(rng.uniform(0, timing.refresh_ms / 1000))
            end_ms = await db_now(conn)
        for child in list(procs.values()):
            await child.stop()
    finally:
        for child in procs.values():
            await child.close()
    beats, leases = await fetch(url, schema)
    return analyse(beats, leases, record, end_ms)


@dataclass
class Freeze:
    """One SIGSTOP of the loop's owner, past its lease, then SIGCONT."""

    victim: str
    run_id: str
    stop_ms: int
    cont_ms: int
    successor: Run
    #: the frozen run's beats after SIGCONT, in ms after it (each one overlaps the successor)
    stale_beats_ms: list[int] = field(default_factory=list)
    #: the successor's acquisition: its first lease write after the SIGSTOP (database clock)
    acquired_ms: int | None = None
    #: the frozen run's beats at or after that acquisition, in ms after it (fenced: none)
    after_takeover_ms: list[int] = field(default_factory=list)
    #: the freeze landed inside a turn of the shared actor: its row lock held off the successor's
    #: beats until SIGCONT (a frozen process's open transaction outlives it; see docs)
    blocked: bool = False


async def freeze_drill(
    url: str,
    schema: str,
    *,
    rounds: int,
    runners: int = 3,
    timing: Timing = SCALED,
    log: Callable[[str], None] = lambda _: None,
    fenced: bool = False,
) -> tuple[Analysis, list[Freeze]]:
    """Freeze (SIGSTOP) the loop's owner until a successor runs, then resume it (SIGCONT).

    Not a refresh stall: the whole process stops, its loop guard included, so nothing in the
    process can stop the loop at lease − margin. What the resumed process does first is measured:
    beats of the frozen run after SIGCONT ran beside the successor's loop. With ``fenced`` the
    runners host ``FencedBeacon``, whose beats are commands fenced on the loop's lease: the
    resumed step's beat is refused, so no beat of the frozen run commits after the takeover.
    """
    actor_type = "FencedBeacon" if fenced else "Beacon"
    await prepare(url, schema, fenced=fenced)
    procs: dict[str, RunnerProc] = {}
    freezes: list[Freeze] = []
    within = (timing.lease_ms + 3 * timing.refresh_ms) / 1000 + 15.0
    settle = 2 * timing.refresh_ms / 1000
    try:
        for child in await asyncio.gather(
            *(RunnerProc.spawn(url, schema, timing, fenced=fenced) for _ in range(runners))
        ):
            procs[child.runner_id] = child
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await wait_for_run(conn, schema, 0, within)
            await asyncio.sleep(settle)
            for i in range(rounds):
                current = (await _runs_since(conn, schema, 0))[-1]
                victim = procs[current.runner_id]
                stop_ms = await db_now(conn)
                victim.freeze()
                blocked = False
                try:
                    # Fenced beats are turns of one shared actor: a freeze inside one of them
                    # leaves its transaction open, holding the actor row, so the successor's
                    # beats wait until the process runs again. Then resume it and wait on.
                    first_wait = (timing.lease_ms + 3 * timing.refresh_ms) / 1000 + 2.0
                    try:
                        successor = await wait_for_run(conn, schema, stop_ms, first_wait)
                        await asyncio.sleep(settle / 2)
                        cont_ms = await db_now(conn)
                    except DrillError:
                        if not fenced:
                            raise
                        blocked = True
                        cont_ms = await db_now(conn)
                        victim.resume()
                        successor = await wait_for_run(conn, schema, stop_ms, within)
                finally:
                    victim.resume()
                freezes.append(
                    Freeze(
                        current.runner_id,
                        current.run_id,
                        stop_ms,
                        cont_ms,
                        successor,
                        blocked=blocked,
                    )
                )
                log(f"freeze {i + 1}/{rounds}: {current.runner_id[:8]} → {successor.runner_id[:8]}")
                await asyncio.sleep(settle)
            end_ms = await db_now(conn)
        for child in list(procs.values()):
            await child.stop()
    finally:
        for child in procs.values():
            await child.close()
    beats, leases = await fetch(url, schema, actor_type)
    for freeze in freezes:
        freeze.stale_beats_ms = [
            b.at_ms - freeze.cont_ms
            for b in beats
            if b.run_id == freeze.run_id and b.at_ms >= freeze.cont_ms
        ]
        freeze.acquired_ms = next(
            (
                w.at_ms
                for w in leases
                if w.owner == freeze.successor.runner_id and w.at_ms > freeze.stop_ms
            ),
            None,
        )
        if freeze.acquired_ms is not None:
            freeze.after_takeover_ms = [
                b.at_ms - freeze.acquired_ms
                for b in beats
                if b.run_id == freeze.run_id and b.at_ms >= freeze.acquired_ms
            ]
    return analyse(beats, leases, end_ms=end_ms), freezes
