"""Actors shared by the fault tests and their child processes (one class for both sides)."""

from __future__ import annotations

from pydantic import BaseModel, Field

import akter


class Tally(BaseModel):
    """A running total and, in order, the command ids that changed it (a durable run count)."""

    total: int = 0
    applied: list[str] = Field(default_factory=list)


class Added(akter.Event):
    """Emitted by every applied ``Counter.add``."""

    k: int
    total: int


class Sink(akter.Actor[akter.EmptyState]):
    """The target of ``Counter``'s intents.

    No runtime in these tests hosts it, so the intents it is sent stay in the outbox where the
    tests count them.
    """

    @akter.command
    async def note(self, k: int) -> None:
        """Receive a note (never delivered in these tests)."""


class Counter(akter.Actor[Tally]):
    """Adds to a total; every application stages state, an event and an intent."""

    @akter.command
    async def add(self, k: int) -> int:
        """Add ``k``, record the command id, emit ``Added``, notify the sink; returns the total."""
        self.state.total += k
        self.state.applied.append(self.command_id)
        self.emit(Added(k=k, total=self.state.total))
        self.send(Sink.note, "x", k)
        return self.state.total

    @akter.query
    async def total(self) -> int:
        """The committed total."""
        return self.state.total
