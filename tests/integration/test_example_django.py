"""The Django example (examples/django_app, docs/guides/sync.md) tested with Django's test client.

Django's settings are configured once per process, so its cases (``django_example_cases.py``:
a view that calls an actor through a SyncRuntime, a view that stages a command in
``transaction.atomic()``, the ``akter_runner`` management command that delivers it) run in a
pytest process of their own, on this session's database and a schema of their own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


def test_the_django_example_under_djangos_test_client(akter_db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    env.update(
        AKTER_TEST_DATABASE_URL=akter_db,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]),
        # Only the plugins the cases need: the others installed here take seconds to load.
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    plugins = ["-p", "pytest_asyncio.plugin", "-p", "pytest_timeout", "-p", "akter.testing.plugin"]
    cases = Path(__file__).with_name("django_example_cases.py")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rA",
            *plugins,
            str(cases),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED")]
    assert len(passed) == 2, done.stdout


def test_the_guides_django_block_is_an_excerpt_of_the_example() -> None:
    page = (ROOT / "docs" / "guides" / "sync.md").read_text("utf-8")
    source = (ROOT / "examples" / "django_app" / "bank" / "views.py").read_text("utf-8")
    section = page[page.index("## Django") : page.index("## Flask")]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert block in source, block
