"""Components receive what they need, never the ``Runtime``; the store imports nothing above it.

The integrator's import-linter contracts (issue 11) check the whole graph; these checks pin the
two rules of the engine's components and the store gateways with the standard library alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "akter"
#: The leaf modules: they import nothing of akter but each other.
LEAVES = frozenset(
    {"akter.errors", "akter._ids", "akter._json", "akter._waits", "akter.callers", "akter._staging"}
)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (``TYPE_CHECKING`` blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_engine_component_imports_the_runtime() -> None:
    modules = [*sorted((SRC / "_engine").rglob("*.py")), SRC / "dead_letters.py"]
    offenders = {
        str(path.relative_to(SRC)): sorted(i for i in _imports(path) if i == "akter.runtime")
        for path in modules
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_store_imports_only_the_leaf_modules() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted((SRC / "_store").rglob("*.py")):
        above = sorted(
            i
            for i in _imports(path)
            if i.startswith("akter.") and not i.startswith("akter._store")
            if not any(i == a or i.startswith(a + ".") for a in LEAVES)
        )
        if above:
            offenders[str(path.relative_to(SRC))] = above
    assert offenders == {}
