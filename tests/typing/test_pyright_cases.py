"""The public contract under pyright (VS Code's Pylance), beside mypy (issue 43).

The same case files as ``test_contract_types.py``, checked by pyright with the project's
``[tool.pyright]`` settings (strict), and held to the same expectations:

- ``user.py``: exactly the two deliberate errors at its end;
- ``contract.py``: no error at all (its one plain in-class migration carries a
  ``# pyright: ignore``, which must be needed: that is where pyright and mypy disagree);
- ``misuse.py``: an error on each line marked ``# E: <code>`` and on no other line (pyright's
  rule names differ from mypy's codes, so only the lines are compared).

``make lint`` runs pyright over the examples and ``tests/typing``; the case files are excluded
there because they hold deliberate errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        importlib.util.find_spec("pyright") is None,
        reason="pyright is not installed (the dev extra has it: make venv)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
CASE_FILES = ("user.py", "contract.py", "misuse.py")
#: The docs' pyright note (docs/get-started.md, "Use akter in your project"), a fourth file.
README_BLOCK = "readme_editors.py"


def readme_block() -> str:
    """The python block of the docs' "Use akter in your project" section."""
    text = (ROOT / "docs" / "get-started.md").read_text("utf-8")
    start = text.index("```python", text.index("## Use akter in your project")) + len("```python")
    return text[start : text.index("```", start)]


_MARK = re.compile(r"#\s*E:\s*(?P<code>[a-z0-9-]+)\s*$")


@pytest.fixture(scope="module")
def pyright_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, list[str]]]:
    """Run pyright once over the case files: per file, line -> the rules reported there."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    settings: dict[str, Any] = {
        k: v for k, v in project["tool"]["pyright"].items() if k not in ("include", "exclude")
    }
    settings.update(
        # This checkout's sources first, whatever the environment has installed.
        extraPaths=[str(ROOT / "src")],
        # The sketch binds results only to pin their types.
        reportUnusedVariable=False,
        # A `# pyright: ignore` that is not needed is an error: the disagreement it documents
        # must be real.
        reportUnnecessaryTypeIgnoreComment="error",
    )
    work = tmp_path_factory.mktemp("pyright")
    config = work / "pyrightconfig.json"
    config.write_text(json.dumps(settings), "utf-8")
    (work / README_BLOCK).write_text(readme_block(), "utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyright",
            "--outputjson",
            "--project",
            str(config),
            "--pythonpath",
            sys.executable,
            *(str(CASES / name) for name in CASE_FILES),
            str(work / README_BLOCK),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        # The bundled pyright on the machine's node; no version look-up on PyPI.
        env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
    )
    # 0: clean, 1: errors found; anything else is a crash, a config error or no files.
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    files = (*CASE_FILES, README_BLOCK)
    assert report["summary"]["filesAnalyzed"] == len(files), proc.stdout
    errors: dict[str, dict[int, list[str]]] = {name: defaultdict(list) for name in files}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] != "error":
            continue
        name = Path(diagnostic["file"]).name
        assert name in errors, f"pyright reported an error outside the case files: {diagnostic}"
        line = diagnostic["range"]["start"]["line"] + 1
        errors[name][line].append(diagnostic.get("rule", diagnostic["message"]))
    return errors


def _line_of(file: str, fragment: str) -> int:
    lines = (CASES / file).read_text("utf-8").splitlines()
    found = [n for n, text in enumerate(lines, start=1) if fragment in text]
    assert len(found) == 1, f"{fragment!r} must occur once in {file}"
    return found[0]


def test_typing_sketch_reports_exactly_the_two_deliberate_errors(
    pyright_errors: dict[str, dict[int, list[str]]],
) -> None:
    bad_result = _line_of("user.py", "bad: int = await order.place(1)")
    bad_argument = _line_of("user.py", 'await order.place("x")')
    assert dict(pyright_errors["user.py"]) == {
        bad_result: ["reportAssignmentType"],
        bad_argument: ["reportArgumentType"],
    }


def test_contract_examples_type_check_cleanly(
    pyright_errors: dict[str, dict[int, list[str]]],
) -> None:
    # Jobs (`call: akter.JobCall`) and workflows (`wf: akter.Workflow`) are declared without
    # `self`; pyright accepts that first parameter because both types are protocols.
    assert dict(pyright_errors["contract.py"]) == {}


def test_misuse_fails_on_each_marked_line_and_no_other(
    pyright_errors: dict[str, dict[int, list[str]]],
) -> None:
    lines = (CASES / "misuse.py").read_text("utf-8").splitlines()
    marked = {n for n, text in enumerate(lines, start=1) if _MARK.search(text)}
    assert len(marked) >= 10
    got = pyright_errors["misuse.py"]
    assert sorted(marked - set(got)) == [], "marked lines pyright accepts"
    assert {n: got[n] for n in sorted(set(got) - marked)} == {}, "unmarked lines pyright rejects"


def test_the_readmes_staticmethod_migration_satisfies_pyright_mypy_and_akter(
    pyright_errors: dict[str, dict[int, list[str]]], tmp_path: Path
) -> None:
    assert dict(pyright_errors[README_BLOCK]) == {}
    source = tmp_path / README_BLOCK
    source.write_text(readme_block(), "utf-8")
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(source)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    namespace: dict[str, Any] = {}
    exec(compile(readme_block(), README_BLOCK, "exec"), namespace)
    definition = namespace["Customer"].__akter_definition__
    definition.resolve()
    assert definition.state_version == 1
