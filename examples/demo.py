"""akter demo: bank accounts as durable actors on PostgreSQL.

Run it with ``make demo`` (or ``.venv/bin/python examples/demo.py``). With no
``AKTER_DATABASE_URL`` it starts an embedded PostgreSQL under ``./.akter`` (or
``$AKTER_DATA_DIR``) and stops it on exit; the first run also initialises the server. Every run
uses fresh account ids, so the demo can be run again and again on one database.

What it shows, step by step (a table is printed at the end):

* opening accounts (a ``creates=True`` command) and depositing into them;
* an idempotent retry: the same command id sent twice commits once, the second call replays the
  stored result;
* a declared error (``InsufficientFunds``) that is stored in the receipt and replays as the same
  class with the same fields — even after the balance changed;
* ``NotCreated`` for an account that was never opened;
* ``CommandConflict`` when a command id is reused with a different payload;
* 50 concurrent deposits on one account: an exact final balance, and the actor row's ``version``
  (bumped once per committed transaction, so batching shows up as fewer bumps than deposits);
* tenants: the same account id in two tenants is two different actors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field, PositiveInt
from rich.console import Console
from rich.table import Table

import akter

HISTORY_LENGTH = 5
CONCURRENT_DEPOSITS = 50

# --- the actor ---------------------------------------------------------------------------------


class Entry(BaseModel):
    """One line of an account's history."""

    kind: Literal["open", "deposit", "withdraw"]
    cents: int
    balance: int


class AccountState(BaseModel):
    """The durable state of an account (a pydantic model with defaults)."""

    owner: str = ""
    balance: int = 0
    postings: int = 0  # operations applied so far (history keeps only the last few)
    history: list[Entry] = Field(default_factory=list)

    def post(self, kind: Literal["open", "deposit", "withdraw"], cents: int) -> Posting:
        self.postings += 1
        self.history = [*self.history, Entry(kind=kind, cents=cents, balance=self.balance)][
            -HISTORY_LENGTH:
        ]
        return Posting(seq=self.postings, balance=self.balance)


class Posting(BaseModel):
    """What a successful deposit or withdrawal returns (stored in its receipt)."""

    seq: int
    balance: int


class InsufficientFunds(akter.DeclaredError):
    """A declared business error: stored in the receipt and replayed with its fields."""

    balance: int
    requested: int


class Account(akter.Actor[AccountState]):
    """A bank account. In-process calls run as ``System``, which the default access allows."""

    @akter.command(creates=True)
    async def open(self, owner: str) -> Posting:
        self.state.owner = owner
        return self.state.post("open", 0)

    @akter.command
    async def deposit(self, cents: PositiveInt) -> Posting:
        self.state.balance += cents
        return self.state.post("deposit", cents)

    @akter.command(errors=[InsufficientFunds])
    async def withdraw(self, cents: PositiveInt) -> Posting:
        if cents > self.state.balance:
            raise InsufficientFunds(balance=self.state.balance, requested=cents)
        self.state.balance -= cents
        return self.state.post("withdraw", cents)

    @akter.query
    async def balance(self) -> int:
        return self.state.balance

    @akter.query
    async def statement(self) -> AccountState:
        # A copy: a query's ``self.state`` is a read-only view of the committed state.
        return self.state.model_copy(deep=True)


# --- the scenario ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One step of the demo, as printed in the table."""

    step: int
    what: str
    command: str
    command_id: str  # shortened for display
    result: str
    replayed: bool | None  # None: not applicable (an error before any handler ran, a summary)
    balance: int | None  # the account's balance after the step (None: not opened)
    error: str | None = None  # the error's class name (or ActorError reason), if any


def short_id(command_id: str) -> str:
    """``v1.<issued>.<expires>.<uuid>`` → the uuid's first 8 hex digits."""
    return "…" + command_id.rsplit(".", 1)[-1][:8]


def describe(outcome: Any) -> str:
    if isinstance(outcome, Posting):
        return f"ok: posting #{outcome.seq}"
    if isinstance(outcome, akter.ActorError):
        return f"ActorError {outcome.reason}"
    if isinstance(outcome, akter.DeclaredError):
        fields = ", ".join(f"{k}={v}" for k, v in outcome.fields.items())
        return f"{type(outcome).__name__}({fields})"
    return repr(outcome)


