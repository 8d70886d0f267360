"""Part 5 of the demo: deploying new code over durable data (``make demo``; spec evolution.md).

Version 1 of a small bank runs, leaves state rows and pending intents, and stops. Then the team
"deploys" version 2, which

* renames the state field ``name`` to ``full_name`` (a state migration moves the value);
* changes ``deposit(amount)`` (whole euros) to ``deposit(cents)`` (payload version 1, with a
  payload migration for the intents still pending at version 0);
* removes the ``ping`` command, although an intent to it is still pending.

``runtime.check()`` (the same as ``akter check app:runtime``) runs before each deploy, on code
that is not started: first on a draft of version 2 that forgot the state migration (the loss
guard reports the key it would drop), then on version 2 (the pending ``ping`` has no command
left). Version 2 is deployed anyway: the ``deposit`` intents are migrated and delivered, the
``ping`` intent is **parked** (kept whole, no attempt used, never deleted). Version 2.1 adds
``hello`` with ``aliases=("ping",)``; its check passes, and ``runtime.outbox.retry()`` delivers
the parked row exactly once. This part uses a schema of its own, dropped at the end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel
from rich.console import Group
from rich.table import Table

import akter

# --- version 1 ----------------------------------------------------------------------------------


class ProfileV1(BaseModel):
    """Version 1 of a customer's state."""

    name: str = ""
    cents: int = 0


class CustomerV1(akter.Actor[ProfileV1], name="Customer"):
    """Version 1: ``deposit`` takes whole euros; ``ping`` exists."""

    @akter.command
    async def register(self, name: str) -> None:
        self.state.name = name

    @akter.command
    async def deposit(self, amount: int) -> int:
        self.state.cents += amount * 100
        return self.state.cents

    @akter.command
    async def ping(self) -> None:
        return None


class DeskV1(akter.Actor, name="Desk"):
    """Sends to customers by intent (the rows the relay delivers after commit)."""

    @akter.command
    async def pay_out(self, customer: str, amount: int) -> None:
        self.send(CustomerV1.deposit, customer, amount)

    @akter.command
    async def greet(self, customer: str) -> None:
        self.send(CustomerV1.ping, customer)


# --- version 2 (and the draft that forgot its state migration) ----------------------------------


class Profile(BaseModel):
    """Version 2 of a customer's state: ``name`` is now ``full_name``."""

    full_name: str = ""
    cents: int = 0


class CustomerDraft(akter.Actor[Profile], name="Customer"):
    """Version 2 without its state migration: every stored ``name`` would be dropped."""

    @akter.command
    async def register(self, full_name: str) -> None:
        self.state.full_name = full_name


class Customer(akter.Actor[Profile], name="Customer"):
    """Version 2: a state migration, a payload version, and no ``ping`` any more."""

    @akter.migrate_state(from_version=0)
    @staticmethod
    def _rename(old: dict[str, Any]) -> dict[str, Any]:
        old["full_name"] = old.pop("name", "")
        return old

    @akter.command
    async def register(self, full_name: str) -> None:
        self.state.full_name = full_name

    @akter.command(version=1)
    async def deposit(self, cents: int) -> int:
        self.state.cents += cents
        return self.state.cents

    @deposit.migrate_payload(from_version=0)
    @staticmethod
    def _euros(old: dict[str, Any]) -> dict[str, Any]:
        return {"cents": old["amount"] * 100}

    @akter.query
    async def profile(self) -> Profile:
        return self.state.model_copy()


class Desk(akter.Actor, name="Desk"):
    """Version 2 of the sender."""

    @akter.command
    async def pay_out(self, customer: str, cents: int) -> None:
        self.send(Customer.deposit, customer, cents)


class CustomerFixed(Customer, name="Customer"):
    """Version 2.1: ``hello`` claims the pending rows still addressed to ``ping``."""

    @akter.command(aliases=("ping",))
    async def hello(self) -> None:
        self.state.full_name = self.state.full_name or "(greeted)"


# --- the scenario -------------------------------------------------------------------------------

CUSTOMERS = {"c-1": "Ada Lovelace", "c-2": "Alan Turing"}


@dataclass
class EvolutionReport:
    """What part 5 observed."""

    before: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    checks: list[tuple[str, akter.CheckReport]] = field(default_factory=list)
    parked: list[akter.ParkedRow] = field(default_factory=list)
    retried: int = 0
    after: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)


async def _rows(url: str, query: str) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query.encode())
        return await cur.fetchall()


def _runtime(url: str | None, schema: str, actors: list[Any], **options: Any) -> akter.Runtime:
    return akter.Runtime(actors, database_url=url, schema=schema, poll=0.25, **options)


