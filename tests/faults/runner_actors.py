"""Actors of the runner fault tests, their child processes and ``bench/drills.py``.

``Beacon`` is a singleton whose background loop is the test instrument of RN-01: every beat
inserts ``(run_id, runner_id, seq, at_ms)`` into ``<schema>.loop_beats`` with the database clock
(``clock_timestamp()``), so the parent can check afterwards, from one clock shared by every
process, which runner's loop ran when (see :mod:`tests.faults.runner_drill`).

``FencedBeacon`` is its fenced variant (the freeze drill): its loop beats through a *command*
sent with ``self.runtime``, so every beat is a turn fenced on the loop's lease. The beat is an
event; a trigger that the drill installs (``FENCED_BEATS_DDL``) copies it into ``loop_beats``
inside that turn, with the database clock at the insert, so a beat row exists only if the fenced
turn committed. A refused beat (``LeaseLost``) ends the loop quietly.

``Ledger`` and ``Inbox`` are the load of RN-04: every applied ``Ledger.add`` records its command
id in durable state and stages two intents to the ``Inbox`` of the same id, one due at once and
one a few seconds later, so a crash always leaves some of them pending in the outbox.

``Tally`` is the frozen-turn drill's actor (``runner_child --tally``): its ``hold`` command waits
inside its turn on a gate the child controls, so the parent can SIGSTOP the child mid-turn.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field

import akter

#: Seconds between two beats of a ``Beacon`` loop (a child sets it from its command line).
BEAT = {"s": 0.05}

#: Seconds after which ``Ledger.add``'s second intent is due.
LATER_S = 3.0

BEATS_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.loop_beats (
    run_id text NOT NULL,
    runner_id text NOT NULL,
    seq int NOT NULL,
    at_ms bigint NOT NULL,
    PRIMARY KEY (run_id, seq)
)
"""


#: Installed by the freeze drill for ``FencedBeacon``: each committed ``Beat`` event is a beat row.
FENCED_BEATS_DDL = """
CREATE OR REPLACE FUNCTION {schema}.fenced_beat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.loop_beats (run_id, runner_id, seq, at_ms)
    VALUES (NEW.payload->>'run_id', NEW.payload->>'runner_id', (NEW.payload->>'seq')::int,
            floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS fenced_beat ON {schema}.events;
CREATE TRIGGER fenced_beat AFTER INSERT ON {schema}.events
    FOR EACH ROW WHEN (NEW.actor_type = 'FencedBeacon' AND NEW.tag = 'Beat')
    EXECUTE FUNCTION {schema}.fenced_beat();
"""


def db_ms_sql() -> sql.SQL:
    """The database clock in epoch ms (what akter's ``now_ms(0)`` computes)."""
    return sql.SQL("floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint")


class Beacon(akter.Actor[akter.EmptyState], singleton=True):
    """A singleton whose loop writes a beat row every ``BEAT["s"]`` seconds."""

    @akter.command
    async def ping(self) -> str:
        """An ordinary command (a singleton's turns run on any runner)."""
        return "pong"

    async def run(self) -> None:
        """Beat until cancelled: one row per beat, stamped with the database clock."""
        runtime = self.runtime
        run_id = uuid.uuid4().hex
        insert = sql.SQL(
            "INSERT INTO {}.loop_beats (run_id, runner_id, seq, at_ms) VALUES (%s, %s, %s, {})"
        ).format(sql.Identifier(runtime.schema), db_ms_sql())
        async with await psycopg.AsyncConnection.connect(
            runtime._store.url, autocommit=True
        ) as conn:
            seq = 0
            while True:
                await conn.execute(insert, (run_id, runtime._runners.runner_id, seq))
                seq += 1
                await asyncio.sleep(BEAT["s"])


class Beat(akter.Event):
    """One beat of a ``FencedBeacon`` loop run."""

    run_id: str
    runner_id: str
    seq: int


class FencedBeacon(
    akter.Actor[akter.EmptyState], singleton=True, events=[Beat], execution_timeout=2.0
):
    """``Beacon`` whose beats are commands from the loop, fenced on its lease.

    The short execution timeout also bounds how long a frozen owner's fenced turn can hold the
    lease row (the fence's idle-in-transaction timeout), so a takeover never waits for a resume.
    """

    @akter.command
    async def beat(self, run_id: str, runner_id: str, seq: int) -> None:
        """Record one beat (an event; the drill's trigger turns it into a beat row)."""
        self.emit(Beat(run_id=run_id, runner_id=runner_id, seq=seq))

    async def run(self) -> None:
        """Beat until cancelled, or until a beat is refused because the lease was lost."""
        beacon = self.runtime.get(FencedBeacon)
        run_id = uuid.uuid4().hex
        seq = 0
        while True:
            try:
                await beacon.beat(run_id, self.lease.owner, seq)
            except akter.ActorError as exc:
                if exc.reason == "LeaseLost":
                    return  # a stale owner: its successor runs the loop
                raise
            seq += 1
            await asyncio.sleep(BEAT["s"])


class Applied(BaseModel):
    """The command ids applied to a ledger, in order, and its total."""

    total: int = 0
    applied: list[str] = Field(default_factory=list)


class Received(BaseModel):
    """What an inbox was delivered: ``<command id of the add>:<now|later>``, in order."""

    notes: list[str] = Field(default_factory=list)


class Inbox(akter.Actor[Received]):
    """Receives the ledger's intents."""

    @akter.command
    async def note(self, tag: str) -> int:
        """Record one delivered intent."""
        self.state.notes.append(tag)
        return len(self.state.notes)


class Ledger(akter.Actor[Applied]):
    """Adds to a total; every application stages one intent now and one a little later."""

    @akter.command
    async def add(self, k: int) -> int:
        """Add ``k``, record the command id, notify the inbox twice; returns the total."""
        self.state.total += k
        self.state.applied.append(self.command_id)
        self.send(Inbox.note, self.ref.id, f"{self.command_id}:now")
        self.later(after=timedelta(seconds=LATER_S)).send(
            Inbox.note, self.ref.id, f"{self.command_id}:later"
        )
        return self.state.total


#: The freeze drill's gate: a child runner sets ``HOLD["gate"]`` to a coroutine function that
#: ``Tally.hold`` awaits once inside its turn (holding the actor row lock) before it applies.
HOLD: dict[str, Any] = {"gate": None}


class Tallied(BaseModel):
    """The command ids applied to a tally, in order."""

    applied: list[str] = Field(default_factory=list)


class Tally(akter.Actor[Tallied], execution_timeout=1.5, lock_wait=0.5):
    """The actor of the frozen-turn drill (hardening finding 7).

    Its short execution timeout makes the server-side bound on a frozen turn's transaction
    (execution timeout + 1 s) short; its short lock wait makes a contender retry often.
    """

    @akter.command
    async def add(self) -> list[str]:
        """Apply this command id; returns every applied id."""
        self.state.applied.append(self.command_id)
        return list(self.state.applied)

    @akter.command
    async def hold(self) -> list[str]:
        """Like ``add``, but first wait on the child's gate (once) inside the turn."""
        gate, HOLD["gate"] = HOLD["gate"], None
        if gate is not None:
            await gate()
        self.state.applied.append(self.command_id)
        return list(self.state.applied)
