"""Child workflow runners and the durable rows the workflow kill tests read.

:func:`workflow_child` starts ``python -m tests.faults.workflow_child`` on a test's schema and
always kills it on exit; the helpers below read the journal and the effect log of
:mod:`tests.faults.workflow_actors`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from akter.testing import ActorTest
from tests.faults.child_process import LINE_WITHIN, ChildProcess, start_module


class WorkflowChild(ChildProcess):
    """A workflow runner in a child process, spoken to over its stdin and stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc, "workflow child")

    async def expect(self, word: str, within: float = LINE_WITHIN) -> list[str]:
        """The fields of the next line, which must start with ``word``."""
        fields = (await self.line(within)).split()
        assert fields and fields[0] == word, (word, fields, await self.diagnosis())
        return fields[1:]


async def spawn(url: str, schema: str, *options: str) -> WorkflowChild:
    """Start a child runner on ``schema`` (not yet READY)."""
    return WorkflowChild(await start_module("tests.faults.workflow_child", url, schema, *options))


@asynccontextmanager
async def workflow_child(t: ActorTest, *options: str) -> AsyncIterator[WorkflowChild]:
    """A READY child runner on the test's schema; killed and reaped on exit."""
    async with await spawn(t.database_url, t.schema, *options) as running:
        (pid,) = await running.expect("READY")
        assert int(pid) == running.pid
        yield running


async def journal(t: ActorTest, run_id: str) -> list[dict[str, Any]]:
    """The run's journal rows in seq order."""
    return await t.rows(
        "SELECT seq, kind, name, status, detail, outcome, started_at_ms, recorded_at_ms"
        " FROM {schema}.workflow_steps WHERE run_id = %(id)s ORDER BY seq",
        {"id": run_id},
    )


def shape(rows: list[dict[str, Any]]) -> list[tuple[int, str, str, str]]:
    """(seq, kind, name, status) of journal rows."""
    return [(int(r["seq"]), str(r["kind"]), str(r["name"]), str(r["status"])) for r in rows]


async def run_row(t: ActorTest, run_id: str) -> dict[str, Any]:
    """The run's row."""
    (row,) = await t.rows(
        "SELECT *, lease_owner::text AS owner FROM {schema}.workflows WHERE run_id = %(id)s",
        {"id": run_id},
    )
    return row


async def effects(t: ActorTest, run_id: str) -> Counter[tuple[str, str]]:
    """How often each (step, kind) of a run really ran, in any process."""
    rows = await t.rows(
        "SELECT step, kind FROM {schema}.wf_effects WHERE run_id = %(id)s", {"id": run_id}
    )
    return Counter((str(r["step"]), str(r["kind"])) for r in rows)


async def receipts(t: ActorTest, command_id: str) -> list[dict[str, Any]]:
    """The receipts stored under one command id."""
    return await t.rows(
        "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": command_id}
    )
