"""The CLI in subprocesses against a real database.

Covered: migrate, serve, inspect, outbox, worker, jobs (list, cancel, watch), dead letters (one
by one and in bulk) and bench.

Progress output is checked in its non-terminal form (plain lines on stderr), which is what a
subprocess with a pipe gets; stdout stays clean for ``--json``.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest
from rich.console import Console

from akter.cli import Steps
from akter.cli.jobs import _show

AKTER = str(Path(sys.executable).parent / "akter")

APP = """
import asyncio, os, akter, akter.jobs
from pydantic import BaseModel

class S(BaseModel):
    n: int = 0

class Job(BaseModel):
    k: int

class Pct(BaseModel):
    done: int
    total: int
    message: str = ""

#: Opened by a test once the watching CLI listens (the executor runs in the test process).
GATE = asyncio.Event()

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

    @akter.command
    async def crunch(self, k: int) -> str:
        return self.enqueue(Counter.churn, Job(k=k))

    @akter.job(attempts=1, progress=Pct, progress_every=0.05)
    async def churn(call: akter.JobCall, payload: Job) -> int:
        await GATE.wait()
        if payload.k < 0:
            raise akter.JobFailure("churned into the ground", final=True)
        for i in range(1, payload.k + 1):
            call.report(Pct(done=i, total=payload.k, message=f"step {i}"))
        return payload.k

    @churn.on_success
    async def churned(self, k: int) -> None:
        self.state.n += k

    @churn.on_cancelled
    async def churn_cancelled(self, report: akter.jobs.Cancelled[Job, int]) -> None:
        self.state.n -= 1

runtime = akter.Runtime(
    [Counter], database_url=os.environ["CLI_URL"], schema=os.environ["CLI_SCHEMA"]
)
"""


@pytest.fixture
def project(tmp_path: Path, akter_db: str) -> Iterator[dict[str, str]]:
    (tmp_path / "cliapp.py").write_text(APP)
    schema = f"cli_{uuid.uuid4().hex[:10]}"
    # The project's directory first, then any path the tests run with (a worktree's src).
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CLI_URL": akter_db, "CLI_SCHEMA": schema, "PYTHONPATH": path}
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
    assert report["state_version"] == 0 == report["code_state_version"]
    assert [r["command_id"] for r in report["receipts"]] == [cid]
    assert [o["command"] for o in report["outbox"]] == ["add"]
    assert [(o["payload_version"], o["parked_at_ms"]) for o in report["outbox"]] == [(0, None)]

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
    loud = run(project, "worker", "cliapp:runtime", "--log-level", "LOUD")
    assert loud.returncode == 1 and "--log-level: Unknown log level 'LOUD'" in loud.stderr


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
                await runtime._relay.run_pass()
                await runtime._jobs.wait_idle()
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


# --- migrate, dead letters in bulk, jobs watch, bench -----------------------------------------


def test_steps_draw_a_bar_on_a_terminal_and_plain_lines_elsewhere() -> None:
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=120)
    with Steps("copying", 3, console=terminal) as steps:
        for i in range(3):
            steps.update(message=f"f{i}")
        frame = {"attempt": 1, "seq": 4, "frame": {"done": 7, "total": 9, "message": "almost"}}
        _show(steps, frame)
    drawn = out.getvalue()
    assert "\x1b[" in drawn and "copying" in drawn and "7/9" in drawn and "almost" in drawn

    out = io.StringIO()
    plain = Console(file=out, force_terminal=False, width=120)
    with Steps("copying", 3, console=plain, plain_every=3600) as steps:
        for i in range(3):  # the first and the last step print; the middle one is too soon
            steps.update(message=f"f{i}")
    with Steps("Job/j", None, console=plain, plain_every=0) as steps:
        _show(steps, {"attempt": 2, "seq": 5, "frame": {"phase": "upload"}})  # not done/total
    assert out.getvalue().splitlines() == [
        "copying: 1/3 f0",
        "copying: 3/3 f2",
        'Job/j: 5 attempt 2  {"phase":"upload"}',
    ]


def test_migrate_shows_progress_on_stderr_and_json_on_stdout(project: dict[str, str]) -> None:
    from akter._store.migrate import known_migrations

    known = [m.id for m in known_migrations()]
    first = run(project, "migrate", "cliapp:runtime", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"schema": project["schema"], "applied": known}
    # Not a terminal: plain lines, the last one for the last migration.
    assert f"migrating: {len(known)}/{len(known)} {known[-1]}" in first.stderr
    again = run(project, "migrate", "cliapp:runtime", "--json")
    assert json.loads(again.stdout)["applied"] == []
    assert "migrating" not in again.stderr
    plain = run(project, "migrate", "cliapp:runtime")
    assert plain.stdout.strip() == f"schema {project['schema']!r} is up to date"


@asynccontextmanager
async def cliapp_runtime(project: dict[str, str], **options: Any) -> AsyncIterator[ModuleType]:
    """The project's module, imported here as the CLI imports it, with its runtime started."""
    sys.path.insert(0, project["cwd"])
    os.environ["CLI_URL"], os.environ["CLI_SCHEMA"] = project["CLI_URL"], project["schema"]
    try:
        cliapp = importlib.import_module("cliapp")
        cliapp.runtime.reconfigure(**options)
        async with cliapp.runtime:
            yield cliapp
    finally:
        sys.path.remove(project["cwd"])
        sys.modules.pop("cliapp", None)


