"""akter served over HTTP on its own: ``uvicorn examples.http_service:app``.

Bank accounts that signed-in callers use, and a public exchange-rate board anyone may read. The
app owns the runtime's lifecycle (``lifespan=True``): uvicorn starts it and drains it on
shutdown. Callers sign in with an API key from ``$BANK_API_KEYS`` (``key=subject@tenant``,
comma-separated)::

    BANK_API_KEYS='alice-key=alice@acme' uvicorn examples.http_service:app

    curl -X POST localhost:8000/command-ids -H 'X-API-Key: alice-key'
    curl -X POST localhost:8000/actors/Account/alice/deposit -H 'X-API-Key: alice-key' \\
         -H 'Idempotency-Key: <the command id>' -H 'Content-Type: application/json' \\
         -d '{"cents": 500}'
    curl -X POST localhost:8000/actors/Rates/_/queries/rate -H 'Content-Type: application/json' \\
         -d '{"currency": "EUR"}'

The same runtime and provider serve with the runner CLI:
``akter serve examples.http_service:runtime --http 127.0.0.1:8000 --auth
examples.http_service:auth``. With no ``$AKTER_DATABASE_URL`` the runtime starts an embedded
PostgreSQL; ``$BANK_SCHEMA`` names the schema of its tables (default ``akter``).
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, Field

import akter
import akter.http


class Balance(BaseModel):
    cents: int = 0


class Deposited(akter.Event, tag="bank.Deposited"):
    cents: int
    balance: int


class InsufficientFunds(akter.DeclaredError, tag="bank.InsufficientFunds"):
    balance: int
    asked: int


Cents = Annotated[int, Field(ge=1, le=100_000_000)]


def owner_only(caller: akter.Caller, ref: akter.ActorRef, member: str, kind: str) -> bool:
    """A signed-in user uses the account named after them; in-process code uses any."""
    if isinstance(caller, akter.System):
        return True
    return isinstance(caller, akter.User) and caller.subject == ref.id


class Account(akter.Actor[Balance], access=owner_only):
    """A bank account: deposit, withdraw, read the balance."""

    @akter.command
    async def deposit(self, cents: Cents) -> int:
        """Add cents; returns the balance."""
        self.state.cents += cents
        self.emit(Deposited(cents=cents, balance=self.state.cents))
        return self.state.cents

    @akter.command(errors=[InsufficientFunds])
    async def withdraw(self, cents: Cents) -> int:
        """Take cents, or fail with InsufficientFunds; returns the balance."""
        if cents > self.state.cents:
            raise InsufficientFunds(balance=self.state.cents, asked=cents)
        self.state.cents -= cents
        return self.state.cents

    @akter.query
    async def balance(self) -> Balance:
        """The committed balance."""
        return self.state


class Board(BaseModel):
    rates: dict[str, float] = Field(default_factory=lambda: {"EUR": 0.92, "GBP": 0.79})


class Rates(akter.Actor[Board], singleton=True, access=akter.public):
    """Exchange rates per US dollar: public, so anonymous callers may read them."""

    @akter.query
    async def rate(self, currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")]) -> float | None:
        """The rate of ``currency``, or null when the board has none."""
        return self.state.rates.get(currency)


def _keys(spec: str) -> dict[str, tuple[str, str]]:
    """``key=subject@tenant,...`` as ``ApiKeys`` wants it."""
    keys: dict[str, tuple[str, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, who = item.partition("=")
        subject, _, tenant = who.partition("@")
        keys[key] = (subject, tenant or "default")
    return keys


runtime = akter.Runtime(actors=[Account, Rates], schema=os.environ.get("BANK_SCHEMA", "akter"))
auth = akter.http.ApiKeys(_keys(os.environ.get("BANK_API_KEYS", "")))
app = akter.http.app(runtime, auth=auth, lifespan=True, title="bank")
