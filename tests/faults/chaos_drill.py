"""The chaos drill (issue 5), shared by ``tests/faults/test_chaos.py`` and ``bench/chaos.py``.

The parent owns an embedded PostgreSQL in a temporary directory and starts ``runners`` child
runner processes (``tests.faults.chaos_child``: turns, relay with ``notify=True``, executors and
HTTP on a unix socket). ``callers`` tasks in the parent call ``Account.work`` on ``actors``
accounts through :class:`akter.client.Client`, each command with an id minted here and sent to
the next runner in turn; a caller retries any error with the **same** command id, moving to the
next runner, until it gets an answer, and records the acknowledgement. Each applied command also
sends an intent to an ``Inbox`` and enqueues a job (see :mod:`tests.faults.chaos_actors`).

Meanwhile, every ``kill_every_s`` one runner is SIGKILLed (round robin) and restarted, and once
the embedded server is stopped (``pg_ctl stop -m fast``: every connection is cut) and started
again. After ``duration_s`` the callers finish their last command, the drill waits until the
outbox is empty, and :func:`verify` checks, from the database alone:

- every acknowledged command id is in its account's ``applied`` exactly once (lost = 0), and no
  ``applied`` list repeats an entry (transitions applied twice = 0);
- every committed command's intent was delivered exactly once (no intent uuid repeats in any
  inbox, none is missing);
- every job (one per committed command; its id is in the command's receipt) ended exactly once:
  its success route or its dead-letter route ran once, on its own account;
- no outbox row is left.

Recovery times, per kill: from the database clock read just before ``SIGKILL`` to the first turn
committed by a surviving runner (the turn clock of the first acknowledged command admitted after
the kill on a survivor); to the acknowledgement of the commands that were in flight on the dead
runner (their callers retried on a survivor); and to the moment every outbox row that was leased
at the kill (intents being delivered, job attempts running) had been settled or claimed again.
For the PostgreSQL restart: the outage, the first commit after the server was back, and the
first commit of each runner after it (every runner must recover through its pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx
import psycopg
from psycopg import sql

from akter._ids import mint_command_id
from akter._store.embedded import EmbeddedPostgres
from akter.client import Client
from tests.faults.chaos_actors import Account, side_ddl, uuid_of
from tests.faults.child_process import ChildProcess, start_module

WINDOW_MS = 86_400_000  # the default retry window
DB_MS = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


class DrillError(AssertionError):
    """The drill could not go on: a child failed to start, or the system did not settle."""


@dataclass(frozen=True)
class Plan:
    """What the drill does; the defaults are the issue's must-show."""

    duration_s: float = 66.0
    callers: int = 16
    actors: int = 256
    runners: int = 3
    kill_every_s: float = 15.0
    #: When to restart PostgreSQL (seconds after the callers started), or ``None``.
    pg_restart_at_s: float | None = 37.5
    #: How long the server stays down.
    pg_down_s: float = 2.0
    #: How long runners get to report ``ready`` again after the server is back; a runner that
    #: reports ``failed`` (its runtime gave up) is restarted, as an orchestrator's liveness
    #: probe would, so the drill can still check its guarantees (reported apart).
    pg_ready_within_s: float = 5.0
    claim_lease_s: float = 5.0
    job_lease_s: float = 3.0
    poll_s: float = 1.0
    #: ``notify=True`` on every runner (LISTEN/NOTIFY wakes); ``False``: polling only.
    notify: bool = True
    settle_within_s: float = 120.0
    seed: int = 5

    def events(self) -> list[tuple[float, str]]:
        """The disruptions, in order: ``(seconds after start, "kill" | "pg")``."""
        found: list[tuple[float, str]] = []
        at = self.kill_every_s
        while at < self.duration_s:
            found.append((at, "kill"))
            at += self.kill_every_s
        if self.pg_restart_at_s is not None:
            found.append((self.pg_restart_at_s, "pg"))
        return sorted(found)


#: Fifteen seconds, one kill, no PostgreSQL restart: the non-slow test.
SHORT = Plan(duration_s=15.0, kill_every_s=8.0, pg_restart_at_s=None)
#: The issue's drill: 66 s, four kills (every 15 s), one PostgreSQL restart.
FULL = Plan()


# --- child runners ---------------------------------------------------------------------------


