"""Actors of the relay tests (``tests/integration/test_relay.py``); no tests here.

``Sender`` stages intents and timers; ``Receiver`` records every delivery it commits — command
id, caller key, argument and the turn's clock — in its durable state, so tests read delivered
work from rows. ``RUNS`` counts handler runs per command id in this process: a replayed receipt
does not run the handler, a second transition would.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

import akter
from akter.actor import AccessKind
from akter.callers import caller_key

#: Handler runs per command id (or per name for ``Sender.loop``) in this process.
RUNS: Counter[str] = Counter()
#: Subjects whose access was revoked (the access policy below refuses them).
REVOKED: set[str] = set()
#: ``Sender.loop`` re-stages itself while this is true.
LOOPING = {"on": True}


def reset() -> None:
    """Forget what earlier tests recorded."""
    RUNS.clear()
    REVOKED.clear()
    LOOPING["on"] = True


def revocable(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: AccessKind) -> bool:
    """Everyone, except users whose access was revoked."""
    return not (isinstance(caller, akter.User) and caller.subject in REVOKED)


class Log(BaseModel):
    """What a receiver committed, in order."""

    received: list[dict[str, Any]] = Field(default_factory=list)
    total: int = 0


class NotSent(akter.DeclaredError):
    """A declared failure of the sender."""

    why: str


class Work(BaseModel):
    k: int


def record(actor: akter.Actor[Log], k: int) -> int:
    """Record one delivery in the receiver's state and count the handler run."""
    RUNS[actor.command_id] += 1
    actor.state.total += k
    actor.state.received.append(
        {"cid": actor.command_id, "caller": caller_key(actor.caller), "k": k, "now": actor.now_ms}
    )
    return actor.state.total


class Receiver(akter.Actor[Log], access=revocable):
    """The target of the sender's intents and timers."""

    @akter.command
    async def take(self, k: int) -> int:
        return record(self, k)

    @akter.command(internal=True)
    async def take_internal(self, k: int) -> int:
        return record(self, k)

    @akter.command
    async def boom(self, k: int) -> int:
        """Always a deterministic defect: the delivery is retried with backoff forever."""
        RUNS[self.command_id] += 1
        raise RuntimeError(f"receiver defect {k}")


class Gate(akter.Actor[Log], access=akter.public):
    """A gated receiver: ``take`` is refused with ``NotCreated`` until ``open`` committed."""

    @akter.command(creates=True)
    async def open(self) -> int:
        return 0

    @akter.command
    async def take(self, k: int) -> int:
        return record(self, k)


class Sender(akter.Actor[Log], access=revocable, execution_timeout=10):
    """Stages intents and timers. Its execution timeout (10 s) differs from the receivers'."""

    @akter.command
    async def send_to(self, target: str, k: int) -> int:
        """One intent to ``Receiver.take``; returns the turn's clock."""
        self.send(Receiver.take, target, k)
        return self.now_ms

    @akter.command
    async def send_internal(self, target: str, k: int) -> int:
        self.send(Receiver.take_internal, target, k)
        return self.now_ms

    @akter.command
    async def send_many(self, targets: list[str], k: int) -> int:
        for target in targets:
            self.send(Receiver.take, target, k)
        return self.now_ms

    @akter.command
    async def send_boom(self, targets: list[str], k: int) -> int:
        for target in targets:
            self.send(Receiver.boom, target, k)
        return self.now_ms

    @akter.command
    async def send_gated(self, target: str, k: int) -> int:
        self.send(Gate.take, target, k)
        return self.now_ms

    @akter.command(errors=[NotSent])
    async def send_then(self, target: str, k: int, ending: str) -> int:
        """Stage an intent and a timer, then end as ``declared`` failure, ``defect`` or ``ok``."""
        self.send(Receiver.take, target, k)
        self.later(after=60, key="t").send(Receiver.take, target, k)
        if ending == "declared":
            raise NotSent(why="declared")
        if ending == "defect":
            raise RuntimeError("sender defect")
        return self.now_ms

    @akter.command
    async def remind(
        self,
        target: str,
        k: int,
        after: float | None = None,
        at_ms: int | None = None,
        key: str | None = None,
    ) -> int:
        """A timer to ``Receiver.take``, relative (``after`` s) or absolute (``at_ms``)."""
        at = None if at_ms is None else datetime.fromtimestamp(at_ms / 1000, tz=UTC)
        self.later(after=after, at=at, key=key).send(Receiver.take, target, k)
        return self.now_ms

    @akter.command
    async def remind_many(self, targets: list[str], after: float) -> int:
        """One timer per target, each due ``after`` seconds from the commit."""
        for target in targets:
            self.later(after=after).send(Receiver.take, target, 1)
        return self.now_ms

    @akter.command
    async def restage(self, target: str, key: str, cancel: bool) -> int:
        """Stage ``key`` twice in one turn (the last wins), optionally cancelling it after."""
        self.later(after=60, key=key).send(Receiver.take, target, 1)
        self.later(after=120, key=key).send(Receiver.take, target, 2)
        if cancel:
            self.cancel_timer(key)
        return self.now_ms

    @akter.command(errors=[NotSent])
    async def cancel(self, key: str, fail: bool = False) -> int:
        self.cancel_timer(key)
        if fail:
            raise NotSent(why="cancel rolled back")
        return self.now_ms

    @akter.command
    async def bad_keys(self, keys: list[str]) -> list[str]:
        """Try each key with every keyed call; returns ``call:key`` for each ValueError."""
        refused: list[str] = []
        for key in keys:
            for call in ("later", "cancel_timer", "enqueue", "cancel_job"):
                try:
                    if call == "later":
                        self.later(after=1, key=key).send(Receiver.take, "r", 1)
                    elif call == "cancel_timer":
                        self.cancel_timer(key)
                    elif call == "enqueue":
                        self.enqueue(Sender.work, Work(k=1), key=key)
                    else:
                        self.cancel_job(key)
                except ValueError:
                    refused.append(f"{call}:{key}")
        return refused

    @akter.command
    async def loop(self, n: int) -> int:
        """Re-stage itself while ``LOOPING`` is on: work that never settles."""
        RUNS["loop"] += 1
        RUNS[self.command_id] += 1
        if LOOPING["on"]:
            self.send(Sender.loop, self.id, n + 1)
        return n

    @akter.job(attempts=1)
    async def work(call: akter.JobCall, payload: Work) -> int:
        return payload.k


ALL = [Sender, Receiver, Gate]
