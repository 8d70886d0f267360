"""The console's overview series and its workflows tab routes, over a real server and PostgreSQL.

Runs across actors filtered by status, workflow, actor type and tenant; signal, cancel and retry
as an operator; the guard refuses a user of another tenant before any run is read; the overview's
chart points come from the runtime's own metrics.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from akter.http.console import Console
from tests._support import until
from tests.e2e.conftest import OPERATOR, Serve, assert_problem, operators_only, token
from tests.integration.workflow_actors import ALL, CALLS, PROVIDER, Order

pytestmark = pytest.mark.timeout(60)

HEADER = {"X-Akter-Console": "1"}


def operators(caller: object, tenant: str) -> bool:
    """Operators are the ``ops`` tenant's OPERATOR (a tenant-safe rule, as docs/console.md)."""
    return getattr(caller, "subject", None) == OPERATOR and tenant == "ops"


APP = {"console": Console(allow=operators)}


@pytest.fixture(autouse=True)
def counters() -> Iterator[None]:
    CALLS.clear()
    PROVIDER.reset()
    yield
    CALLS.clear()
    PROVIDER.reset()


async def test_runs_across_actors_with_filters(served: Serve) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        done = await t.get(Order, "o-1", tenant="acme").three.start("sku-1")
        waiting = await t.get(Order, "o-2", tenant="acme").compensating.start()
        theirs = await t.get(Order, "o-9", tenant="beta").compensating.start()
        await t.drain()
        ops = s.http(token(OPERATOR, "ops"), headers=HEADER)

        async def listed(**params: str) -> list[str]:
            response = await ops.get("/console/api/runs", params=params)
            assert response.status_code == 200, response.text
            return [r["run_id"] for r in response.json()["runs"]]

        assert set(await listed()) == {done.id, waiting.id, theirs.id}
        assert await listed(status="completed") == [done.id]
        assert set(await listed(status="suspended")) == {waiting.id, theirs.id}
        assert set(await listed(workflow="compensating")) == {waiting.id, theirs.id}
        assert await listed(workflow="three", type="Order") == [done.id]
        assert await listed(type="Stock") == []
        # Scoped to a tenant: another tenant's run is not listed.
        assert set(await listed(tenant="acme")) == {done.id, waiting.id}
        assert await listed(tenant="beta", status="suspended") == [theirs.id]
        response = await ops.get("/console/api/runs", params={"tenant": "acme"})
        assert theirs.id not in response.text
        (row,) = [r for r in response.json()["runs"] if r["run_id"] == waiting.id]
        assert row["ref"] == {"tenant": "acme", "type": "Order", "id": "o-2"}
        assert row["wake"]["waiting"] == "signal Shipped"

        bad = await ops.get("/console/api/runs", params={"status": "asleep"})
        assert_problem(bad, 400, "InvalidInput")
        assert "status takes one of runnable, running" in bad.json()["detail"]
        too_many = await ops.get("/console/api/runs", params={"limit": "501"})
        assert_problem(too_many, 400, "InvalidInput")


async def test_a_user_of_another_tenant_sees_no_run_and_cannot_act(served: Serve) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        run = await t.get(Order, "o-1", tenant="acme").compensating.start()
        await t.drain()
        for caller in (token(OPERATOR, "acme"), token("mallory", "ops")):
            impostor = s.http(caller, headers=HEADER)
            refused = await impostor.get("/console/api/runs")
            assert_problem(refused, 403, "Unauthorized", "console_denied")
            assert run.id not in refused.text
            for action in ("cancel", "retry"):
                denied = await impostor.post(f"/console/api/workflows/{run.id}/{action}")
                assert_problem(denied, 403, "Unauthorized", "console_denied")
            sent = await impostor.post(
                f"/console/api/workflows/{run.id}/signal",
                json={"name": "Shipped", "payload": {"tracking": "T-0"}},
            )
            assert_problem(sent, 403, "Unauthorized", "console_denied")
        anonymous = await s.http(headers=HEADER).get("/console/api/runs")
        assert anonymous.status_code == 401
        status = await t.runtime.workflows.status(run.id)
        assert (status.status, status.cancel_requested) == ("suspended", False)