async def dead_letters(cliapp: ModuleType, *ks: int) -> list[str]:
    runtime = cliapp.runtime
    ids = [await runtime.get(cliapp.Counter, f"k{k}").pay(k) for k in ks]
    for _ in range(50):
        await runtime._relay.run_pass()
        await runtime._jobs.wait_idle()
        if len(await runtime.dead_letters.list()) == len(ks):
            break
    return ids


async def test_dead_letters_retry_and_discard_in_bulk(project: dict[str, str]) -> None:
    async with cliapp_runtime(project) as cliapp:
        first, second, third = await dead_letters(cliapp, -1, -2, -3)

    neither = run(project, "dead-letters", "retry", "cliapp:runtime")
    assert neither.returncode == 1 and "--all" in neither.stderr
    loose = run(project, "dead-letters", "discard", "cliapp:runtime", "--type", "Counter")
    assert loose.returncode == 1 and "pass --all" in loose.stderr
    unknown = run(project, "dead-letters", "retry", "cliapp:runtime", first, "v1.1.2.nope")
    assert unknown.returncode == 1 and "no dead letter" in unknown.stderr
    assert (
        len(json.loads(run(project, "dead-letters", "list", "cliapp:runtime", "--json").stdout))
        == 3
    )

    retried = run(project, "dead-letters", "retry", "cliapp:runtime", first, second, "--json")
    assert retried.returncode == 0, retried.stderr
    pairs = json.loads(retried.stdout)
    assert [p["job_id"] for p in pairs] == [first, second]
    assert "retrying dead letters: 2/2" in retried.stderr
    jobs = json.loads(run(project, "jobs", "list", "cliapp:runtime", "--json").stdout)
    assert sorted(j["job_id"] for j in jobs) == sorted(p["new_job_id"] for p in pairs)

    none = run(project, "dead-letters", "discard", "cliapp:runtime", "--all", "--job", "churn")
    assert none.returncode == 0 and none.stdout == "" and "no dead letters match" in none.stderr
    discarded = run(
        project, "dead-letters", "discard", "cliapp:runtime", "--all", "--type", "Counter"
    )
    assert discarded.returncode == 0, discarded.stderr
    assert discarded.stdout.split() == ["discarded", third]
    assert "discarding dead letters: 1/1" in discarded.stderr
    assert json.loads(run(project, "dead-letters", "list", "cliapp:runtime", "--json").stdout) == []


