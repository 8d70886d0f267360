"""Serving as the HTTP guide (docs/guides/http.md) says: its commands, run as child processes.

``uvicorn examples.http_service:app`` (the app owns the runtime's lifecycle) and ``akter serve
... --http ... --auth module:provider`` both serve the example behind its API keys: a signed-in
caller calls commands, queries and reads a declared error; an anonymous caller reads the public
actor and is asked for credentials by the others; SIGTERM drains and exits 0. The section's
Python blocks run as written.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from akter.cli import app as cli
from akter.cli._common import load_auth
from akter.errors import ConfigurationError
from akter.http import ApiKeys
from tests.e2e.example_server import ALICE, ROOT, example_server, free_port

pytestmark = pytest.mark.timeout(120)

AKTER = str(Path(sys.executable).parent / "akter")


def section() -> str:
    """The HTTP guide, docs/guides/http.md."""
    return (ROOT / "docs" / "guides" / "http.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), flags=re.S)


def readme_command(program: str) -> list[str]:
    """The README's command line that runs ``program`` (its environment assignments dropped)."""
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and "=" in words[0] and not words[0].startswith("-"):
                words.pop(0)
            if words[:2] == program.split()[:2] or words[:1] == program.split():
                return words
    raise AssertionError(f"the README section shows no {program!r} command")


def with_port(words: list[str], port: int) -> list[str]:
    """``words`` run by this interpreter's tools, serving on ``port``."""
    exe = [sys.executable, "-m", "uvicorn"] if words[0] == "uvicorn" else [AKTER]
    rest = words[1:]
    if "--http" in rest:
        rest[rest.index("--http") + 1] = f"127.0.0.1:{port}"
    else:
        rest[rest.index("--port") + 1] = str(port)
        rest += ["--host", "127.0.0.1"]
    return [*exe, *rest]


def exercise(url: str) -> None:
    """What the README promises of the served example."""
    with httpx.Client(base_url=url, timeout=10) as http:
        minted = http.post("/command-ids", headers=ALICE)
        assert minted.status_code == 200, minted.text
        key = {"Idempotency-Key": minted.json()["command_id"], **ALICE}
        deposit = http.post("/actors/Account/alice/deposit", json={"cents": 500}, headers=key)
        assert (deposit.status_code, deposit.json()) == (200, 500)
        again = http.post("/actors/Account/alice/deposit", json={"cents": 500}, headers=key)
        assert (again.status_code, again.json()) == (200, 500)  # a replay, not a second deposit
        balance = http.post("/actors/Account/alice/queries/balance", json={}, headers=ALICE)
        assert balance.json() == {"cents": 500}
        mint = http.post("/command-ids", headers=ALICE).json()["command_id"]
        refused = http.post(
            "/actors/Account/alice/withdraw",
            json={"cents": 900},
            headers={"Idempotency-Key": mint, **ALICE},
        )
        assert refused.status_code == 422
        assert refused.json()["error"] == "bank.InsufficientFunds"
        assert refused.json()["fields"] == {"balance": 500, "asked": 900}
        # Anonymous callers: the public board answers, the accounts ask for credentials.
        rate = http.post("/actors/Rates/_/queries/rate", json={"currency": "EUR"})
        assert (rate.status_code, rate.json()) == (200, 0.92)
        anonymous = http.post("/actors/Account/alice/queries/balance", json={})
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "missing_credentials")
        bob = http.post(
            "/actors/Account/alice/queries/balance", json={}, headers={"X-API-Key": "bob-key"}
        )
        assert (bob.status_code, bob.json()["code"]) == (403, "access_denied")
        wrong = http.post(
            "/actors/Rates/_/queries/rate",
            json={"currency": "EUR"},
            headers={"X-API-Key": "not-a-key"},
        )
        assert (wrong.status_code, wrong.json()["code"]) == (401, "invalid_credentials")
        spec = http.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"] == {
            "ApiKeys": {"type": "apiKey", "in": "header", "name": "x-api-key"}
        }


def test_uvicorn_serves_the_example_from_the_readme_command(akter_db: str) -> None:
    port = free_port()
    argv = with_port(readme_command("uvicorn"), port)
    assert argv[3] == "examples.http_service:app"
    with example_server(akter_db, argv, port) as child:
        exercise(child.url)


def test_the_readme_curl_commands_work(akter_db: str) -> None:
    port = free_port()
    (curls,) = [b for b in blocks("sh") if "curl" in b]
    with example_server(akter_db, with_port(readme_command("uvicorn"), port), port) as child:
        script = curls.replace("localhost:8000", child.url.removeprefix("http://"))
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["500", "0.92"]


def test_akter_serve_takes_the_auth_provider_from_the_readme_command(akter_db: str) -> None:
    port = free_port()
    words = readme_command("akter serve")
    assert "--auth" in words
    with example_server(akter_db, with_port(words, port), port) as child:
        exercise(child.url)


def test_the_readme_python_blocks_run() -> None:
    found = blocks("python")
    assert found, "the section shows Python"
    for code in found:
        namespace: dict[str, Any] = {"__name__": "readme"}
        exec(compile(code, "README.md", "exec"), namespace)


# --- --auth module:provider -------------------------------------------------------------------


def test_load_auth_takes_a_provider_or_a_zero_argument_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "authmod.py").write_text(
        "import akter.http\n"
        "keys = akter.http.ApiKeys({'k': ('alice', 'acme')})\n"
        "def make():\n    return keys\n"
        "async def custom(request):\n    return akter.http.Identity(akter.Anonymous())\n"
        "number = 5\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_auth("authmod:keys"), ApiKeys)
    assert isinstance(load_auth("authmod:make"), ApiKeys)
    assert load_auth("authmod:custom").__name__ == "custom"
    for bad in ("authmod:number", "authmod:missing", "authmod", "nomodule:x"):
        with pytest.raises(ConfigurationError):
            load_auth(bad)


def test_serve_refuses_auth_without_http() -> None:
    result = CliRunner().invoke(
        cli, ["serve", "examples.http_service:runtime", "--auth", "examples.http_service:auth"]
    )
    assert result.exit_code == 1
    assert "--auth needs --http" in result.output