async def test_signal_cancel_and_retry_a_run(served: Serve) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        shipped = await t.get(Order, "o-1").compensating.start()
        stopped = await t.get(Order, "o-2").compensating.start()
        await t.drain()
        ops = s.http(token(OPERATOR, "ops"), headers=HEADER)

        sent = await ops.post(
            f"/console/api/workflows/{shipped.id}/signal",
            json={"name": "Shipped", "payload": {"tracking": "T-1"}},
        )
        assert sent.status_code == 200, sent.text
        assert sent.json() == {"run_id": shipped.id, "signal": "Shipped"}
        cancelled = await ops.post(f"/console/api/workflows/{stopped.id}/cancel")
        assert cancelled.json() == {"run_id": stopped.id, "cancel": "requested"}
        await t.drain()
        assert (await t.runtime.workflows.status(shipped.id)).status == "completed"
        assert (await t.runtime.workflows.status(stopped.id)).status == "cancelled"
        # The compensation ran: the cancel reached the run's wait.
        assert await t.get(Order, "o-2").marks() == ["reserve", "compensate"]

        again = await ops.post(f"/console/api/workflows/{stopped.id}/cancel")
        assert_problem(again, 409, "InvalidInput", "workflow_finished")
        late = await ops.post(
            f"/console/api/workflows/{shipped.id}/signal", json={"name": "Shipped", "payload": {}}
        )
        assert_problem(late, 409, "InvalidInput", "workflow_finished")
        retried = await ops.post(f"/console/api/workflows/{shipped.id}/retry")
        assert retried.json() == {"run_id": shipped.id, "retried": False}  # not diverged
        unknown = await ops.post("/console/api/workflows/wf-nope/retry")
        assert_problem(unknown, 404, "InvalidInput", "unknown_workflow_run")
        malformed = await ops.post(f"/console/api/workflows/{shipped.id}/signal", json=["x"])
        assert_problem(malformed, 400, "InvalidInput", "invalid_signal")


async def test_the_overview_series_come_from_the_runtimes_own_metrics(served: Serve) -> None:
    async with served(ALL, app_options=APP, relay=False) as s:
        t = s.t
        ops = s.http(token(OPERATOR, "ops"), headers=HEADER)
        first = await ops.get("/console/api/series")
        assert first.status_code == 200, first.text
        assert first.json() == {"every_s": 15.0, "sampled": False, "points": []}

        history = t.runtime.history
        before = history.record()
        await t.get(Order, "o-1").paid.start(100)  # a command, a run, a job
        await t.get(Order, "o-2").failing.start()
        await t.get(Order, "o-3").compensating.start()
        await t.drain()
        await t.runtime._runners.sampler.sample()  # the $maintenance owner's gauges, now
        history.record()
        body = (await ops.get("/console/api/series", params={"minutes": "5"})).json()
        assert body["sampled"] is True
        last = body["points"][-1]
        assert last["commits_per_s"] > 0
        assert last["jobs"] == {"succeeded": 1, "retried": 0, "dead": 0}
        assert (last["workflows"]["completed"], last["workflows"]["failed"]) == (1, 1)
        assert last["workflows"]["suspended"] == 1  # o-3 waits for its signal
        assert last["outbox_rows"] is not None and last["relay_lag_ms"] is not None
        assert before.at_ms <= last["at_ms"]

        refused = await s.http(token(OPERATOR, "acme"), headers=HEADER).get("/console/api/series")
        assert_problem(refused, 403, "Unauthorized", "console_denied")
        bad = await ops.get("/console/api/series", params={"minutes": "61"})
        assert_problem(bad, 400, "InvalidInput")


async def test_the_runtime_records_its_history_while_it_runs(served: Serve) -> None:
    async with served(ALL, app_options={"console": Console(allow=operators_only)}) as s:
        history = s.t.runtime.history
        await history.stop()  # started with the runtime, asleep for 15 s: again, faster
        history.every_s = 0.05
        history.start()
        await s.t.get(Order, "o-1").mark("x")

        async def recorded() -> bool:
            return len(history.series()) >= 2

        await until(recorded, within=10)
    assert history.series()[-1]["at_ms"] > 0
