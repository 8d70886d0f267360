"""The library's code fits on a screen: no module over 600 lines, no function over 80.

A module past the bound holds more than one concept (split it along its seam); a function past
it hides its decisions (name them as functions of their own). Complexity has its own gate: ruff's
C901 at 15 (``[tool.ruff.lint.mccabe]``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import akter

SOURCE = Path(akter.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _offenders(root: Path) -> list[tuple[str, str]]:
    """``(module path, what is too long)`` for every module and function past its bound."""
    found: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append((relative, f"{relative}: {lines} lines"))
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    where = f"{relative}:{node.lineno}"
                    found.append((relative, f"{where} {node.name}(): {length} lines"))
    return found


def test_no_module_over_600_lines_and_no_function_over_80() -> None:
    offenders = [what for _, what in _offenders(SOURCE)]
    assert not offenders, (
        f"Past the bounds ({MAX_MODULE_LINES} lines a module, {MAX_FUNCTION_LINES} a function):\n"
        + "\n".join(offenders)
    )


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}() -> None:\n{body}"


def test_the_walk_reports_every_long_module_and_function(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fits.py").write_text(_function("fits", MAX_FUNCTION_LINES))
    (tmp_path / "pkg" / "long.py").write_text(_function("long", MAX_FUNCTION_LINES + 1))
    method = _function("method", MAX_FUNCTION_LINES + 1, indent="    ")
    (tmp_path / "nested.py").write_text(f"class C:\n{method}")
    (tmp_path / "big.py").write_text("x = 0\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "full.py").write_text("x = 0\n" * MAX_MODULE_LINES)
    assert _offenders(tmp_path) == [
        ("big.py", f"big.py: {MAX_MODULE_LINES + 1} lines"),
        ("nested.py", f"nested.py:2 method(): {MAX_FUNCTION_LINES + 1} lines"),
        ("pkg/long.py", f"pkg/long.py:1 long(): {MAX_FUNCTION_LINES + 1} lines"),
    ]
