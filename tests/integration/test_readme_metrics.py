"""The "Metrics" example runs as printed: akter's families in the app's own registry.

The examples are on docs/guides/metrics.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "docs" / "guides" / "metrics.md"


def block(heading: str) -> str:
    """The first python block after ``heading`` on the docs page."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


def test_the_metrics_example_runs(tmp_path: Path) -> None:
    (tmp_path / "metrics.py").write_text(block("# Metrics"), "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKTER_")}
    paths = [str(README.parents[2]), str(README.parents[2] / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    done = subprocess.run(
        [sys.executable, "metrics.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True True"]
