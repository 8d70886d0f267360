"""``akter workflows`` in subprocesses against a real database (workflows W4, W5).

The runs are started and driven in this process with the project's own runtime (its relay pass
claims runnable runs); the verbs then go through the CLI, and the assertions read the durable
rows. A diverged run is made by rewriting its first journal record in SQL (what a deploy that
reordered the steps looks like to a replay), and "fixed" by writing it back.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

from tests.integration.test_cli import run

pytestmark = pytest.mark.timeout(180)

APP = """
import os
from datetime import timedelta
import akter
from pydantic import BaseModel

class S(BaseModel):
    marks: list[str] = []

class Shipped(BaseModel):
    tracking: str

class Note(BaseModel):
    text: str

class Order(akter.Actor[S], access=akter.public):
    @akter.command
    async def mark(self, text: str) -> int:
        self.state.marks.append(text)
        return len(self.state.marks)

    @akter.workflow
    async def shipping(wf: akter.Workflow) -> str:
        await wf.get(Order, wf.ref.id).mark("reserved")
        shipped = await wf.wait(Shipped)
        return shipped.tracking

    @akter.workflow
    async def napper(wf: akter.Workflow) -> str:
        await wf.sleep(timedelta(hours=1))
        return "rested"

runtime = akter.Runtime(
    [Order], database_url=os.environ["CLI_URL"], schema=os.environ["CLI_SCHEMA"]
)
"""


@pytest.fixture
def project(tmp_path: Path, akter_db: str) -> Iterator[dict[str, str]]:
    (tmp_path / "wfapp.py").write_text(APP)
    schema = f"cliwf_{uuid.uuid4().hex[:10]}"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CLI_URL": akter_db, "CLI_SCHEMA": schema, "PYTHONPATH": path}
    yield {"cwd": str(tmp_path), "schema": schema, **env}
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class App:
    """The project's module in this process (as the CLI imports it) and its runtime."""

    def __init__(self, project: dict[str, str]) -> None:
        self.project = project

    def __enter__(self) -> ModuleType:
        sys.path.insert(0, self.project["cwd"])
        os.environ["CLI_URL"] = self.project["CLI_URL"]
        os.environ["CLI_SCHEMA"] = self.project["schema"]
        return importlib.import_module("wfapp")

    def __exit__(self, *exc: object) -> None:
        sys.path.remove(self.project["cwd"])
        sys.modules.pop("wfapp", None)


async def drain(runtime: Any, rounds: int = 20) -> None:
    """Relay passes until no run is runnable or running (each pass claims the due ones)."""
    for _ in range(rounds):
        await runtime._relay.run_pass()
        await runtime._workflow_engine.wait_idle()
        busy = await runtime.workflows.runs(status="runnable")
        busy += await runtime.workflows.runs(status="running")
        if not busy:
            return
    raise AssertionError(f"runs still busy after {rounds} passes: {busy}")


def sql(project: dict[str, str], statement: str, params: dict[str, Any] | None = None) -> list[Any]:
    with psycopg.connect(project["CLI_URL"], autocommit=True) as conn:
        cur = conn.execute(statement.replace("{schema}", f'"{project["schema"]}"'), params)
        return cur.fetchall() if cur.description else []


def row(project: dict[str, str], run_id: str) -> tuple[Any, ...]:
    [found] = sql(
        project,
        "SELECT status, cancel_requested, error, result FROM {schema}.workflows"
        " WHERE run_id = %(id)s",
        {"id": run_id},
    )
    return tuple(found)


def cli(project: dict[str, str], *args: str) -> Any:
    """Run ``akter workflows ARGS`` with the project's target; the completed process."""
    verb, *rest = args
    return run(project, "workflows", verb, "wfapp:runtime", *rest)


