"""The public contract under ``mypy --strict`` (design §2, spec/typing-sketch).

The case files in ``cases/`` are excluded from the project's normal mypy run; this test runs mypy
on them explicitly with the project's configuration (strict, pydantic plugin) and compares the
reported errors with what each file is meant to produce:

- ``user.py``: the design's typing sketch against the real package — exactly the two deliberate
  errors at its end (a wrong result type, a wrong argument type) and nothing else;
- ``contract.py``: more of the contract, with ``assert_type`` pins — no error at all;
- ``misuse.py``: each line marked ``# E: <code>`` gets exactly one error with that code.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
CASE_FILES = ("user.py", "contract.py", "misuse.py")

_LINE = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*)$")
_CODE = re.compile(r"\s+\[(?P<code>[a-z0-9-]+)\]$")
_MARK = re.compile(r"#\s*E:\s*(?P<code>[a-z0-9-]+)\s*$")


@dataclass(frozen=True)
class Error:
    file: str
    line: int
    code: str
    message: str


@pytest.fixture(scope="module")
def mypy_errors() -> dict[str, list[Error]]:
    """Run mypy once over every case file; errors grouped by case file name."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            # The project's settings (strict, pydantic plugin, python 3.11). Files given on the
            # command line are checked even though the config's `exclude` covers cases/.
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--show-error-codes",
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            "--no-color-output",
            *(str(CASES / name) for name in CASE_FILES),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    # 0: clean, 1: type errors found; anything else is a crash or a usage error.
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    errors: dict[str, list[Error]] = {name: [] for name in CASE_FILES}
    for raw in proc.stdout.splitlines():
        match = _LINE.match(raw)
        assert match is not None, f"unexpected mypy output line: {raw!r}\n{proc.stdout}"
        if match["severity"] == "note":
            continue
        name = Path(match["path"]).name
        assert name in errors, f"mypy reported an error outside the case files: {raw!r}"
        message = match["message"]
        code_match = _CODE.search(message)
        assert code_match is not None, f"error without a code: {raw!r}"
        errors[name].append(
            Error(name, int(match["line"]), code_match["code"], message[: code_match.start()])
        )
    return errors


def _line_of(file: str, fragment: str) -> int:
    lines = (CASES / file).read_text("utf-8").splitlines()
    found = [n for n, text in enumerate(lines, start=1) if fragment in text]
    assert len(found) == 1, f"{fragment!r} must occur once in {file}"
    return found[0]


def _show(errors: list[Error]) -> str:
    return "\n".join(f"{e.file}:{e.line}: {e.message} [{e.code}]" for e in errors)


def test_typing_sketch_reports_exactly_the_two_deliberate_errors(
    mypy_errors: dict[str, list[Error]],
) -> None:
    errors = mypy_errors["user.py"]
    bad_result = _line_of("user.py", "bad: int = await order.place(1)")
    bad_argument = _line_of("user.py", 'await order.place("x")')
    assert [(e.line, e.code) for e in errors] == [
        (bad_result, "assignment"),
        (bad_argument, "arg-type"),
    ], _show(errors)
    assert errors[0].message == (
        'Incompatible types in assignment (expression has type "str", variable has type "int")'
    )
    # A command is a descriptor (``akter.actor.Command``, so that ``@cmd.migrate_payload``
    # type-checks): the bound call mypy reports on carries no name.
    assert errors[1].message == 'Argument 1 has incompatible type "str"; expected "int"'


def test_contract_examples_type_check_cleanly(mypy_errors: dict[str, list[Error]]) -> None:
    assert mypy_errors["contract.py"] == [], _show(mypy_errors["contract.py"])


def test_misuse_fails_to_type_check_on_each_marked_line(
    mypy_errors: dict[str, list[Error]],
) -> None:
    lines = (CASES / "misuse.py").read_text("utf-8").splitlines()
    expected = Counter(
        (n, m["code"]) for n, text in enumerate(lines, start=1) if (m := _MARK.search(text))
    )
    assert len(expected) >= 10
    got = Counter((e.line, e.code) for e in mypy_errors["misuse.py"])
    assert got == expected, _show(mypy_errors["misuse.py"])


@pytest.mark.parametrize("name", ["user.py", "contract.py"])
def test_cases_are_valid_definitions_at_run_time(name: str) -> None:
    # The examples must not only type-check: importing them runs definition-time validation.
    spec = importlib.util.spec_from_file_location(f"akter_typing_case_{name[:-3]}", CASES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        definition = module.Order.__akter_definition__
        definition.resolve()
        assert "place" in definition.members
        jobs = {"charge", "receipt"} if name == "contract.py" else {"charge"}  # receipt: a def
        assert set(definition.jobs) == jobs
    finally:
        del sys.modules[spec.name]
