"""The rolling-deploy drill (issue 38): two runner processes on different code over one database.

A runner on ``deploy_v1``'s code serves a load alone; a runner on ``deploy_v2``'s code starts
beside it, writes each actor once, then the v1 runner is called on each (it meets rows the newer
code wrote), and both serve the load; the v1 runner stops (a graceful drain); the v2 runner serves
the load alone; then the drill waits for the outbox and the workflows to settle. The client
acts like an HTTP client behind a load balancer: it sends each call to a random runner that is
up, and retries a retryable refusal with the same command id on a random runner again.

Each command carries a unique token, which the handler records in its actor's state. The
ledger compares every acknowledged command with the final rows: each acknowledged token is
applied exactly once (nothing lost, nothing applied twice), no token applies twice, no
command was refused non-retryably, and nothing is left pending or parked in the outbox. One
case per change (``deploy_v1``'s docstring): ``field``, ``rename``, ``command``, ``step``.

The ``step`` case changes a workflow's command step target without ``wf.patched`` (v1 adds to
``Acct('wx')``, v2 to ``Acct('wy')``). A run whose step v1 recorded and v2 replays must park as
``diverged`` (never re-sent to the new target): for those runs the ledger checks instead that
the parked message tells the truth about the recorded target (applied there once, or not at
all, as the rows show), that nothing reached the new target, and that the token applied at most
once. Those runs are left for the operator, which is the documented outcome of an unguarded
step change.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from tests.faults.child_process import ChildProcess, start_module

#: Per case: the command the load calls, its actors, and the types whose rows hold the tokens.
CASES: dict[str, tuple[str, str, list[str], list[str]]] = {
    "field": ("Acct", "add", [f"acct{i}" for i in range(4)], ["Acct"]),
    "rename": ("Meter", "add", [f"meter{i}" for i in range(4)], ["Meter"]),
    "command": ("Feeder", "feed", [f"feeder{i}" for i in range(2)], ["Box"]),
    "step": ("Mover", "go", [f"mover{i}" for i in range(4)], ["Acct"]),
}
#: How long one call may keep retrying, and how long the outbox may take to settle.
CALL_WITHIN = 30.0
SETTLE_WITHIN = 60.0


class DrillError(AssertionError):
    """A child failed, or the final rows contradict the ledger."""


@dataclass
class Reply:
    """One ``DONE`` line."""

    command_id: str
    ok: bool
    reason: str = ""
    retryable: bool = False
    retry_after: float = 0.0


class Runner:
    """A child runner on one version of the code, with its replies routed by tag."""

    def __init__(self, child: ChildProcess, code: str) -> None:
        self.child = child
        self.code = code
        self.up = True
        self.stopped = asyncio.Event()
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._reader = asyncio.create_task(self._read(), name=f"{code} replies")

    @classmethod
    async def start(cls, url: str, schema: str, code: str) -> Runner:
        proc = await start_module("tests.faults.deploy_child", url, schema, "--code", code)
        child = ChildProcess(proc, f"{code} runner")
        await child.ready()
        return cls(child, code)

    async def _read(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                line = await self.child.line(within=3600)
                words = line.split()
                if words[:1] == ["STOPPED"]:
                    self.stopped.set()
                    return
                if words[:1] != ["DONE"]:
                    continue
                tag, cid, outcome = words[1:4]
                reply = Reply(cid, outcome == "ok")
                if not reply.ok:
                    reply.reason = words[4]
                    reply.retryable = words[5] == "1"
                    reply.retry_after = float(words[6])
                future = self._waiting.pop(tag, None)
                if future is not None and not future.done():
                    future.set_result(reply)

    async def call(
        self, tag: str, cid: str, type_name: str, actor: str, cmd: str, token: str
    ) -> Reply:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = future
        await self.child.send(f"CALL {tag} {cid} {type_name} {actor} {cmd} {token}")
        return await asyncio.wait_for(future, CALL_WITHIN)

    async def stop(self) -> None:
        """A graceful stop: no new calls, end of input, wait for ``STOPPED``."""
        self.up = False
        self.child.end_input()
        await asyncio.wait_for(self.stopped.wait(), 60)
        await self.child.close(grace=10)

    async def close(self) -> None:
        self.up = False
        self._reader.cancel()
        await self.child.close()


@dataclass
class Ledger:
    """What the client saw."""

    #: token -> the command id it was acknowledged under.
    acked: dict[str, str] = field(default_factory=dict)
    #: Tokens of calls that ended without an answer (they may or may not have applied).
    unknown: set[str] = field(default_factory=set)
    #: Non-retryable refusals of valid commands: (token, reason).
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: Retryable refusals by reason (StateTooNew while v1 and v2 run together, ...).
    retried: Counter[str] = field(default_factory=Counter)
    #: Tokens of workflow runs parked as ``diverged`` (the ``step`` case; module docstring).
    diverged: set[str] = field(default_factory=set)


class Client:
    """Sends each call to a random runner that is up; retries with the same id elsewhere."""

    def __init__(self, runners: list[Runner], ledger: Ledger, seed: int) -> None:
        self.runners = runners
        self.ledger = ledger
        self.random = random.Random(seed)
        self._serial = 0

    async def call(
        self, type_name: str, actor: str, cmd: str, token: str, first: Runner | None = None
    ) -> None:
        """One call until answered; ``first``: the runner of the first attempt."""
        cid = "-"
        deadline = time.monotonic() + CALL_WITHIN
        while time.monotonic() < deadline:
            up = [r for r in self.runners if r.up]
            runner, first = first or self.random.choice(up), None
            self._serial += 1
            try:
                reply = await runner.call(f"t{self._serial}", cid, type_name, actor, cmd, token)
            except TimeoutError:
                break
            cid = reply.command_id
            if reply.ok:
                self.ledger.acked[token] = cid
                return
            if not reply.retryable:
                self.ledger.refused.append((token, f"{runner.code}: {reply.reason}"))
                return
            self.ledger.retried[reply.reason] += 1
            await asyncio.sleep(self.random.uniform(0.01, min(reply.retry_after or 0.1, 0.2)))
        self.ledger.unknown.add(token)


async def tokens_in(url: str, schema: str, types: list[str]) -> Counter[str]:
    """Every token recorded in the state of the given types' actors, with its multiplicity."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            sql.SQL("SELECT state FROM {}.actors WHERE actor_type = ANY(%(t)s)").format(
                sql.Identifier(schema)
            ),
            {"t": types},
        )
        found: Counter[str] = Counter()
        for row in await cur.fetchall():
            found.update(row["state"].get("tokens", []))
        return found


