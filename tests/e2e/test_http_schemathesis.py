"""schemathesis (``st run --checks all``) against a live uvicorn server: zero failures.

The server serves the e2e actors (a public one with a declared error and a job, and one only
System callers may use) and ``Shelf``, a public one owning a table (``GET /tables/...``, whose
well-formed ``after`` that is no cursor is a documented 400), behind ``ApiKeys``.
schemathesis reads ``/openapi.json`` and runs every operation through its example, coverage
and fuzzing phases with all of its checks: no 5xx, responses, statuses, content types and
headers as documented, valid data accepted and invalid data refused, auth enforced where the
document says so. Its only help: the API key (``-H``) and
a hook that replaces a generated well-formed ``Idempotency-Key`` with a minted one, and the id
of one ended job for the job-progress feed (any other job id is a documented 404).

Two outcomes that no schema can rule out are declared to ``positive_data_acceptance`` per
operation, from the document itself: a command's declared errors (its documented 422), and on a
feed a cursor beyond the actor's last event (``UnknownCursor``, 400 by semantics §2.9), and on
an outcome read a well-formed id that expired long ago (410 ``receipt_gone``). The
example count is modest so the run stays well under a minute; one worker, because Hypothesis
parsing lambdas in several threads trips a CPython 3.11 ``ast`` bug.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import akter
import akter.http
from tests.e2e.conftest import Account, Serve, Vault
from tests.e2e.shelf import Shelf

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
ST = str(Path(sys.executable).parent / "st")
KEY = "st-key-0123456789"
#: Examples per operation and the seed; raise or vary them locally to search further than CI.
EXAMPLES = os.environ.get("AKTER_E2E_ST_EXAMPLES", "10")
SEED = os.environ.get("AKTER_E2E_ST_SEED", "1")
ACCEPTED = ["2xx", "401", "403", "404", "409"]


def config(document: dict[str, Any], ended_job: str, done: dict[str, tuple[str, str]]) -> str:
    """``schemathesis.toml``: the documented outcomes a valid request may still meet.

    The job-progress feed (and the job's output stream) of a job no row names is a 404
    (``unknown_job``): its operation is given a real ended job of actor ``st-account`` (what the
    warning ``missing_test_data`` asks for), so valid requests read a feed that closes at once;
    likewise each outcome read is given a command with a receipt (and ``wait=0``), so it answers
    at once.
    """
    sections = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            if path in (
                "/actors/Account/{id}/jobs/{job_id}/progress",
                "/actors/Account/{id}/jobs/{job_id}/stream",
            ):
                sections.append(
                    f"[[operations]]\ninclude-name = {json.dumps(f'{method.upper()} {path}')}\n"
                    f'parameters = {{ "path.id" = "st-account", "path.job_id" = "{ended_job}" }}\n'
                )
            owner = path.split("/")[2] if path.startswith("/actors/") else ""
            if owner in done and path == f"/actors/{owner}/{{id}}/commands/{{command_id}}":
                actor_id, command_id = done[owner]
                sections.append(
                    f"[[operations]]\ninclude-name = {json.dumps(f'{method.upper()} {path}')}\n"
                    f'parameters = {{ "path.id" = "{actor_id}", "path.command_id" = '
                    f'"{command_id}", "query.wait" = 0 }}\n'
                )
            extra = []
            if "422" in op["responses"]:
                extra.append("422")  # a declared error of the command
            if path.endswith("/events"):
                extra.append("400")  # UnknownCursor: beyond the actor's last event
            if path.endswith("/stream"):
                extra += ["400", "410"]  # UnknownCursor (beyond_end), RetentionGap
            if path.endswith("/commands/{command_id}"):
                extra.append("410")  # receipt_gone: a well-formed id that expired long ago
            if path.startswith("/tables/"):
                extra.append("400")  # UnknownCursor: a well-formed `after` that is no cursor
            settings = []
            if extra:
                settings.append(
                    "checks.positive_data_acceptance.expected-statuses = "
                    f"{json.dumps(ACCEPTED + extra)}\n"
                )
            if path.startswith("/actors/Vault/"):
                # Vault is System-only: 403 to every HTTP user is its contract, so schemathesis's
                # missing_auth warning (an operation that answered only 401/403) is expected.
                settings.append(
                    'warnings = { enabled = true, display = ["missing_test_data", '
                    '"validation_mismatch", "missing_deserializer"] }\n'
                )
            if settings:
                sections.append(
                    f"[[operations]]\ninclude-name = {json.dumps(f'{method.upper()} {path}')}\n"
                    + "".join(settings)
                )
    return "\n".join(sections)


async def test_schemathesis_checks_all_pass(served: Serve, tmp_path: Path, shelf: None) -> None:
    auth = akter.http.ApiKeys({KEY: ("alice", "acme")})
    async with served([Account, Vault, Shelf], auth=auth) as s:
        for sku in ("apple", "pear", "plum"):
            await s.t.get(Shelf, "st-shelf", tenant="acme").stock(sku)
        document = (await s.http().get("/openapi.json")).json()
        account = s.t.get(Account, "st-account", tenant="acme")
        job = await account.send_letter("st")
        async for message in account.progress(job):  # until the job has ended
            if message.get("closed"):
                break
        settings = tmp_path / "schemathesis.toml"
        done = await s.t.runtime.mint_command_id()
        await account.with_command_id(done).deposit(1)
        stocked = await s.t.runtime.mint_command_id()
        await s.t.get(Shelf, "st-shelf", tenant="acme").with_command_id(stocked).stock("fig")
        outcomes = {"Account": ("st-account", done), "Shelf": ("st-shelf", stocked)}
        settings.write_text(config(document, job, outcomes))
        header = f"X-API-Key: {KEY}"
        env = {
            **os.environ,
            "AKTER_ST_URL": s.url,
            "AKTER_ST_HEADER": header,
            "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
            # Run in tmp_path (schemathesis keeps a cache in its working directory) with the
            # repository importable for the hooks module.
            "PYTHONPATH": os.pathsep.join([str(ROOT), *map(os.path.abspath, PYTHONPATH)]),
        }
        proc = await asyncio.create_subprocess_exec(
            ST,
            "--config-file",
            str(settings),
            "run",
            f"{s.url}/openapi.json",
            "--checks",
            "all",
            "--header",
            header,
            "--max-examples",
            EXAMPLES,
            "--phases",
            "examples,coverage,fuzzing",
            "--request-timeout",
            "1.5",
            "--workers",
            "1",
            "--seed",
            SEED,
            "--no-color",
            "--report-dir",
            str(tmp_path),
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        text = out.decode()
        (tmp_path / "schemathesis.txt").write_text(text)
        assert proc.returncode == 0, text
        assert "23 selected / 23 total" in text, text  # with Shelf and its table's rows
        assert "No issues found" in text, text