def show(project: dict[str, str], run_id: str) -> dict[str, Any]:
    shown = cli(project, "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    body: dict[str, Any] = json.loads(shown.stdout)
    return body


async def test_list_show_signal_and_cancel_runs(project: dict[str, str]) -> None:
    with App(project) as app:
        async with app.runtime as rt:
            waiting = await rt.get(app.Order, "o1").shipping.start()
            sleeping = await rt.get(app.Order, "o2").napper.start()
            await drain(rt)

    listed = cli(project, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert set(runs) == {waiting.id, sleeping.id}
    assert runs[waiting.id]["status"] == "suspended"
    assert runs[waiting.id]["waiting"] == "signal Shipped"
    # Only a signal, a cancel or its deadline (the default timeout=, 30 days) wakes it.
    assert runs[waiting.id]["wake_at_ms"] == runs[waiting.id]["deadline_ms"]
    assert runs[sleeping.id]["wake_at_ms"] > runs[sleeping.id]["started_at_ms"]
    assert runs[waiting.id]["actor"] == {"tenant": "default", "type": "Order", "id": "o1"}
    filtered = cli(project, "list", "--status", "suspended", "--type", "Order", "--limit", "1")
    assert filtered.returncode == 0, filtered.stderr
    assert "workflow runs" in filtered.stdout and "Order/o" in filtered.stdout
    assert json.loads(cli(project, "list", "--status", "completed", "--json").stdout) == []
    assert json.loads(cli(project, "list", "--type", "Ghost", "--json").stdout) == []
    bad_status = cli(project, "list", "--status", "asleep")
    assert bad_status.returncode == 1 and "--status" in bad_status.stderr

    detail = show(project, waiting.id)
    assert (detail["status"], detail["waiting"], detail["signals"]) == (
        "suspended",
        "signal Shipped",
        [],
    )
    assert [(s["seq"], s["kind"], s["name"], s["status"]) for s in detail["steps"]] == [
        (0, "command", "Order.mark", "done"),
        (1, "wait", "Shipped", "pending"),
    ]
    table = cli(project, "show", waiting.id)
    assert table.returncode == 0, table.stderr
    for text in ("suspended", "signal Shipped", "Order.mark", "steps", "signals"):
        assert text in table.stdout, text
    asleep = cli(project, "show", sleeping.id)
    assert "sleep until 20" in asleep.stdout  # the wake time, as an ISO time

    # Signals: refusals first (nothing is kept), then a stray one and the awaited one.
    not_json = cli(project, "signal", waiting.id, "Shipped", "{tracking")
    assert not_json.returncode == 1 and "not JSON" in not_json.stderr
    not_object = cli(project, "signal", waiting.id, "Shipped", "[1]")
    assert not_object.returncode == 1 and "JSON object" in not_object.stderr
    unknown = cli(project, "signal", "nope", "Shipped", "{}")
    assert unknown.returncode == 1 and "No workflow run 'nope'" in unknown.stderr
    assert sql(project, "SELECT * FROM {schema}.workflow_signals") == []
    stray = cli(project, "signal", waiting.id, "Note", '{"text": "fragile"}')
    assert stray.returncode == 0, stray.stderr
    sent = cli(project, "signal", waiting.id, "Shipped", '{"tracking": "T-1"}')
    assert sent.returncode == 0, sent.stderr
    assert row(project, waiting.id)[0] == "runnable"  # the signal woke it
    pending = show(project, waiting.id)["signals"]
    assert [(g["name"], g["payload"], g["state"]) for g in pending] == [
        ("Note", {"text": "fragile"}, "pending"),
        ("Shipped", {"tracking": "T-1"}, "pending"),
    ]

    cancelled = cli(project, "cancel", sleeping.id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancel requested" in cancelled.stdout
    assert row(project, sleeping.id)[:2] == ("runnable", True)

    with App(project) as app:
        async with app.runtime as rt:
            await drain(rt)
    status, _, _, result = row(project, waiting.id)
    assert (status, json.loads(result)) == ("completed", "T-1")
    status, requested, error, _ = row(project, sleeping.id)
    assert (status, requested, json.loads(error)["type"]) == (
        "cancelled",
        True,
        "WorkflowCancelled",
    )
    signals = show(project, waiting.id)["signals"]
    assert [(g["name"], g["state"], g["consumed_seq"]) for g in signals] == [
        ("Note", "pending", None),
        ("Shipped", "consumed", 1),
    ]

    # Ended runs take no cancel and no signal; an unknown run is refused by every verb.
    ended = cli(project, "cancel", waiting.id)
    assert ended.returncode == 1 and "has ended (completed)" in ended.stderr
    late = cli(project, "signal", sleeping.id, "Shipped", '{"tracking": "T-2"}')
    assert late.returncode == 1 and "has ended" in late.stderr
    for verb in ("show", "cancel", "retry"):
        missing = cli(project, verb, "nope")
        assert missing.returncode == 1 and "No workflow run 'nope'" in missing.stderr, verb
    assert "Traceback" not in missing.stderr
    done = cli(project, "list", "--status", "completed", "--json")
    assert [r["run_id"] for r in json.loads(done.stdout)] == [waiting.id]


async def test_retry_and_cancel_diverged_runs(project: dict[str, str]) -> None:
    with App(project) as app:
        async with app.runtime as rt:
            fixed = await rt.get(app.Order, "o1").shipping.start()
            abandoned = await rt.get(app.Order, "o2").shipping.start()
            await drain(rt)
            runs = (fixed.id, abandoned.id)
            # The journal now disagrees with the code at seq 0 (as after reordered steps).
            sql(
                project,
                "UPDATE {schema}.workflow_steps SET kind = 'local', name = 'reordered'"
                " WHERE run_id = ANY(%(ids)s) AND seq = 0",
                {"ids": list(runs)},
            )
            for run_id in runs:
                await rt.workflows.signal_json(run_id, "Shipped", {"tracking": run_id})
            await drain(rt)
    for run_id in runs:
        status, _, error, _ = row(project, run_id)
        assert status == "diverged"
        assert "Step 0 of workflow run" in json.loads(error)["message"]
    shown = cli(project, "show", fixed.id)
    assert "diverged" in shown.stdout and "Diverged" in shown.stdout

    retried = cli(project, "retry", fixed.id)
    assert retried.returncode == 0, retried.stderr
    assert row(project, fixed.id)[:3] == ("runnable", False, None)
    again = cli(project, "retry", fixed.id)
    assert again.returncode == 1 and "is runnable, not diverged" in again.stderr

    dropped = cli(project, "cancel", abandoned.id)
    assert dropped.returncode == 0, dropped.stderr
    assert "cancelled diverged run" in dropped.stdout
    status, requested, error, _ = row(project, abandoned.id)
    assert (status, requested, json.loads(error)["type"]) == (
        "cancelled",
        True,
        "WorkflowCancelled",
    )

    # The fix: the journal agrees with the code again; the retried run finishes from it.
    sql(
        project,
        "UPDATE {schema}.workflow_steps SET kind = 'command', name = 'Order.mark'"
        " WHERE run_id = %(id)s AND seq = 0",
        {"id": fixed.id},
    )
    with App(project) as app:
        async with app.runtime as rt:
            await drain(rt)
    status, _, _, result = row(project, fixed.id)
    assert (status, json.loads(result)) == ("completed", fixed.id)
    # The command step was answered from the journal, not run again.
    [(state,)] = sql(project, "SELECT state FROM {schema}.actors WHERE actor_id = 'o1'")
    assert state["marks"] == ["reserved"]