async def diverged_runs(url: str, schema: str) -> list[dict[str, Any]]:
    """Workflow runs parked as ``diverged``, with the token of their input and their message."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            sql.SQL(
                "SELECT w.input::jsonb ->> 'token' AS token,"
                " w.error::jsonb ->> 'message' AS message"
                " FROM {}.workflows w WHERE w.status = 'diverged'"
            ).format(sql.Identifier(schema))
        )
        return await cur.fetchall()


async def tokens_at(url: str, schema: str, type_name: str, actor: str) -> Counter[str]:
    """The tokens recorded in one actor's state."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            sql.SQL(
                "SELECT state FROM {}.actors WHERE actor_type = %(t)s AND actor_id = %(a)s"
            ).format(sql.Identifier(schema)),
            {"t": type_name, "a": actor},
        )
        found: Counter[str] = Counter()
        for row in await cur.fetchall():
            found.update(row["state"].get("tokens", []))
        return found


async def check_diverged(url: str, schema: str, ledger: Ledger) -> list[dict[str, Any]]:
    """The ``step`` case's parked runs (module docstring); returns them, raises on a lie."""
    runs = await diverged_runs(url, schema)
    at_old = await tokens_at(url, schema, "Acct", "wx")
    at_new = await tokens_at(url, schema, "Acct", "wy")
    problems = []
    for run in runs:
        token, message = run["token"], run["message"] or ""
        applied = "was applied to Acct('wx'" in message
        if not applied and "was not applied to Acct('wx'" not in message:
            problems.append(f"{token}: the parked message names no outcome: {message!r}")
        if at_old[token] != (1 if applied else 0):
            problems.append(
                f"{token}: the message says applied={applied}, wx holds it {at_old[token]}x"
            )
        if at_new[token]:
            problems.append(f"{token}: a diverged run's step reached the new target")
        if "Step 0" not in message or "Acct('wy'" not in message:
            problems.append(f"{token}: the message names neither the seq nor both targets")
        ledger.diverged.add(token)
    if problems:
        raise DrillError("; ".join(problems[:5]))
    return runs