def deposit(cents: int) -> Callable[[Account], Awaitable[Posting]]:
    """``lambda a: a.deposit(cents)``, with ``cents`` bound now (for use in loops)."""
    return lambda account: account.deposit(cents)


class Demo:
    """Runs the scenario against a started runtime and records one row per step."""

    def __init__(self, runtime: akter.Runtime) -> None:
        self.runtime = runtime
        self.rows: list[Row] = []
        self.suffix = uuid.uuid4().hex[:8]

    def account(self, name: str, tenant: str = "default") -> Account:
        return self.runtime.get(Account, f"{name}-{self.suffix}", tenant=tenant)

    async def postings(self, account: Account) -> int | None:
        try:
            return (await account.statement()).postings
        except akter.ActorError as exc:
            if exc.reason == "NotCreated":
                return None
            raise

    async def step(
        self,
        what: str,
        label: str,
        account: Account,
        call: Callable[[Account], Awaitable[Any]],
        *,
        command_id: str | None = None,
        replayed: bool | None = None,
    ) -> Any:
        """Run one command with an explicit command id and record what happened.

        ``replayed`` is derived from evidence when not given: a successful call that did not
        advance the account's posting counter was answered from its receipt.
        """
        cid = command_id or await self.runtime.mint_command_id()
        before = await self.postings(account)
        outcome: Any
        error: str | None = None
        try:
            outcome = await call(account.with_command_id(cid))
        except akter.ActorError as exc:
            outcome, error = exc, exc.reason
        except akter.DeclaredError as exc:
            outcome, error = exc, type(exc).__name__
        after = await self.postings(account)
        if replayed is None and error is None:
            replayed = before == after
        balance = None if after is None else await account.balance()
        self.rows.append(
            Row(
                len(self.rows) + 1,
                what,
                label,
                short_id(cid),
                describe(outcome),
                replayed,
                balance,
                error,
            )
        )
        return outcome

    async def run(self) -> list[Row]:
        alice, bob = self.account("alice"), self.account("bob")

        # 1. Open two accounts and deposit into them.
        await self.step("open an account", "alice.open('Alice')", alice, lambda a: a.open("Alice"))
        await self.step("open an account", "bob.open('Bob')", bob, lambda a: a.open("Bob"))
        await self.step("deposit", "alice.deposit(10_000)", alice, lambda a: a.deposit(10_000))
        await self.step("deposit", "bob.deposit(2_500)", bob, lambda a: a.deposit(2_500))

        # 2. Idempotent retry: one command id, sent twice; the second call is a replay.
        cid = await self.runtime.mint_command_id()
        first = await self.step(
            "deposit, pinned id",
            "alice.deposit(500)",
            alice,
            lambda a: a.deposit(500),
            command_id=cid,
        )
        again = await self.step(
            "retry, same id",
            "alice.deposit(500)",
            alice,
            lambda a: a.deposit(500),
            command_id=cid,
        )
        assert again == first, "a replay returns the stored result"

        # 3. A declared error, then its replay with the same id — after the balance changed.
        cid = await self.runtime.mint_command_id()
        refused = await self.step(
            "withdraw too much",
            "bob.withdraw(5_000)",
            bob,
            lambda a: a.withdraw(5_000),
            command_id=cid,
            replayed=False,
        )
        await self.step("deposit", "bob.deposit(5_000)", bob, lambda a: a.deposit(5_000))
        # A fresh execution would now succeed; the receipt makes the retry fail identically.
        replayed = await self.step(
            "retry, same id (funds OK)",
            "bob.withdraw(5_000)",
            bob,
            lambda a: a.withdraw(5_000),
            command_id=cid,
        )
        # Evidence of a replay: the same error, with the old balance, although funds now suffice.
        bob_balance = await bob.balance()
        if replayed == refused and isinstance(replayed, InsufficientFunds):
            self.rows[-1] = dataclasses.replace(
                self.rows[-1], replayed=bob_balance >= replayed.requested
            )
        await self.step(
            "withdraw (new id)", "bob.withdraw(5_000)", bob, lambda a: a.withdraw(5_000)
        )

        # 4. NotCreated: commands on an account that was never opened are refused.
        ghost = self.account("ghost")
        await self.step(
            "deposit, never opened", "ghost.deposit(100)", ghost, lambda a: a.deposit(100)
        )

        # 5. CommandConflict: an id already used for deposit(700) cannot carry deposit(900).
        cid = await self.runtime.mint_command_id()
        await self.step(
            "deposit, pinned id",
            "alice.deposit(700)",
            alice,
            lambda a: a.deposit(700),
            command_id=cid,
        )
        await self.step(
            "same id, other amount",
            "alice.deposit(900)",
            alice,
            lambda a: a.deposit(900),
            command_id=cid,
        )

        # 6. 50 concurrent deposits on one account: exact balance; fewer version bumps (batching).
        carol = self.account("carol")
        await self.step("open an account", "carol.open('Carol')", carol, lambda a: a.open("Carol"))
        version_before = await self.version(carol)
        started = time.perf_counter()
        postings = await asyncio.gather(*(carol.deposit(100) for _ in range(CONCURRENT_DEPOSITS)))
        elapsed_ms = (time.perf_counter() - started) * 1000
        version_after = await self.version(carol)
        seqs = sorted(p.seq for p in postings)
        assert seqs == list(range(2, CONCURRENT_DEPOSITS + 2)), "each deposit applied once"
        self.rows.append(
            Row(
                len(self.rows) + 1,
                f"{CONCURRENT_DEPOSITS} concurrent deposits",
                f"gather({CONCURRENT_DEPOSITS} × carol.deposit(100))",
                f"{CONCURRENT_DEPOSITS} ids",
                f"ok in {elapsed_ms:.0f} ms; row version {version_before} → {version_after}"
                f" ({version_after - version_before} transactions)",
                False,
                await carol.balance(),
            )
        )

        # 7. Tenants: the same account id in two tenants is two separate actors.
        for tenant, cents in (("acme", 1_000), ("globex", 7_000)):
            shared = self.account("shared", tenant=tenant)
            await self.step(
                f"open in tenant {tenant!r}",
                "shared.open('Shared')",
                shared,
                lambda a: a.open("Shared"),
            )
            await self.step(
                f"deposit in tenant {tenant!r}",
                f"shared.deposit({cents:_})",
                shared,
                deposit(cents),
            )
        return self.rows

    async def version(self, account: Account) -> int:
        """The actor row's ``version``: state lives in your PostgreSQL, queryable with SQL."""
        ref = account.ref
        query = sql.SQL(
            "SELECT version FROM {}.actors WHERE routing_key = %s AND tenant_id = %s"
            " AND actor_type = %s AND actor_id = %s"
        ).format(sql.Identifier(self.runtime.schema))
        params = (self.runtime.routing_key(ref), ref.tenant, ref.type, ref.id)
        async with await psycopg.AsyncConnection.connect(self.runtime.database_url) as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])


