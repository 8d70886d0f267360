"""Part 5 of the demo (``examples/demo_evolution.py``) runs and shows what it claims."""

from __future__ import annotations

import asyncio
import io

import pytest
from examples.demo_evolution import EvolutionReport, evolution_main, render_evolution
from rich.console import Console

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def report(akter_db: str) -> EvolutionReport:
    """One run of part 5, shared by the tests below."""
    return asyncio.run(evolution_main(akter_db, echo=lambda line: None))


def test_v1_leaves_state_and_pending_intents(report: EvolutionReport) -> None:
    assert [r["state"]["name"] for r in report.before] == ["Ada Lovelace", "Alan Turing"]
    assert {r["state_version"] for r in report.before} == {0}
    assert [(r["command"], r["payload_version"]) for r in report.pending] == [
        ("deposit", 0),
        ("deposit", 0),
        ("ping", 0),
    ]


def test_each_check_says_what_the_deploy_would_do(report: EvolutionReport) -> None:
    (_, draft), (_, v2), (_, fixed) = report.checks
    lost = [f for f in draft.findings if f.kind == "state_lost"]
    assert not draft.ok and lost and "holds 'name'" in lost[0].examples[0]
    assert not v2.ok
    errors = [f for f in v2.findings if f.severity == "error"]
    assert [(f.actor_type, f.member) for f in errors] == [("Customer", "ping")], errors
    assert fixed.ok, fixed.findings
    assert any(f.severity == "warning" for f in fixed.findings)  # the parked row


def test_v2_parks_the_removed_command_and_v2_1_delivers_it_once(
    report: EvolutionReport,
) -> None:
    assert [(r.command, r.actor_id) for r in report.parked] == [("ping", "c-1")]
    assert "ping" in report.parked[0].error
    assert report.retried == 1
    assert report.left == []


def test_written_rows_migrate_and_payloads_were_upgraded(report: EvolutionReport) -> None:
    states = {r["actor_id"]: (r["state"], r["state_version"]) for r in report.after}
    # 10 euros at v1, then 5 and 7 euros by intents staged at payload version 0.
    assert states["c-1"] == ({"full_name": "Ada Lovelace", "cents": 1_500}, 1)
    assert states["c-2"] == ({"full_name": "Alan Turing", "cents": 1_700}, 1)


def test_render(report: EvolutionReport) -> None:
    out = io.StringIO()
    Console(file=out, width=200).print(render_evolution(report))
    text = out.getvalue()
    assert "parked by v2" in text and "v2.1" in text
