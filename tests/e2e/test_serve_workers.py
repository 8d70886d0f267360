"""``akter serve --workers 2``: two runner processes behind one HTTP port (issue 13, goal 6).

Real processes: the parent binds the port once and starts two children that accept on it; both
register as runners in the database and answer HTTP. A SIGKILLed child is reported and restarted
by the parent (a new runner registers); SIGTERM to the parent drains every child, unregisters
them and exits 0, and no child outlives it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.example_server import ALICE, KEYS, ROOT, free_port

pytestmark = pytest.mark.timeout(120)

AKTER = str(Path(sys.executable).parent / "akter")


class Parent:
    """The ``akter serve --workers`` process, with its stderr collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def close(self) -> None:
        """Kill the parent if still running; close its stderr once read to the end."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def pids(self) -> list[int]:
        """Every worker pid the parent reported starting, in order."""
        found = (re.search(r"worker \d+ started \(pid (\d+)\)", line) for line in self.lines)
        return [int(m.group(1)) for m in found if m]

    def wait_for(self, check: Callable[[], bool], what: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not check():
            assert self.proc.poll() is None, "\n".join(self.lines)
            assert time.monotonic() < deadline, f"{what}; stderr:\n" + "\n".join(self.lines)
            time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def schema(akter_db: str) -> Iterator[str]:
    name = f"bank_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(akter_db, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def runner_rows(url: str, schema: str) -> list[tuple[str, str | None]]:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            rows = conn.execute(
                f'SELECT runner_id::text, http_address FROM "{schema}".runners ORDER BY 1'
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [(str(r[0]), r[1]) for r in rows]


@pytest.mark.kill
def test_two_workers_share_one_port_restart_a_killed_one_and_drain_on_sigterm(
    akter_db: str, schema: str
) -> None:
    port = free_port()
    env = {**os.environ, "AKTER_DATABASE_URL": akter_db, "BANK_SCHEMA": schema}
    env["BANK_API_KEYS"] = KEYS
    argv = [AKTER, "serve", "examples.http_service:runtime", "--http", f"127.0.0.1:{port}"]
    argv += ["--auth", "examples.http_service:auth", "--workers", "2"]
    parent = Parent(argv, env)
    url = f"http://127.0.0.1:{port}"
    try:
        parent.wait_for(lambda: len(runner_rows(akter_db, schema)) == 2, "two runners registered")
        first = parent.pids()
        assert len(first) == 2 and all(alive(p) for p in first)
        assert {a for _, a in runner_rows(akter_db, schema)} == {f"127.0.0.1:{port}"}

        # Both answer on the one port: commands from many connections all land.
        with httpx.Client(base_url=url, timeout=10) as http:
            for cents in range(1, 11):
                with httpx.Client(base_url=url, timeout=10) as fresh:  # a new connection each
                    key = fresh.post("/command-ids", headers=ALICE).json()["command_id"]
                    done = fresh.post(
                        "/actors/Account/alice/deposit",
                        json={"cents": cents},
                        headers={"Idempotency-Key": key, **ALICE},
                    )
                    assert done.status_code == 200, done.text
            balance = http.post("/actors/Account/alice/queries/balance", json={}, headers=ALICE)
            assert balance.json() == {"cents": 55}

        # A child killed outright is reported and replaced by a new runner.
        before = {r for r, _ in runner_rows(akter_db, schema)}
        os.kill(first[0], signal.SIGKILL)
        parent.wait_for(lambda: len(parent.pids()) == 3, "the killed worker restarted")
        assert any(f"pid {first[0]}) exited with status -9" in line for line in parent.lines)
        parent.wait_for(
            lambda: len({r for r, _ in runner_rows(akter_db, schema)} - before) == 1,
            "the restarted worker registered",
        )
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 200

        # SIGTERM drains every child and the parent exits 0; no child outlives it.
        parent.proc.send_signal(signal.SIGTERM)
        assert parent.proc.wait(timeout=60) == 0, "\n".join(parent.lines)
        assert not any(alive(p) for p in parent.pids())
        left = {r for r, _ in runner_rows(akter_db, schema)}
        assert len(left) == 1 and left < before, (
            left
        )  # the SIGKILLed runner's row, until it expires
    finally:
        parent.close()
        for pid in parent.pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