async def main(database_url: str | None = None, *, schema: str = "akter") -> list[Row]:
    """Run the scenario and return its rows.

    Args:
        database_url: A PostgreSQL URL; ``None`` means ``$AKTER_DATABASE_URL``, else the embedded
            server under ``./.akter``.
        schema: The schema holding akter's tables.
    """
    async with akter.Runtime(actors=[Account], database_url=database_url, schema=schema) as rt:
        return await Demo(rt).run()


def render(rows: list[Row]) -> Table:
    table = Table(
        title="akter demo: accounts",
        title_style="bold",
        caption=(
            "replayed? = answered from the command id's receipt, the handler did not run; "
            "balance = after the step; row version = +1 per committed transaction."
        ),
    )
    table.add_column("#", justify="right")
    table.add_column("step")
    table.add_column("command")
    table.add_column("command id", style="dim", no_wrap=True)
    table.add_column("result", min_width=48)
    table.add_column("replayed?", justify="center")
    table.add_column("balance", justify="right")
    for row in rows:
        result = f"[red]{row.result}[/red]" if row.error else row.result
        replayed = {None: "—", True: "[bold green]yes[/bold green]", False: "no"}[row.replayed]
        balance = "—" if row.balance is None else f"{row.balance:,}"
        table.add_row(
            str(row.step), row.what, row.command, row.command_id, result, replayed, balance
        )
    return table


def run() -> int:
    console = Console()
    if not console.is_terminal:  # piped or captured: don't squeeze the table into 80 columns
        console = Console(width=160)
    started = time.perf_counter()
    with console.status("Running the demo (the first run initialises the embedded PostgreSQL) …"):
        rows = asyncio.run(main())
    console.print(render(rows))
    console.print(f"Done in {time.perf_counter() - started:.1f} s.", style="dim")
    return 0


if __name__ == "__main__":
    sys.exit(run())
