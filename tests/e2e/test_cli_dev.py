"""``akter dev`` in a subprocess: embedded PostgreSQL + HTTP, then a graceful stop of both.

The data directory is made with ``tempfile.mkdtemp`` under /tmp (not pytest's ``tmp_path``):
as root, the embedded server runs as a system user that must be able to reach it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from akter._store.embedded import is_running, running_url, shutdown

AKTER = str(Path(sys.executable).parent / "akter")

APP = """
import akter
import akter.http
from pydantic import BaseModel

class S(BaseModel):
    n: int = 0

class Counter(akter.Actor[S], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        return self.state.n

runtime = akter.Runtime([Counter])
"""

#: ``APP`` with an actor only signed-in users may use, and an auth provider for ``--auth``.
APP_WITH_AUTH = (
    APP
    + """
class Mine(akter.Actor[S], access=lambda caller, ref, member, kind: isinstance(caller, akter.User)):
    @akter.query
    async def n(self) -> int:
        return self.state.n

runtime = akter.Runtime([Counter, Mine])
auth = akter.http.ApiKeys({"dev-key": ("dev", "default")})
"""
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Dev:
    """A running ``akter dev`` child: its process, base URL, data dir and stderr so far."""

    proc: subprocess.Popen[str]
    base: str
    data_dir: Path
    lines: list[str]


@contextmanager
def dev_process(workdir: Path, prefix: str, *extra: str, app: str = APP) -> Iterator[Dev]:
    """Start ``akter dev`` on ``APP`` with a fresh data dir; yield once it printed "ready".

    Afterwards the child is killed if still running and its embedded server stopped and removed.
    """
    (workdir / "devapp.py").write_text(app)
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("AKTER_DATABASE_URL", "AKTER_DATA_DIR")}
    pythonpath = env.get("PYTHONPATH")  # a worktree's src, if the tests run with one
    argv = [AKTER, "dev", "devapp:runtime", "--http", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*argv, "--data-dir", str(data_dir), *extra],
        cwd=workdir,
        env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(workdir), pythonpath]))},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        while not any("ready" in line for line in lines):
            line = proc.stderr.readline()
            assert line, f"akter dev exited early: {''.join(lines)}"
            lines.append(line)
        yield Dev(proc, f"http://127.0.0.1:{port}", data_dir, lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutdown(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def get_when_up(url: str, within: float = 20) -> httpx.Response:
    """GET ``url``, retrying connection errors until ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


@pytest.mark.timeout(120)
def test_dev_serves_on_the_embedded_server_and_stops_both_on_sigterm(tmp_path: Path) -> None:
    with dev_process(tmp_path, "akter-dev-") as dev:
        base, data_dir, proc = dev.base, dev.data_dir, dev.proc
        assert f"docs at {base}/docs" in dev.lines[-1]
        url = running_url(data_dir)
        assert url is not None and is_running(data_dir)

        ready = get_when_up(f"{base}/ready")
        assert ready.json() == {"status": "ready"}
        assert httpx.get(f"{base}/docs", timeout=5).status_code == 200
        cid = httpx.post(f"{base}/command-ids").json()["command_id"]
        added = httpx.post(
            f"{base}/actors/Counter/c1/add", json={"k": 7}, headers={"Idempotency-Key": cid}
        )
        assert (added.status_code, added.json()) == (200, 7)
        # The turn committed in the embedded server of the data directory, schema "akter".
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT state, version FROM akter.actors WHERE actor_id = 'c1'"
            ).fetchone()
        assert row == ({"n": 7}, 1)

        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "drained" in err and "Stopped the embedded PostgreSQL" in err
        assert not is_running(data_dir) and running_url(data_dir) is None
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base}/ready", timeout=2)
