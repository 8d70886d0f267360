"""Part 6 of the demo: an order workflow that survives a SIGKILL (``make demo``; spec workflows.md).

Two orders run the workflow ``Shop.fulfil``: reserve (a command step), charge through a flaky
provider (a job step: its first attempt fails, the retry succeeds), wait for a ``Shipped`` signal
for a few seconds, print a label (a local step) and close; without the signal in time, refund.

R1, a runner in a child process, runs both orders. Order A gets its signal; R1 resumes it and is
SIGKILLed while it prints the label (``wf.step``: at least once). The journal is printed before
and after. R2, a runner in this process, starts; once R1's lease on the run has ended it claims
the run and replays it from the top: the recorded steps are answered from the journal (the
command handlers and the provider are not called again), the label step runs again, and the run
completes. Order B's wait times out on R2, which refunds it. This part uses a schema of its own,
dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel
from rich.console import Group
from rich.table import Table

import akter

#: The lease of a running run (``Runtime(workflow_lease=...)``; 30 s by default): short, so the
#: takeover after the kill takes about this long.
LEASE = 2.0
#: How long an order waits for its shipment signal.
SHIP_WITHIN = timedelta(seconds=4)
#: The relay's poll of this part's runners (their passes claim runnable runs).
POLL = 0.1
#: The child runner prints this, then sleeps in the label step until it is killed.
LABEL_LINE = "LABEL"
WITHIN = 60.0
HERE = Path(__file__).resolve()


class Shipped(BaseModel):
    """The signal a warehouse sends when the parcel leaves."""

    tracking: str


class Charge(BaseModel):
    """A charge of the payment provider."""

    order: str
    cents: int


class OrderState(BaseModel):
    """What an order remembers: its notes and how its workflow ended."""

    notes: list[str] = []
    outcome: str | None = None


async def print_label(order: str, tracking: str) -> str:
    """The local step: in R1 (the child) it announces itself and hangs until the kill."""
    runner = os.environ.get("AKTER_DEMO_RUNNER", "R2")
    if runner == "R1":
        sys.stdout.write(f"{LABEL_LINE} {order}\n")
        sys.stdout.flush()
        await asyncio.sleep(WITHIN)
    return f"label {tracking} printed by {runner}"


class Shop(akter.Actor[OrderState], name="DemoShop"):
    """An order with its fulfilment workflow."""

    @akter.command
    async def note(self, text: str) -> int:
        self.state.notes.append(text)
        return len(self.state.notes)

    @akter.query
    async def read(self) -> OrderState:
        return self.state

    @akter.job(attempts=3, backoff=(0.2, 0.2), timeout=5)
    async def charge(call: akter.JobCall, payload: Charge) -> str:
        if call.attempt == 1:
            raise akter.JobFailure("the card network timed out")
        return f"ch_{payload.order}_{call.attempt}"

    @akter.workflow(timeout=timedelta(minutes=5))
    async def fulfil(wf: akter.Workflow, cents: int) -> str:
        shop = wf.get(Shop, wf.ref.id)
        await shop.note("reserved")
        charge_id = await wf.job(Shop.charge, Charge(order=wf.ref.id, cents=cents))
        await shop.note(f"charged {charge_id}")
        shipped = await wf.wait(Shipped, timeout=SHIP_WITHIN)
        if shipped is None:
            await shop.note(f"refunded {charge_id}")
            return "refunded"
        label = await wf.step(print_label, wf.ref.id, shipped.tracking)
        await shop.note(label)
        return f"shipped {shipped.tracking}"

    @fulfil.on_complete
    async def fulfilled(self, outcome: akter.WorkflowOutcome[str]) -> None:
        self.state.outcome = f"{outcome.status}: {outcome.result}"


def _runtime(database_url: str | None, schema: str, **options: Any) -> akter.Runtime:
    return akter.Runtime(
        actors=[Shop],
        database_url=database_url,
        schema=schema,
        workflow_lease=LEASE,
        poll=POLL,
        **options,
    )


@dataclass
class StepRow:
    """One journal record as the part prints it."""

    seq: int
    kind: str
    name: str
    status: str
    outcome: str


@dataclass
class WorkflowsReport:
    """What part 6 observed, read from the database."""

    child_pid: int = 0
    child_exit: int | None = None
    before: list[StepRow] = field(default_factory=list)
    after: list[StepRow] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    receipts: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    log: list[str] = field(default_factory=list)


async def _rows(url: str, query: sql.Composed, *params: Any) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def _journal(url: str, schema: str, run_id: str) -> list[StepRow]:
    rows = await _rows(
        url,
        sql.SQL(
            "SELECT seq, kind, name, status, coalesce(outcome, detail, '') AS outcome "
            "FROM {}.workflow_steps WHERE run_id = %s ORDER BY seq"
        ).format(sql.Identifier(schema)),
        run_id,
    )
    return [
        StepRow(r["seq"], r["kind"], r["name"], r["status"], str(r["outcome"])[:60]) for r in rows
    ]


async def _until(what: str, check: Callable[[], Awaitable[bool]], within: float = WITHIN) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {within} s.")
        await asyncio.sleep(0.05)


async def workflows_main(
    database_url: str | None = None,
    *,
    schema: str | None = None,
    echo: Callable[[str], None] = print,
) -> WorkflowsReport:
    """Run part 6 and return what it observed (the schema is dropped at the end)."""
    if database_url is None:
        # One embedded server for the whole part: the child runner and the resuming runner
        # connect to it, and the schema is dropped after the runtimes have stopped.
        from akter.operators.database import EmbeddedPostgres, default_data_dir

        server = EmbeddedPostgres(default_data_dir())
        url = await asyncio.to_thread(server.start)
        try:
            return await workflows_main(url, schema=schema, echo=echo)
        finally:
            await asyncio.to_thread(server.stop)
    schema = schema or f"flows_{uuid.uuid4().hex[:8]}"
    report = WorkflowsReport()

    def say(text: str) -> None:
        report.log.append(text)
        echo(text)

    # The front starts runs and sends signals; with its relay off it claims no run.
    front = _runtime(database_url, schema, relay=False)
    url = ""
    try:
        async with front:
            url = front.database_url
            await _scenario(front, url, schema, report, say)
    finally:
        if url:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            await _rows(url, drop)
    return report


async def _scenario(
    front: akter.Runtime,
    url: str,
    schema: str,
    report: WorkflowsReport,
    say: Callable[[str], None],
) -> None:
    from examples.runner_process import RunnerProcess

    child = await RunnerProcess.start(
        str(HERE), "--runner", url, schema, env={"AKTER_DEMO_RUNNER": "R1"}
    )
    report.child_pid = child.proc.pid
    try:
        await child.line()  # READY
        say(f"R1 started in a child process (pid {child.proc.pid}); it runs the workflows.")
        a = await front.get(Shop, "A").fulfil.start(2500)
        b = await front.get(Shop, "B").fulfil.start(1200)
        say("Orders A and B started their fulfil workflow.")

        async def waiting(run: akter.WorkflowRun[str]) -> bool:
            return (await run.status()).waiting == "signal Shipped"

        await _until("both orders waiting for shipment", lambda: _both(waiting, a, b))
        say("Both are charged (the first attempt failed, the retry succeeded) and wait.")
        await a.signal(Shipped(tracking="TRACK-7"))
        say("A's parcel left: Shipped(tracking='TRACK-7') sent to A's run.")
        label = await child.line()
        assert label == f"{LABEL_LINE} A", label
        report.before = await _journal(url, schema, a.id)
        say("R1 is printing A's label (a local step) — SIGKILL.")
        child.kill()
    finally:
        report.child_exit = await child.close()
    async with _runtime(url, schema) as r2:
        say(f"R2 started here; it resumes A once R1's {LEASE:g} s lease on it has ended.")
        done_a = await r2.workflow_run(a.id).result(timeout=WITHIN)
        done_b = await r2.workflow_run(b.id).result(timeout=WITHIN)
        say(f"A: {done_a}; B: {done_b} (no shipment within {SHIP_WITHIN.seconds} s).")

        async def reported() -> bool:
            states = [await r2.get(Shop, o).read() for o in ("A", "B")]
            return all(s.outcome is not None for s in states)

        await _until("on_complete delivered to both orders", reported)
        report.after = await _journal(url, schema, a.id)
        for order, run in (("A", a), ("B", b)):
            state = await r2.get(Shop, order).read()
            report.outcomes[order] = state.outcome or ""
            report.notes[order] = state.notes
            report.attempts[order] = (await r2.workflow_run(run.id).status()).attempts
        receipts = await _rows(
            url,
            sql.SQL(
                "SELECT actor_id, count(*) AS n FROM {}.receipts WHERE command = 'note' "
                "GROUP BY actor_id"
            ).format(sql.Identifier(schema)),
        )
        report.receipts = {r["actor_id"]: int(r["n"]) for r in receipts}
        letters = await _rows(
            url, sql.SQL("SELECT count(*) AS n FROM {}.dead_letters").format(sql.Identifier(schema))
        )
        report.dead_letters = int(letters[0]["n"])


async def _both(check: Callable[[Any], Awaitable[bool]], *runs: Any) -> bool:
    return all([await check(run) for run in runs])


def render_workflows(report: WorkflowsReport) -> Group:
    """The part's tables: A's journal before and after the kill, and how each order ended."""

    def journal(title: str, rows: list[StepRow]) -> Table:
        table = Table(title=title, title_justify="left")
        for column in ("seq", "kind", "name", "status", "outcome / detail"):
            table.add_column(column)
        for r in rows:
            table.add_row(str(r.seq), r.kind, r.name, r.status, r.outcome)
        return table

    orders = Table(title="How each order ended", title_justify="left")
    for column in ("order", "on_complete", "notes", "attempts", "note receipts"):
        orders.add_column(column)
    for order in sorted(report.outcomes):
        orders.add_row(
            order,
            report.outcomes[order],
            "; ".join(report.notes[order]),
            str(report.attempts[order]),
            str(report.receipts.get(order, 0)),
        )
    return Group(
        journal(f"A's journal when R1 (pid {report.child_pid}) was killed", report.before),
        journal("A's journal after R2 resumed it", report.after),
        orders,
    )


async def runner_process(database_url: str, schema: str) -> int:
    """The child of part 6 (``demo_workflows.py --runner URL SCHEMA``): R1."""
    async with _runtime(database_url, schema):
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--runner"]:
        url_arg, schema_arg = sys.argv[2:4]
        sys.exit(asyncio.run(runner_process(url_arg, schema_arg)))
    sys.path.insert(0, str(HERE.parents[1]))  # as a script, examples/ is not a package
    report = asyncio.run(workflows_main())
    from rich.console import Console

    Console().print(render_workflows(report))
