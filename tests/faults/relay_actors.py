"""Actors of the relay fault tests and of their child runners (one module for both sides).

The parent process hosts ``Sender``; a child runner (``tests.faults.relay_child``) hosts
``Receiver``, so the parent's relay never claims the receiver's intents unless the test adds a
runtime that hosts it. ``Receiver`` records each delivery it commits — command id, caller key,
argument and the turn's clock — in its durable state: a second transition would show there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

import akter
from akter.callers import caller_key

#: Handler runs per command id in this process.
RUNS: Counter[str] = Counter()
#: ``Receiver.flaky`` raises a defect for the first ``n`` runs of each command id (per process).
FLAKY = {"n": 0}


class Log(BaseModel):
    """The deliveries a receiver committed, in order."""

    received: list[dict[str, Any]] = Field(default_factory=list)


def record(actor: akter.Actor[Log], k: int) -> int:
    """Record one delivery in durable state; returns how many the receiver committed."""
    RUNS[actor.command_id] += 1
    actor.state.received.append(
        {"cid": actor.command_id, "caller": caller_key(actor.caller), "k": k, "now": actor.now_ms}
    )
    return len(actor.state.received)


class Receiver(akter.Actor[Log]):
    """The target of the sender's intents."""

    @akter.command
    async def take(self, k: int) -> int:
        """Record the delivery."""
        return record(self, k)

    @akter.command
    async def flaky(self, k: int) -> int:
        """A deterministic defect for the first ``FLAKY["n"]`` runs of a command id, then record."""
        RUNS[f"flaky:{self.command_id}"] += 1
        if RUNS[f"flaky:{self.command_id}"] <= FLAKY["n"]:
            raise RuntimeError(f"flaky receiver, run {RUNS[f'flaky:{self.command_id}']}")
        return record(self, k)


class Sender(akter.Actor[akter.EmptyState]):
    """Stages intents to the receiver; each command returns its turn's clock."""

    @akter.command
    async def send_to(self, target: str, k: int) -> int:
        """One intent to ``Receiver.take``."""
        self.send(Receiver.take, target, k)
        return self.now_ms

    @akter.command
    async def send_many(self, targets: list[str], k: int) -> int:
        """One intent to ``Receiver.take`` per target."""
        for target in targets:
            self.send(Receiver.take, target, k)
        return self.now_ms

    @akter.command
    async def send_flaky(self, target: str, k: int) -> int:
        """One intent to ``Receiver.flaky``."""
        self.send(Receiver.flaky, target, k)
        return self.now_ms
