"""The console's workflow routes (the workflows spec W4) over a real server and PostgreSQL.

An actor's runs, newest first, with the wake condition of the suspended ones; one run's step
timeline and signals; the guard refuses before any row is read; unknown runs and actors are
problems, not 500s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from akter.http.console import Console
from tests.e2e.conftest import (
    OPERATOR,
    Serve,
    assert_problem,
    operators_only,
    token,
)
from tests.integration.workflow_actors import ALL, CALLS, PROVIDER, Order

pytestmark = pytest.mark.timeout(60)

HEADER = {"X-Akter-Console": "1"}
APP = {"console": Console(allow=operators_only)}


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    CALLS.clear()
    PROVIDER.reset()
    yield
    CALLS.clear()
    PROVIDER.reset()


async def test_an_actors_runs_and_a_runs_timeline(served: Serve) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        order = t.get(Order, "o-1", tenant="acme")
        done = await order.three.start("sku-1")
        asleep = await order.sleeper.start(2)
        waiting = await order.compensating.start()
        await t.get(Order, "o-2", tenant="acme").sleeper.start(1)  # another actor's run
        await t.drain()
        await t.runtime.workflows.signal_json(waiting.id, "Note", {"text": "not yet"})
        await t.drain()
        ops = s.http(token(OPERATOR), headers=HEADER)

        params = {"type": "Order", "id": "o-1", "tenant": "acme"}
        listed = await ops.get("/console/api/actor/workflows", params=params)
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert body["ref"] == {"tenant": "acme", "type": "Order", "id": "o-1"}
        runs = {r["run_id"]: r for r in body["runs"]}
        assert set(runs) == {done.id, asleep.id, waiting.id}
        assert (runs[done.id]["status"], runs[done.id]["wake"]) == ("completed", None)
        assert runs[done.id]["finished_at"] is not None
        sleeping = runs[asleep.id]
        assert sleeping["status"] == "suspended"
        assert sleeping["wake"]["waiting"].startswith("sleep until")
        assert sleeping["wake"]["until"] > sleeping["started_at"]  # ISO times compare in order
        # A wait for a signal alone wakes by itself at the run's deadline (timeout=, issue 38).
        assert runs[waiting.id]["wake"]["waiting"] == "signal Shipped"
        assert runs[waiting.id]["wake"]["until"] > sleeping["started_at"]  # its deadline
        limited = await ops.get("/console/api/actor/workflows", params={**params, "limit": "1"})
        assert len(limited.json()["runs"]) == 1
        bad_limit = await ops.get("/console/api/actor/workflows", params={**params, "limit": "0"})
        assert_problem(bad_limit, 400, "InvalidInput")
        unknown_type = await ops.get(
            "/console/api/actor/workflows", params={"type": "Ghost", "id": "x"}
        )
        assert_problem(unknown_type, 404, "InvalidInput", "unknown_type")
        nobody = await ops.get(
            "/console/api/actor/workflows", params={"type": "Order", "id": "nobody"}
        )
        assert nobody.json()["runs"] == []

        timeline: dict[str, Any] = (await ops.get(f"/console/api/workflows/{done.id}")).json()
        assert (timeline["status"], timeline["result"], timeline["wake"]) == (
            "completed",
            "reserved, 2 left",
            None,
        )
        assert [(x["seq"], x["kind"], x["name"], x["status"]) for x in timeline["steps"]] == [
            (0, "command", "Order.mark", "done"),
            (1, "command", "Stock.reserve", "done"),
            (2, "command", "Order.mark", "done"),
        ]
        assert timeline["steps"][1]["outcome"] == {"ok": 2}
        assert all(x["recorded_at"] >= x["started_at"] for x in timeline["steps"])

        parked = (await ops.get(f"/console/api/workflows/{waiting.id}")).json()
        assert parked["wake"] == {"waiting": "signal Shipped", "until": parked["deadline"]}
        assert parked["deadline"] is not None
        assert [(x["kind"], x["name"], x["status"]) for x in parked["steps"]] == [
            ("command", "Order.mark", "done"),
            ("wait", "Shipped", "pending"),
        ]
        assert [(g["name"], g["payload"], g["state"]) for g in parked["signals"]] == [
            ("Note", {"text": "not yet"}, "pending")
        ]

        missing = await ops.get("/console/api/workflows/nope")
        assert_problem(missing, 404, "InvalidInput", "unknown_workflow_run")
        # The guard refuses first: no console header, or a caller the rule does not admit.
        plain = s.http(token(OPERATOR))
        assert_problem(
            await plain.get(f"/console/api/workflows/{done.id}"),
            403,
            "Unauthorized",
            "console_header_missing",
        )
        bob = s.http(token("bob"), headers=HEADER)
        assert_problem(
            await bob.get("/console/api/actor/workflows", params=params),
            403,
            "Unauthorized",
            "console_denied",
        )
