"""Failures are visible with the logging the docs recommend (docs/guides/logging.md).

``akter.logs.configure_logging()`` in a process whose application configured no logging prints
akter's lines to a stream. A failed workflow run, a dead letter and a parked row each print
exactly one WARNING line, and that line alone names its subject (type, id, job or run id, cause),
without the record's ``extra`` fields.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

import pytest
from pydantic import BaseModel

import akter
from akter.logs import configure_logging
from akter.testing import ActorTest

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


class Empty(BaseModel):
    n: int = 0


class Charge(BaseModel):
    cents: int


class Till(akter.Actor[Empty], access=akter.public):
    @akter.command
    async def buy(self, cents: int) -> str:
        return self.enqueue(Till.charge, Charge(cents=cents))

    @akter.job(attempts=1, timeout=5)
    async def charge(call: akter.JobCall, payload: Charge) -> str:
        raise akter.JobFailure(f"card declined for {payload.cents} cents")

    @akter.workflow
    async def receipt(wf: akter.Workflow, cents: int) -> str:
        raise RuntimeError(f"printer out of paper at {cents} cents")


class DrawerOld(akter.Actor[Empty], name="Drawer", access=akter.public):
    @akter.command
    async def open_drawer(self, why: str) -> None:
        self.state.n += 1


class DrawerNew(akter.Actor[Empty], name="Drawer", access=akter.public):
    @akter.command
    async def count(self) -> int:
        return self.state.n


class Cashier(akter.Actor[Empty], access=akter.public):
    @akter.command
    async def pay_out(self, drawer: str) -> None:
        self.send(DrawerOld.open_drawer, drawer, "pay out")


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What ``configure_logging()`` prints in a process that configured no logging."""
    root = logging.getLogger()
    akter_logger = logging.getLogger("akter")
    level = akter_logger.level
    # A fresh process: no handler on the root logger (pytest's own are set aside for the test).
    monkeypatch.setattr(root, "handlers", [])
    stream = io.StringIO()
    handler = configure_logging(stream=stream)
    assert handler is not None and root.handlers == [handler]
    try:
        yield stream
    finally:
        akter_logger.setLevel(level)


def warnings_naming(printed: io.StringIO, subject: str) -> list[str]:
    return [
        line for line in printed.getvalue().splitlines() if " WARNING " in line and subject in line
    ]


async def test_a_failed_workflow_run_prints_one_warning_naming_the_run(
    akter_test: Make, printed: io.StringIO
) -> None:
    async with akter_test([Till]) as t:
        run = await t.get(Till, "t-1").receipt.start(120)
        await t.drain()
        with pytest.raises(akter.WorkflowFailed):
            await run.result(timeout=10)
        [line] = warnings_naming(printed, run.id)
        assert " WARNING akter.workflows: Workflow run failed: " in line
        assert f"workflow receipt of Till/'t-1' (run id {run.id!r})" in line
        assert line.endswith("RuntimeError: printer out of paper at 120 cents")


async def test_a_dead_letter_prints_one_warning_naming_the_job(
    akter_test: Make, printed: io.StringIO
) -> None:
    async with akter_test([Till]) as t:
        job_id = await t.get(Till, "t-2").buy(450)
        await t.advance(1)
        [letter] = await t.rows("SELECT job_id, cause FROM {schema}.dead_letters")
        assert letter["job_id"] == job_id
        [line] = warnings_naming(printed, job_id)
        assert " WARNING akter.jobs: Job dead-lettered after its last attempt: " in line
        assert f"job charge of Till/'t-2' (job id {job_id!r}), attempt 1" in line
        assert line.endswith("JobFailure: card declined for 450 cents")


async def test_a_parked_row_prints_one_warning_naming_the_row(
    akter_test: Make, printed: io.StringIO
) -> None:
    async with akter_test([Cashier]) as t:
        await t.get(Cashier, "c").pay_out("d-1")
        await t.add_runtime([DrawerNew])
        await t.drain()
        [row] = await t.rows("SELECT intent_id, parked_at_ms FROM {schema}.outbox")
        assert row["parked_at_ms"] is not None
        [line] = warnings_naming(printed, row["intent_id"])
        assert " WARNING akter.relay: Outbox row parked: this code cannot deliver it: " in line
        assert f"intent {row['intent_id']!r} to Drawer/'d-1'.open_drawer: UnknownCommand" in line
