"""The extras split (issue 43): the core imports without them, each surface names its extra.

Each check runs in a fresh interpreter whose import system refuses the extra's modules, as an
environment that installed ``akter`` without ``[http]`` or ``[cli]`` would. ``make wheel-check``
does the same for real: the built wheel in a fresh virtualenv without extras.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from akter._extras import EXTRA_MODULES, require_extra

ROOT = Path(__file__).resolve().parents[2]

# Refuses every module under the top-level names in argv[1], then runs argv[2].
_BLOCKING = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse())
exec(sys.argv[2])
"""


def _run(blocked: set[str], code: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _BLOCKING, ",".join(sorted(blocked)), code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )


def test_the_core_and_the_test_kit_import_without_any_extra() -> None:
    everything = set().union(*EXTRA_MODULES.values())
    proc = _run(
        everything,
        "import akter, akter.testing, akter.testing.plugin\n"
        "loaded = sorted({m.partition('.')[0] for m in sys.modules} & blocked)\n"
        "print('loaded:', loaded)",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded: []"


@pytest.mark.parametrize(
    ("surface", "missing", "extra"),
    [
        ("akter.http", "starlette", "http"),
        ("akter.http", "jwt", "http"),
        ("akter.http.app", "starlette", "http"),
        ("akter.client", "httpx", "http"),
        ("akter.cli", "typer", "cli"),
        ("akter.cli", "rich", "cli"),
        ("akter.cli", "starlette", "cli"),
    ],
)
def test_a_surface_without_its_extra_names_it(surface: str, missing: str, extra: str) -> None:
    proc = _run(
        {missing},
        "import akter\n"
        "try:\n"
        f"    import {surface}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.name, exc, sep='|')\n"
        "else:\n"
        "    print('imported')",
    )
    assert proc.returncode == 0, proc.stderr
    kind, name, message = proc.stdout.strip().split("|")
    assert (kind, name) == ("ImportError", missing)
    # The command line's own extra includes the HTTP stack; akter.http names the narrower one.
    named = "http" if surface == "akter.cli" and missing == "starlette" else extra
    assert message.endswith(f"pip install 'akter[{named}]'"), message
    assert repr(missing) in message


def test_the_akter_command_without_the_cli_extra_says_what_to_install() -> None:
    proc = _run({"typer"}, "from akter.cli import main\nmain()")
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == (
        "ImportError: The akter command line needs 'typer', which is not installed; it comes "
        "with akter's 'cli' extra: pip install 'akter[cli]'"
    )


def test_a_module_missing_for_another_reason_is_not_blamed_on_an_extra() -> None:
    # Returns, so that the caller re-raises the original error.
    require_extra(ModuleNotFoundError(name="akter_plugin"), "akter.http", "http")
    with pytest.raises(ImportError, match=r"pip install 'akter\[http\]'") as raised:
        require_extra(ModuleNotFoundError(name="starlette.routing"), "akter.http", "http")
    assert raised.value.name == "starlette"
    assert raised.value.__cause__ is not None