async def akter_async(project: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in project.items() if k not in ("cwd", "schema")}
    return await asyncio.create_subprocess_exec(
        AKTER,
        *args,
        cwd=project["cwd"],
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def watching(proc: asyncio.subprocess.Process) -> str:
    """Wait for the CLI's "watching" line: from then on it hears every frame."""
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
    assert line.startswith("watching job"), line
    return line


async def finish(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_jobs_watch_prints_frames_until_success(project: dict[str, str]) -> None:
    assert run(project, "migrate", "cliapp:runtime").returncode == 0
    async with cliapp_runtime(project, notify=True) as cliapp:
        job = await cliapp.runtime.get(cliapp.Counter, "w").crunch(4)
        proc = await akter_async(
            project, "jobs", "watch", "cliapp:runtime", "Counter", "w", job, "--json"
        )
        try:
            await watching(proc)
            cliapp.GATE.set()
            code, out, err = await finish(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    *frames, closing = lines
    # The first frame is published at once; later ones coalesce (the latest wins), in order.
    assert frames and frames[0]["frame"] == {"done": 1, "total": 4, "message": "step 1"}
    done = [f["frame"]["done"] for f in frames]
    assert done == sorted(set(done)) and set(done) <= {1, 2, 3, 4}
    assert all(f["job_id"] == job and f["attempt"] == 1 for f in frames)
    assert closing["closed"] is True and closing["outcome"] == "succeeded"

    # The route carries the outcome: the success route's intent or receipt has the job's id.
    shown = json.loads(run(project, "inspect", "cliapp:runtime", "Counter", "w", "--json").stdout)
    traces = [r["command"] for r in shown["receipts"] if r["command_id"] == job]
    traces += [o["command"] for o in shown["outbox"] if o["intent_id"] == job]
    assert traces == ["churned"]


async def test_jobs_watch_exit_codes_for_dead_letter_cancel_and_unknown(
    project: dict[str, str],
) -> None:
    assert run(project, "migrate", "cliapp:runtime").returncode == 0
    async with cliapp_runtime(project, notify=True) as cliapp:
        runtime = cliapp.runtime
        doomed = await runtime.get(cliapp.Counter, "d").crunch(-1)
        proc = await akter_async(project, "jobs", "watch", "cliapp:runtime", "Counter", "d", doomed)
        await watching(proc)
        cliapp.GATE.set()
        code, out, _ = await finish(proc)
        assert (code, out.strip()) == (2, "dead-lettered")
        assert [x.job_id for x in await runtime.dead_letters.list()] == [doomed]

        cliapp.GATE.clear()  # the next attempt waits at the gate until it is cancelled
        cancelled = await runtime.get(cliapp.Counter, "c").crunch(3)
        proc = await akter_async(
            project, "jobs", "watch", "cliapp:runtime", "Counter", "c", cancelled, "--json"
        )
        await watching(proc)
        assert await runtime.cancel_job(cancelled) in ("cancelled", "deleted")
        code, out, _ = await finish(proc)
        assert code == 3
        assert json.loads(out.splitlines()[-1])["outcome"] == "cancelled"

    never = f"{doomed.rsplit('.', 1)[0]}.{uuid.uuid4()}"  # well-formed, never enqueued
    unknown = run(project, "jobs", "watch", "cliapp:runtime", "Counter", "d", never)
    assert unknown.returncode == 1 and "no job" in unknown.stderr, unknown.stderr
    malformed = run(project, "jobs", "watch", "cliapp:runtime", "Counter", "d", "v1.1.2.x")
    assert malformed.returncode == 1 and "malformed" in malformed.stderr


def test_bench_runs_for_a_second_and_reports_json(project: dict[str, str]) -> None:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        done = run(
            project,
            "bench",
            "--seconds",
            "1",
            "--callers",
            "3",
            "--actors",
            "5",
            "--schema",
            schema,
            "--database-url",
            project["CLI_URL"],
            "--json",
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["callers"], report["actors"], report["errors"]) == (3, 5, 0)
        assert report["turns"] > 0 and report["seconds"] >= 1
        assert report["turns_per_second"] > 0
        assert 0 < report["p50_ms"] <= report["p99_ms"]
        with psycopg.connect(project["CLI_URL"]) as conn:
            rows = conn.execute(
                f"SELECT sum((state->>'n')::int), count(*) FROM \"{schema}\".actors"
            ).fetchone()
        assert rows == (report["turns"], 5)
    finally:
        with psycopg.connect(project["CLI_URL"], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
