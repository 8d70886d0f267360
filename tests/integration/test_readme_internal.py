"""The "Internal commands and workflows" example runs as printed (on a fresh schema).

The examples are on docs/concepts.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def block(heading: str) -> str:
    """The first python block after ``heading`` on the docs page."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


async def test_the_internal_members_example_runs(akter_test: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "readme_internal"}
    heading = "### Internal commands and workflows"
    exec(compile(block(heading), "README Internal commands and workflows", "exec"), namespace)
    await namespace["test_only_the_framework_reaches_internal_members"](akter_test)
