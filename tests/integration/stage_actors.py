"""Actors of the staging tests (``tests/integration/test_stage_*.py``); no tests here.

``Account`` records every delivery it commits (command id, caller key, cents) in its durable
state, so a test reads what was delivered, and how often, from rows.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

import akter
from akter.callers import caller_key


class Ledger(BaseModel):
    """What an account committed, in order."""

    cents: int = 0
    seen: list[dict[str, Any]] = Field(default_factory=list)


class Overdrawn(akter.DeclaredError, tag="stage.Overdrawn"):
    """A declared failure: the withdrawal is larger than the balance."""

    short: int


class Account(akter.Actor[Ledger]):
    """The target of staged commands."""

    @akter.command
    async def deposit(self, cents: int, note: str = "") -> int:
        self.state.cents += cents
        self.state.seen.append(
            {"cid": self.command_id, "caller": caller_key(self.caller), "cents": cents}
        )
        return self.state.cents

    @akter.command(errors=(Overdrawn,))
    async def withdraw(self, cents: int) -> int:
        if cents > self.state.cents:
            raise Overdrawn(short=cents - self.state.cents)
        self.state.cents -= cents
        return self.state.cents

    @akter.command(internal=True)
    async def audit(self, cents: int) -> int:
        return cents

    @akter.query
    async def balance(self) -> int:
        return self.state.cents


class Order(akter.Actor[Ledger]):
    """The target of a staged workflow start."""

    @akter.command
    async def add(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @akter.workflow
    async def checkout(wf: akter.Workflow, cents: int) -> int:
        return int(await wf.get(Order, wf.ref.id).add(cents))


class Total(BaseModel):
    """A tally's sum alone (bulk tests: no per-delivery record to outgrow the state bound)."""

    cents: int = 0


class Tally(akter.Actor[Total]):
    """The target of bulk staging."""

    @akter.command
    async def add(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents


ALL = [Account, Order, Tally]
