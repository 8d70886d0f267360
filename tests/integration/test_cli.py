"""The CLI in subprocesses against a real database: migrate, serve, inspect, outbox, worker."""

from __future__ import annotations

import importlib
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

    @akter.command
    async def pay(self, k: int) -> str:
        return self.enqueue(Counter.work, Job(k=k))

    @akter.job(attempts=1)
    async def work(call: akter.JobCall, payload: Job) -> int:
        if payload.k < 0:
            raise akter.JobFailure("declined by the provider", final=True)
        return payload.k

    @work.on_success
    async def worked(self, k: int) -> None:
        self.state.n += k

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


async def test_dead_letters_list_show_retry_discard(project: dict[str, str]) -> None:
    sys.path.insert(0, project["cwd"])
    os.environ["CLI_URL"], os.environ["CLI_SCHEMA"] = project["CLI_URL"], project["schema"]
    try:
        cliapp = importlib.import_module("cliapp")  # the project's module, as the CLI imports it
        runtime = cliapp.runtime
        async with runtime:
            first = await runtime.get(cliapp.Counter, "c").pay(-1)
            second = await runtime.get(cliapp.Counter, "d").pay(-2)
            for _ in range(50):
                await runtime.relay.run_pass()
                await runtime.jobs.wait_idle()
                if len(await runtime.dead_letters.list()) == 2:
                    break
    finally:
        sys.path.remove(project["cwd"])
        sys.modules.pop("cliapp", None)

    listed = run(project, "dead-letters", "list", "cliapp:runtime", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = {x["job_id"]: x for x in json.loads(listed.stdout)}
    assert set(letters) == {first, second}
    assert letters[first]["ambiguous"] is False and letters[first]["attempts"] == 1
    assert "declined by the provider" in letters[first]["cause"]

    shown = run(project, "dead-letters", "show", "cliapp:runtime", first)
    assert json.loads(shown.stdout)["payload"] == {"k": -1}

    retried = run(project, "dead-letters", "retry", "cliapp:runtime", first)
    assert retried.returncode == 0, retried.stderr
    new_id = retried.stdout.strip()
    assert new_id.startswith("v1.") and new_id != first
    jobs = json.loads(run(project, "jobs", "list", "cliapp:runtime", "--json").stdout)
    assert [(j["job_id"], j["maybe_applied"]) for j in jobs] == [(new_id, False)]

    discarded = run(project, "dead-letters", "discard", "cliapp:runtime", second)
    assert discarded.returncode == 0, discarded.stderr
    remaining = json.loads(run(project, "dead-letters", "list", "cliapp:runtime", "--json").stdout)
    assert remaining == []
    missing = run(project, "dead-letters", "show", "cliapp:runtime", second)
    assert missing.returncode == 1

    cancelled = run(project, "jobs", "cancel", "cliapp:runtime", new_id)
    assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "deleted")
    assert json.loads(run(project, "jobs", "list", "cliapp:runtime", "--json").stdout) == []
    unknown = run(project, "jobs", "cancel", "cliapp:runtime", new_id)
    assert unknown.returncode == 1
