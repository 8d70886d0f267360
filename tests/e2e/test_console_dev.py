"""``akter dev`` serves the console to this machine: the URL is printed and the API answers.

The printed URL carries the process's console token in its fragment; the API answers with that
token and refuses without it.

The data directory is made with ``tempfile.mkdtemp`` under /tmp, as in ``test_cli_dev``.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cli_dev import APP_WITH_AUTH, dev_process, get_when_up


@pytest.mark.timeout(120)
def test_dev_serves_the_console_to_loopback(tmp_path: Path) -> None:
    with dev_process(tmp_path, "akter-dev-console-") as dev:
        base, lines, proc = dev.base, dev.lines, dev.proc
        found = re.search(r"console at (\S+)", lines[-1])
        assert found is not None, lines[-1]
        url, _, fragment = found.group(1).partition("#")
        assert url == f"{base}/console/", lines[-1]
        assert fragment.startswith("token="), lines[-1]
        secret = fragment.removeprefix("token=")
        assert re.fullmatch(r"[A-Za-z0-9_-]{32,}", secret), secret

        page = get_when_up(f"{base}/console/")
        assert page.status_code == 200 and "akter console" in page.text
        cid = httpx.post(f"{base}/command-ids").json()["command_id"]
        added = httpx.post(
            f"{base}/actors/Counter/c1/add", json={"k": 3}, headers={"Idempotency-Key": cid}
        )
        assert added.status_code == 200, added.text
        console = {"X-Akter-Console": "1", "X-Akter-Console-Token": secret}
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
        # Without the token, or with another: 401; through a proxy on this machine: 403.
        tokenless = httpx.get(f"{base}/console/api/overview", headers={"X-Akter-Console": "1"})
        assert tokenless.status_code == 401, tokenless.text
        assert tokenless.json()["code"] == "console_token_missing"
        wrong = httpx.get(
            f"{base}/console/api/overview",
            headers={**console, "X-Akter-Console-Token": secret[::-1]},
        )
        assert wrong.status_code == 401 and wrong.json()["code"] == "console_token_invalid"
        proxied = httpx.get(
            f"{base}/console/api/overview", headers={**console, "X-Forwarded-For": "192.0.2.7"}
        )
        assert proxied.status_code == 403 and proxied.json()["code"] == "console_proxied"

        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "drained" in err


@pytest.mark.timeout(120)
def test_dev_with_auth_serves_the_api_behind_it_and_the_console_as_before(tmp_path: Path) -> None:
    with dev_process(
        tmp_path, "akter-dev-auth-", "--auth", "devapp:auth", app=APP_WITH_AUTH
    ) as dev:
        base = dev.base
        found = re.search(r"#token=(\S+)", dev.lines[-1])
        assert found is not None, dev.lines[-1]
        get_when_up(f"{base}/ready")
        key = {"X-API-Key": "dev-key"}
        # Counter is public: anonymous callers still reach it; Mine needs a signed-in user.
        cid = httpx.post(f"{base}/command-ids").json()["command_id"]
        added = httpx.post(
            f"{base}/actors/Counter/c1/add", json={"k": 2}, headers={"Idempotency-Key": cid}
        )
        assert (added.status_code, added.json()) == (200, 2)
        anonymous = httpx.post(f"{base}/actors/Mine/m1/queries/n", json={})
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "missing_credentials")
        signed_in = httpx.post(f"{base}/actors/Mine/m1/queries/n", json={}, headers=key)
        assert (signed_in.status_code, signed_in.json()) == (200, 0)
        spec = httpx.get(f"{base}/openapi.json").json()
        assert set(spec["components"]["securitySchemes"]) == {"ApiKeys"}
        console = {"X-Akter-Console": "1", "X-Akter-Console-Token": found.group(1)}
        overview = httpx.get(f"{base}/console/api/overview", headers=console, timeout=5)
        assert overview.status_code == 200, overview.text
        dev.proc.send_signal(signal.SIGTERM)
        _, err = dev.proc.communicate(timeout=60)
        assert dev.proc.returncode == 0, err
