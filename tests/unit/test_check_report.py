"""The public values of ``akter check``: ``CheckReport`` and ``Finding`` (evolution E5)."""

from __future__ import annotations

import json

import akter
from akter._engine.check.report import Findings, report


def test_ok_means_no_error_finding() -> None:
    warning = akter.Finding("warning", "parked", "A", "pay", 1, "1 parked row.")
    error = akter.Finding("error", "unknown_command", "A", "old", 2, "2 rows.", ("x",))
    assert akter.CheckReport((warning,)).ok
    assert akter.CheckReport().ok
    failing = akter.CheckReport((warning, error))
    assert not failing.ok and failing.errors == (error,)
    assert failing.of("parked") == [warning]


def test_the_json_form_is_one_object_with_every_field() -> None:
    finding = akter.Finding("error", "state_lost", "A", None, 1, "m", ("A/'a': k",), None, "fix")
    data = json.loads(json.dumps(akter.CheckReport((finding,)).to_json()))
    assert data == {
        "ok": False,
        "findings": [
            {
                "severity": "error",
                "kind": "state_lost",
                "actor_type": "A",
                "member": None,
                "count": 1,
                "message": "m",
                "examples": ["A/'a': k"],
                "version": None,
                "fix": "fix",
            }
        ],
    }


def test_findings_come_errors_first_with_counts_and_capped_examples() -> None:
    found = Findings()
    found.add_many("state_version", "B", None, 1, 7)
    found.add_many("state_version", "B", None, 0, 3)
    for i in range(8):
        found.add("unknown_command", "B", "old", example=f"row {i}\n  with   spaces")
    found.add("parked", "A", "pay", example="p")
    findings = report(found, {})
    assert [(f.severity, f.kind, f.version) for f in findings] == [
        ("error", "unknown_command", None),
        ("warning", "parked", None),
        ("info", "state_version", 0),
        ("info", "state_version", 1),
    ]
    unknown = findings[0]
    assert unknown.count == 8 and len(unknown.examples) == 5
    assert unknown.examples[0] == "row 0 with spaces"
    assert "aliases=('old',)" in unknown.fix