async def evolution_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> EvolutionReport:
    """Run part 5 and return what it observed (the schema is dropped at the end)."""
    if database_url is None:
        # One embedded server for the whole part: its checks run between the runtimes, which
        # would otherwise each start and stop the server (and a check finds none running).
        from akter.operators.database import EmbeddedPostgres, default_data_dir

        server = EmbeddedPostgres(default_data_dir())
        url = await asyncio.to_thread(server.start)
        try:
            return await evolution_main(url, schema=schema, echo=echo)
        finally:
            await asyncio.to_thread(server.stop)
    schema = schema or f"evolve_{uuid.uuid4().hex[:8]}"
    report = EvolutionReport()
    actors = f'"{schema}".actors'
    outbox = f'"{schema}".outbox'
    v1 = _runtime(database_url, schema, [CustomerV1, DeskV1], relay=False)
    async with v1:
        url = v1.database_url
        try:
            for cid, name in CUSTOMERS.items():
                await v1.get(CustomerV1, cid).register(name)
                await v1.get(CustomerV1, cid).deposit(10)
            desk = v1.get(DeskV1, "front")
            await desk.pay_out("c-1", 5)
            await desk.pay_out("c-2", 7)
            await desk.greet("c-1")
            echo("v1 ran with its relay off: two deposits and a ping wait in the outbox.")
            report.before = await _rows(
                url,
                f"SELECT actor_id, state, state_version FROM {actors}"
                " WHERE actor_type = 'Customer' ORDER BY actor_id",
            )
            report.pending = await _rows(
                url,
                f"SELECT target_id, command, payload, payload_version FROM {outbox}"
                " ORDER BY command, target_id",
            )
        except BaseException:
            await _drop(url, schema)
            raise
    try:
        await _deploy(database_url, schema, report, echo)
        report.after = await _rows(
            url,
            f"SELECT actor_id, state, state_version FROM {actors}"
            " WHERE actor_type = 'Customer' ORDER BY actor_id",
        )
        report.left = await _rows(url, f"SELECT command, parked_at_ms FROM {outbox}")
    finally:
        await _drop(url, schema)
    return report


async def _deploy(
    url: str | None, schema: str, report: EvolutionReport, echo: Callable[[str], None]
) -> None:
    draft = _runtime(url, schema, [CustomerDraft, Desk])
    report.checks.append(("v2 draft (no state migration)", await draft.check()))
    v2 = _runtime(url, schema, [Customer, Desk])
    report.checks.append(("v2", await v2.check()))
    echo("v2 is deployed although its check failed: watch the ping intent park.")
    async with v2:
        await _settled(v2, schema)
        report.parked = await v2.outbox.parked()
    fixed = _runtime(url, schema, [CustomerFixed, Desk])
    report.checks.append(("v2.1 (hello aliases ping)", await fixed.check()))
    async with fixed:
        report.retried = await fixed.outbox.retry()
        await _settled(fixed, schema)
    echo(f"v2.1 retried {report.retried} parked row(s); it was delivered to hello.")


async def _settled(runtime: akter.Runtime, schema: str, within: float = 15.0) -> None:
    """Wait until the relay has delivered or parked every outbox row."""
    deadline = time.monotonic() + within
    query = f'SELECT count(*) AS n FROM "{schema}".outbox WHERE parked_at_ms IS NULL'
    while (await _rows(runtime.database_url, query))[0]["n"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the outbox did not settle")
        await asyncio.sleep(0.1)


async def _drop(url: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


def render_evolution(report: EvolutionReport) -> Group:
    """The tables of part 5."""
    before = Table(title="v1 left: state rows and pending intents", title_style="bold")
    for column in ("row", "what", "payload / state", "version"):
        before.add_column(column)
    for row in report.before:
        before.add_row(
            f"actor {row['actor_id']}", "state", str(row["state"]), str(row["state_version"])
        )
    for row in report.pending:
        before.add_row(
            f"intent → {row['target_id']}",
            row["command"],
            str(row["payload"]),
            str(row["payload_version"]),
        )
    checks = Table(
        title="runtime.check() before each deploy (akter check app:runtime)",
        title_style="bold",
        caption="ok = no error finding (akter check exits 0); otherwise it exits 1.",
    )
    for column in ("code", "ok", "severity", "finding", "type.member", "rows", "message"):
        checks.add_column(column)
    for label, result in report.checks:
        shown = [f for f in result.findings if f.severity != "info"] or result.findings[:1]
        for i, finding in enumerate(shown):
            checks.add_row(
                label if i == 0 else "",
                ("yes" if result.ok else "[red]no[/red]") if i == 0 else "",
                finding.severity,
                finding.kind,
                ".".join(p for p in (finding.actor_type, finding.member) if p),
                str(finding.count),
                finding.message[:90],
                end_section=i == len(shown) - 1,
            )
    parked = Table(title="parked by v2, then retried by v2.1", title_style="bold")
    for column in ("kind", "to", "command", "error"):
        parked.add_column(column)
    for parked_row in report.parked:
        parked.add_row(
            parked_row.kind,
            f"{parked_row.actor_type}/{parked_row.actor_id}",
            parked_row.command,
            parked_row.error[:80],
        )
    after = Table(
        title=f"after v2.1: {report.retried} retried; outbox rows left: {len(report.left)}",
        title_style="bold",
        caption="A row migrates when a turn writes it (state_version 1); reads never write.",
    )
    for column in ("actor", "state", "state_version"):
        after.add_column(column)
    for row in report.after:
        after.add_row(row["actor_id"], str(row["state"]), str(row["state_version"]))
    return Group(before, checks, parked, after)
