"""More of the public contract (design §2) that must type-check cleanly under ``mypy --strict``.

Every ``assert_type`` pins what a user's editor sees; mypy must report no error in this file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type

import psycopg
from pydantic import BaseModel

import akter
import akter.jobs
import akter.staging
import akter.sync
from akter.client import Client
from akter.job_streams import AttemptStarted, Chunk, Closed, StreamOutcome, StreamReader


class Quote(BaseModel):
    cents: int
    currency: str = "EUR"


class OrderState(BaseModel):
    status: str = "new"
    cents: int = 0
    charge_id: str | None = None


class Charge(BaseModel):
    order: str
    cents: int


class Paid(akter.Event):
    charge_id: str


class OutOfStock(akter.DeclaredError, tag="typing-case.OutOfStock"):
    sku: str


class Ledger(akter.Actor[OrderState], name="Ledger", placement="actor"):
    @akter.command
    async def record(self, order: str, cents: int, note: str = "") -> None:
        self.state.cents += cents

    @akter.command
    async def remind(self) -> None:
        return None


class Billing(akter.Actor, singleton=True, access=akter.public, execution_timeout=5):
    @akter.command
    async def tick(self) -> int:
        return 1


class Order(akter.Actor[OrderState], access=akter.public, lock_wait=timedelta(seconds=1)):
    @akter.command(creates=True, errors=[OutOfStock])
    async def place(self, cents: int) -> str:
        if cents <= 0:
            raise OutOfStock(sku="none")
        assert_type(self.state, OrderState)
        assert_type(self.id, str)
        assert_type(self.tenant, str)
        assert_type(self.ref, akter.ActorRef)
        assert_type(self.caller, akter.User | akter.Anonymous | akter.System)
        assert_type(self.principal, str | None)
        assert_type(self.command_id, str)
        assert_type(self.now, datetime)
        self.state.status, self.state.cents = "charging", cents
        job_id = self.enqueue(
            Order.charge, Charge(order=self.id, cents=cents), key="charge", after=0.5
        )
        assert_type(job_id, str)
        self.send(Ledger.record, self.id, self.id, cents, note="placed")
        self.send(Billing.tick, "")
        self.later(after=5, key="r").send(Ledger.record, self.id, order=self.id, cents=1)
        self.later(after=timedelta(hours=1)).send(Ledger.remind, self.id)
        self.later(at=datetime(2030, 1, 1, tzinfo=UTC)).send(Ledger.remind, self.id)
        self.cancel_timer("r")
        self.emit(Paid(charge_id="none"))
        child = self.mint(Ledger)
        assert_type(child, akter.ActorRef)
        return self.state.status

    @akter.command
    async def cancel(self) -> None:
        self.cancel_job("charge")

    @akter.job(attempts=4, backoff=(1.0, timedelta(minutes=4)), timeout=30.0, per_actor=1)
    async def charge(call: akter.JobCall, req: Charge) -> str:
        if req.cents > 1_000_000:
            raise akter.JobFailure("amount refused", final=True)
        call.stream(f"charging {req.cents}")  # output streams: str, a model or a JSON value
        call.stream(req)
        return f"ch-{call.job_id}-{call.attempt}"

    @charge.on_success
    async def charged(self, charge_id: str) -> None:
        self.state.status, self.state.charge_id = "paid", charge_id
        self.emit(Paid(charge_id=charge_id))

    # A plain def (a blocking client) is an executor too: it runs in a thread.
    @akter.job(timeout=10.0, concurrency=4)
    def receipt(call: akter.JobCall, req: Charge) -> int:
        return req.cents

    @receipt.on_success
    async def receipted(self, cents: int) -> None:
        self.state.status = f"receipt for {cents}"

    @charge.on_dead_letter
    async def charge_failed(self, letter: akter.DeadLetter[Charge]) -> None:
        self.state.status = f"failed after {letter.attempts}: {letter.job.cents}"

    @charge.on_cancelled
    async def charge_cancelled(self, report: akter.jobs.Cancelled[Charge, str]) -> None:
        if isinstance(report.outcome, akter.jobs.Succeeded):
            self.state.charge_id = report.outcome.value

    @akter.query
    async def status(self) -> str:
        return self.state.status

    @akter.query
    async def quote(self, currency: str = "EUR") -> Quote:
        return Quote(cents=self.state.cents, currency=currency)

    @akter.query
    async def summary(self: akter.QueryView[OrderState], verbose: bool = False) -> str:
        # A query's self annotated as a view: what a query may read, and nothing it may not do.
        assert_type(self.state, OrderState)
        assert_type(self.id, str)
        assert_type(self.ref, akter.ActorRef)
        assert_type(self.principal, str | None)
        assert_type(self.now, datetime)
        assert_type(self.cursor, str)
        assert_type(self.events(after=self.cursor), akter.EventStream)
        return f"{self.state.status} {self.state.cents}" if verbose else self.state.status


async def use(url: str) -> None:
    assert_type(Order.charge, akter.Job[Charge, str])
    assert_type(Order.receipt, akter.Job[Charge, int])
    async with akter.Runtime(actors=[Order, Ledger, Billing], database_url=url) as runtime:
        assert_type(runtime, akter.Runtime)
        order = runtime.get(Order, "o-1", tenant="acme")
        assert_type(order, Order)
        assert_type(await order.place(1200), str)
        assert_type(await order.with_command_id("v1.1.2.x").place(1200), str)
        assert_type(await order.quote(), Quote)
        assert_type(await order.quote(currency="USD"), Quote)
        assert_type(await order.status(), str)
        assert_type(await order.summary(verbose=True), str)
        await order.cancel()

        stream = order.job_stream("v1.1.2.x", after=3)
        assert_type(stream, StreamReader)
        async for item in stream:
            assert_type(item, AttemptStarted | Chunk | Closed)
            assert_type(item.seq, int)
            if isinstance(item, Closed):
                assert_type(item.outcome, StreamOutcome)
        await stream.aclose()

        minted = await runtime.create(Order)
        assert_type(minted, Order)
        assert_type(minted.id, str)

        billing = runtime.get(Billing)
        assert_type(await billing.tick(), int)

        with akter.as_caller(akter.User("alice")) as caller:
            assert_type(caller, akter.User | akter.Anonymous | akter.System)
            await order.status()
        with akter.as_caller(akter.System("process", on_behalf_of="alice")):
            await order.place(1)

    try:
        await order.place(-1)
    except OutOfStock as exc:
        assert_type(exc.sku, str)
    except akter.ActorError as exc:
        assert_type(exc.retryable, bool)


# --- evolution: versions, aliases and migrations (evolution E1–E3) ---------------------------


class AccountV0(BaseModel):
    name: str = ""


class AccountV1(BaseModel):
    first: str = ""
    last: str = ""


class AccountState(BaseModel):
    first: str = ""
    last: str = ""
    cents: int = 0


class Deposited(akter.Event, version=1, aliases=("Credited",)):
    cents: int


@Deposited.migrate(from_version=0)
def _deposited_cents(old: dict[str, object]) -> dict[str, object]:
    return {"cents": old.get("amount", 0)}


class Account(akter.Actor[AccountState], name="Account", events=(Deposited,)):
    # In a class body pyright wants a migration (no ``self``) to be a staticmethod; akter takes
    # either spelling, and mypy accepts both.
    @akter.migrate_state(from_version=0)
    @staticmethod
    def _split(old: AccountV0) -> AccountV1:
        first, _, last = old.name.partition(" ")
        return AccountV1(first=first, last=last)

    # The plain spelling: pyright (not mypy) reports its first parameter as not the class.
    @akter.migrate_state(from_version=1)
    def _cents(old: dict[str, object]) -> dict[str, object]:  # pyright: ignore[reportGeneralTypeIssues]
        return {**old, "cents": 0}

    @akter.command(version=1, aliases=("credit",))
    async def deposit(self, cents: int, currency: str = "EUR") -> int:
        self.state.cents += cents
        self.emit(Deposited(cents=cents))
        return self.state.cents

    @deposit.migrate_payload(from_version=0)
    @staticmethod
    def _amount(old: dict[str, object]) -> dict[str, object]:
        return {"cents": old.get("amount", 0)}

    @akter.job(version=1, aliases=("pay",))
    async def settle(self_call: akter.JobCall, payload: Charge) -> str:
        return self_call.job_id

    @settle.migrate_payload(from_version=0)
    @staticmethod
    def _settle_v0(old: dict[str, object]) -> dict[str, object]:
        return old

    @akter.command
    async def touch(self) -> None:
        self.send(Account.deposit, "a-2", 5, currency="USD")


async def evolution(runtime: akter.Runtime) -> None:
    account = runtime.get(Account, "a-1")
    assert_type(await account.deposit(5), int)
    assert_type(Account.deposit.__name__, str)


# --- workflows (the workflows spec, W1, WF-11) -------------------------------------------------


class Shipped(BaseModel):
    tracking: str


class Fulfilment(akter.Actor[AccountState], name="Fulfilment"):
    @akter.command
    async def mark(self, text: str) -> int:
        return len(text)

    @akter.job()
    async def charge(call: akter.JobCall, payload: Charge) -> str:
        return call.job_id

    @akter.workflow(timeout=60)
    async def fulfil(wf: akter.Workflow, sku: str, cents: int = 0) -> str:
        assert_type(await wf.get(Fulfilment, wf.ref.id).mark(sku), int)
        assert_type(await wf.job(Fulfilment.charge, Charge(order=sku, cents=cents)), str)
        shipped = await wf.wait(Shipped, timeout=5)
        assert_type(shipped, Shipped | None)
        assert_type(await wf.step(len, sku), int)
        assert_type(wf.now(), datetime)
        assert_type(wf.patched("x"), bool)
        await wf.sleep(1)
        return "done"

    @fulfil.on_complete
    async def fulfilled(self, outcome: akter.WorkflowOutcome[str]) -> None:
        assert_type(outcome.result, str | None)

    @akter.command
    async def begin(self) -> str:
        run_id = self.start_workflow(Fulfilment.fulfil, "sku", key="k")
        self.signal_workflow(run_id, Shipped(tracking="t"))
        self.cancel_workflow(run_id)
        return run_id


async def workflows(runtime: akter.Runtime) -> None:
    run = await runtime.get(Fulfilment, "f-1").fulfil.start("sku", cents=5)
    assert_type(run, akter.WorkflowRun[str])
    assert_type(await run.result(timeout=10), str)
    assert_type(await run.status(), akter.WorkflowStatus)
    await run.signal(Shipped(tracking="t"))
    await run.cancel()
    assert_type(runtime.workflow_run(run.id), akter.WorkflowRun[Any])


# --- job resources: a typed key gives a typed lookup ---------------------------------------------


class Mailer:
    async def send(self, to: str) -> str:
        return to


MAILER = akter.Resource[Mailer]("mailer")
mailers = akter.Resources().provide(MAILER, Mailer())


@mailers.setup(akter.Resource[int]("pool size"))
async def pool_size() -> AsyncIterator[int]:
    yield 4


def mailer_of(call: akter.JobCall) -> None:
    assert_type(call.resource(MAILER), Mailer)
    assert_type(mailers.override(MAILER, Mailer()), akter.Resources)


# --- live reads: a watchable query watches as an async iterator of its result ---------------------


class Wallet(akter.Actor[OrderState], access=akter.public):
    @akter.query(watch=True)
    async def balance(self) -> int:
        return 0

    @akter.query(watch=True)
    async def above(self, floor: int) -> bool:
        return floor < 0

    @akter.command
    async def pay(self) -> None:
        self.broadcast("chat", {"paid": True})


async def live(runtime: akter.Runtime, client: Client) -> None:
    wallet = runtime.get(Wallet, "w-1")
    assert_type(await wallet.balance(), int)
    assert_type(wallet.balance.watch(), AsyncIterator[int])
    assert_type(wallet.above.watch(5), AsyncIterator[bool])
    async for value in wallet.balance.watch():
        assert_type(value, int)
    assert_type(await wallet.broadcasts("chat"), AsyncIterator[Any])
    assert_type(client.get(Wallet, "w-1").above.watch(floor=1), AsyncIterator[bool])
    async with client.connect() as socket:
        assert_type(socket.get(Wallet, "w-1").balance.watch(), AsyncIterator[int])
        assert_type(await socket.broadcasts(Wallet, "w-1", "chat"), AsyncIterator[Any])


# --- owned tables: rows in a command and a query, a tenant's rows across actors ------------------

import sqlalchemy as sa  # noqa: E402

order_lines = sa.Table(
    "order_lines",
    sa.MetaData(),
    *akter.owner_columns(),
    sa.Column("line_no", sa.Integer, primary_key=True),
    sa.Column("cents", sa.BigInteger),
)


class Basket(BaseModel):
    lines: int = 0


class Till(akter.Actor[Basket], tables=[order_lines]):
    @akter.command
    async def add(self, cents: int) -> int:
        self.state.lines += 1
        self.rows(order_lines).insert({"line_no": self.state.lines, "cents": cents})
        self.rows(order_lines).update({"cents": 0}).where(order_lines.c.cents < 0)
        assert_type(await self.rows(order_lines).count(), int)
        return self.state.lines

    @akter.query
    async def cents(self) -> list[int]:
        found = await self.rows(order_lines).order_by(order_lines.c.line_no).all()
        assert_type(found, list[dict[str, Any]])
        return [int(r["cents"]) for r in found]

    @akter.query
    async def biggest(self: akter.QueryView[Basket]) -> int:
        # a QueryView self reads its rows too (writes are not on the protocol: misuse.py)
        found = await self.rows(order_lines).order_by(order_lines.c.cents.desc()).limit(1).all()
        assert_type(found, list[dict[str, Any]])
        assert_type(await self.rows(order_lines).count(), int)
        return int(found[0]["cents"]) if found else 0


async def tenant_rows(runtime: akter.Runtime) -> None:
    rows = runtime.rows(order_lines, tenant="acme")
    found = await rows.all(rows.select.where(order_lines.c.cents > 100))
    assert_type(found, list[dict[str, Any]])
    page, after = await rows.page(key=[order_lines.c.line_no], limit=10)
    assert_type(page, list[dict[str, Any]])
    assert_type(after, tuple[Any, ...] | None)


# --- synchronous code: a SyncRuntime's blocking handles (docs/guides/sync.md) ---------------------


def sync_code(url: str) -> None:
    with akter.SyncRuntime(actors=[Order, Ledger, Billing, Fulfilment], database_url=url) as rt:
        assert_type(rt, akter.SyncRuntime)
        order = rt.get(Order, "o-1", tenant="acme")
        assert_type(order, akter.sync.SyncHandle[Order])
        assert_type(order.call(Order.place, 1200), str)
        assert_type(order.with_command_id("v1.1.2.x").call(Order.place, cents=1200), str)
        assert_type(order.call(Order.quote, currency="USD"), Quote)
        assert_type(order.call(Order.summary, verbose=True), str)  # a QueryView self
        assert_type(rt.call(Order.status, "o-1"), str)
        assert_type(rt.get(Billing).call(Billing.tick), int)
        assert_type(order.events(after="0"), list[akter.EventRecord])
        run = rt.get(Fulfilment, "f-1").start(Fulfilment.fulfil, "sku", cents=5)
        assert_type(run, akter.sync.SyncWorkflowRun[str])
        assert_type(run.result(timeout=10), str)
        assert_type(run.status(), akter.WorkflowStatus)
        assert_type(rt.workflow_run(run.id).result(), Any)
        assert_type(rt.run(runtime_of(rt).get(Order, "o-1").place(5)), str)
        assert_type(rt.mint_command_id(), str)
        assert_type(rt.create(Order), akter.sync.SyncHandle[Order])
        for record in order.follow(after="0", idle_timeout=5):
            assert_type(record, akter.EventRecord)
        assert_type(rt.stop(), akter.DrainReport)


def runtime_of(rt: akter.SyncRuntime) -> akter.Runtime:
    return rt.runtime


# --- staging in the application's transaction (issue 41) -----------------------------------------


async def staging(aconn: psycopg.AsyncConnection[tuple[Any, ...]]) -> None:
    conn = psycopg.connect("")
    stager = akter.stage(conn, Order, "o-1", after=5)
    assert_type(stager, akter.staging.Stager[Order])
    assert_type(stager.place(cents=5), str)
    assert_type(stager.send(Order.place, 5), str)
    assert_type(akter.stage(conn, Fulfilment, "f-1").fulfil.start("sku"), str)
    assert_type(akter.stage(aconn, Order, "o-1"), akter.staging.AsyncStager[Order])
    assert_type(await akter.stage(aconn, Order, "o-1").place(cents=5), str)
    assert_type(await akter.astage(aconn, Order, "o-1").send(Order.place, cents=5), str)
    batch = [akter.staged(Order, f"o-{i}").place(cents=i) for i in range(3)]
    assert_type(akter.stage_many(conn, batch), list[str])
    assert_type(await akter.stage_many(aconn, batch), list[str])


async def outcomes(runtime: akter.Runtime) -> None:
    assert_type(await runtime.outcome("v1.1.2.x", timeout=5), Any)


# --- subscriptions (the subscriptions spec) ---------------------------------------------------


class Follower(akter.Actor[OrderState]):
    @akter.subscription(Order, events=[Paid], route=lambda event, source: source.id)
    async def on_paid(self, delivery: akter.Delivery[Paid]) -> None:
        assert_type(delivery.source, akter.ActorRef)
        assert_type(delivery.cursor, int)
        assert_type(delivery.event, Paid)
        assert_type(delivery.emitted_at, datetime)
        if isinstance(delivery, akter.RetentionGap):
            assert_type(delivery.resume_after, int)

    @akter.subscription(Order, events=[Paid])
    async def on_followed(self, delivery: akter.Delivery[Paid]) -> None:
        assert_type(delivery.event.charge_id, str)

    @akter.command
    async def follow(self, order_id: str) -> None:
        self.subscribe(Follower.on_followed, source_id=order_id, start="start")
        self.unsubscribe(Follower.on_followed, source_id=order_id)