async def unsettled(url: str, schema: str) -> list[dict[str, Any]]:
    """Outbox rows (intents, parked ones too) and workflow runs not yet ended."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        s = sql.Identifier(schema)
        await cur.execute(
            sql.SQL(
                "SELECT 'outbox' AS what, o.kind, o.target_type, o.command, o.parked_at_ms,"
                " o.last_error FROM {}.outbox o WHERE o.kind <> 'tick'"
                " UNION ALL SELECT 'run', w.status, w.actor_type, w.workflow, NULL, w.error::text"
                " FROM {}.workflows w WHERE w.status NOT IN ('completed', 'failed', 'cancelled')"
            ).format(s, s)
        )
        return await cur.fetchall()


async def drill(url: str, schema: str, case: str, *, per_phase: int, seed: int = 0) -> Ledger:
    """Run one case's rolling deploy under load and check the ledger (module docstring)."""
    type_name, cmd, actors, holders = CASES[case]
    ledger = Ledger()
    runners: list[Runner] = []
    client = Client(runners, ledger, seed)
    serial = iter(range(1_000_000))

    def token() -> str:
        n = next(serial)
        return f"{n % 3}.{case}{n}" if case == "command" else f"{case}{n}"

    async def load(count: int) -> None:
        await asyncio.gather(
            *(
                client.call(type_name, client.random.choice(actors), cmd, token())
                for _ in range(count)
            )
        )

    try:
        runners.append(await Runner.start(url, schema, "v1"))
        await load(per_phase)
        v1, v2 = runners[0], await Runner.start(url, schema, "v2")
        runners.append(v2)
        for actor in actors:  # v2 writes each actor, then v1 meets the row v2 wrote
            await client.call(type_name, actor, cmd, token(), first=v2)
            await client.call(type_name, actor, cmd, token(), first=v1)
        await load(2 * per_phase)
        await runners[0].stop()
        await load(per_phase)
        for _ in range(int(SETTLE_WITHIN / 0.1)):  # polled: the rows are the only signal
            left = await unsettled(url, schema)
            if case == "step":  # parked runs wait for the operator (module docstring)
                left = [row for row in left if row["kind"] != "diverged"]
            if not left:
                break
            await asyncio.sleep(0.1)
    finally:
        for runner in runners:
            await runner.close()
    if case == "step":
        await check_diverged(url, schema, ledger)
    check(ledger, await tokens_in(url, schema, holders), left)
    return ledger


def check(ledger: Ledger, found: Counter[str], left: list[dict[str, Any]]) -> None:
    """The ledger against the final rows (module docstring)."""
    problems: list[str] = []
    if ledger.refused:
        problems.append(f"refused non-retryably: {ledger.refused[:5]}")
    lost = [t for t in ledger.acked if found[t] == 0 and t not in ledger.diverged]
    if lost:
        problems.append(f"acknowledged and not applied: {lost[:10]}")
    doubled = {t: n for t, n in found.items() if n > 1}
    if doubled:
        problems.append(f"applied more than once: {dict(list(doubled.items())[:10])}")
    if left:
        problems.append(f"left pending or parked: {left[:5]}")
    if ledger.unknown:
        problems.append(f"calls without an answer: {sorted(ledger.unknown)[:5]}")
    if problems:
        raise DrillError("; ".join(problems) + f" (retried: {dict(ledger.retried)})")
