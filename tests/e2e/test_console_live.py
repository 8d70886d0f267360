"""The console's live reads: an actor's row as it commits, and a job's output stream.

Both feeds sit behind the console's guard (401/403 before anything is read) and follow its
tenancy: the operator names the tenant, and a job of one actor or tenant is not found under
another's name. The state feed is a row follower of ``runtime.live``: it holds a watch slot
while open and gives it back when the page goes.
"""

from __future__ import annotations

import pytest

import akter
from akter.http.console import Console
from tests._support.polling import until
from tests.e2e.conftest import (
    ACTORS,
    OPERATOR,
    Account,
    Courier,
    CourierControl,
    Serve,
    SseReader,
    Vault,
    assert_problem,
    operators_only,
    token,
)

pytestmark = pytest.mark.timeout(60)

CONSOLE = {"console": Console(allow=operators_only)}
HEADER = {"X-Akter-Console": "1"}


async def test_the_state_feed_follows_commits_of_the_named_tenant_only(served: Serve) -> None:
    async with served([*ACTORS, Courier], app_options=CONSOLE) as s:
        acme = s.t.get(Account, "a-1", tenant="acme")
        same_id = s.t.get(Account, "a-1")  # the default tenant's actor of the same id
        await acme.deposit(5)
        await same_id.deposit(100)
        ops = s.http(token(OPERATOR), headers=HEADER)
        params = {"type": "Account", "id": "a-1", "tenant": "acme"}
        async with ops.stream("GET", "/console/api/actor/state", params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-store"
            reader = SseReader(response)
            (first,) = await reader.take(1)
            assert (first.event, first.id) == ("state", "1")
            assert first.json()["state"]["balance"] == 5 and first.json()["exists"] is True
            assert s.t.runtime.live.watching == 1
            # Another tenant's commit wakes nothing here; the named tenant's shows at once,
            # and so does a commit that emits no event (the event feed would not show it).
            await same_id.deposit(1)
            await acme.deposit(7)
            (second,) = await reader.take(1)
            assert second.id == "2" and second.json()["state"]["balance"] == 12
            assert second.json()["event_seq"] == 2
            await acme.withdraw(2)
            (third,) = await reader.take(1)
            assert third.id == "3" and third.json()["state"]["balance"] == 10
            assert third.json()["event_seq"] == 2  # no event: only the state feed saw it
        # The page went: its watch slot is given back.
        live = s.t.runtime.live
        await until(lambda: live.watching, holds=lambda n: n == 0, what="the slot given back")


async def test_the_state_feed_of_an_actor_that_never_committed(served: Serve) -> None:
    async with served([*ACTORS, Courier], app_options=CONSOLE) as s:
        ops = s.http(token(OPERATOR), headers=HEADER)
        params = {"type": "Account", "id": "new", "tenant": "acme"}
        async with ops.stream("GET", "/console/api/actor/state", params=params) as response:
            reader = SseReader(response)
            (first,) = await reader.take(1)
            assert first.id == "0" and first.json()["exists"] is False
            await s.t.get(Account, "new", tenant="acme").deposit(3)
            (second,) = await reader.take(1)
            assert second.id == "1" and second.json()["state"]["balance"] == 3


async def test_live_feeds_refuse_before_reading(served: Serve, courier: CourierControl) -> None:
    async with served([*ACTORS, Courier], app_options=CONSOLE) as s:
        job_id = await s.t.get(Courier, "c-1", tenant="acme").haul(1)
        state = ("/console/api/actor/state", {"type": "Account", "id": "a-1", "tenant": "acme"})
        stream = (
            "/console/api/jobs/stream",
            {"type": "Courier", "id": "c-1", "tenant": "acme", "job_id": job_id},
        )
        for path, params in (state, stream):
            anonymous = s.http(headers=HEADER)
            assert_problem(
                await anonymous.get(path, params=params), 401, "Unauthorized", "missing_credentials"
            )
            # A user of the tenant whose actor it is is no operator.
            bob = s.http(token("bob", tenant="acme"), headers=HEADER)
            assert_problem(
                await bob.get(path, params=params), 403, "Unauthorized", "console_denied"
            )
            bare = s.http(token(OPERATOR))
            assert_problem(
                await bare.get(path, params=params), 403, "Unauthorized", "console_header_missing"
            )
        assert s.t.runtime.live.watching == 0
        ops = s.http(token(OPERATOR), headers=HEADER)
        path, params = stream
        # The job is acme's Courier's: under another tenant or actor it is not found.
        for other in ({"tenant": "default"}, {"id": "c-2"}):
            assert_problem(
                await ops.get(path, params={**params, **other}), 404, "InvalidInput", "unknown_job"
            )
        assert_problem(await ops.get(path, params={**params, "after": "x"}), 400, "UnknownCursor")
        missing = {k: v for k, v in params.items() if k != "job_id"}
        assert_problem(await ops.get(path, params=missing), 400, "InvalidInput")
        assert_problem(
            await ops.get(state[0], params={**state[1], "type": "Nope"}), 404, "InvalidInput"
        )
        courier.permits.put_nowait(None)


async def test_the_job_output_stream_is_live_and_resumable(
    served: Serve, courier: CourierControl
) -> None:
    async with served([*ACTORS, Courier], app_options=CONSOLE) as s:
        job_id = await s.t.get(Courier, "c-1", tenant="acme").haul(2)
        ops = s.http(token(OPERATOR), headers=HEADER)
        params = {"type": "Courier", "id": "c-1", "tenant": "acme", "job_id": job_id}
        async with ops.stream("GET", "/console/api/jobs/stream", params=params) as response:
            assert response.status_code == 200
            reader = SseReader(response)
            courier.permits.put_nowait(None)
            attempt, chunk = await reader.take(2, within=10)
            assert attempt.event == "attempt" and attempt.json()["attempt"] == 1
            assert (chunk.event, chunk.json()["data"]) == ("chunk", "leg 1 of 2")
            courier.permits.put_nowait(None)
            rest = await reader.rest(within=10)
        assert [(f.event, f.json().get("data")) for f in rest] == [
            ("chunk", "leg 2 of 2"),
            ("closed", None),
        ]
        assert rest[-1].json()["outcome"] == "succeeded"
        # A late reader, resuming after the first chunk, reads the rest from the stored stream.
        resumed = await ops.get("/console/api/jobs/stream", params={**params, "after": chunk.id})
        assert resumed.status_code == 200
        assert "leg 2 of 2" in resumed.text and "leg 1 of 2" not in resumed.text
        assert "event: closed" in resumed.text


async def test_operators_follow_an_actor_its_policy_hides_from_users(served: Serve) -> None:
    # Vault admits System callers only: its users' reads are refused, the console shows its row.
    async with served([*ACTORS, Courier], app_options=CONSOLE, max_watchers_per_actor=1) as s:
        vault = s.t.get(Vault, "v-1", tenant="acme")
        await vault.put(9)
        user = s.http(token("bob", tenant="acme"))
        denied = await user.get("/actors/Vault/v-1/events")
        assert_problem(denied, 403, "Unauthorized", "access_denied")
        ops = s.http(token(OPERATOR), headers=HEADER)
        params = {"type": "Vault", "id": "v-1", "tenant": "acme"}
        async with ops.stream("GET", "/console/api/actor/state", params=params) as response:
            (first,) = await SseReader(response).take(1)
            assert first.json()["state"]["balance"] == 9
            # The feed holds the actor's one watch slot on this runner: a second is refused.
            again = await ops.get("/console/api/actor/state", params=params)
            assert_problem(again, 503, "RunnerAtCapacity", "too_many_actor_watchers")


async def test_a_tenant_safe_rule_refuses_a_namesake_of_another_tenant(
    served: Serve, courier: CourierControl
) -> None:
    def ops_tenant_only(caller: akter.User | akter.Anonymous, tenant: str) -> bool:
        return isinstance(caller, akter.User) and (tenant, caller.subject) == ("ops", "admin")

    options = {"console": Console(allow=ops_tenant_only)}
    async with served([*ACTORS, Courier], app_options=options) as s:
        await s.t.get(Account, "a-1", tenant="acme").deposit(1)
        job_id = await s.t.get(Courier, "c-1", tenant="acme").haul(1)
        feeds = (
            ("/console/api/actor/state", {"type": "Account", "id": "a-1", "tenant": "acme"}),
            (
                "/console/api/jobs/stream",
                {"type": "Courier", "id": "c-1", "tenant": "acme", "job_id": job_id},
            ),
        )
        # "admin" of acme is not the operator "admin" of ops, even for acme's own actors.
        namesake = s.http(token("admin", tenant="acme"), headers=HEADER)
        operator = s.http(token("admin", tenant="ops"), headers=HEADER)
        for path, params in feeds:
            refused = await namesake.get(path, params=params)
            assert_problem(refused, 403, "Unauthorized", "console_denied")
            async with operator.stream("GET", path, params=params) as response:
                assert response.status_code == 200
                (first,) = await SseReader(response).take(1)
                assert first.event in ("state", "attempt")
                courier.permits.put_nowait(None)
