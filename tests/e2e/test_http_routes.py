"""Every command, query and feed route through a real uvicorn server on loopback (design §2.2).

Typed calls go through ``akter.client.Client`` (and ``SyncClient``); the wire format is checked
with raw httpx requests; event feeds are read as server-sent events (semantics §6.5, EV-04).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

import akter
from akter.client import SyncClient
from tests._support.citus import ON_CITUS
from tests.e2e.conftest import (
    RUNS,
    Account,
    Ledger,
    Overdrawn,
    Purse,
    Registry,
    Serve,
    Served,
    SseReader,
    assert_problem,
    count,
    token,
)

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")
COMMAND_ID = re.compile(r"^v1\.([1-9][0-9]{0,14})\.([1-9][0-9]{0,14})\.[0-9a-f-]{36}$")


async def deposits(s: Served, actor_id: str, n: int, *, auth: str = ALICE) -> None:
    account = s.client(auth).get(Account, actor_id)
    for k in range(1, n + 1):
        await account.deposit(k)


# --- commands and queries ------------------------------------------------------------------


async def test_typed_client_commands_queries_and_replays(served: Serve) -> None:
    async with served() as s:
        client = s.client(ALICE)
        account = client.get(Account, "a1")
        assert await account.deposit(5) == 5
        assert await account.deposit(cents=7, memo="rent") == 12
        assert await account.withdraw(2) == 10
        with pytest.raises(Overdrawn) as declared:
            await account.withdraw(100)
        assert (declared.value.balance, declared.value.asked) == (10, 100)
        assert await account.whoami() == "alice@acme"
        assert await account.balance() == 10
        purse = await account.purse()
        assert isinstance(purse, Purse)
        assert purse == Purse(balance=10, callers=["alice", "alice"], memos=["rent"])
        assert await account.last_callers(n=2) == ["alice", "alice"]

        # A pinned command id replays the stored outcome, also for a declared error.
        cid = await client.mint_command_id()
        assert COMMAND_ID.match(cid)
        assert await account.with_command_id(cid).deposit(1) == 11
        assert await account.with_command_id(cid).deposit(1) == 11
        fail_id = await client.mint_command_id()
        for _ in range(2):
            with pytest.raises(Overdrawn):
                await account.with_command_id(fail_id).withdraw(1000)
        assert await account.balance() == 11
        assert RUNS["acme/Account/a1/withdraw"] == 3  # 2, 100, then 1000 once: replays ran none

        # Gated actors, singletons (path id "_").
        ledger = client.get(Ledger, "l1")
        with pytest.raises(akter.ActorError) as refused:
            await ledger.post(1)
        assert refused.value.reason == "NotCreated"
        assert await ledger.open("alice") == "alice"
        assert await ledger.post(3) == 3
        assert await ledger.owner() == "alice"
        registry = client.get(Registry)
        assert await registry.register("x") == 1
        assert await registry.register("y") == 2
        assert await registry.names() == ["x", "y"]

        # The durable rows: one receipt per distinct command id, none for queries.
        state = await s.t.inspect(akter.ActorRef("acme", "Account", "a1"))
        assert state.state is not None and state.state["balance"] == 11
        assert len(state.receipts) == 7  # 5, 7, 2, 100, whoami, cid, fail_id
        assert {r["caller_key"] for r in state.receipts} == {'["User","alice"]'}


async def test_raw_wire_format_of_commands_and_queries(served: Serve) -> None:
    async with served() as s:
        http = s.http(ALICE)
        cid = await s.mint(ALICE)
        issued, expires = (int(x) for x in COMMAND_ID.match(cid).groups())  # type: ignore[union-attr]
        assert expires - issued == 86_400_000
        assert abs(issued - await s.t.now_ms()) < 5_000

        response = await http.post(
            "/actors/Account/a1/deposit", json={"cents": 3}, headers={"Idempotency-Key": cid}
        )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/json")
        assert response.json() == 3
        response = await http.post("/actors/Account/a1/queries/purse", json={})
        assert response.status_code == 200
        assert response.json() == {"balance": 3, "callers": ["alice"], "memos": []}
        response = await http.post("/actors/Account/a1/queries/last_callers", json={"n": 1})
        assert response.json() == ["alice"]
        response = await http.post(
            "/actors/Registry/_/register",
            json={"name": "r"},
            headers={"Idempotency-Key": await s.mint(ALICE)},
        )
        assert (response.status_code, response.json()) == (200, 1)

        # A declared error is 422 problem+json with its tag and fields, and replays as such.
        fail_id = await s.mint(ALICE)
        for _ in range(2):
            response = await http.post(
                "/actors/Account/a1/withdraw",
                json={"cents": 50},
                headers={"Idempotency-Key": fail_id},
            )
            body = assert_problem(response, 422, "DeclaredError")
            assert body["error"] == "e2e.Overdrawn"
            assert body["fields"] == {"balance": 3, "asked": 50}
        assert RUNS["acme/Account/a1/withdraw"] == 1


async def test_operations_routes(served: Serve) -> None:
    async with served() as s:
        http = s.http()
        ready = await http.get("/ready")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        docs = await http.get("/docs")
        assert docs.status_code == 200
        assert docs.headers["content-type"].startswith("text/html")
        assert "openapi.json" in docs.text
        spec = (await http.get("/openapi.json")).json()
        assert spec["openapi"].startswith("3.1")
        paths = set(spec["paths"])
        expected = {
            "/actors/Account/{id}/deposit",
            "/actors/Account/{id}/withdraw",
            "/actors/Account/{id}/whoami",
            "/actors/Account/{id}/note",
            "/actors/Account/{id}/send_letter",
            "/actors/Account/{id}/queries/balance",
            "/actors/Account/{id}/queries/purse",
            "/actors/Account/{id}/queries/last_callers",
            "/actors/Account/{id}/events",
            "/actors/Vault/{id}/put",
            "/actors/Vault/{id}/queries/total",
            "/actors/Vault/{id}/events",
            "/actors/Ledger/{id}/open",
            "/actors/Ledger/{id}/post",
            "/actors/Ledger/{id}/queries/owner",
            "/actors/Ledger/{id}/events",
            "/actors/Registry/{id}/register",
            "/actors/Registry/{id}/queries/names",
            "/actors/Registry/{id}/events",
            "/command-ids",
            "/ready",
        }
        assert expected <= paths
        deposit = spec["paths"]["/actors/Account/{id}/deposit"]["post"]
        assert {p["name"] for p in deposit["parameters"]} == {"id", "Idempotency-Key"}
        # Only commands that declare errors list the 422 of a declared error.
        assert "422" not in deposit["responses"]
        assert "422" in spec["paths"]["/actors/Account/{id}/withdraw"]["post"]["responses"]
        ref = deposit["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/AccountDepositArgs"  # a clean name for clients
        schema = spec["components"]["schemas"]["AccountDepositArgs"]
        assert set(schema["properties"]) == {"cents", "memo"}
        assert schema["required"] == ["cents"]
        # After drain the readiness probe answers 503.
        s.t.runtime.readiness = "draining"
        try:
            not_ready = await http.get("/ready")
            assert (not_ready.status_code, not_ready.json()) == (503, {"status": "draining"})
        finally:
            s.t.runtime.readiness = "ready"


async def test_sync_client(served: Serve) -> None:
    async with served() as s:

        def blocking() -> tuple[int, int, str]:
            with SyncClient(s.url, auth=ALICE) as client:
                # SyncClient.get is annotated as returning the actor class, whose methods are
                # coroutine functions for mypy although the sync handle returns values.
                account: Any = client.get(Account, "sync")
                return account.deposit(4), account.balance(), account.whoami()

        assert await asyncio.to_thread(blocking) == (4, 4, "alice@acme")


async def test_job_enqueued_over_http_routes_once(served: Serve) -> None:
    async with served() as s:
        account = s.client(ALICE).get(Account, "mailer")
        job_id = await account.send_letter("bob")
        assert COMMAND_ID.match(job_id)
        await s.t.drain()
        purse = await account.purse()
        assert purse.memos == ["sent to bob"]
        assert await count(s.t, "outbox") == 0


# --- event feeds (EV-04) -------------------------------------------------------------------


async def test_EV04_last_event_id_resumes_after_it_then_follows_live(served: Serve) -> None:
    async with served() as s:
        await deposits(s, "feed", 6)
        http = s.http(ALICE)
        for headers, params in (({"Last-Event-ID": "3"}, {}), ({}, {"after": "3"})):
            async with http.stream(
                "GET", "/actors/Account/feed/events", headers=headers, params=params
            ) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                reader = SseReader(response)
                replay = await reader.take(3)
                assert [f.id for f in replay] == ["4", "5", "6"]
                assert {f.event for f in replay} == {"e2e.Deposited"}
                first = replay[0].json()
                assert first["cursor"] == "4"
                assert first["tag"] == "e2e.Deposited"
                assert first["event"] == {"cents": 4, "balance": 10}
                assert COMMAND_ID.match(first["command_id"])
                # A commit made while the stream is open arrives on it (local: at once).
                started = time.monotonic()
                await s.client(ALICE).get(Account, "feed").deposit(100)
                (live,) = await reader.take(1)
                assert live.id == "7"
                assert live.json()["event"]["cents"] == 100
                assert time.monotonic() - started < 1.0
            await s.client(ALICE).get(Account, "feed").deposit(-100)

        # The typed client: one page, and a live follow from a cursor.
        account = s.client(ALICE).get(Account, "feed")
        page = await account.events(after="8")
        assert [r.cursor for r in page] == ["9", "10"]
        assert [r.tag for r in page] == ["e2e.Deposited"] * 2
        assert COMMAND_ID.match(page[0].command_id)
        seen: list[str] = []
        async with asyncio.timeout(5):
            async for record in account.events(after="9"):
                seen.append(record.cursor)
                if len(seen) == 1:
                    await account.deposit(1)
                if len(seen) == 2:
                    break
        assert seen == ["10", "11"]


async def test_EV04_pruned_last_event_id_yields_one_retention_gap(served: Serve) -> None:
    async with served() as s:
        await deposits(s, "gap", 8)
        await s.t.rows("DELETE FROM {schema}.events WHERE seq <= 5")
        http = s.http(ALICE)
        async with http.stream(
            "GET", "/actors/Account/gap/events", headers={"Last-Event-ID": "3"}
        ) as response:
            assert response.status_code == 200
            got = await SseReader(response).rest()  # returns: the stream closed
        assert len(got) == 1
        assert got[0].event == "retention_gap"
        assert got[0].json()["reason"] == "RetentionGap"
        # Resuming exactly at the first retained event - 1 is not a gap.
        async with http.stream(
            "GET", "/actors/Account/gap/events", headers={"Last-Event-ID": "5"}
        ) as response:
            assert [f.id for f in await SseReader(response).take(3)] == ["6", "7", "8"]
        # The typed client surfaces the gap as RetentionGap.
        account = s.client(ALICE).get(Account, "gap")
        with pytest.raises(akter.ActorError) as gap:
            async with asyncio.timeout(5):
                async for _ in account.events(after="3"):
                    pass
        assert gap.value.reason == "RetentionGap"
        # The actor's sequence is unchanged and continues.
        assert await account.deposit(1) == 37
        assert (await s.t.inspect(akter.ActorRef("acme", "Account", "gap"))).event_seq == 9


@pytest.mark.parametrize("notify", [False, True])
async def test_EV04_event_committed_on_another_runtime_arrives(served: Serve, notify: bool) -> None:
    # On Citus the remote turn and the feed's read each take a few hundred ms on this machine, so
    # the poll is longer there: the NOTIFY bound must still be clearly shorter than one poll.
    poll = 2.0 if ON_CITUS else 0.4
    async with served(poll=poll, notify=notify) as s:
        other = await s.t.add_runtime()
        await deposits(s, "x", 1)
        http = s.http(ALICE)
        async with http.stream(
            "GET", "/actors/Account/x/events", headers={"Last-Event-ID": "1"}
        ) as response:
            assert response.status_code == 200
            await asyncio.sleep(0.05)  # the server is now following
            started = time.monotonic()
            assert await other.get(Account, "x", tenant="acme").deposit(9) == 10
            (frame,) = await SseReader(response).take(1, within=3 * poll + 2)
            took = time.monotonic() - started
        assert frame.id == "2"
        assert frame.json()["event"] == {"cents": 9, "balance": 10}
        # Within one poll; with NOTIFY at once (well before a poll could have passed).
        assert took < (poll * 0.75 if notify else poll * 1.1 + 0.5), took


async def test_event_feed_refusals(served: Serve) -> None:
    async with served() as s:
        await deposits(s, "f", 2)
        http = s.http(ALICE)
        bad = await http.get("/actors/Account/f/events", headers={"Last-Event-ID": "abc"})
        assert_problem(bad, 400, "UnknownCursor")
        beyond = await http.get("/actors/Account/f/events", headers={"Last-Event-ID": "3"})
        assert_problem(beyond, 400, "UnknownCursor")
        denied = await http.get("/actors/Vault/f/events")
        assert_problem(denied, 403, "Unauthorized", "access_denied")
        unknown = await http.get("/actors/Nope/f/events")
        assert_problem(unknown, 404, "InvalidInput", "unknown_type")
        # Without credentials the caller is Anonymous: a non-public feed asks for credentials.
        anonymous = await s.http().get("/actors/Vault/f/events")
        assert_problem(anonymous, 401, "Unauthorized", "missing_credentials")


async def test_metrics_route_counts_turns_without_identifiers(served: Serve) -> None:
    async with served() as s:
        account = s.client(ALICE).get(Account, "metered-actor")
        cid = await s.mint(ALICE)
        await account.with_command_id(cid).deposit(1)
        await account.with_command_id(cid).deposit(1)  # a replay
        with pytest.raises(Overdrawn):
            await account.withdraw(5)
        response = await s.http().get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        text = response.text
        for outcome in ("success", "replay", "failure"):
            line = f'akter_turns_total{{actor_type="Account",outcome="{outcome}"}} 1.0'
            assert line in text.splitlines(), text
        # Prometheus names use "_"; no label holds a tenant, actor id, subject or command id.
        assert "akter.turns" not in text
        for identifier in ("acme", "metered-actor", "alice", cid):
            assert identifier not in text
