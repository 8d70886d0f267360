"""The README's quick start runs as printed: on an embedded PostgreSQL in a fresh directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> str:
    text = README.read_text("utf-8")
    start = text.index("```python", text.index("## Quick start")) + len("```python")
    return text[start : text.index("```", start)]


def test_the_quick_start_runs_as_printed(tmp_path: Path) -> None:
    (tmp_path / "quick.py").write_text(quick_start(), "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(README.parent / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "quick.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["declared error: unicorn", "items: 3"]
    assert "QueryView" in quick_start()  # the typed query view is shown where queries start
