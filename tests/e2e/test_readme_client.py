"""docs/guides/http.md: "The Python client" example runs as printed against the served bank example.

``examples/http_service.py`` is served by uvicorn in a child process (as the README serves it,
on a fresh schema); the block runs in another, with the URL it names pointed at that server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.example_server import ROOT, example_server, free_port

pytestmark = pytest.mark.timeout(120)


def block(heading: str) -> str:
    """The first python block after ``heading`` in the HTTP guide."""
    text = (ROOT / "docs" / "guides" / "http.md").read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


def test_the_client_example_runs_against_the_served_bank(akter_db: str, tmp_path: Path) -> None:
    code = block("## The Python client")
    assert "http://127.0.0.1:8000" in code
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "examples.http_service:app"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    with example_server(akter_db, argv, port) as child:
        script = tmp_path / "bank_client.py"
        script.write_text(code.replace("http://127.0.0.1:8000", child.url), "utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKTER_")}
        paths = [str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["replayed: True"]
