"""The "Flow control" example runs as printed (its test function, on a fresh schema).

The examples are on docs/guides/flow-control.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "flow-control.md"


def block(heading: str) -> str:
    """The first python block after ``heading`` on the docs page."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


async def test_the_flow_control_example_runs(akter_test: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "readme_flow"}
    exec(compile(block("# Flow control"), "README Flow control", "exec"), namespace)
    await namespace["test_a_tenant_over_its_quota_waits_for_tokens"](akter_test)
