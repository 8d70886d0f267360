"""``akter dev`` serves the console to this machine: the URL is printed and the API answers.

The data directory is made with ``tempfile.mkdtemp`` under /tmp, as in ``test_cli_dev``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cli_dev import AKTER, APP, free_port


@pytest.mark.timeout(120)
def test_dev_serves_the_console_to_loopback(tmp_path: Path) -> None:
    (tmp_path / "devapp.py").write_text(APP)
    data_dir = Path(tempfile.mkdtemp(prefix="akter-dev-console-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("AKTER_DATABASE_URL", "AKTER_DATA_DIR")}
    proc = subprocess.Popen(
        [
            AKTER,
            "dev",
            "devapp:runtime",
            "--http",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(tmp_path)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        base = f"http://127.0.0.1:{port}"
        lines: list[str] = []
        while not any("ready" in line for line in lines):
            line = proc.stderr.readline()
            assert line, f"akter dev exited early: {''.join(lines)}"
            lines.append(line)
        found = re.search(r"console at (\S+)", lines[-1])
        assert found is not None and found.group(1) == f"{base}/console/", lines[-1]

        deadline = time.monotonic() + 20
        while True:
            try:
                page = httpx.get(f"{base}/console/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert page.status_code == 200 and "akter console" in page.text
        cid = httpx.post(f"{base}/command-ids").json()["command_id"]
        added = httpx.post(
            f"{base}/actors/Counter/c1/add", json={"k": 3}, headers={"Idempotency-Key": cid}
        )
        assert added.status_code == 200, added.text
        console = {"X-Akter-Console": "1"}
        overview = httpx.get(f"{base}/console/api/overview", headers=console, timeout=5)
        assert overview.status_code == 200, overview.text
        assert [(t["type"], t["actors"]) for t in overview.json()["types"]] == [("Counter", 1)]
        actor = httpx.get(
            f"{base}/console/api/actor", params={"type": "Counter", "id": "c1"}, headers=console
        ).json()
        assert actor["state"] == {"n": 3}
        # Another host name (DNS rebinding) or no console header: refused.
        rebound = httpx.get(
            f"{base}/console/api/overview", headers={**console, "Host": "attacker.example"}
        )
        assert rebound.status_code == 403
        assert httpx.get(f"{base}/console/api/overview").status_code == 403

        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "drained" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        from akter._store.embedded import shutdown

        shutdown(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
