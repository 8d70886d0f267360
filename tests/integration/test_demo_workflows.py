"""Part 6 of the demo (``examples/demo_workflows.py``) runs and shows what it claims."""

from __future__ import annotations

import uuid

import pytest
from examples.demo_workflows import LABEL_LINE, render_workflows, workflows_main
from rich.console import Console

pytestmark = [pytest.mark.timeout(120), pytest.mark.kill]


async def test_the_order_workflow_survives_the_kill_of_its_runner(akter_db: str) -> None:
    report = await workflows_main(akter_db, schema=f"flows_{uuid.uuid4().hex[:8]}", echo=print)
    assert report.child_exit == -9  # SIGKILL
    kinds_before = [(r.kind, r.name, r.status) for r in report.before]
    assert kinds_before == [
        ("command", "DemoShop.note", "done"),
        ("job", "charge", "done"),
        ("command", "DemoShop.note", "done"),
        ("wait", "Shipped", "done"),
    ]
    kinds_after = [(r.kind, r.name, r.status) for r in report.after]
    assert kinds_after == [
        *kinds_before,
        ("step", "print_label", "done"),
        ("command", "DemoShop.note", "done"),
    ]
    # The steps recorded before the kill were answered from the journal: each note ran once.
    assert report.notes["A"] == ["reserved", "charged ch_A_2", "label TRACK-7 printed by R2"]
    assert report.receipts == {"A": 3, "B": 3}
    assert report.notes["B"] == ["reserved", "charged ch_B_2", "refunded ch_B_2"]
    assert report.outcomes == {"A": "completed: shipped TRACK-7", "B": "completed: refunded"}
    assert report.attempts["A"] >= 3  # R1 until the wait, R1 after the signal, R2 after the kill
    assert report.dead_letters == 0
    assert any(LABEL_LINE not in line and "SIGKILL" in line for line in report.log)
    Console(width=160, record=True).print(render_workflows(report))
