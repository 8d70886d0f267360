"""Two versions of one application for the ``akter check`` tests (EVO-11).

``OLD`` is the code that wrote the rows: accounts with a ``name``, a ``deposit(amount)``
command, ``rename`` and ``note(text)`` commands, ``charge`` and ``refund`` jobs, the events
``Deposited`` and ``Withdrawn``, an hourly schedule, and a ``Gone`` type. ``NEW`` is the code
about to be deployed: the state split into ``first``/``last`` by a migration,
``deposit(cents)`` at payload version 1 with its migration; ``rename``, ``refund``,
``Withdrawn``, the schedule and ``Gone`` removed; ``note`` with a new required parameter. The
CLI tests import ``NEW`` from here in a subprocess.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

import akter


# Tags unique to these tests: the events' process-wide registry is shared by the whole session.
class Deposited(akter.Event, tag="evo-check.Deposited"):
    amount: int


class Withdrawn(akter.Event, tag="evo-check.Withdrawn"):
    amount: int


class Charge(BaseModel):
    amount: int


# --- the code that wrote the rows ----------------------------------------------------------------


class AccountV0(BaseModel):
    name: str = ""
    balance: int = 0


class OldAccount(
    akter.Actor[AccountV0], name="Account", events=[Deposited, Withdrawn], access=akter.public
):
    @akter.command
    async def open(self, name: str) -> None:
        self.state.name = name
        self.emit(Deposited(amount=0))
        self.emit(Withdrawn(amount=0))

    @akter.command
    async def deposit(self, amount: int) -> int:
        self.state.balance += amount
        return self.state.balance

    @akter.command
    async def rename(self, name: str) -> None:
        self.state.name = name

    @akter.command
    async def note(self, text: str) -> None:
        return None

    @akter.schedule(every=timedelta(hours=1))
    @akter.command
    async def hourly(self) -> None:
        return None

    @akter.command
    async def stage(self) -> None:
        """Leave one pending row of each kind: timers an hour ahead, two due jobs."""
        self.later(after=3600, key="deposit").send(OldAccount.deposit, self.id, 5)
        self.later(after=3600, key="rename").send(OldAccount.rename, self.id, "x")
        self.later(after=3600, key="note").send(OldAccount.note, self.id, "hi")
        self.enqueue(OldAccount.charge, Charge(amount=3))
        self.enqueue(OldAccount.refund, Charge(amount=1))

    @akter.job(attempts=1)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        return payload.amount

    @akter.job(attempts=1)
    async def refund(call: akter.JobCall, payload: Charge) -> int:
        return payload.amount


class Gone(akter.Actor[akter.EmptyState], name="Gone", access=akter.public):
    @akter.command
    async def touch(self) -> None:
        return None


OLD: list[type[akter.Actor[Any]]] = [OldAccount, Gone]


# --- the code about to be deployed -------------------------------------------------------------


class AccountV1(BaseModel):
    first: str = ""
    last: str = ""
    balance: int = 0


class NewAccount(akter.Actor[AccountV1], name="Account", events=[Deposited], access=akter.public):
    @akter.migrate_state(from_version=0)
    def _split(old: dict[str, Any]) -> dict[str, Any]:
        first, _, last = old.pop("name", "").partition(" ")
        return {**old, "first": first, "last": last}

    @akter.command
    async def open(self, name: str) -> None:
        self.state.first, _, self.state.last = name.partition(" ")
        self.emit(Deposited(amount=0))

    @akter.command(version=1)
    async def deposit(self, cents: int) -> int:
        self.state.balance += cents
        return self.state.balance

    @deposit.migrate_payload(from_version=0)
    def _cents(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100}

    @akter.command
    async def note(self, text: str, level: int) -> None:
        return None

    @akter.job(attempts=1)
    async def charge(call: akter.JobCall, payload: Charge) -> int:
        return payload.amount


NEW: list[type[akter.Actor[Any]]] = [NewAccount]
