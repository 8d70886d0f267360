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

Then a second part, orders and inventory (tables of the outbox, stock and events at the end):

* orders reserve stock from inventory actors by intent (``self.send(Inventory.reserve, ...)``):
  the rows are committed to the outbox with the turn, and a relay delivers them after ``COMMIT``
  — here a second runner, started once the first snapshot of the outbox was taken;
* a reminder timer per order (``self.later(after=..., key="remind")``): a confirmed order cancels
  it (``cancel_timer``); a short order stages the key again, which replaces the pending row with
  one due sooner, and that one fires;
* live event feeds: one task per order runs ``async for record in handle.events()`` and prints
  each event as it commits, on whichever runner it commits.

Then a third part, payments as jobs (tables of each job's fate, the dead letters and the
per-customer concurrency at the end):

* each payment is a job (``self.enqueue(Customer.charge, payment, key=payment_id)``) run after
  the turn commits by an executor that calls a scripted ``FakeProvider``, with the job id as the
  idempotency key. Its outcome comes back to the customer through one route, under command
  id = job id: ``on_success``, ``on_dead_letter`` or ``on_cancelled``;
* the provider approves, declines (``akter.JobFailure``: known not applied, so a dead letter
  that is *not* ambiguous), declines for good (``final=True``), resets the connection or hangs
  past the 0.6 s timeout (the provider may have applied it: an *ambiguous* dead letter if every
  attempt ends so);
* card charges have ``per_actor=2``: at most two live provider calls per customer, the others
  wait in FIFO order; other customers are not held back;
* a bank transfer hangs on runner W1, which stops mid-call. W1 writes nothing more, so the
  row stays running until its 3 s lease ends; runner W2 then runs attempt 2 under the same
  job id;
* a transfer is cancelled mid-call (``self.cancel_job(key)``): the runner running it sees the
  cancellation at its next lease renewal, interrupts the call and reports it once, as
  ``Cancelled(outcome=Unknown)``, which is ambiguous;
* the operator's side: ``runtime.dead_letters`` lists the letters, retries one as a new job
  and discards another (the same as ``akter dead-letters list|retry|discard``).

It prints a live log of provider calls and of akter's own job messages (the retries and dead
letters above are the warnings it expects).

Then a fourth part, nightly billing (tables of the tick, the bill, the registry and the loop's
owners at the end), in a schema of its own that is dropped at the end:

* ``Billing`` is a singleton (``singleton=True``) with a nightly ``@akter.schedule("0 2 * * *",
  tz="Europe/Zurich")`` on its zero-argument ``bill`` command, which withdraws each account's fee
  by intent, and an ``async def run(self)`` loop that records each step with its runner's id;
* a nightly tick cannot fire in a short demo on the real clock, so every runner of this part is
  started with the same ``Runtime(clock_offset=...)``: the framework clock reads a few seconds
  before 02:00 in that zone. The tick row waits in the outbox until then; the relay delivers it
  as ``bill`` with caller ``System(source="cron")`` and rewrites it for the next night;
* a second runner process (``demo.py --runner``, R1) shares the database and starts first, so it
  holds the loop's lease (``Runtime(singleton_lease=3.5)``; 35 s by default). The demo kills it
  with SIGKILL: it releases nothing, and R2 (in this process) takes the loop over once R1's lease
  has ended. The runner registry is shown before and after; the ledger's steps show the loop
  ran on one runner at a time.

Then a fifth part, evolving the code over durable data: it lives in ``examples/demo_evolution.py``,
whose docstring says what it shows.

Then a sixth part, workflows: it lives in ``examples/demo_workflows.py``. An order workflow
charges through a flaky provider, waits for a shipment signal with a timeout, is SIGKILLed in a
child runner while it prints a label, and is resumed by another runner; it prints the step
journal before and after.

