"""The console's "Parked" view (evolution E3) over a real server on a real PostgreSQL.

The routes behave as ``runtime.outbox`` (and ``akter outbox``): a listing, a retry that makes the
row due now (it parks again when the code still cannot deliver it), a discard that needs a
reason and is audited under the operator's principal. Refusals leave the row as it was.
"""

from __future__ import annotations

from typing import Any

import pytest

from akter.callers import System, caller_to_json
from akter.testing import ActorTest
from tests._support import until
from tests.e2e.conftest import OPERATOR, Serve, assert_problem, token
from tests.e2e.test_console_api import CONSOLE_ACTORS, HEADER, console_app

pytestmark = pytest.mark.timeout(60)


async def park_a_row(t: ActorTest) -> str:
    """A parked intent to a command no definition declares (as the relay would leave it)."""
    await t.rows(
        "INSERT INTO {schema}.outbox (routing_key, intent_id, bucket, kind, tenant_id,"
        " actor_type, actor_id, target_type, target_id, command, payload, caller, due_at_ms,"
        " scheduled_at_ms, parked_at_ms, last_error)"
        " VALUES (0, 'parked-1', 0, 'intent', 'acme', 'Account', 'a-1', 'Account', 'a-1',"
        " 'gone', '{}', %(caller)s, 0, 0, 1000, 'UnknownCommand: gone')",
        {"caller": caller_to_json(System("actor"))},
    )
    return "parked-1"


async def row(t: ActorTest) -> list[dict[str, Any]]:
    return await t.rows("SELECT * FROM {schema}.outbox WHERE intent_id = 'parked-1'")


async def test_the_parked_view_lists_retries_and_discards(served: Serve) -> None:
    async with served(CONSOLE_ACTORS, app_options=console_app()) as s:
        row_id = await park_a_row(s.t)
        ops = s.http(token(OPERATOR), headers=HEADER)
        listed = await ops.get("/console/api/parked")
        assert listed.status_code == 200, listed.text
        [shown] = listed.json()["parked"]
        assert (shown["id"], shown["command"], shown["actor_type"]) == (row_id, "gone", "Account")

        # Outsiders are refused before anything is read or written.
        before = await row(s.t)
        assert (await s.http().post(f"/console/api/parked/{row_id}/retry")).status_code in (
            401,
            403,
        )
        no_reason = await ops.post(f"/console/api/parked/{row_id}/discard", json={})
        assert_problem(no_reason, 400, "InvalidInput")
        unknown = await ops.post("/console/api/parked/nope/retry")
        assert_problem(unknown, 400, "InvalidInput", "unknown_parked")
        assert await row(s.t) == before

        retried = await ops.post(f"/console/api/parked/{row_id}/retry")
        assert retried.status_code == 200 and retried.json()["retried"] == 1

        async def parked_again() -> bool:
            [again] = await row(s.t)
            return again["parked_at_ms"] is not None and again["parked_at_ms"] != 1000

        await until(parked_again, within=10)  # the command is still unknown: it parks again

        discarded = await ops.post(
            f"/console/api/parked/{row_id}/discard", json={"reason": "command removed in v3"}
        )
        assert discarded.status_code == 200 and discarded.json()["discarded"] == 1
        assert await row(s.t) == []
        [audit] = await s.t.rows("SELECT * FROM {schema}.v_operator_audit")
        assert (audit["reason"], audit["row_json"]["intent_id"]) == (
            "command removed in v3",
            row_id,
        )
        assert audit["operator"] == OPERATOR
