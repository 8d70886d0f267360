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
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg import sql
from pydantic import BaseModel, Field, PositiveInt
from rich.console import Console, Group
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
    schema: str = "akter",
    echo: Callable[[str], None] = print,
) -> OrdersReport:
    """Run the orders scenario and return what it observed.

    Args:
        database_url: As for :func:`main`.
        schema: The schema holding akter's tables.
        echo: Prints one line of the live event feed.
    """
    async with akter.Runtime(
        actors=[Order, Inventory],
        database_url=database_url,
        schema=schema,
        relay=False,
        poll=POLL,
    ) as front:
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


def run() -> int:
    console = Console()
    if not console.is_terminal:  # piped or captured: don't squeeze the table into 80 columns
        console = Console(width=160)
    started = time.perf_counter()
    with console.status("Running the demo (the first run initialises the embedded PostgreSQL) …"):
        rows = asyncio.run(main())
    console.print(render(rows))
    console.rule("orders: intents, timers and a live event feed")
    console.print("Live event feeds of orders A-1 and B-2, printed as events commit:")
    report = asyncio.run(orders_main(echo=lambda line: console.print(line, highlight=False)))
    console.print(render_orders(report))
    console.print(f"Done in {time.perf_counter() - started:.1f} s.", style="dim")
    return 0


if __name__ == "__main__":
    sys.exit(run())