Then a seventh part, subscriptions: it lives in ``examples/demo_subscriptions.py``. A read model
(a singleton subscribed to every till's sales, ``start="start"``) is added by a runner that
starts beside a running one; it is rebuilt from the tills' history, keeps up with the new sales,
and a rewind of its feeds is redelivered without applying a sale twice.

Every part runs in a schema of its own, dropped at the end once its runtimes have stopped: a
runtime that shares a schema with actor types no live runner hosts warns about them as orphans
(evolution E2), and the demo leaves nothing behind in the schema ``akter`` that the docs'
examples use. Without ``AKTER_DATABASE_URL``, one embedded server runs for the whole demo.

At the end it says what you saw and where to read more (:data:`NEXT_STEPS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, LiteralString
from zoneinfo import ZoneInfo

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field, PositiveInt
from rich.console import Console, Group
from rich.table import Table

# As a script, examples/ is sys.path[0] and not a package: the repository root makes it one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import akter
import akter.jobs
from akter.actor import definition_of
from akter.operators.database import EmbeddedPostgres, default_data_dir
from akter.schedules import next_fire
from akter.testing.provider import (
    FakeProvider,
    ProviderCall,
    Step,
    fail,
    hang,
    raises,
    succeed,
)
from examples.runner_process import CHILD_WITHIN, RunnerProcess

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


@contextlib.asynccontextmanager
async def demo_database(database_url: str | None) -> AsyncGenerator[str, None]:
    """The demo's database: ``database_url``, else ``$AKTER_DATABASE_URL``, else the embedded
    server under ``./.akter`` (or ``$AKTER_DATA_DIR``), started for as long as the block runs."""
    url = database_url or os.environ.get("AKTER_DATABASE_URL")
    if url:
        yield url
        return
    server = EmbeddedPostgres(default_data_dir())
    url = await asyncio.to_thread(server.start)
    try:
        yield url
    finally:
        await asyncio.to_thread(server.stop)


@contextlib.asynccontextmanager
async def own_schema(url: str, schema: str | None, prefix: str) -> AsyncGenerator[str, None]:
    """``schema`` if given (its caller drops it), else a fresh ``<prefix>_<hex>``, dropped when
    the block ends: open the runtimes inside the block, so that they stop before the drop."""
    if schema:
        yield schema
        return
    fresh = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        yield fresh
    finally:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(fresh))
            )


async def main(database_url: str | None = None, *, schema: str | None = None) -> list[Row]:
    """Run the scenario and return its rows.

    Args:
        database_url: A PostgreSQL URL; ``None`` means ``$AKTER_DATABASE_URL``, else the embedded
            server under ``./.akter``.
        schema: The schema holding akter's tables (default: a fresh one, dropped at the end).
    """
    async with (
        demo_database(database_url) as url,
        own_schema(url, schema, "accounts") as schema,
        akter.Runtime(actors=[Account], database_url=url, schema=schema) as rt,
    ):
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


# --- part 2: orders, inventory, intents, timers and a live event feed -------------------------

#: The reminder staged when an order is placed: long, so it sits in the outbox where you can see it.
REMIND_AFTER = 3600.0
#: The reminder that replaces it when stock is short: short, so you can watch it fire.
SHORT_REMIND_AFTER = 1.5
#: Relay passes and feed polls of the demo's runners (the default is 1 s).
POLL = 0.25
#: Longest wait for something the scenario expects (the demo fails instead of hanging).
EXPECT_WITHIN = 10.0

STOCK = {"apple": 10, "pear": 5, "plum": 2}
ORDERS = {"A-1": {"apple": 2, "pear": 1}, "B-2": {"plum": 5}}


def lines_text(lines: dict[str, int]) -> str:
    # Sorted: jsonb keeps object keys in its own order (shorter keys first), not insertion order.
    return ", ".join(f"{sku} × {qty}" for sku, qty in sorted(lines.items()))


class OrderPlaced(akter.Event):
    """An order was accepted; its reservations are on their way to the inventory actors."""

    lines: dict[str, int]

    def summary(self) -> str:
        return lines_text(self.lines)


class LineReserved(akter.Event):
    """An inventory actor held stock for one line."""

    sku: str
    qty: int

    def summary(self) -> str:
        return f"{self.sku} × {self.qty} held"


class LineShort(akter.Event):
    """An inventory actor could not hold a line; the reminder is moved closer."""

    sku: str
    wanted: int
    available: int

    def summary(self) -> str:
        return f"{self.sku}: wanted {self.wanted}, {self.available} in stock; reminder moved up"


class OrderConfirmed(akter.Event):
    """Every line is held; the pending reminder was cancelled in the same turn."""

    lines: int

    def summary(self) -> str:
        return f"all {self.lines} lines held; reminder cancelled"


class ReminderSent(akter.Event):
    """The reminder timer fired for an order that is still waiting."""

    missing: list[str]
    reminders: int

    def summary(self) -> str:
        return f"reminder #{self.reminders}: still missing {', '.join(self.missing)}"


class OrderState(BaseModel):
    """The durable state of an order."""

    lines: dict[str, int] = Field(default_factory=dict)
    held: dict[str, int] = Field(default_factory=dict)
    short: dict[str, int] = Field(default_factory=dict)  # sku → stock when it was refused
    status: Literal["new", "placed", "confirmed", "waiting"] = "new"
    reminders: int = 0


class StockState(BaseModel):
    """The durable state of one SKU's inventory."""

    on_hand: int = 0
    held: dict[str, int] = Field(default_factory=dict)  # order id → quantity held for it


class Inventory(akter.Actor[StockState]):
    """One SKU. Orders reach it only by intent: ``self.send(Inventory.reserve, sku, ...)``."""

    @akter.command
    async def restock(self, qty: PositiveInt) -> int:
        self.state.on_hand += qty
        return self.state.on_hand

    @akter.command(internal=True)
    async def reserve(self, order_id: str, qty: PositiveInt) -> bool:
        # Delivered by the relay, with the intent's id as command id: a redelivery replays.
        if qty > self.state.on_hand:
            self.send(Order.short, order_id, self.id, qty, self.state.on_hand)
            return False
        self.state.on_hand -= qty
        self.state.held[order_id] = qty
        self.send(Order.line_held, order_id, self.id, qty)
        return True

    @akter.query
    async def level(self) -> StockState:
        return self.state.model_copy(deep=True)


class Order(
    akter.Actor[OrderState],
    events=[OrderPlaced, LineReserved, LineShort, OrderConfirmed, ReminderSent],
):
    """An order: reserves stock by intent, keeps one reminder timer keyed ``remind``."""

    @akter.command(creates=True)
    async def place(self, lines: dict[str, PositiveInt]) -> str:
        self.state.lines = dict(lines)
        self.state.status = "placed"
        for sku, qty in lines.items():
            # Written to the outbox with this turn; delivered by a relay after COMMIT.
            self.send(Inventory.reserve, sku, self.id, qty)
        self.later(after=REMIND_AFTER, key="remind").send(Order.remind, self.id)
        self.emit(OrderPlaced(lines=dict(lines)))
        return self.state.status

    @akter.command(internal=True)
    async def line_held(self, sku: str, qty: int) -> str:
        self.state.held[sku] = qty
        self.emit(LineReserved(sku=sku, qty=qty))
        if self.state.held == self.state.lines:
            self.state.status = "confirmed"
            self.cancel_timer("remind")  # deletes the pending reminder row if this turn commits
            self.emit(OrderConfirmed(lines=len(self.state.lines)))
        return self.state.status

    @akter.command(internal=True)
    async def short(self, sku: str, wanted: int, available: int) -> str:
        self.state.short[sku] = available
        self.state.status = "waiting"
        # Staging the same key again replaces the pending reminder: still one row, due sooner.
        self.later(after=SHORT_REMIND_AFTER, key="remind").send(Order.remind, self.id)
        self.emit(LineShort(sku=sku, wanted=wanted, available=available))
        return self.state.status

    @akter.command(internal=True)
    async def remind(self) -> int:
        # A timer whose delivery already started is still delivered once: check the state.
        if self.state.status == "waiting":
            self.state.reminders += 1
            missing = sorted(self.state.short)
            self.emit(ReminderSent(missing=missing, reminders=self.state.reminders))
        return self.state.reminders

    @akter.query
    async def details(self) -> OrderState:
        return self.state.model_copy(deep=True)


@dataclass(frozen=True)
class OutboxRow:
    """One pending outbox row, as seen by SQL at one moment of the scenario."""

    phase: str
    sender: str  # "Order/A-1"
    kind: Literal["intent", "timer"]
    target: str  # "Inventory/apple.reserve"
    timer_key: str | None
    due_in: float  # seconds from the snapshot until the row is due
    intent_id: str


@dataclass(frozen=True)
class SeenEvent:
    """One event as the live feed printed it."""

    order: str
    cursor: str
    tag: str
    summary: str
    at: float  # seconds since the orders part started


@dataclass
class OrdersReport:
    """What the orders part observed."""

    outbox: dict[str, list[OutboxRow]] = field(default_factory=dict)  # phase → rows
    stock: dict[str, StockState] = field(default_factory=dict)
    orders: dict[str, OrderState] = field(default_factory=dict)
    events: list[SeenEvent] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)  # the feed's lines, as printed live


PLACED = "1. placed, no relay yet"
ANSWERED = "2. worker relayed"
REMINDED = "3. reminder fired"


class OrdersDemo:
    """Runs the orders scenario.

    ``front`` takes the calls and does not relay; a second runner (the worker) started halfway
    through delivers the outbox. Both are ordinary runtimes on one schema.
    """

    def __init__(self, front: akter.Runtime, echo: Callable[[str], None]) -> None:
        self.front = front
        self.echo = echo
        self.tenant = f"shop-{uuid.uuid4().hex[:8]}"  # fresh actors on every run
        self.report = OrdersReport()
        self.started = time.perf_counter()
        self._seen = asyncio.Event()

    def order(self, order_id: str) -> Order:
        return self.front.get(Order, order_id, tenant=self.tenant)

    async def follow(self, order_id: str) -> None:
        """The live feed of one order: replay, then print each event as it commits."""
        async for record in self.order(order_id).events():
            seen = SeenEvent(
                order_id,
                record.cursor,
                record.tag,
                record.event.summary(),
                time.perf_counter() - self.started,
            )
            self.report.events.append(seen)
            line = f"  {seen.at:5.2f} s  {order_id} #{seen.cursor}  {seen.tag:<15} {seen.summary}"
            self.report.printed.append(line)
            self.echo(line)
            self._seen.set()

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        """Wait (bounded) until the feed has shown what ``check`` looks for."""
        deadline = time.monotonic() + EXPECT_WITHIN
        while not check():
            self._seen.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"The demo waited {EXPECT_WITHIN} s for {what}.")
            try:
                await asyncio.wait_for(self._seen.wait(), left)
            except TimeoutError:
                pass

    def saw(self, order_id: str, tag: str) -> bool:
        return any(e.order == order_id and e.tag == tag for e in self.report.events)

    async def outbox(self) -> list[dict[str, Any]]:
        """This run's pending outbox rows, straight from SQL."""
        query = sql.SQL(
            "SELECT actor_type, actor_id, kind, target_type, target_id, command, timer_key,"
            " intent_id, due_at_ms - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
            " AS due_in_ms FROM {}.outbox WHERE tenant_id = %s"
            " ORDER BY actor_type, actor_id, timer_key NULLS FIRST, target_id"
        ).format(sql.Identifier(self.front.schema))
        async with await psycopg.AsyncConnection.connect(self.front.database_url) as conn:
            cur = await conn.execute(query, (self.tenant,))
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]

    async def snapshot(self, phase: str) -> None:
        self.report.outbox[phase] = [
            OutboxRow(
                phase=phase,
                sender=f"{r['actor_type']}/{r['actor_id']}",
                kind="timer" if r["timer_key"] is not None else "intent",
                target=f"{r['target_type']}/{r['target_id']}.{r['command']}",
                timer_key=r["timer_key"],
                due_in=int(r["due_in_ms"]) / 1000,
                intent_id=str(r["intent_id"]),
            )
            for r in await self.outbox()
        ]

    async def intents_settled(self) -> None:
        """Wait (bounded) until every untimed intent of this run was delivered and deleted."""
        deadline = time.monotonic() + EXPECT_WITHIN
        while any(r["timer_key"] is None for r in await self.outbox()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Intents still pending after {EXPECT_WITHIN} s.")
            await asyncio.sleep(0.05)

    async def run(self) -> OrdersReport:
        for sku, qty in STOCK.items():
            await self.front.get(Inventory, sku, tenant=self.tenant).restock(qty)
        feeds = [
            asyncio.create_task(self.follow(order_id), name=f"feed {order_id}")
            for order_id in ORDERS
        ]
        try:
            # 1. Place the orders on the front runner: reservations and reminders wait in the
            #    outbox, committed with the turns that staged them.
            for order_id, lines in ORDERS.items():
                await self.order(order_id).place(lines)
            await self.until("both OrderPlaced events", lambda: len(self.report.events) >= 2)
            await self.snapshot(PLACED)

            # 2. A worker runner with the relay on delivers them: stock is held for A-1, which
            #    cancels its reminder; B-2 is short, which replaces its reminder with a sooner one.
            self.echo(f"  {time.perf_counter() - self.started:5.2f} s  (worker runner starts)")
            async with akter.Runtime(
                actors=[Order, Inventory],
                database_url=self.front.database_url,
                schema=self.front.schema,
                poll=POLL,
            ):
                await self.until(
                    "A-1 confirmed and B-2 short",
                    lambda: self.saw("A-1", "OrderConfirmed") and self.saw("B-2", "LineShort"),
                )
                await self.intents_settled()
                await self.snapshot(ANSWERED)

                # 3. The replacement reminder fires SHORT_REMIND_AFTER seconds later.
                await self.until("B-2's reminder", lambda: self.saw("B-2", "ReminderSent"))
                await self.snapshot(REMINDED)
        finally:
            for feed in feeds:
                feed.cancel()
            await asyncio.gather(*feeds, return_exceptions=True)
        for sku in STOCK:
            self.report.stock[sku] = await self.front.get(
                Inventory, sku, tenant=self.tenant
            ).level()
        for order_id in ORDERS:
            self.report.orders[order_id] = await self.order(order_id).details()
        return self.report


async def orders_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> OrdersReport:
    """Run the orders scenario and return what it observed.

    Args:
        database_url: As for :func:`main`.
        schema: As for :func:`main`.
        echo: Prints one line of the live event feed.
    """
    async with (
        demo_database(database_url) as url,
        own_schema(url, schema, "orders") as schema,
        akter.Runtime(
            actors=[Order, Inventory],
            database_url=url,
            schema=schema,
            relay=False,
            poll=POLL,
        ) as front,
    ):
        return await OrdersDemo(front, echo).run()


def fate(report: OrdersReport, row: OutboxRow) -> str:
    """What became of an outbox row by the next snapshot."""
    phases = list(report.outbox)
    position = phases.index(row.phase)
    if position + 1 == len(phases):
        return ""
    later = report.outbox[phases[position + 1]]
    if any(r.intent_id == row.intent_id for r in later):
        return "still pending"
    if row.kind == "intent":
        return "delivered, then deleted"
    same_key = [r for r in later if r.sender == row.sender and r.timer_key == row.timer_key]
    if same_key:
        return f"replaced by {short_id(same_key[0].intent_id)} (same key)"
    order = report.orders.get(row.sender.split("/", 1)[1])
    if order is not None and order.status == "confirmed":
        return "cancelled (cancel_timer)"
    return "fired, then deleted"


def render_orders(report: OrdersReport) -> Group:
    outbox = Table(
        title="akter demo: orders — the outbox, read with SQL",
        title_style="bold",
        caption=(
            "intent = self.send(...), delivered after commit; timer = self.later(...).send(...) "
            "with a key; due in = seconds from the snapshot; then = by the next snapshot."
        ),
    )
    for column in ("phase", "sender", "kind", "target", "key", "due in", "row id", "then"):
        outbox.add_column(column, justify="right" if column == "due in" else "left")
    for phase, rows in report.outbox.items():
        if not rows:
            outbox.add_row(phase, "[dim]— no pending rows —[/dim]", *[""] * 6)
        for i, row in enumerate(rows):
            outbox.add_row(
                phase if i == 0 else "",
                row.sender,
                row.kind,
                row.target,
                row.timer_key or "",
                "now" if row.due_in <= 0 else f"{row.due_in:,.1f} s",
                short_id(row.intent_id),
                fate(report, row),
                end_section=i == len(rows) - 1,
            )
    stock = Table(title="inventory after the run", title_style="bold")
    for column in ("sku", "stock before", "on hand", "held for"):
        stock.add_column(column, justify="left" if column in ("sku", "held for") else "right")
    for sku, level in report.stock.items():
        held = ", ".join(f"{order} × {qty}" for order, qty in level.held.items()) or "—"
        stock.add_row(sku, str(STOCK[sku]), str(level.on_hand), held)
    orders = Table(title="orders after the run", title_style="bold")
    for column in ("order", "lines", "status", "reminders"):
        orders.add_column(column)
    for order_id, state in report.orders.items():
        orders.add_row(order_id, lines_text(state.lines), state.status, str(state.reminders))
    events = Table(
        title="events seen by the live feeds (handle.events())",
        title_style="bold",
        caption="cursor = the event's seq; a feed can resume with events(after=cursor).",
    )
    for column in ("at", "order", "cursor", "event", "detail"):
        events.add_column(column, justify="right" if column in ("at", "cursor") else "left")
    for seen in report.events:
        events.add_row(f"{seen.at:.2f} s", seen.order, seen.cursor, seen.tag, seen.summary)
    return Group(outbox, stock, orders, events)


# --- part 3: payments, jobs, dead letters and cancellation ------------------------------------

#: The job lease of the payments runners: the smallest allowed, so a takeover fits in the demo.
LEASE = 3.0
#: How often a running attempt renews its lease (and so sees a cancellation from elsewhere).
CANCEL_CHECK = 1.0
#: Relay and executor passes of the payments runners.
PAYMENTS_POLL = 0.1
#: A card charge's time limit per attempt: a provider that hangs is cut off after this.
CHARGE_TIMEOUT = 0.6
#: Live card charges per customer, across all runners (``per_actor``).
CHARGE_CAP = 2
#: Attempts of a card charge.
CHARGE_ATTEMPTS = 3
#: A bank transfer's time limit per attempt: longer than the lease, so renewals keep it.
TRANSFER_TIMEOUT = 10.0


class Provider(FakeProvider):
    """The scripted fake provider, also telling a listener about each call as it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.listener: Callable[[ProviderCall], None] | None = None

    async def __call__(self, call: akter.JobCall, key: str | None = None) -> Any:
        try:
            return await super().__call__(call, key)
        finally:
            if self.listener is not None:
                self.listener(
                    next(
                        c
                        for c in reversed(self.calls)
                        if (c.job_id, c.attempt) == (call.job_id, call.attempt)
                    )
                )


#: The payment provider every executor calls: a scripted fake that records each call.
PROVIDER = Provider()


class Payment(BaseModel):
    """A job's payload: one payment to make with the provider."""

    payment_id: str
    cents: PositiveInt


class Charged(BaseModel):
    """A job's result: the provider's charge id, and which attempt got it."""

    payment_id: str
    charge_id: str
    attempt: int


class Outcome(BaseModel):
    """One report a route delivered to the customer (its command id is the job id)."""

    payment_id: str
    job_id: str
    route: Literal["on_success", "on_dead_letter", "on_cancelled"]
    attempts: int
    ambiguous: bool
    detail: str  # the charge id, the cause, or the cancelled outcome


class Wallet(BaseModel):
    """The durable state of a customer: every report its jobs' routes delivered."""

    outcomes: list[Outcome] = Field(default_factory=list)


async def call_provider(call: akter.JobCall, payment: Payment) -> Charged:
    """What both executors do: one provider call, with ``call.job_id`` as idempotency key."""
    charge_id = await PROVIDER(call, key=payment.payment_id)
    return Charged(payment_id=payment.payment_id, charge_id=str(charge_id), attempt=call.attempt)


def cancelled_outcome(job_id: str, report: akter.jobs.Cancelled[Payment, Charged]) -> Outcome:
    outcome = report.outcome
    detail = (
        f"Succeeded: {outcome.value.charge_id}"
        if isinstance(outcome, akter.jobs.Succeeded)
        else f"{outcome.kind}: {outcome.cause}"
    )
    return Outcome(
        payment_id=report.job.payment_id,
        job_id=job_id,
        route="on_cancelled",
        attempts=report.attempts,
        ambiguous=report.ambiguous,
        detail=detail,
    )


def dead_outcome(job_id: str, letter: akter.DeadLetter[Payment]) -> Outcome:
    return Outcome(
        payment_id=letter.job.payment_id,
        job_id=job_id,
        route="on_dead_letter",
        attempts=letter.attempts,
        ambiguous=letter.ambiguous,
        detail=letter.cause,
    )


def success_outcome(job_id: str, result: Charged) -> Outcome:
    return Outcome(
        payment_id=result.payment_id,
        job_id=job_id,
        route="on_success",
        attempts=result.attempt,
        ambiguous=False,
        detail=result.charge_id,
    )


class Customer(akter.Actor[Wallet]):
    """A customer paying by card (a capped queue of charges) or by bank transfer."""

    @akter.command
    async def pay(self, payment_id: str, cents: PositiveInt) -> str:
        # Staged with the turn: nothing runs unless it commits. The key lets us cancel it.
        payment = Payment(payment_id=payment_id, cents=cents)
        return self.enqueue(Customer.charge, payment, key=payment_id)

    @akter.command
    async def wire(self, payment_id: str, cents: PositiveInt) -> str:
        payment = Payment(payment_id=payment_id, cents=cents)
        return self.enqueue(Customer.transfer, payment, key=payment_id)

    @akter.command
    async def cancel_payment(self, payment_id: str) -> None:
        self.cancel_job(payment_id)  # applied if this turn commits

    @akter.query
    async def outcomes(self) -> list[Outcome]:
        return [o.model_copy() for o in self.state.outcomes]

    # --- card charges: short timeout, three attempts, at most CHARGE_CAP live per customer ----

    @akter.job(
        attempts=CHARGE_ATTEMPTS,
        backoff=(0.05, 0.2),
        timeout=CHARGE_TIMEOUT,
        per_actor=CHARGE_CAP,
    )
    async def charge(call: akter.JobCall, payment: Payment) -> Charged:
        return await call_provider(call, payment)

    @charge.on_success
    async def charged(self, result: Charged) -> None:
        self.state.outcomes.append(success_outcome(self.command_id, result))

    @charge.on_dead_letter
    async def charge_dead(self, letter: akter.DeadLetter[Payment]) -> None:
        self.state.outcomes.append(dead_outcome(self.command_id, letter))

    @charge.on_cancelled
    async def charge_cancelled(self, report: akter.jobs.Cancelled[Payment, Charged]) -> None:
        self.state.outcomes.append(cancelled_outcome(self.command_id, report))

    # --- bank transfers: a long timeout (beyond the lease), two attempts, uncapped ------------

    @akter.job(attempts=2, backoff=(0.05, 0.2), timeout=TRANSFER_TIMEOUT)
    async def transfer(call: akter.JobCall, payment: Payment) -> Charged:
        return await call_provider(call, payment)

    @transfer.on_success
    async def transferred(self, result: Charged) -> None:
        self.state.outcomes.append(success_outcome(self.command_id, result))

    @transfer.on_dead_letter
    async def transfer_dead(self, letter: akter.DeadLetter[Payment]) -> None:
        self.state.outcomes.append(dead_outcome(self.command_id, letter))

    @transfer.on_cancelled
    async def transfer_cancelled(self, report: akter.jobs.Cancelled[Payment, Charged]) -> None:
        self.state.outcomes.append(cancelled_outcome(self.command_id, report))


#: What the fake provider does on each call, by label.
STEPS: dict[str, Callable[[str], Step]] = {
    "approve": lambda pid: succeed(f"ch_{pid}", after=0.05),
    "approve slowly": lambda pid: succeed(f"ch_{pid}", after=0.2),
    "decline": lambda pid: fail("card declined: do not honor"),
    "report stolen": lambda pid: fail("card reported stolen", final=True),
    "hang": lambda pid: hang(),
    "reset": lambda pid: raises(ConnectionError("provider connection reset")),
}


@dataclass(frozen=True)
class Plan:
    """One payment of the scenario and what the provider will do on each of its calls."""

    payment_id: str
    customer: str
    job: Literal["charge", "transfer"]
    cents: int
    steps: tuple[str, ...]  # keys of STEPS, one per provider call
    story: str


PLANS = [
    Plan("A-1", "ana", "charge", 1_200, ("approve slowly",), "approves (slowly)"),
    Plan("A-2", "ana", "charge", 2_500, ("hang", "approve"), "hangs once, then approves"),
    Plan("A-3", "ana", "charge", 900, ("decline",) * 3, "declines every time"),
    Plan("A-4", "ana", "charge", 4_000, ("report stolen",), "card stolen: final failure"),
    Plan("A-5", "ana", "charge", 700, ("hang",) * 3, "hangs every time"),
    Plan("A-6", "ana", "charge", 1_500, ("decline", "approve"), "declines once, then approves"),
    Plan("B-1", "bo", "charge", 3_000, ("reset",) * 3, "connection reset every time"),
    Plan("B-2", "bo", "charge", 800, ("reset", "approve"), "connection reset, then approves"),
    Plan("B-3", "bo", "charge", 600, ("approve slowly",), "approves (slowly)"),
    Plan("C-1", "cy", "transfer", 50_000, ("hang",), "hangs; cancelled mid-call"),
    Plan(
        "C-2",
        "cy",
        "transfer",
        75_000,
        ("hang", "approve"),
        "hangs on runner W1, which stops; approves on W2",
    ),
]
#: The dead letter the operator retries (after "the customer fixed their card"), and the
#: one the operator discards.
RETRIED, DISCARDED = "A-3", "A-4"


@dataclass(frozen=True)
class Letter:
    """A dead letter as the operator saw it, and what the operator did with it."""

    job_id: str
    payment_id: str
    attempts: int
    ambiguous: bool
    cause: str
    action: str


@dataclass
class Fate:
    """What became of one job: its route's report(s), its provider calls, its route receipts."""

    plan: Plan
    job_id: str
    retry_of: str | None = None  # the dead job this one re-enqueued
    outcomes: list[Outcome] = field(default_factory=list)
    calls: list[tuple[int, str]] = field(default_factory=list)  # (attempt, provider outcome)
    receipts: list[str] = field(default_factory=list)  # commands run under command id = job id


@dataclass
class PaymentsReport:
    """What the payments part observed."""

    fates: list[Fate] = field(default_factory=list)
    letters: list[Letter] = field(default_factory=list)
    letters_left: list[str] = field(default_factory=list)  # job ids still dead-lettered at the end
    queue: dict[str, dict[str, int]] = field(default_factory=dict)  # customer → state → rows
    stranded: dict[str, Any] = field(default_factory=dict)  # C-2's row once W1 stopped
    concurrency: dict[str, int] = field(default_factory=dict)  # customer → most calls at once
    overall_concurrency: int = 0  # most card charges at once, all customers together
    printed: list[str] = field(default_factory=list)

    def fate(self, payment_id: str, *, retry: bool = False) -> Fate:
        """The fate of a payment's first job (or of its re-enqueued dead letter)."""
        return next(
            f
            for f in self.fates
            if f.plan.payment_id == payment_id and (f.retry_of is not None) == retry
        )


def most_at_once(calls: list[ProviderCall]) -> int:
    """The most of ``calls`` that overlapped in time (like ``FakeProvider.max_concurrency``)."""
    edges = sorted(
        [(c.started, 1) for c in calls]
        + [(c.ended if c.ended is not None else float("inf"), -1) for c in calls],
    )
    most = level = 0
    for _, delta in edges:
        level += delta
        most = max(most, level)
    return most


class LiveLog(logging.Handler):
    """Prints akter's own job messages (dead-lettered, interrupted, ...) as they happen."""

    QUIET = frozenset({"Job attempt failed; retrying with backoff"})  # the calls show these

    def __init__(self, demo: PaymentsDemo) -> None:
        super().__init__(logging.INFO)
        self.demo = demo

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.show(record)
        except Exception:  # a log handler must never raise into the code that logged
            self.handleError(record)

    def show(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message in self.QUIET:
            return
        job_id = getattr(record, "job_id", None)
        payment = self.demo.payment_of.get(str(job_id), "") if job_id else ""
        if job_id and not payment:
            return  # another run's job on the same database
        attempt = getattr(record, "attempt", None)
        where = f"{payment} #{attempt}" if attempt else payment
        self.demo.say(f"{where:<8} {record.name}: {message}")


class PaymentsDemo:
    """Runs the payments scenario.

    ``front`` takes the calls, relays, and executes card charges (``jobs=[Customer.charge]``).
    Bank transfers run on a runner of their own: W1, stopped while a transfer hangs, then W2.
    """

    def __init__(self, front: akter.Runtime, echo: Callable[[str], None]) -> None:
        self.front = front
        self.echo = echo
        self.tenant = f"pay-{uuid.uuid4().hex[:8]}"  # fresh customers on every run
        self.report = PaymentsReport()
        self.started = time.perf_counter()
        self.steps: dict[str, list[Step]] = {}
        self.payment_of: dict[str, str] = {}  # job id → payment id
        self.jobs: dict[str, str] = {}  # payment id → its first job id

    def customer(self, name: str) -> Customer:
        return self.front.get(Customer, name, tenant=self.tenant)

    def say(self, text: str) -> None:
        line = f"  {time.perf_counter() - self.started:5.2f} s  {text}"
        self.report.printed.append(line)
        self.echo(line)

    def transfer_runner(self) -> akter.Runtime:
        return akter.Runtime(
            actors=[Customer],
            database_url=self.front.database_url,
            schema=self.front.schema,
            poll=PAYMENTS_POLL,
            lease=LEASE,
            cancel_check=CANCEL_CHECK,
            jobs=[Customer.transfer],
        )

    def script(self) -> None:
        PROVIDER.reset()
        for plan in PLANS:
            steps = [STEPS[label](plan.payment_id) for label in plan.steps]
            self.steps[plan.payment_id] = steps
            PROVIDER.script(*steps, key=plan.payment_id)

    async def start(self, plan: Plan) -> str:
        customer = self.customer(plan.customer)
        command = customer.pay if plan.job == "charge" else customer.wire
        job_id = await command(plan.payment_id, plan.cents)
        self.jobs[plan.payment_id] = job_id
        self.payment_of[job_id] = plan.payment_id
        self.report.fates.append(Fate(plan, job_id))
        return job_id

    async def entered(self, payment_id: str) -> None:
        """Wait (bounded) until the payment's first provider call has started."""
        await asyncio.wait_for(self.steps[payment_id][0].entered.wait(), EXPECT_WITHIN)

    def call_ended(self, call: ProviderCall) -> None:
        """Print a provider call as it ends, with what its script told the provider to do."""
        labels = {plan.payment_id: plan.steps for plan in PLANS}
        nth = sum(1 for c in PROVIDER.calls[: PROVIDER.calls.index(call)] if c.key == call.key)
        script = (*labels.get(call.key or "", ()), "approve")  # + the retried letter's call
        took = (call.ended or call.started) - call.started
        self.say(
            f"{call.key} #{call.attempt:<5} provider: {script[nth]:<14} → "
            f"{call.outcome} after {took:.2f} s"
        )

    async def queue_snapshot(self) -> None:
        """The job rows of this run's customers, by state, read with SQL (``akter jobs list``)."""
        query = sql.SQL(
            "SELECT actor_id, count(*) FILTER (WHERE running) AS running,"
            " count(*) FILTER (WHERE waiting AND NOT running) AS waiting,"
            " count(*) FILTER (WHERE NOT running AND NOT waiting) AS pending"
            " FROM {}.outbox WHERE kind = 'job' AND tenant_id = %s GROUP BY actor_id"
        ).format(sql.Identifier(self.front.schema))
        async with await psycopg.AsyncConnection.connect(self.front.database_url) as conn:
            cur = await conn.execute(query, (self.tenant,))
            for actor_id, running, waiting, pending in await cur.fetchall():
                self.report.queue[str(actor_id)] = {
                    "running": int(running),
                    "waiting": int(waiting),
                    "pending": int(pending),
                }

    async def job_row(self, job_id: str) -> dict[str, Any]:
        """One job row's attempt columns, read with SQL."""
        query = sql.SQL(
            "SELECT attempts, running, ambiguous, maybe_applied, due_at_ms"
            " - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS lease_left_ms"
            " FROM {}.outbox WHERE kind = 'job' AND intent_id = %s"
        ).format(sql.Identifier(self.front.schema))
        async with await psycopg.AsyncConnection.connect(self.front.database_url) as conn:
            cur = await conn.execute(query, (job_id,))
            names = [c.name for c in cur.description or ()]
            row = await cur.fetchone()
        if row is None:
            raise LookupError(f"No job row {job_id!r}.")
        return dict(zip(names, row, strict=True))

    async def receipts(self) -> dict[str, list[str]]:
        """The commands run under each job id as command id: the routes, one each."""
        query = sql.SQL(
            "SELECT command_id, command FROM {}.receipts WHERE tenant_id = %s"
            " AND command_id = ANY(%s) ORDER BY command_id"
        ).format(sql.Identifier(self.front.schema))
        ids = [fate.job_id for fate in self.report.fates]
        found: dict[str, list[str]] = {}
        async with await psycopg.AsyncConnection.connect(self.front.database_url) as conn:
            cur = await conn.execute(query, (self.tenant, ids))
            for command_id, command in await cur.fetchall():
                found.setdefault(str(command_id), []).append(str(command))
        return found

    async def outcomes(self) -> list[Outcome]:
        names = sorted({plan.customer for plan in PLANS})
        return [o for name in names for o in await self.customer(name).outcomes()]

    async def reported(self, job_ids: list[str]) -> list[Outcome]:
        """Wait (bounded) until every job of ``job_ids`` has had its route delivered."""
        deadline = time.monotonic() + EXPECT_WITHIN
        while True:
            outcomes = await self.outcomes()
            if {o.job_id for o in outcomes} >= set(job_ids):
                return outcomes
            if time.monotonic() > deadline:
                raise TimeoutError(f"Payments still unreported after {EXPECT_WITHIN} s.")
            await asyncio.sleep(0.05)

    async def run(self) -> PaymentsReport:
        self.script()
        PROVIDER.listener = self.call_ended
        try:
            await self.scenario()
        finally:
            PROVIDER.listener = None
        await self.collect()
        return self.report

    async def scenario(self) -> None:
        cards = [plan for plan in PLANS if plan.job == "charge"]
        c1, c2 = (next(p for p in PLANS if p.payment_id == pid) for pid in ("C-1", "C-2"))
        async with self.transfer_runner():
            self.say("(runner W1 starts: it executes bank transfers only)")
            # 1. Card payments: each turn enqueues one charge; at most CHARGE_CAP run per
            #    customer, the others wait their turn in FIFO order.
            for plan in cards:
                await self.start(plan)
            await self.queue_snapshot()
            # 2. A bank transfer whose provider call hangs on W1, and W1 stops mid-call: the
            #    job has to wait for the attempt's lease to end before anyone runs it again.
            await self.start(c2)
            await self.entered("C-2")
            await asyncio.sleep(0.3)
            self.say("C-2      (runner W1 stops while C-2's provider call hangs)")
        # W1 wrote nothing for the attempt it abandoned: the row still says "running", and
        # ambiguous (claims pre-mark it), until its lease ends; then another runner takes it.
        self.report.stranded = await self.job_row(self.jobs["C-2"])
        left = self.report.stranded["lease_left_ms"] / 1000
        self.say(
            f"C-2      (its row: attempt {self.report.stranded['attempts']}, still running, "
            f"ambiguous; the lease ends in {left:.1f} s)"
        )
        async with self.transfer_runner():
            self.say("(runner W2 starts: it executes bank transfers only)")
            # 3. A transfer cancelled mid-call: the cancelling turn commits on the front
            #    runner; W2 sees it at its next lease renewal and interrupts the call.
            await self.start(c1)
            await self.entered("C-1")
            await self.customer("cy").cancel_payment("C-1")
            self.say("C-1      (cancel_payment('C-1') committed while the call hangs)")
            await self.reported([fate.job_id for fate in self.report.fates])

            # 4. The operator's view of the dead letters: retry one, discard another.
            await self.operate()

    async def operate(self) -> None:
        letters = [x for x in await self.front.dead_letters.list() if x.ref.tenant == self.tenant]
        actions: dict[str, str] = {}
        retried = self.jobs[RETRIED]
        PROVIDER.script(STEPS["approve"](RETRIED), key=RETRIED)
        new_id = await self.front.dead_letters.retry(retried)
        self.payment_of[new_id] = RETRIED
        plan = next(p for p in PLANS if p.payment_id == RETRIED)
        self.report.fates.append(Fate(plan, new_id, retry_of=retried))
        actions[retried] = f"retried as job {short_id(new_id)}"
        self.say(f"{RETRIED:<8} (operator: dead_letters.retry → new job {short_id(new_id)})")
        discarded = self.jobs[DISCARDED]
        await self.front.dead_letters.discard(discarded)
        actions[discarded] = "discarded"
        self.say(f"{DISCARDED:<8} (operator: dead_letters.discard)")
        await self.reported([new_id])
        for x in sorted(letters, key=lambda x: self.payment_of.get(x.job_id, "")):
            self.report.letters.append(
                Letter(
                    job_id=x.job_id,
                    payment_id=self.payment_of.get(x.job_id, "?"),
                    attempts=x.attempts,
                    ambiguous=x.ambiguous,
                    cause=x.cause,
                    action=actions.get(
                        x.job_id,
                        "kept: the provider may have applied it" if x.ambiguous else "kept",
                    ),
                )
            )
        self.report.letters_left = [
            x.job_id for x in await self.front.dead_letters.list() if x.ref.tenant == self.tenant
        ]

    async def collect(self) -> None:
        outcomes = await self.outcomes()
        receipts = await self.receipts()
        for fate in self.report.fates:
            fate.outcomes = [o for o in outcomes if o.job_id == fate.job_id]
            fate.calls = [(c.attempt, c.outcome) for c in PROVIDER.calls_for(fate.job_id)]
            fate.receipts = receipts.get(fate.job_id, [])
        charges = {f.job_id: f.plan.customer for f in self.report.fates if f.plan.job == "charge"}
        card_calls = [c for c in PROVIDER.calls if c.job_id in charges]
        for name in sorted(set(charges.values())):
            self.report.concurrency[name] = most_at_once(
                [c for c in card_calls if charges[c.job_id] == name]
            )
        self.report.overall_concurrency = most_at_once(card_calls)


async def payments_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> PaymentsReport:
    """Run the payments scenario and return what it observed.

    Args:
        database_url: As for :func:`main`.
        schema: As for :func:`main`.
        echo: Prints one line of the live log (provider calls and akter's job messages).
    """
    async with (
        demo_database(database_url) as url,
        own_schema(url, schema, "payments") as schema,
        akter.Runtime(
            actors=[Customer],
            database_url=url,
            schema=schema,
            poll=PAYMENTS_POLL,
            lease=LEASE,
            cancel_check=CANCEL_CHECK,
            jobs=[Customer.charge],
        ) as front,
    ):
        demo = PaymentsDemo(front, echo)
        logger = logging.getLogger("akter")
        jobs_logger = logging.getLogger("akter.jobs")
        handler, level = LiveLog(demo), jobs_logger.level
        logger.addHandler(handler)
        jobs_logger.setLevel(logging.INFO)
        try:
            return await demo.run()
        finally:
            jobs_logger.setLevel(level)
            logger.removeHandler(handler)


ROUTE_STYLE = {"on_success": "green", "on_dead_letter": "red", "on_cancelled": "yellow"}


def render_payments(report: PaymentsReport) -> Group:
    fates = Table(
        title="akter demo: payments — each job's fate",
        title_style="bold",
        caption=(
            "route = the one report delivered to the customer, under command id = job id; "
            "ambiguous = the provider may have applied the call; provider calls = what the fake "
            "provider recorded, attempt by attempt (interrupted = timed out, cancelled, or its "
            "runner stopped)."
        ),
    )
    for column in (
        "payment",
        "job",
        "job id",
        "the provider…",
        "provider calls",
        "route",
        "attempts",
        "ambiguous?",
        "detail",
    ):
        fates.add_column(column, justify="right" if column == "attempts" else "left")
    for fate in sorted(report.fates, key=lambda f: (f.retry_of is not None, f.plan.payment_id)):
        plan = fate.plan
        story = f"retried dead letter {short_id(fate.retry_of)}" if fate.retry_of else plan.story
        calls = " · ".join(outcome for _, outcome in fate.calls) or "none"
        first = [f"{plan.payment_id} ({plan.customer})", plan.job, short_id(fate.job_id), story]
        if not fate.outcomes:
            fates.add_row(*first, calls, "[dim]none[/dim]", "", "", "")
        for i, o in enumerate(fate.outcomes):  # exactly one per job: routed once
            style = ROUTE_STYLE[o.route]
            ambiguous = (
                "—"
                if o.route == "on_success"
                else "[bold red]yes[/bold red]"
                if o.ambiguous
                else "no"
            )
            fates.add_row(
                *(first if i == 0 else [""] * 4),
                calls if i == 0 else "",
                f"[{style}]{o.route}[/{style}]",
                str(o.attempts),
                ambiguous,
                o.detail,
            )
    letters = Table(
        title="dead letters (runtime.dead_letters, or 'akter dead-letters list')",
        title_style="bold",
        caption="Never pruned. retry = the same payload as a new job (new id); discard = delete.",
    )
    for column in ("payment", "job id", "attempts", "ambiguous?", "cause", "operator"):
        letters.add_column(column, justify="right" if column == "attempts" else "left")
    for x in report.letters:
        letters.add_row(
            x.payment_id,
            short_id(x.job_id),
            str(x.attempts),
            "[bold red]yes[/bold red]" if x.ambiguous else "no",
            x.cause,
            x.action,
        )
    caps = Table(
        title=f"card charges per customer (per_actor={CHARGE_CAP})",
        title_style="bold",
        caption=(
            f"most at once = the most overlapping provider calls; all customers together: "
            f"{report.overall_concurrency}. Queue = job rows right after the card payments "
            "were enqueued (waiting = deferred by the cap; pending = not claimed yet, or backing "
            "off after a failure)."
        ),
    )
    for column in ("customer", "payments", "provider calls", "most at once", "queue"):
        caps.add_column(column, justify="left" if column in ("customer", "queue") else "right")
    for name, most in report.concurrency.items():
        mine = [f for f in report.fates if f.plan.customer == name and f.plan.job == "charge"]
        queue = report.queue.get(name, {})
        caps.add_row(
            name,
            str(len({f.plan.payment_id for f in mine})),
            str(sum(len(f.calls) for f in mine)),
            str(most),
            ", ".join(f"{n} {state}" for state, n in queue.items() if n) or "—",
        )
    return Group(fates, letters, caps)


#: What the demo showed, and where to read more: (what you saw, where to go next). Each place is
#: a page of the docs (``docs/<page>.md``, or ``docs/<page>.md#<heading>`` for a section of it);
#: a test checks
#: that each one exists.
NEXT_STEPS: tuple[tuple[str, str], ...] = (
    ("commands, receipts, replayed retries, declared errors", "docs/get-started.md#Quick start"),
    ("intents, timers and live event feeds", "docs/guides/intents-timers-events.md"),
    ("jobs, retries, dead letters, cancellation", "docs/guides/jobs.md"),
    ("per-customer caps (flow control)", "docs/guides/flow-control.md"),
    ("a cron singleton and a takeover", "docs/guides/singletons.md"),
    ("evolving code over durable data", "docs/guides/evolution.md"),
    ("workflows that survive a SIGKILL", "docs/guides/workflows.md"),
    ("a read model kept by a subscription", "docs/spec/subscriptions.md"),
)
#: Where to go once the demo is done.
GO_NEXT: tuple[tuple[str, str], ...] = (
    ("use akter in your own project", "docs/get-started.md#Use akter in your project"),
    (
        "operate it: akter inspect, jobs, dead-letters, workflows",
        "docs/guides/operating.md",
    ),
    ("the web console", "docs/console.md"),
    ("test your actors", "docs/guides/testing.md"),
)


def place(where: str) -> str:
    """``docs/get-started.md#Quick start`` → ``docs/get-started.md › Quick start``."""
    path, _, section = where.partition("#")
    return f"{path} › {section}" if section else path


def closing() -> Group:
    """The demo's last words: what you saw, and where to go next."""
    saw = Table(title="what you saw, where to read more", title_style="bold", show_header=False)
    saw.add_column("what")
    saw.add_column("where")
    for what, where in NEXT_STEPS:
        saw.add_row(what, place(where))
    go = Table(title="where to go next", title_style="bold", show_header=False)
    go.add_column("what")
    go.add_column("where")
    for what, where in GO_NEXT:
        go.add_row(what, place(where))
    return Group(saw, go)


def run() -> int:
    console = Console()
    if not console.is_terminal:  # piped or captured: don't squeeze the table into 80 columns
        console = Console(width=160)
    started = time.perf_counter()
    # One database for every part: $AKTER_DATABASE_URL, else one embedded server for the demo.
    server = None if os.environ.get("AKTER_DATABASE_URL") else EmbeddedPostgres(default_data_dir())
    with console.status("Starting PostgreSQL (the first run initialises the embedded server) …"):
        url = server.start() if server else os.environ["AKTER_DATABASE_URL"]
    try:
        return _parts(console, url, started)
    finally:
        if server is not None:
            server.stop()


def _parts(console: Console, url: str, started: float) -> int:
    def echo(line: str) -> None:
        console.print(line, highlight=False)

    console.rule("accounts: commands, receipts and idempotent retries")
    console.print(render(asyncio.run(main(url))))
    console.rule("orders: intents, timers and a live event feed")
    console.print("Live event feeds of orders A-1 and B-2, printed as events commit:")
    report = asyncio.run(orders_main(url, echo=echo))
    console.print(render_orders(report))
    console.rule("payments: jobs, retries, dead letters, cancellation and a capped queue")
    console.print(
        "Live log: each provider call as it ends, and akter's own job messages (a retry after a "
        "failed attempt is shown by the calls; a dead letter and an interrupted attempt by akter)."
    )
    payments = asyncio.run(payments_main(url, echo=echo))
    console.print(render_payments(payments))
    console.rule("nightly billing: a cron singleton, a second runner process, a kill, a takeover")
    console.print(
        "Live log: a runner in a child process (R1) holds the Billing loop; R2 runs here. "
        "The nightly tick is delivered, then R1 is SIGKILLed and R2 takes over."
    )
    billing = asyncio.run(billing_main(url, echo=echo))
    console.print(render_billing(billing))
    console.rule("evolving the code: a state migration, a payload version, a parked intent")
    console.print(
        "v1 leaves state and pending intents; runtime.check() runs before each deploy of v2; "
        "v2 parks the intent to a removed command, v2.1 claims it with an alias and retries it."
    )
    # Part 5 lives in examples/demo_evolution.py; as a script, examples/ is not a package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.demo_evolution import evolution_main, render_evolution

    evolution = asyncio.run(evolution_main(url, echo=echo))
    console.print(render_evolution(evolution))
    console.rule("workflows: an order workflow, a flaky provider, a signal, a SIGKILL, a resume")
    console.print(
        "R1, a runner in a child process, runs two orders' fulfil workflow; A's shipment "
        "arrives, R1 is SIGKILLed while it prints A's label, and R2 (here) resumes A from its "
        "journal; B's wait times out."
    )
    from examples.demo_workflows import render_workflows, workflows_main

    flows = asyncio.run(workflows_main(url, echo=echo))
    console.print(render_workflows(flows))
    console.rule("subscriptions: a read model added to a running system, rebuilt from the start")
    console.print(
        "R1 sells on three tills; R2, with the new read model, starts beside it and feeds it "
        "every till's history; R1 stops, R2 sells on; the feeds are rewound and redelivered."
    )
    from examples.demo_subscriptions import render_subscriptions, subscriptions_main

    subs = asyncio.run(subscriptions_main(url, echo=echo))
    console.print(render_subscriptions(subs))
    console.rule("what you saw, where to go next")
    console.print(
        "Each part ran in a schema of its own, dropped at its end: the database is as it was."
    )
    console.print(closing())
    console.print(f"Done in {time.perf_counter() - started:.1f} s.", style="dim")
    return 0


# --- part 4: a nightly-billing singleton, a second runner process, a kill and a takeover ------

#: The singleton lease of part 4's runners (``Runtime(singleton_lease=...)``; 35 s by default):
#: short, so a takeover fits in the demo. Refreshed every lease × 10/35 = 1 s.
SINGLETON_LEASE = 3.5
#: The nightly schedule, read in this zone.
NIGHTLY = "0 2 * * *"
ZONE = "Europe/Zurich"
#: How long before 02:00 (local) the shifted clock starts: time for every runner to start.
LEAD = 8.0
#: How often the billing loop steps, and the relay passes of part 4's runners.
STEP_EVERY = 0.25
BILLING_POLL = 0.25
#: Loop steps kept in the ledger (the oldest are dropped).
MAX_STEPS = 400
#: The nightly fee of each account, billed by intent (``Account.withdraw``), and what each
#: account holds before the night.
FEES = {"ada": 1_500, "ben": 900, "cem": 2_000}
OPENING = {"ada": 10_000, "ben": 5_000, "cem": 2_500}
#: Longest wait for a runner process's first line, and for the takeover after the kill.
TAKEOVER_WITHIN = SINGLETON_LEASE + 10.0
#: This file: the runner process runs it with ``--runner``.
DEMO_PATH = Path(__file__).resolve()


class Invoice(BaseModel):
    """One account billed in one night."""

    account: str
    cents: int


class NightlyRun(BaseModel):
    """One delivered tick of the nightly schedule, as the ``bill`` command recorded it."""

    fired_at: str  # local time of the turn, in ZONE
    command_id: str  # the tick row's intent id
    caller: str  # who delivered it: System(source='cron')
    at_ms: int
    invoices: list[Invoice]


class LoopStep(BaseModel):
    """One step of the background loop: which runner ran it, and when (framework time)."""

    runner: str
    n: int  # the loop's step count on that runner
    at_ms: int


class Ledger(BaseModel):
    """The durable state of the billing singleton."""

    runs: list[NightlyRun] = Field(default_factory=list)
    steps: list[LoopStep] = Field(default_factory=list)


class Billing(akter.Actor[Ledger], singleton=True):
    """Nightly billing: one actor per deployment, a cron tick, and a loop on one runner."""

    @akter.schedule(NIGHTLY, tz=ZONE)
    @akter.command
    async def bill(self) -> int:
        # Delivered by the relay of a runner hosting Billing, with the tick's id as command id.
        caller = self.caller
        source = caller.source if isinstance(caller, akter.System) else type(caller).__name__
        invoices = [Invoice(account=a, cents=c) for a, c in sorted(FEES.items())]
        for invoice in invoices:
            self.send(Account.withdraw, invoice.account, invoice.cents)
        local = self.now.astimezone(ZoneInfo(ZONE))
        self.state.runs.append(
            NightlyRun(
                fired_at=local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + local.strftime(" %Z"),
                command_id=self.command_id,
                caller=f"System(source={source!r})",
                at_ms=self.now_ms,
                invoices=invoices,
            )
        )
        return sum(invoice.cents for invoice in invoices)

    @akter.command
    async def step(self, runner: str, n: int) -> int:
        self.state.steps = [
            *self.state.steps,
            LoopStep(runner=runner, n=n, at_ms=self.now_ms),
        ][-MAX_STEPS:]
        return n

    @akter.query
    async def ledger(self) -> Ledger:
        return self.state.model_copy(deep=True)

    async def run(self) -> None:
        # On the runner holding the lease only; cancelled when the lease cannot be refreshed.
        billing = self.runtime.get(Billing)
        runner = str(self.runtime.runner_id)
        n = 0
        while True:
            n += 1
            await billing.step(runner, n)
            await asyncio.sleep(STEP_EVERY)


def billing_runtime(
    database_url: str | None,
    schema: str,
    offset_ms: int,
    actors: list[type[akter.Actor[Any]]] | None = None,
) -> akter.Runtime:
    """A runner of part 4: every one shares the schema, the clock offset and the lease."""
    return akter.Runtime(
        actors=[Billing, Account] if actors is None else actors,
        database_url=database_url,
        schema=schema,
        poll=BILLING_POLL,
        singleton_lease=SINGLETON_LEASE,
        clock_offset=timedelta(milliseconds=offset_ms),
    )


def clock_offset_ms(now_ms: int) -> int:
    """How far to move the clock so that ``now_ms`` becomes LEAD seconds before a 02:00."""
    (entry,) = definition_of(Billing).schedules
    lead_ms = int(LEAD * 1000)
    return next_fire(entry, now_ms + lead_ms) - lead_ms - now_ms


def time_of_day(ms: int) -> str:
    """Epoch ms as a time of day in ZONE, to the millisecond."""
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(ZONE)).strftime("%H:%M:%S.%f")[:-3]


def local_time(ms: int, *, millis: bool = False) -> str:
    """Epoch ms as a wall time in ZONE."""
    wall = datetime.fromtimestamp(ms / 1000, ZoneInfo(ZONE))
    text = wall.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if millis else f"{wall:%Y-%m-%d %H:%M:%S}"
    return f"{text} {wall:%Z}"


@dataclass(frozen=True)
class RunnerRow:
    """One row of the runner registry, as SQL read it at one moment."""

    label: str
    runner_id: str
    actor_types: list[str]
    job_types: list[str]
    address: str | None
    heartbeat_age: float  # seconds since its last heartbeat, on the framework clock
    live: bool  # heartbeat younger than 35 s
    owns_loop: bool  # the Billing lease names it and has not ended


@dataclass
class BillingReport:
    """What part 4 observed, read from the database."""

    offset_ms: int = 0
    started_at: str = ""  # the shifted framework time when the runners started
    tick: dict[str, Any] = field(default_factory=dict)  # the pending tick row, before it fired
    next_tick: dict[str, Any] = field(default_factory=dict)  # the row after: the next night
    receipts: list[dict[str, Any]] = field(default_factory=list)  # Billing.bill receipts
    runs: list[NightlyRun] = field(default_factory=list)
    balances: dict[str, tuple[int, int]] = field(default_factory=dict)  # before, after
    registry: dict[str, list[RunnerRow]] = field(default_factory=dict)  # phase → rows
    labels: dict[str, str] = field(default_factory=dict)  # runner id → label
    child_pid: int = 0
    child_exit: int | None = None
    owner_runner: str = ""  # the child's runner id: the loop's first owner
    survivor_runner: str = ""
    killed_at_ms: int = 0
    lease_at_kill: dict[str, Any] = field(default_factory=dict)  # the singletons row then
    lease_after: dict[str, Any] = field(default_factory=dict)
    steps: list[LoopStep] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)

    def spans(self) -> list[tuple[str, int, int, int]]:
        """The loop's runs, from the ledger: (runner, first step ms, last step ms, steps)."""
        found: list[tuple[str, int, int, int]] = []
        for step in self.steps:
            if found and found[-1][0] == step.runner:
                runner, first, _, n = found[-1]
                found[-1] = (runner, first, step.at_ms, n + 1)
            else:
                found.append((step.runner, step.at_ms, step.at_ms, 1))
        return found

    def overlaps(self) -> bool:
        """Whether two runners' loop runs overlapped in time (they must not)."""
        spans = self.spans()
        runners = [span[0] for span in spans]
        if len(set(runners)) != len(runners):
            return True  # a runner's steps interleaved with another's
        return any(a[2] >= b[1] for a, b in itertools.pairwise(spans))

    def first_step_of(self, runner: str) -> LoopStep | None:
        return next((s for s in self.steps if s.runner == runner), None)

    def last_step_of(self, runner: str) -> LoopStep | None:
        return next((s for s in reversed(self.steps) if s.runner == runner), None)


async def spawn_runner(database_url: str, schema: str, offset_ms: int) -> RunnerProcess:
    """R1 of part 4: ``demo.py --runner URL SCHEMA OFFSET_MS`` in a child process."""
    return await RunnerProcess.start(
        str(DEMO_PATH), "--runner", database_url, schema, str(offset_ms)
    )


class BillingDemo:
    """Runs part 4.

    ``front`` (this process; it hosts ``Account`` only) opens the accounts. R1, a runner in a
    child process, starts first and so holds the Billing lease; R2 (this process) waits. The
    nightly tick is delivered, then R1 is killed with SIGKILL and R2 takes the loop over once
    R1's lease has ended.
    """

    def __init__(self, front: akter.Runtime, offset_ms: int, echo: Callable[[str], None]) -> None:
        self.front = front
        self.offset_ms = offset_ms
        self.echo = echo
        self.report = BillingReport(offset_ms=offset_ms)
        self.started = time.perf_counter()
        self.survivor: akter.Runtime | None = None

    def say(self, text: str) -> None:
        line = f"  {time.perf_counter() - self.started:5.2f} s  {text}"
        self.report.printed.append(line)
        self.echo(line)

    def label(self, runner_id: str) -> str:
        return self.report.labels.get(runner_id, "another run's runner")

    async def fetch(self, query: LiteralString, *params: Any) -> list[dict[str, Any]]:
        """Rows of ``query``, with ``{schema}`` filled in; pass the offset to ``now_ms()``."""
        text = sql.SQL(query).format(schema=sql.Identifier(self.front.schema))
        async with await psycopg.AsyncConnection.connect(self.front.database_url) as conn:
            cur = await conn.execute(text, params)
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]

    async def now_ms(self) -> int:
        (row,) = await self.fetch("SELECT {schema}.now_ms(%s::bigint) AS now", self.offset_ms)
        return int(row["now"])

    async def tick_row(self) -> dict[str, Any]:
        (row,) = await self.fetch(
            "SELECT intent_id::text AS intent_id, timer_key, command, due_at_ms, attempts,"
            " due_at_ms - {schema}.now_ms(%s::bigint) AS due_in_ms FROM {schema}.outbox"
            " WHERE actor_type = 'Billing' AND timer_key LIKE '$cron:%%'",
            self.offset_ms,
        )
        return row

    async def lease_row(self) -> dict[str, Any]:
        (row,) = await self.fetch(
            "SELECT owner::text AS owner, lease_until_ms, acquired_at_ms,"
            " lease_until_ms - {schema}.now_ms(%s::bigint) AS left_ms"
            " FROM {schema}.singletons WHERE actor_type = 'Billing'",
            self.offset_ms,
        )
        return row

    async def registry(self, phase: str) -> None:
        """The runner rows (``runners`` table), with their heartbeat age and the loop's owner."""
        rows = await self.fetch(
            "SELECT r.runner_id::text AS runner_id, r.actor_types, r.job_types, r.http_address,"
            " {schema}.now_ms(%s::bigint) - r.heartbeat_at_ms AS age_ms,"
            " s.owner IS NOT DISTINCT FROM r.runner_id"
            "   AND s.lease_until_ms > {schema}.now_ms(%s::bigint) AS owns"
            " FROM {schema}.runners r"
            " LEFT JOIN {schema}.singletons s ON s.actor_type = 'Billing'"
            " ORDER BY r.started_at_ms, r.runner_id",
            self.offset_ms,
            self.offset_ms,
        )
        self.report.registry[phase] = [
            RunnerRow(
                label=self.label(r["runner_id"]),
                runner_id=r["runner_id"],
                actor_types=list(r["actor_types"]),
                job_types=list(r["job_types"]),
                address=r["http_address"],
                heartbeat_age=int(r["age_ms"]) / 1000,
                live=int(r["age_ms"]) < 35_000,
                owns_loop=bool(r["owns"]),
            )
            for r in rows
        ]

    async def ledger(self) -> Ledger:
        assert self.survivor is not None
        return await self.survivor.get(Billing).ledger()

    async def until(self, what: str, check: Callable[[], Awaitable[bool]], within: float) -> None:
        """Wait (bounded) until ``check`` holds."""
        deadline = time.monotonic() + within
        while not await check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"The demo waited {within:.1f} s for {what}.")
            await asyncio.sleep(0.05)

    async def run(self) -> BillingReport:
        report = self.report
        report.labels[str(self.front.runner_id)] = "front (this process)"
        report.started_at = local_time(await self.now_ms(), millis=True)
        self.say(f"framework clock moved ahead by {self.offset_ms / 3_600_000:.2f} h: it reads")
        self.say(f"  {report.started_at}, {LEAD:.0f} s before the nightly {NIGHTLY!r} tick")
        for name, cents in OPENING.items():
            account = self.front.get(Account, name)
            await account.open(name.title())
            await account.deposit(cents)
        child = await spawn_runner(self.front.database_url, self.front.schema, self.offset_ms)
        report.child_pid = child.proc.pid
        try:
            ready = (await child.line()).split()
            if ready[:1] != ["READY"]:
                raise RuntimeError(f"Unexpected line from the runner process: {ready}")
            report.owner_runner = ready[1]
            report.labels[report.owner_runner] = f"R1 (child process, pid {child.proc.pid})"
            self.say(f"R1 started in a child process (pid {child.proc.pid}): it holds the lease")
            async with billing_runtime(
                self.front.database_url, self.front.schema, self.offset_ms
            ) as survivor:
                self.survivor = survivor
                report.survivor_runner = str(survivor.runner_id)
                report.labels[report.survivor_runner] = "R2 (this process)"
                self.say("R2 started in this process: it waits for the lease")
                await self.scenario(child)
        finally:
            report.child_exit = await child.close()  # always killed (if still running) and reaped
        return report

    async def scenario(self, child: RunnerProcess) -> None:
        report = self.report

        async def r1_stepped() -> bool:
            return any(s.runner == report.owner_runner for s in (await self.ledger()).steps)

        await self.until("R1's first loop step", r1_stepped, CHILD_WITHIN)
        # 1. The tick row, inserted by the first runner hosting Billing, due at 02:00 local.
        report.tick = await self.tick_row()
        if int(report.tick["due_in_ms"]) > LEAD * 1000:
            raise RuntimeError(
                f"The runners took more than {LEAD} s to start: the tick fired before it could "
                "be shown. Run the demo again on a less busy machine."
            )
        await self.registry("1. before the kill")
        lease = await self.lease_row()
        self.say(
            f"lease: owner {self.label(lease['owner'])}, ends in {int(lease['left_ms']) / 1000:.1f}"
            f" s; tick row due {local_time(int(report.tick['due_at_ms']))}"
            f" (in {int(report.tick['due_in_ms']) / 1000:.1f} s)"
        )

        # 2. The tick fires: the relay delivers 'bill' with caller System(source='cron'), then
        #    rewrites the row to the next night; the withdrawals go out by intent.
        async def billed() -> bool:
            if not (await self.ledger()).runs:
                return False
            pending = await self.fetch(
                "SELECT 1 FROM {schema}.outbox WHERE kind = 'intent' AND timer_key IS NULL"
            )
            return not pending and (await self.tick_row())["intent_id"] != report.tick["intent_id"]

        await self.until("the nightly tick", billed, LEAD + CHILD_WITHIN)
        (run, *_) = (await self.ledger()).runs
        self.say(f"tick delivered at {run.fired_at} by {run.caller}: bill() → 3 withdrawals")
        report.next_tick = await self.tick_row()

        # 3. SIGKILL the lease owner: it releases nothing; its lease row stays until it ends.
        child.kill()
        await child.proc.wait()
        report.killed_at_ms = await self.now_ms()
        report.lease_at_kill = await self.lease_row()
        self.say(
            f"R1 killed (SIGKILL); its lease still runs for "
            f"{int(report.lease_at_kill['left_ms']) / 1000:.2f} s"
        )

        async def taken_over() -> bool:
            steps = (await self.ledger()).steps
            return any(s.runner == report.survivor_runner for s in steps)

        await self.until("R2 to take the loop over", taken_over, TAKEOVER_WITHIN)
        ledger = await self.ledger()
        report.steps = ledger.steps
        first = report.first_step_of(report.survivor_runner)
        assert first is not None
        report.lease_after = await self.lease_row()
        after_kill = (first.at_ms - report.killed_at_ms) / 1000
        after_lease = (first.at_ms - int(report.lease_at_kill["lease_until_ms"])) / 1000
        self.say(
            f"R2 took the loop over: first step {after_kill:.2f} s after the kill, "
            f"{after_lease:.2f} s after R1's lease ended"
        )
        await self.registry("2. after the kill")

        # A few more steps on R2, then the durable evidence.
        async def r2_stepping() -> bool:
            steps = (await self.ledger()).steps
            return sum(s.runner == report.survivor_runner for s in steps) >= 3

        await self.until("R2's next steps", r2_stepping, EXPECT_WITHIN)
        ledger = await self.ledger()
        report.steps, report.runs = ledger.steps, ledger.runs
        report.receipts = await self.fetch(
            "SELECT command_id, command, caller_key FROM {schema}.receipts"
            " WHERE actor_type = 'Billing' AND command = 'bill' ORDER BY command_id"
        )
        for name, cents in OPENING.items():
            report.balances[name] = (cents, await self.front.get(Account, name).balance())


async def billing_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    keep_schema: bool = False,
    echo: Callable[[str], None] = print,
) -> BillingReport:
    """Run part 4 and return what it observed.

    Args:
        database_url: As for :func:`main`. The runner process connects to the same server.
        schema: The schema of part 4 (default: a fresh ``billing_<hex>``). Its runners' clocks
            are shifted, and a singleton is one per schema, so it gets a schema of its own.
        keep_schema: Keep the schema afterwards (otherwise it is dropped at the end).
        echo: Prints one line of the live log.
    """
    schema = schema or f"billing_{uuid.uuid4().hex[:8]}"
    # The shift is computed from the local clock (the database is local); only the lead of a
    # few seconds depends on it. Every runner of the schema gets the same offset.
    offset_ms = clock_offset_ms(int(time.time() * 1000))
    async with demo_database(database_url) as url:
        try:
            async with billing_runtime(url, schema, offset_ms, actors=[Account]) as front:
                return await BillingDemo(front, offset_ms, echo).run()
        finally:  # once every runtime of the part has stopped: none writes to a dropped schema
            if not keep_schema:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    await conn.execute(
                        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                    )


async def runner_process(database_url: str, schema: str, offset_ms: int) -> int:
    """The child of part 4 (``demo.py --runner URL SCHEMA OFFSET_MS``): R1.

    Prints ``READY <runner id>`` once it runs the Billing loop (it is started first, so it gets
    the lease); stops gracefully at end of input, or is killed.
    """
    async with billing_runtime(database_url, schema, offset_ms) as runtime:
        deadline = time.monotonic() + CHILD_WITHIN
        while not runtime.holds_singleton("Billing"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"No Billing lease within {CHILD_WITHIN} s.")
            await asyncio.sleep(0.01)
        sys.stdout.write(f"READY {runtime.runner_id}\n")
        sys.stdout.flush()
        while await asyncio.to_thread(sys.stdin.readline):
            pass
    return 0


def render_billing(report: BillingReport) -> Group:
    tick = Table(
        title="akter demo: nightly billing — the cron tick, read with SQL",
        title_style="bold",
        caption=(
            f"Every runner of this part runs with Runtime(clock_offset=…) = "
            f"{report.offset_ms / 3_600_000:.2f} h: the framework clock read {report.started_at} "
            f"at start, so the {NIGHTLY!r} ({ZONE}) tick is seconds away. One pending row per "
            "entry; after a delivery it is rewritten with a new id for the next night."
        ),
    )
    for column in ("when", "row id", "timer key", "command", "due at", "due in"):
        tick.add_column(column)
    for when, row in (("before it fired", report.tick), ("after", report.next_tick)):
        if row:
            tick.add_row(
                when,
                short_id(str(row["intent_id"])),
                str(row["timer_key"]),
                str(row["command"]),
                local_time(int(row["due_at_ms"])),
                f"{int(row['due_in_ms']) / 1000:,.1f} s",
            )
    runs = Table(
        title="deliveries of Billing.bill (receipts and the ledger)",
        title_style="bold",
        caption="command id = the tick row's id; each withdrawal is an intent to Account.",
    )
    for column in ("command id", "caller", "fired at", "invoices", "receipts"):
        runs.add_column(column)
    for run in report.runs:
        receipts = [r for r in report.receipts if r["command_id"] == run.command_id]
        runs.add_row(
            short_id(run.command_id),
            run.caller,
            run.fired_at,
            ", ".join(f"{i.account} {i.cents:,}" for i in run.invoices),
            str(len(receipts)),
        )
    balances = Table(title="accounts billed", title_style="bold")
    for column in ("account", "before", "fee", "after"):
        balances.add_column(column, justify="left" if column == "account" else "right")
    for name, (before, after) in report.balances.items():
        balances.add_row(name, f"{before:,}", f"{FEES[name]:,}", f"{after:,}")
    registry = Table(
        title="the runner registry (table runners)",
        title_style="bold",
        caption=(
            "heartbeat = age of its last heartbeat (every 10 s); a runner is live below 35 s, so "
            "the killed R1 is still listed (pruned after 1 h). loop = holds the Billing lease."
        ),
    )
    for column in ("phase", "runner", "id", "hosts", "jobs", "address", "heartbeat", "loop"):
        registry.add_column(column)
    for phase, runners in report.registry.items():
        for i, entry in enumerate(runners):
            registry.add_row(
                phase if i == 0 else "",
                entry.label,
                "…" + entry.runner_id[:8],
                ", ".join(entry.actor_types) or "—",
                ", ".join(entry.job_types) or "—",
                entry.address or "—",
                f"{entry.heartbeat_age:.1f} s ago" + ("" if entry.live else " (not live)"),
                "[bold green]owner[/bold green]" if entry.owns_loop else "",
                end_section=i == len(runners) - 1,
            )
    takeover = Table(
        title=f"the Billing loop: who ran it (singleton_lease={SINGLETON_LEASE} s)",
        title_style="bold",
        caption=(
            "From the ledger's loop steps (framework time of each step's turn): one runner at a "
            f"time; R2 could only acquire the lease once R1's had ended. Overlap: "
            f"{'YES' if report.overlaps() else 'none'}."
        ),
    )
    for column in ("runner", "steps", "first step", "last step", "note"):
        takeover.add_column(column, justify="right" if column == "steps" else "left")
    lease_end = int(report.lease_at_kill.get("lease_until_ms", 0))
    for runner, first, last, n in report.spans():
        if runner == report.owner_runner:
            note = (
                f"SIGKILLed at {time_of_day(report.killed_at_ms)}; "
                f"its lease ended at {time_of_day(lease_end)}"
            )
        elif runner == report.survivor_runner:
            note = (
                f"{(first - report.killed_at_ms) / 1000:.2f} s after the kill, "
                f"{(first - lease_end) / 1000:.2f} s after the lease ended"
            )
        else:
            note = ""
        takeover.add_row(
            report.labels.get(runner, runner[:8]),
            str(n),
            time_of_day(first),
            time_of_day(last),
            note,
        )
    return Group(tick, runs, balances, registry, takeover)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runner"]:  # part 4's second runner process
        url, schema_name, offset = sys.argv[2:5]
        sys.exit(asyncio.run(runner_process(url, schema_name, int(offset))))
    sys.exit(run())
