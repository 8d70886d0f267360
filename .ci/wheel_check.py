"""The install a user does: build akter, install the wheel without extras, run the quick start.

``make wheel-check`` (part of ``make test``) runs this with the project's virtualenv, which has
``build``. Steps, each timed:

1. ``python -m build``: an sdist, and a wheel built from that sdist (so the sdist is complete);
2. a fresh virtualenv (no access to the project's) gets the wheel alone, no extras: none of the
   extras' modules may be there, and ``akter.http`` and the ``akter`` command must name the
   extra they need;
3. the README's quick start runs with that virtualenv's python from a directory outside the
   repository, on its own embedded PostgreSQL data directory (``./.akter`` there), and so does
   the tutorial's final app (docs/tutorial.md, the last ``shop.py``: a job and a workflow);
4. pip resolves ``akter[all]`` from the wheel (``--dry-run``): the extras, and the ones that
   name other extras, are well formed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TUTORIAL = ROOT / "docs" / "tutorial.md"

#: Modules the core install must not bring: the extras' and the development tools'.
NOT_IN_CORE = (
    "starlette",
    "uvicorn",
    "httpx",
    "jwt",
    "typer",
    "rich",
    "fastapi",
    "pytest",
    "mypy",
    "playwright",
    "schemathesis",
)
#: Files the wheel must carry besides modules: the SQL catalogue, migrations, console assets.
DATA = ("akter/py.typed", "akter/_store/queries.sql", "akter/_store/schema/0001_initial.sql")


def quick_start() -> str:
    """The README's quick start: the first python block under its heading."""
    text = README.read_text("utf-8")
    start = text.index("```python", text.index("## Quick start")) + len("```python")
    return text[start : text.index("```", start)]


def tutorial_app() -> str:
    """The tutorial's final app: the last block it saves as ``shop.py``."""
    text = TUTORIAL.read_text("utf-8")
    mark = text.rindex("<!-- file: shop.py -->")
    start = text.index("```python", mark) + len("```python")
    return text[start : text.index("```", start)]


def run(
    argv: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure print its output and stop."""
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"wheel check: {' '.join(map(str, argv))} exited {done.returncode}")
    return done


def step(title: str, started: float) -> float:
    """Print a step's duration; return the time for the next step."""
    now = time.monotonic()
    print(f"  {now - started:5.1f} s  {title}", flush=True)
    return now


def main() -> None:
    """Build, install without extras into a fresh virtualenv, run the quick start outside."""
    work = Path(tempfile.mkdtemp(prefix="akter-wheel-check-"))
    # Nothing of the repository or the caller's settings may leak into the user's environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKTER_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    begun = started = time.monotonic()
    try:
        dist = work / "dist"
        run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=work, env=env)
        (wheel,) = dist.glob("akter-*.whl")
        (sdist,) = dist.glob("akter-*.tar.gz")
        with zipfile.ZipFile(wheel) as archive:
            missing = sorted(set(DATA) - set(archive.namelist()))
        assert not missing, f"the wheel lacks {missing}"
        started = step(f"built {sdist.name} and {wheel.name}", started)

        venv = work / "venv"
        run([sys.executable, "-m", "venv", venv], cwd=work, env=env)
        python = venv / "bin" / "python"
        run([python, "-m", "pip", "install", "--quiet", wheel], cwd=work, env=env)
        started = step("installed the wheel, no extras, into a fresh virtualenv", started)

        app = work / "app"
        app.mkdir()
        probe = (
            "import importlib.util, akter\n"
            f"present = [m for m in {NOT_IN_CORE!r} if importlib.util.find_spec(m)]\n"
            "assert not present, f'the core install brought {present}'\n"
            "try:\n"
            "    import akter.http\n"
            "except ImportError as exc:\n"
            "    assert \"pip install 'akter[http]'\" in str(exc), exc\n"
            "else:\n"
            "    raise AssertionError('akter.http imported without the http extra')\n"
            "print(akter.__file__)\n"
        )
        where = run([python, "-c", probe], cwd=app, env=env).stdout.strip()
        assert Path(where).is_relative_to(venv), f"akter came from {where}, not the virtualenv"
        command = subprocess.run(
            [venv / "bin" / "akter", "--help"],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert command.returncode != 0, command.stdout
        assert "pip install 'akter[cli]'" in command.stderr, command.stderr
        started = step("no extras' modules; akter.http and `akter` name their extra", started)

        (app / "quick.py").write_text(quick_start(), "utf-8")
        out = run([python, "quick.py"], cwd=app, env=env, timeout=180).stdout
        print("".join(f"           | {line}\n" for line in out.splitlines()), end="")
        assert (app / ".akter").is_dir(), "the quick start did not use its own data directory"
        started = step(f"ran the README's quick start in {app}", started)

        (app / "shop.py").write_text(tutorial_app(), "utf-8")
        out = run([python, "shop.py"], cwd=app, env=env, timeout=180).stdout
        assert out.splitlines() == ["True shipped"], out
        started = step("ran the tutorial's final app (a job and a workflow)", started)

        run(
            [python, "-m", "pip", "install", "--dry-run", "--quiet", f"{wheel}[all]"],
            cwd=work,
            env=env,
        )
        step("pip resolves akter[all] (http, cli) from the wheel", started)
        print(f"  {time.monotonic() - begun:5.1f} s  wheel check passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
