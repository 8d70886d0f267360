"""``examples/http_service.py`` served by a real child process, as the README serves it.

:func:`example_server` starts a command (``uvicorn examples.http_service:app`` or ``akter serve
... --auth ...``) from the repository root, with the test database, a fresh schema and the
README's API keys, waits until ``/ready`` answers 200, yields the base URL, then stops the child
with SIGTERM (it must drain and exit cleanly) and drops the schema.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[2]
#: The README's keys: alice and bob in tenant acme.
KEYS = "alice-key=alice@acme,bob-key=bob@acme"
ALICE = {"X-API-Key": "alice-key"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """A served example: its base URL and process."""

    url: str
    proc: subprocess.Popen[str]


@contextmanager
def example_server(database_url: str, argv: list[str], port: int) -> Iterator[Child]:
    """Run ``argv`` (serving on ``port``) until it is ready; stop it and drop its schema."""
    schema = f"bank_{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "AKTER_DATABASE_URL": database_url,
        "BANK_SCHEMA": schema,
        "BANK_API_KEYS": KEYS,
    }
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the example did not become ready"
            time.sleep(0.1)
        yield Child(url, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        # uvicorn re-raises the signal once it has shut down (exit status -SIGTERM); the drain
        # ran when "Application shutdown complete" was logged.
        assert proc.returncode in (0, -signal.SIGTERM), err
        assert proc.returncode == 0 or "Application shutdown complete" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