class Runner(ChildProcess):
    """A ``tests.faults.chaos_child`` process, spoken to over stdin and stdout."""

    def __init__(self, slot: int, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "chaos child")
        self.slot = slot
        self.runner_id = ""

    def fail(self, message: str) -> NoReturn:
        """A drill failure (the drill also runs outside pytest)."""
        raise DrillError(message)

    @classmethod
    async def spawn(cls, slot: int, url: str, schema: str, socket: Path, plan: Plan) -> Runner:
        """Start a child; returns once it is READY."""
        proc = await start_module(
            "tests.faults.chaos_child",
            url,
            schema,
            str(socket),
            f"--claim-lease={plan.claim_lease_s}",
            f"--lease={plan.job_lease_s}",
            f"--poll={plan.poll_s}",
            *([] if plan.notify else ["--no-notify"]),
        )
        child = cls(slot, proc)
        child.runner_id = (await child.ready())[0]
        return child

    async def stop(self, within: float = 30.0) -> str:
        """Graceful stop; returns the drain status the child reports."""
        self.end_input()
        line = await self.line(within)
        if not line.startswith("STOPPED") or await self.proc.wait() != 0:
            raise DrillError(f"unclean stop: {line!r} {await self.diagnosis()}")
        return line.partition(" ")[2]


# --- records ---------------------------------------------------------------------------------


@dataclass
class Acked:
    """One acknowledged command."""

    cid: str
    actor: str
    job_id: str
    #: the runner that committed the turn, and the turn's clock (from the stored outcome)
    by: str
    now_ms: int
    #: the runner that answered the last try
    answered_by: str
    tries: int
    acked_wall: float


@dataclass
class Kill:
    """One SIGKILL and what followed."""

    slot: int
    victim: str
    kill_ms: int
    kill_wall: float
    survivors: set[str]
    #: callers whose try was in flight on the victim: caller → command id
    in_flight: dict[int, str] = field(default_factory=dict)
    #: those commands' acknowledgement (by a survivor, after retrying) minus the kill, ms
    stalls_ms: list[int] = field(default_factory=list)
    #: of those, answered by the victim before it died (the caller had not read the answer yet)
    answered_before: int = 0
    #: of those, never acknowledged
    unacked: int = 0
    #: outbox rows leased at the kill (intent deliveries, running job attempts)
    leased: int = 0
    #: when every one of them had been settled or claimed again, minus the kill, ms
    leases_settled_ms: int | None = None
    #: the first turn committed by a survivor after the kill, minus the kill, ms
    survivor_commit_ms: int | None = None
    restart_s: float = 0.0


@dataclass
class Restart:
    """The PostgreSQL restart."""

    down_ms: int = 0
    up_ms: int = 0
    stop_s: float = 0.0
    start_s: float = 0.0
    #: the first turn committed after the server was up, minus the up instant, ms
    first_commit_ms: int | None = None
    #: per runner slot: the first commit after the up instant by the runner in that slot, ms
    slot_commit_ms: dict[int, int | None] = field(default_factory=dict)
    #: readiness of every runner alive across the restart, ``pg_ready_within_s`` after it
    readiness: dict[str, str] = field(default_factory=dict)
    #: runners that did not recover by themselves and were restarted by the drill
    replaced: list[str] = field(default_factory=list)


@dataclass
class Counts:
    """The verification, from the database."""

    acked: int = 0
    committed: int = 0
    acked_lost: int = 0
    applied_twice: int = 0
    applied_without_receipt: int = 0
    intents_delivered: int = 0
    intents_twice: int = 0
    intents_missing: int = 0
    jobs: int = 0
    jobs_succeeded: int = 0
    jobs_dead_lettered: int = 0
    jobs_terminal_twice: int = 0
    jobs_not_terminal: int = 0
    jobs_reattempted: int = 0
    attempts: int = 0
    provider_calls_repeated: int = 0
    outbox_left: int = 0
    dead_letter_rows: int = 0


