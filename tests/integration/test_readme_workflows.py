"""The "Workflows" examples run as printed (their test functions, on a fresh schema).

The examples are on docs/guides/workflows.md.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "workflows.md"


def block(heading: str) -> str:
    """The first python block after ``heading`` on the docs page."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


async def test_the_workflows_example_runs(akter_test: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A module of its own: pydantic registers WorkflowOutcome[str] in its defining module.
    module = types.ModuleType("readme_workflows")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(block("# Workflows"), "README Workflows", "exec"), module.__dict__)
    await module.test_an_order_is_fulfilled(akter_test)
    await module.test_one_live_run_per_key(akter_test)


async def test_the_step_identity_example_runs(
    akter_test: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType("readme_workflow_deploys")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(
        compile(block("**What a deploy may change safely"), "README deploys", "exec"),
        module.__dict__,
    )
    await module.test_a_changed_step_target_parks_the_run(akter_test)


async def test_the_job_step_cancel_example_runs(
    akter_test: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = types.ModuleType("readme_workflow_cancels")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    heading = "## Cancelling or timing out a run at a job step"
    exec(compile(block(heading), "README workflow cancels", "exec"), module.__dict__)
    await module.test_a_run_cancelled_at_a_job_step_cancels_its_job(akter_test)
