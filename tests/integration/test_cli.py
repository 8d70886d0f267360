"""The CLI in subprocesses against a real database: migrate, serve, inspect, outbox, worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

AKTER = str(Path(sys.executable).parent / "akter")

APP = """
import os, akter
from pydantic import BaseModel

class S(BaseModel):
    n: int = 0

class Job(BaseModel):
    k: int

class Counter(akter.Actor[S], access=akter.public):
    @akter.command
    async def add(self, k: int) -> int:
        self.state.n += k
        self.later(after=3600, key="later").send(Counter.add, self.id, 0)
        return self.state.n

    @akter.job()
    async def work(call: akter.JobCall, payload: Job) -> int:
        return payload.k

runtime = akter.Runtime(
    [Counter], database_url=os.environ["CLI_URL"], schema=os.environ["CLI_SCHEMA"]
)
"""


@pytest.fixture
def project(tmp_path: Path, akter_db: str) -> Iterator[dict[str, str]]:
    (tmp_path / "cliapp.py").write_text(APP)
    schema = f"cli_{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "CLI_URL": akter_db, "CLI_SCHEMA": schema, "PYTHONPATH": str(tmp_path)}
    yield {"cwd": str(tmp_path), "schema": schema, **env}
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(project: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in project.items() if k not in ("cwd", "schema")}
    return subprocess.run(
        [AKTER, *args], cwd=project["cwd"], env=env, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(90)
def test_serve_http_then_sigterm_drains(project: dict[str, str]) -> None:
    assert run(project, "migrate", "cliapp:runtime").returncode == 0
    port = free_port()
    env = {k: v for k, v in project.items() if k not in ("cwd", "schema")}
    proc = subprocess.Popen(
        [AKTER, "serve", "cliapp:runtime", "--http", f"127.0.0.1:{port}"],
        cwd=project["cwd"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "ready" in line, line
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                ready = httpx.get(f"{base}/ready", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert ready.json() == {"status": "ready"}
        cid = httpx.post(f"{base}/command-ids").json()["command_id"]
        for _ in range(2):  # the retry replays
            r = httpx.post(
                f"{base}/actors/Counter/c1/add", json={"k": 5}, headers={"Idempotency-Key": cid}
            )
            assert (r.status_code, r.json()) == (200, 5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "drained" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    shown = run(project, "inspect", "cliapp:runtime", "Counter", "c1", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["state"] == {"n": 5} and report["version"] == 1
    assert [r["command_id"] for r in report["receipts"]] == [cid]
    assert [o["command"] for o in report["outbox"]] == ["add"]

    listed = run(project, "outbox", "cliapp:runtime", "--json")
    rows = json.loads(listed.stdout)
    assert [(r["target_id"], r["timer_key"]) for r in rows] == [("c1", "later")]
    # No runner is left registered after the drain.
    with psycopg.connect(project["CLI_URL"]) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{project["schema"]}".runners').fetchone()
    assert count == (0,)


def test_inspect_missing_actor_and_bad_targets(project: dict[str, str]) -> None:
    assert run(project, "migrate", "cliapp:runtime").returncode == 0
    missing = run(project, "inspect", "cliapp:runtime", "Counter", "nope")
    assert missing.returncode == 1 and "never committed" in missing.stdout
    unknown = run(project, "inspect", "cliapp:runtime", "Ghost", "x")
    assert unknown.returncode == 1 and "not registered" in unknown.stderr
    bad = run(project, "inspect", "nothing_here:runtime", "Counter", "x")
    assert bad.returncode == 1 and "Cannot import" in bad.stderr
    worker = run(project, "worker", "cliapp:runtime", "--jobs", "Counter.nope")
    assert worker.returncode == 1 and "Unknown jobs" in worker.stderr
