"""``akter outbox`` in subprocesses: pending rows as before, and the parked-row verbs (E3).

The parked row is made by parking a pending timer in SQL (what the relay does to a row the code
cannot deliver); the verbs then go through the CLI against the real database.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

import psycopg
import pytest

from tests.integration import test_cli

project = test_cli.project
run = test_cli.run


async def _stage_a_timer(project: dict[str, str]) -> None:
    sys.path.insert(0, project["cwd"])
    os.environ["CLI_URL"], os.environ["CLI_SCHEMA"] = project["CLI_URL"], project["schema"]
    try:
        cliapp = importlib.import_module("cliapp")
        async with cliapp.runtime:
            await cliapp.runtime.get(cliapp.Counter, "c1").add(1)  # stages the 'later' timer
    finally:
        sys.path.remove(project["cwd"])
        sys.modules.pop("cliapp", None)


def _sql(project: dict[str, str], statement: str) -> list[Any]:
    with psycopg.connect(project["CLI_URL"], autocommit=True) as conn:
        cur = conn.execute(statement.replace("{schema}", f'"{project["schema"]}"'))
        return cur.fetchall() if cur.description else []


@pytest.mark.slow
async def test_outbox_parked_retry_discard(project: dict[str, str]) -> None:
    await _stage_a_timer(project)
    pending = json.loads(run(project, "outbox", "cliapp:runtime", "--json").stdout)
    assert [r["timer_key"] for r in pending] == ["later"]  # ``akter outbox TARGET`` as before
    listed = json.loads(run(project, "outbox", "list", "cliapp:runtime", "--json").stdout)
    assert listed == pending
    [(row_id,)] = _sql(project, "SELECT intent_id FROM {schema}.outbox")

    def park() -> None:
        _sql(
            project,
            "UPDATE {schema}.outbox SET parked_at_ms = 1000, last_error = 'InvalidInput: k'",
        )

    park()
    parked = run(project, "outbox", "parked", "cliapp:runtime", "--json")
    assert parked.returncode == 0, parked.stderr
    [shown] = json.loads(parked.stdout)
    assert (shown["id"], shown["command"], shown["error"]) == (row_id, "add", "InvalidInput: k")
    assert (shown["actor_type"], shown["actor_id"]) == ("Counter", "c1")

    unknown = run(project, "outbox", "retry", "cliapp:runtime", "nope")
    assert unknown.returncode == 1 and "'nope'" in unknown.stderr
    retried = run(project, "outbox", "retry", "cliapp:runtime", row_id)
    assert retried.returncode == 0, retried.stderr
    assert _sql(project, "SELECT parked_at_ms FROM {schema}.outbox") == [(None,)]

    park()
    unconfirmed = run(project, "outbox", "discard", "cliapp:runtime", "--all", "--reason", "old")
    assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr
    no_reason = run(project, "outbox", "discard", "cliapp:runtime", "--all", "--yes")
    assert no_reason.returncode == 1 and "--reason" in no_reason.stderr
    assert len(_sql(project, "SELECT * FROM {schema}.outbox")) == 1
    discarded = run(
        project, "outbox", "discard", "cliapp:runtime", "--all", "--reason", "old", "--yes"
    )
    assert discarded.returncode == 0, discarded.stderr
    assert _sql(project, "SELECT * FROM {schema}.outbox") == []
    [(operator, reason, kept)] = _sql(
        project, "SELECT operator, reason, row_json->>'intent_id' FROM {schema}.v_operator_audit"
    )
    assert operator.startswith("os:") and (reason, kept) == ("old", row_id)
