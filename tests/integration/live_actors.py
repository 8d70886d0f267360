"""Actors of the live-read tests (watches, broadcasts, WebSockets)."""

from __future__ import annotations

import collections

from pydantic import BaseModel

import akter
from akter.actor import AccessKind


class Balance(BaseModel):
    cents: int = 0
    owner: str = ""


class Moved(akter.Event, tag="live.moved"):
    cents: int


class Refused(akter.DeclaredError, tag="live.Refused"):
    """The command refused after staging a broadcast: nothing it staged is sent."""


#: Runs of queries that count them.
RUNS: collections.Counter[str] = collections.Counter()
#: Callers the Account's access policy refuses (a test revokes access by adding one).
REVOKED: set[str] = set()


def account_access(
    caller: akter.Caller, ref: akter.ActorRef, member: str, kind: AccessKind
) -> bool:
    if isinstance(caller, akter.System):
        return True
    return isinstance(caller, akter.User) and caller.subject not in REVOKED


class Account(akter.Actor[Balance], access=account_access, events=[Moved], delivery_timeout=5):
    @akter.command
    async def deposit(self, cents: int, note: str = "") -> int:
        self.state.cents += cents
        self.emit(Moved(cents=cents))
        self.broadcast("chat", {"deposit": cents, "note": note})
        return self.state.cents

    @akter.command
    async def touch(self) -> int:
        """Commits without changing the balance (a version bump the watch must not repeat)."""
        self.state.owner = self.state.owner or "someone"
        return self.state.cents

    @akter.command(errors=(Refused,))
    async def refuse_after_broadcast(self) -> None:
        self.state.cents += 1_000_000
        self.broadcast("chat", {"never": True})
        raise Refused()

    @akter.command
    async def shout(self, text: str) -> None:
        self.broadcast("chat", {"text": text})

    @akter.command
    async def shout_model(self) -> str:
        """A model is sent as its JSON form; a bad topic is refused at the call, catchably."""
        self.broadcast("chat", Moved(cents=1))
        try:
            self.broadcast("bad topic!", 1)
        except akter.ActorError as exc:
            return exc.code or ""
        return "accepted"

    @akter.query(watch=True)
    async def balance(self) -> int:
        return self.state.cents

    @akter.query(watch=True)
    async def above(self, floor: int) -> bool:
        return self.state.cents > floor

    @akter.query
    async def plain(self) -> int:
        return self.state.cents

    @akter.query(watch=True)
    async def counted(self) -> int:
        """Counts its runs: how many reads the watches of it made."""
        RUNS["counted"] += 1
        return self.state.cents


def owner_only(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: AccessKind) -> bool:
    """A user reads only the actor named after them (in their own tenant: the credential's)."""
    return isinstance(caller, akter.System) or (
        isinstance(caller, akter.User) and caller.subject == ref.id
    )


class Private(akter.Actor[Balance], access=owner_only):
    @akter.command
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        self.broadcast("chat", {"deposit": cents})
        return self.state.cents

    @akter.query(watch=True)
    async def balance(self) -> int:
        return self.state.cents


ACTORS = [Account, Private]