@dataclass
class Report:
    """Everything the drill measured."""

    plan: Plan
    elapsed_s: float = 0.0
    counts: Counts = field(default_factory=Counts)
    kills: list[Kill] = field(default_factory=list)
    restart: Restart | None = None
    settle_s: float = 0.0
    retried_commands: int = 0
    replayed_elsewhere: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    child_log: Counter[str] = field(default_factory=Counter)
    stops: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Violations of the drill's guarantees (empty when it passed)."""
        c = self.counts
        out = []
        for name in (
            "acked_lost",
            "applied_twice",
            "applied_without_receipt",
            "intents_twice",
            "intents_missing",
            "jobs_terminal_twice",
            "jobs_not_terminal",
            "outbox_left",
        ):
            if getattr(c, name):
                out.append(f"{name} = {getattr(c, name)}")
        if c.acked == 0:
            out.append("no command was acknowledged")
        for i, kill in enumerate(self.kills):
            if kill.survivor_commit_ms is None:
                out.append(f"kill {i + 1}: no survivor committed afterwards")
            if kill.unacked:
                out.append(f"kill {i + 1}: a command in flight on the victim was never acked")
        if self.restart is not None:
            r = self.restart
            if r.first_commit_ms is None:
                out.append("no commit after the PostgreSQL restart")
            lost = [slot for slot, ms in r.slot_commit_ms.items() if ms is None]
            if lost:
                out.append(f"runner slots without a commit after the PostgreSQL restart: {lost}")
        return out + self.details

    def recovery_problems(self) -> list[str]:
        """Runners that did not come back by themselves after the PostgreSQL restart.

        ``storage`` is not one: readiness turns ``ready`` at the runner's next successful
        heartbeat (every 10 s), and its commits after the restart are checked apart.
        """
        if self.restart is None:
            return []
        bad = {
            rid[:8]: s for rid, s in self.restart.readiness.items() if s not in ("ready", "storage")
        }
        if not bad:
            return []
        return [
            f"runners whose runtime gave up on the PostgreSQL restart (restarted by the "
            f"drill): {bad}"
        ]

    def table(self) -> str:
        """The counts and the recovery times, as a printable table."""
        c = self.counts
        p = self.plan
        rows = [
            ("runners / callers / actors", f"{p.runners} / {p.callers} / {p.actors}"),
            ("load duration (s)", f"{self.elapsed_s:.1f}"),
            ("commands acknowledged", f"{c.acked} ({c.acked / max(self.elapsed_s, 1e-9):.0f}/s)"),
            ("commands committed (receipts)", str(c.committed)),
            ("commands retried by callers", str(self.retried_commands)),
            ("  acked by a replay on another runner", str(self.replayed_elsewhere)),
            ("acknowledged commands lost", str(c.acked_lost)),
            ("transitions applied twice", str(c.applied_twice)),
            ("transitions without a receipt", str(c.applied_without_receipt)),
            ("intents delivered", str(c.intents_delivered)),
            ("intents delivered twice", str(c.intents_twice)),
            ("intents never delivered", str(c.intents_missing)),
            ("jobs enqueued", str(c.jobs)),
            ("jobs succeeded (route once)", str(c.jobs_succeeded)),
            (
                "jobs dead-lettered (route once)",
                f"{c.jobs_dead_lettered} ({c.dead_letter_rows} rows)",
            ),
            ("jobs terminal twice", str(c.jobs_terminal_twice)),
            ("jobs not terminal", str(c.jobs_not_terminal)),
            ("job attempts (jobs re-attempted)", f"{c.attempts} ({c.jobs_reattempted})"),
            ("jobs whose provider ran twice", str(c.provider_calls_repeated)),
            ("outbox rows left", str(c.outbox_left)),
            ("settle after the load (s)", f"{self.settle_s:.1f}"),
        ]
        width = max(len(k) for k, _ in rows)
        lines = ["| check | value |", "|---|---|"]
        lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
        lines += [
            "",
            "| kill | victim | at (s) | leased rows | survivor's first commit (ms) | "
            "in-flight acked after (ms) | leased rows settled (ms) | restart (s) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, k in enumerate(self.kills):
            stalls = ", ".join(str(s) for s in sorted(k.stalls_ms)) or "—"
            if k.answered_before:
                stalls += f" (+{k.answered_before} answered before the kill)"
            lines.append(
                f"| {i + 1} | slot {k.slot} ({k.victim[:8]}) | {k.kill_wall:.1f} | {k.leased} | "
                f"{_ms(k.survivor_commit_ms)} | {stalls} | {_ms(k.leases_settled_ms)} | "
                f"{k.restart_s:.1f} |"
            )
        if self.restart is not None:
            r = self.restart
            per_slot = ", ".join(
                f"slot {slot}: {_ms(ms)}" for slot, ms in sorted(r.slot_commit_ms.items())
            )
            ready = Counter(r.readiness.values())
            lines += [
                "",
                "| PostgreSQL restart | value |",
                "|---|---|",
                f"| outage: stop began → start returned (ms) | {r.up_ms - r.down_ms} |",
                f"| pg_ctl stop / start (s) | {r.stop_s:.1f} / {r.start_s:.1f} |",
                f"| first commit after the server was up (ms) | {_ms(r.first_commit_ms)} |",
                f"| each runner slot's first commit after it (ms) | {per_slot} |",
                f"| readiness {self.plan.pg_ready_within_s:.0f} s after it | {_counter(ready)} |",
                f"| runners restarted by the drill (did not recover) | {len(r.replaced)} |",
            ]
        if self.errors:
            lines += ["", "caller-side errors (retried with the same id): " + _counter(self.errors)]
        if self.child_log:
            lines += ["runner log lines (all processes): " + _counter(self.child_log)]
        if self.stops:
            lines += [f"final graceful stops: {self.stops}"]
        return "\n".join(lines)


def _error_kind(exc: BaseException) -> str:
    """A short label of a failed try: the reason, and the last one behind a client timeout."""
    reason = getattr(exc, "reason", None)
    if reason is None:
        return type(exc).__name__
    if reason == "Timeout":
        found = re.search(r"last error: (\w+)", str(exc))
        return f"Timeout (last error {found.group(1)})" if found else "Timeout"
    return str(reason)


def _ms(value: int | None) -> str:
    return "—" if value is None else str(value)


def _counter(counter: Counter[str]) -> str:
    return ", ".join(f"{k} × {v}" for k, v in counter.most_common())


# --- the database ----------------------------------------------------------------------------


class Db:
    """The parent's own connection, reopened after the server restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: database clock − local wall clock, ms (same host: about 0)
        self.offset_ms = 0.0

    async def rows(self, query: str, params: Any = None, schema: str = "") -> list[Any]:
        """Run one statement (``{schema}`` replaced by the quoted schema)."""
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        statement = sql.SQL(query.replace("{schema}", "{0}")).format(sql.Identifier(schema))
        try:
            cur = await self._conn.execute(statement, params)
            return await cur.fetchall() if cur.description else []
        except psycopg.OperationalError:
            await self.close()
            raise

    async def now(self) -> int:
        """The database clock, ms; refreshes the offset to the local clock."""
        [(now,)] = await self.rows(f"SELECT {DB_MS}")
        self.offset_ms = int(now) - time.time() * 1000
        return int(now)

    def estimate(self) -> int:
        """The database clock from the local clock (no round trip; usable while it is down)."""
        return int(time.time() * 1000 + self.offset_ms)

    async def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None


# --- the drill -------------------------------------------------------------------------------


class Drill:
    """One run of the chaos drill (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        *,
        log: Callable[[str], None] = lambda _: None,
        data_dir: Path | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.plan = plan
        self.log = log
        self.log_dir = log_dir
        self.own_dir = data_dir is None
        # Not pytest's tmp_path: the server's OS user may not be able to reach it.
        self.dir = data_dir or Path(tempfile.mkdtemp(prefix="akter-chaos-"))
        self.server = EmbeddedPostgres(self.dir / "db")
        self.schema = "chaos"
        self.url = ""
        self.db: Db | None = None
        self.runners: list[Runner | None] = [None] * plan.runners
        self.dead: list[Runner] = []
        self.clients: list[Client] = []
        self.acks: dict[str, Acked] = {}
        self.report = Report(plan)
        self.in_flight: dict[int, tuple[int, str]] = {}  # caller → (slot, cid)
        self.stop_callers = asyncio.Event()
        self.t0 = 0.0
        self._trackers: list[asyncio.Task[None]] = []

    def socket(self, slot: int) -> Path:
        """The unix socket of a runner slot (fixed across restarts)."""
        return self.dir / f"runner-{slot}.sock"

    def runner_id(self, slot: int) -> str:
        """The runner id in a slot now."""
        runner = self.runners[slot]
        return runner.runner_id if runner else "?"

    async def run(self) -> Report:
        """Run the drill and verify; always tears everything down."""
        try:
            self.url = await asyncio.to_thread(self.server.start)
            self.db = Db(self.url)
            await self.db.now()
            await self._start_runners()
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                await conn.execute(side_ddl(self.schema))
            self.clients = [
                Client(
                    "http://runner",
                    transport=httpx.AsyncHTTPTransport(uds=str(self.socket(slot))),
                    delivery_timeout=0.5,
                    timeout=15.0,
                )
                for slot in range(self.plan.runners)
            ]
            await self._load()
            await self._settle()
            await verify(self)
            await self._stop_runners()
            self._scan_logs()
        finally:
            await self._teardown()
        return self.report

    async def _start_runners(self) -> None:
        plan = self.plan
        # The first one migrates the schema; the others start together.
        first = await Runner.spawn(0, self.url, self.schema, self.socket(0), plan)
        self.runners[0] = first
        others = await asyncio.gather(
            *(
                Runner.spawn(slot, self.url, self.schema, self.socket(slot), plan)
                for slot in range(1, plan.runners)
            )
        )
        for runner in others:
            self.runners[runner.slot] = runner
        self.log(f"runners ready: {[self.runner_id(s)[:8] for s in range(plan.runners)]}")

    # --- load and disruptions ----------------------------------------------------------------

    async def _load(self) -> None:
        plan = self.plan
        self.t0 = time.monotonic()
        callers = [
            asyncio.create_task(self._caller(i), name=f"chaos caller {i}")
            for i in range(plan.callers)
        ]
        try:
            for at, what in plan.events():
                await asyncio.sleep(max(0.0, self.t0 + at - time.monotonic()))
                if what == "kill":
                    await self._kill(len(self.report.kills) % plan.runners)
                else:
                    await self._restart_postgres()
            await asyncio.sleep(max(0.0, self.t0 + plan.duration_s - time.monotonic()))
            self.stop_callers.set()
            done, _ = await asyncio.wait(callers, timeout=120.0)
            if len(done) != len(callers):
                raise DrillError("callers did not finish their last command within 120 s")
            for task in done:
                task.result()
        finally:
            for task in callers:
                task.cancel()
            await asyncio.gather(*callers, return_exceptions=True)
        self.report.elapsed_s = time.monotonic() - self.t0
        await asyncio.gather(*self._trackers)
        self._measure()

    async def _caller(self, index: int) -> None:
        plan = self.plan
        rng = random.Random(plan.seed * 1000 + index)
        assert self.db is not None
        sent = 0
        while not self.stop_callers.is_set():
            # Each new command goes to the next runner (every runner gets traffic); a failed
            # try moves on to the one after.
            slot = (index + sent) % plan.runners
            sent += 1
            actor = f"a{rng.randrange(plan.actors)}"
            inbox = rng.randrange(plan.actors)
            cid = mint_command_id(self.db.estimate() - 1000, WINDOW_MS)
            tries = 0
            wait = 0.02
            started = time.monotonic()
            while True:
                tries += 1
                self.in_flight[index] = (slot, cid)
                answered_by = self.runner_id(slot)
                try:
                    handle = self.clients[slot].get(Account, actor).with_command_id(cid)
                    ack = await handle.work(inbox)
                except Exception as exc:  # any refusal or transport failure: same id again
                    self.in_flight.pop(index, None)
                    self.report.errors[_error_kind(exc)] += 1
                    if time.monotonic() - started > 300:
                        raise DrillError(f"{cid} not acknowledged within 300 s: {exc!r}") from exc
                    slot = (slot + 1) % plan.runners
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, 1.0)
                    continue
                self.in_flight.pop(index, None)
                break
            if tries > 1:
                self.report.retried_commands += 1
            self.acks[cid] = Acked(
                cid=cid,
                actor=actor,
                job_id=ack.job_id,
                by=ack.by,
                now_ms=ack.now_ms,
                answered_by=answered_by,
                tries=tries,
                acked_wall=time.monotonic(),
            )

    async def _kill(self, slot: int) -> None:
        assert self.db is not None
        victim = self.runners[slot]
        assert victim is not None
        survivors = {r.runner_id for r in self.runners if r is not None and r is not victim}
        leased = await self.db.rows(
            "SELECT intent_id, due_at_ms FROM {schema}.outbox"
            f" WHERE due_at_ms > {DB_MS} AND ((kind = 'intent' AND attempts > 0"
            " AND last_error IS NULL) OR (kind = 'job' AND running))",
            schema=self.schema,
        )
        kill_ms = await self.db.now()
        kill_wall = time.monotonic()
        in_flight = {c: cid for c, (s, cid) in list(self.in_flight.items()) if s == slot}
        await victim.kill()
        self.runners[slot] = None
        self.dead.append(victim)
        kill = Kill(
            slot=slot,
            victim=victim.runner_id,
            kill_ms=kill_ms,
            kill_wall=kill_wall - self.t0,
            survivors=survivors,
            in_flight=in_flight,
            leased=len(leased),
        )
        self.report.kills.append(kill)
        self._trackers.append(
            asyncio.create_task(self._track_leases(kill, leased), name="chaos lease tracker")
        )
        started = time.monotonic()
        self.runners[slot] = await Runner.spawn(
            slot, self.url, self.schema, self.socket(slot), self.plan
        )
        kill.restart_s = time.monotonic() - started
        self.log(
            f"kill {len(self.report.kills)}: slot {slot} ({victim.runner_id[:8]}) at "
            f"{kill.kill_wall:.1f} s, {len(in_flight)} calls in flight, {len(leased)} leased rows;"
            f" replacement {self.runner_id(slot)[:8]} after {kill.restart_s:.1f} s"
        )

    async def _track_leases(self, kill: Kill, leased: list[Any]) -> None:
        """Poll until every row leased at the kill was settled or claimed again."""
        assert self.db is not None
        ids = [str(r[0]) for r in leased]
        dues = [int(r[1]) for r in leased]
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            try:
                [(left, now)] = await self.db.rows(
                    "SELECT count(*), " + DB_MS + " FROM {schema}.outbox o"
                    " JOIN unnest(%s::text[], %s::bigint[]) AS s(id, due)"
                    " ON o.intent_id = s.id AND o.due_at_ms = s.due",
                    (ids, dues),
                    schema=self.schema,
                )
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)  # the server is restarting
                continue
            if int(left) == 0:
                kill.leases_settled_ms = int(now) - kill.kill_ms
                return
            await asyncio.sleep(0.05)  # polling an observable condition

    async def _restart_postgres(self) -> None:
        assert self.db is not None
        restart = Restart()
        self.report.restart = restart
        await self.db.close()
        restart.down_ms = self.db.estimate()
        started = time.monotonic()
        await asyncio.to_thread(self.server.stop)
        restart.stop_s = time.monotonic() - started
        await asyncio.sleep(self.plan.pg_down_s)
        started = time.monotonic()
        url = await asyncio.to_thread(self.server.start)
        restart.start_s = time.monotonic() - started
        if url != self.url:
            raise DrillError(f"the server came back on another URL: {url!r} != {self.url!r}")
        restart.up_ms = await self.db.now()
        restart.slot_commit_ms = dict.fromkeys(range(self.plan.runners))
        self.log(
            f"PostgreSQL restarted: down {restart.up_ms - restart.down_ms} ms "
            f"(stop {restart.stop_s:.1f} s, start {restart.start_s:.1f} s)"
        )
        # Every runner must come back through its pool: poll its readiness for a while.
        deadline = time.monotonic() + self.plan.pg_ready_within_s
        while True:
            restart.readiness = await self._readiness()
            if all(s == "ready" for s in restart.readiness.values()):
                return
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)  # polling an observable condition
        self.log(f"runners not ready after the restart: {restart.readiness}")
        failed = [
            slot
            for slot, runner in enumerate(self.runners)
            if runner is not None
            and restart.readiness.get(runner.runner_id) not in ("ready", "storage")
        ]
        await asyncio.gather(*(self._replace(slot, restart) for slot in failed))

    async def _replace(self, slot: int, restart: Restart) -> None:
        """SIGKILL a runner whose runtime failed and start a new one in its slot."""
        runner = self.runners[slot]
        assert runner is not None
        await runner.kill()
        self.runners[slot] = None
        self.dead.append(runner)
        restart.replaced.append(runner.runner_id)
        self.runners[slot] = await Runner.spawn(
            slot, self.url, self.schema, self.socket(slot), self.plan
        )
        self.log(f"slot {slot}: failed runner {runner.runner_id[:8]} replaced")

    async def _readiness(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for slot, runner in enumerate(self.runners):
            if runner is None:
                continue
            async with httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=str(self.socket(slot))), timeout=5.0
            ) as http:
                try:
                    response = await http.get("http://runner/ready")
                    found[runner.runner_id] = str(response.json().get("status"))
                except (httpx.HTTPError, ValueError) as exc:
                    found[runner.runner_id] = f"unreachable ({type(exc).__name__})"
        return found

    def _measure(self) -> None:
        """Recovery times from the acknowledgements."""
        acks = sorted(self.acks.values(), key=lambda a: a.now_ms)
        by_cid = self.acks
        for kill in self.report.kills:
            first = next(
                (a for a in acks if a.now_ms >= kill.kill_ms and a.by in kill.survivors), None
            )
            kill.survivor_commit_ms = None if first is None else first.now_ms - kill.kill_ms
            kill.stalls_ms = []
            for cid in kill.in_flight.values():
                ack = by_cid.get(cid)
                if ack is None:
                    kill.unacked += 1
                elif ack.answered_by == kill.victim:
                    kill.answered_before += 1
                else:
                    kill.stalls_ms.append(int((ack.acked_wall - self.t0 - kill.kill_wall) * 1000))
        restart = self.report.restart
        if restart is not None:
            after = [a for a in acks if a.now_ms >= restart.up_ms]
            restart.first_commit_ms = after[0].now_ms - restart.up_ms if after else None
            slot_of = {r.runner_id: r.slot for r in self.dead}
            slot_of.update({r.runner_id: r.slot for r in self.runners if r is not None})
            for slot in restart.slot_commit_ms:
                mine = next((a for a in after if slot_of.get(a.by) == slot), None)
                restart.slot_commit_ms[slot] = None if mine is None else mine.now_ms - restart.up_ms
        self.report.replayed_elsewhere = sum(
            1 for a in acks if a.tries > 1 and a.by != a.answered_by
        )

    # --- settle, stop ------------------------------------------------------------------------

    async def _settle(self) -> None:
        """Wait until the outbox is empty (every intent delivered, every job routed)."""
        assert self.db is not None
        started = time.monotonic()
        deadline = started + self.plan.settle_within_s
        while True:
            [(left,)] = await self.db.rows(
                "SELECT count(*) FROM {schema}.outbox", schema=self.schema
            )
            if int(left) == 0:
                break
            if time.monotonic() > deadline:
                self.log(f"outbox not empty after {self.plan.settle_within_s} s: {left} rows")
                break
            await asyncio.sleep(0.1)  # polling an observable condition
        self.report.settle_s = time.monotonic() - started

    async def _stop_runners(self) -> None:
        """Stop the runners gracefully, all at once (the drain is bounded by 5 s)."""
        alive = [r for r in self.runners if r is not None]
        outcomes = await asyncio.gather(*(r.stop() for r in alive), return_exceptions=True)
        for runner, outcome in zip(alive, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                # Ask the child for its asyncio tasks' stacks before it is killed.
                with contextlib.suppress(ProcessLookupError):
                    runner.signal(signal.SIGUSR1)
                await asyncio.sleep(1.0)
                self.report.stops.append("hung")
                tail = runner.stderr.decode(errors="replace")[-6000:]
                self.report.details.append(
                    f"runner {runner.runner_id[:8]} did not stop: {outcome}\n{tail}"
                )
            else:
                self.report.stops.append(outcome)
            self.dead.append(runner)
            self.runners[runner.slot] = None

    def _scan_logs(self) -> None:
        patterns = {
            "Background task stopped unexpectedly": "runtime failed (background task died)",
            "Task exception was never retrieved": "task exception never retrieved",
            "Relay pass failed": "relay pass failed",
            "Job claim failed": "job claim failed",
            "Outbox delivery failed": "outbox delivery failed",
            "Job attempt failed; retrying": "job attempt failed, retried",
            "Job dead-lettered": "job dead-lettered",
            "Runner heartbeat failed": "heartbeat failed",
            "HTTP request failed": "HTTP request failed (500)",
            "Traceback": "tracebacks",
        }
        for runner in [*self.dead, *(r for r in self.runners if r is not None)]:
            text = runner.stderr.decode(errors="replace")
            for needle, label in patterns.items():
                if (n := text.count(needle)) > 0:
                    self.report.child_log[label] += n

    async def _teardown(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        for runner in [*(r for r in self.runners if r is not None), *self.dead]:
            await runner.close()
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                name = f"slot{runner.slot}-{runner.runner_id[:8] or runner.proc.pid}.log"
                (self.log_dir / name).write_bytes(bytes(runner.stderr))
        for task in self._trackers:
            task.cancel()
        await asyncio.gather(*self._trackers, return_exceptions=True)
        if self.db is not None:
            await self.db.close()
        await asyncio.to_thread(self.server.stop)
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def child_stderr(self) -> str:
        """The end of every runner's stderr (for failure messages)."""
        parts = []
        for runner in [*self.dead, *(r for r in self.runners if r is not None)]:
            text = runner.stderr.decode(errors="replace")
            parts.append(f"--- slot {runner.slot} {runner.runner_id[:8]}\n{text[-3000:]}")
        return "\n".join(parts)


# --- verification ----------------------------------------------------------------------------


async def verify(drill: Drill) -> Counts:
    """Check the drill's guarantees against the database; fills ``drill.report.counts``."""
    db = drill.db
    assert db is not None
    schema = drill.schema
    counts = drill.report.counts
    details = drill.report.details
    accounts = {
        str(actor_id): state
        for actor_id, state in await db.rows(
            "SELECT actor_id, state FROM {schema}.actors WHERE actor_type = 'Account'",
            schema=schema,
        )
    }
    inboxes = [
        state
        for (state,) in await db.rows(
            "SELECT state FROM {schema}.actors WHERE actor_type = 'Inbox'", schema=schema
        )
    ]
    receipts = {
        str(cid): (str(actor_id), outcome)
        for actor_id, cid, outcome in await db.rows(
            "SELECT actor_id, command_id, outcome FROM {schema}.receipts"
            " WHERE actor_type = 'Account' AND command = 'work'",
            schema=schema,
        )
    }
    counts.acked = len(drill.acks)
    counts.committed = len(receipts)

    # Commands: each acknowledged id applied exactly once, nothing applied twice.
    applied: dict[str, Counter[str]] = {
        actor: Counter(state.get("applied", [])) for actor, state in accounts.items()
    }
    for ack in drill.acks.values():
        seen = applied.get(ack.actor, Counter())[uuid_of(ack.cid)]
        stored = receipts.get(ack.cid)
        if seen == 0 or stored is None:
            counts.acked_lost += 1
            if len(details) < 20:
                details.append(f"acknowledged {ack.cid} on {ack.actor} missing (receipt {stored})")
        elif stored[1].get("ok", {}).get("job_id") != ack.job_id:
            details.append(f"{ack.cid}: acknowledged job {ack.job_id}, receipt {stored[1]}")
    receipt_uuids = {(actor, uuid_of(cid)) for cid, (actor, _) in receipts.items()}
    for actor, entries in applied.items():
        for entry, n in entries.items():
            counts.applied_twice += n - 1
            if (actor, entry) not in receipt_uuids:
                counts.applied_without_receipt += 1

    # Intents: one per committed command, each delivered exactly once.
    delivered: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    for state in inboxes:
        for note in state.get("notes", []):
            intent, _, source = str(note).partition(":")
            delivered[intent] += 1
            sources[source] += 1
    counts.intents_delivered = sum(delivered.values())
    counts.intents_twice = sum(n - 1 for n in delivered.values())
    committed_uuids = {uuid_of(cid) for cid in receipts}
    counts.intents_missing = sum(1 for u in committed_uuids if sources[u] == 0)
    extra = sum(max(0, n - 1) for n in sources.values())
    if extra:
        details.append(f"{extra} commands had more than one intent delivered")

    # Jobs: one per committed command, terminal exactly once on its own account.
    attempts: Counter[str] = Counter()
    for job_id, n in await db.rows(
        "SELECT job_id, count(*) FROM {schema}.chaos_attempts GROUP BY job_id", schema=schema
    ):
        attempts[str(job_id)] = int(n)
    repeated = await db.rows(
        "SELECT count(*) FROM {schema}.chaos_effects WHERE applications > 1", schema=schema
    )
    counts.provider_calls_repeated = int(repeated[0][0])
    counts.attempts = sum(attempts.values())
    counts.jobs_reattempted = sum(1 for n in attempts.values() if n > 1)
    for cid, (actor, outcome) in receipts.items():
        job_id = str(outcome.get("ok", {}).get("job_id", ""))
        counts.jobs += 1
        state = accounts.get(actor, {})
        ok = state.get("done", []).count(uuid_of(job_id))
        dead = state.get("dead", []).count(uuid_of(job_id))
        if ok + dead == 1:
            counts.jobs_succeeded += ok
            counts.jobs_dead_lettered += dead
        elif ok + dead == 0:
            counts.jobs_not_terminal += 1
        else:
            counts.jobs_terminal_twice += 1
            details.append(f"job {job_id} of {cid}: {ok} successes, {dead} dead letters")
    [(letters,)] = await db.rows("SELECT count(*) FROM {schema}.dead_letters", schema=schema)
    counts.dead_letter_rows = int(letters)
    [(left,)] = await db.rows("SELECT count(*) FROM {schema}.outbox", schema=schema)
    counts.outbox_left = int(left)
    if counts.outbox_left:
        for row in await db.rows(
            "SELECT kind, target_type, command, attempts, running, last_error"
            " FROM {schema}.outbox ORDER BY attempts DESC LIMIT 5",
            schema=schema,
        ):
            details.append(f"outbox row left: {row}")
    return counts


async def chaos(plan: Plan, log: Callable[[str], None] = lambda _: None) -> tuple[Report, Drill]:
    """Run the drill with ``plan``; returns its report (and the drill, for diagnostics)."""
    drill = Drill(plan, log=log)
    report = await drill.run()
    return report, drill
