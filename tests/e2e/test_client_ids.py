"""The typed client mints its command ids itself: one round trip per command (issue 43, scope 8).

A real uvicorn server on loopback, behind an ASGI wrapper that records every request, on real
PostgreSQL. Command answers carry the server's database-clock reading (``Akter-Clock``) and the
retry window (``Akter-Retry-Window``); the client mints ids from the last reading plus its own
monotonic time since, ``CLOCK_MARGIN_MS`` behind, never from its wall clock. Before its first
reading (or after a ``future`` refusal) it asks the server: ``POST /command-ids``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

import akter
import akter.http
from akter._client_clock import CLOCK_MARGIN_MS
from akter._ids import CLOCK_HEADER, WINDOW_HEADER, mint_command_id, parse_command_id
from akter.client import Client, SyncClient
from akter.testing import ActorTest
from tests.e2e.conftest import (
    ACTORS,
    RUNS,
    SECRET,
    Account,
    DropOneResponse,
    Overdrawn,
    count,
    serving,
    token,
)

pytestmark = pytest.mark.timeout(90)

ALICE = token("alice")
MINT = "POST /command-ids"


class Counted:
    """An ASGI wrapper that records ``"METHOD /path"`` of every HTTP request it serves."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.requests.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)

    def mints(self) -> int:
        return self.requests.count(MINT)

    def commands(self) -> int:
        return sum(1 for r in self.requests if r.startswith("POST /actors/"))


@dataclass
class Server:
    t: ActorTest
    url: str
    counted: Counted
    clients: list[Client] = field(default_factory=list)

    def client(self, **options: Any) -> Client:
        made = Client(options.pop("url", self.url), auth=ALICE, **options)
        self.clients.append(made)
        return made


Make = Callable[..., contextlib.AbstractAsyncContextManager[Server]]


@pytest.fixture
def counted_server(akter_test: Callable[..., ActorTest]) -> Make:
    @contextlib.asynccontextmanager
    async def make(**runtime_options: Any) -> AsyncIterator[Server]:
        async with akter_test(ACTORS, **runtime_options) as t:
            counted = Counted(akter.http.app(t.runtime, auth=akter.http.BearerJWT(SECRET)))
            async with serving(counted) as url:
                server = Server(t, url, counted)
                try:
                    yield server
                finally:
                    for client in server.clients:
                        await client.aclose()

    return make


def issued(command_id: str) -> int:
    return int(command_id.split(".")[1])


async def test_one_round_trip_per_command_after_the_first(counted_server: Make) -> None:
    async with counted_server() as s:
        account = s.client().get(Account, "a1")
        # 16 concurrent first calls share one server-minted reading: 1 mint, 16 commands.
        await asyncio.gather(*(account.deposit(1) for _ in range(16)))
        assert (s.counted.mints(), s.counted.commands()) == (1, 16)
        for _ in range(10):
            await account.deposit(1)
        assert (s.counted.mints(), s.counted.commands()) == (1, 26)
        assert await account.balance() == 26
        assert RUNS["acme/Account/a1/deposit"] == 26
        assert await count(s.t, "receipts") == 26


async def test_the_sync_client_too(counted_server: Make) -> None:
    async with counted_server() as s:

        def blocking() -> tuple[list[int], str]:
            with SyncClient(s.url, auth=ALICE) as client:
                account: Any = client.get(Account, "sync")
                balances = [account.deposit(2) for _ in range(5)]
                return balances, client.mint_command_id()

        balances, minted = await asyncio.to_thread(blocking)
        assert balances == [2, 4, 6, 8, 10]
        assert (s.counted.mints(), s.counted.commands()) == (1, 5)
        parse_command_id(minted, s.t.runtime.config.window_ms)


async def test_command_answers_carry_the_database_clock_and_the_window(
    counted_server: Make,
) -> None:
    async with counted_server() as s:
        client = s.client()
        cid = await client.server_command_id()
        async with httpx.AsyncClient(base_url=s.url, timeout=15) as http:
            answers = []
            for key in (cid, cid, None):
                before = await s.t.now_ms()
                headers = {"Authorization": f"Bearer {ALICE}"}
                if key is not None:
                    headers["Idempotency-Key"] = key
                response = await http.post(
                    "/actors/Account/h1/deposit", json={"cents": 5}, headers=headers
                )
                after = await s.t.now_ms()
                answers.append(response.status_code)
                # A lower bound of the database clock when the server answered.
                reading = int(response.headers[CLOCK_HEADER])
                assert before - 1_000 <= reading <= after, (before, reading, after)
                assert int(response.headers[WINDOW_HEADER]) == s.t.runtime.config.window_ms
            assert answers == [200, 200, 400]  # a run, a replay, a refusal: each tells the clock
        assert RUNS["acme/Account/h1/deposit"] == 1


async def test_ids_minted_by_the_client_pass_the_servers_checks_behind_its_clock(
    counted_server: Make,
) -> None:
    async with counted_server() as s:
        client = s.client()
        await client.get(Account, "v1").deposit(1)  # the first reading
        window = s.t.runtime.config.window_ms
        for _ in range(20):
            minted = await client.mint_command_id()
            after = await s.t.now_ms()
            parsed = parse_command_id(minted, window)  # format, version and window
            # Issued behind the database clock by the margin: never refused as "future".
            assert after - CLOCK_MARGIN_MS - 5_000 <= parsed.issued_ms <= after - CLOCK_MARGIN_MS
            account = client.get(Account, "v1").with_command_id(minted)
            assert await account.deposit(1) >= 2
        assert s.counted.mints() == 1


@pytest.mark.parametrize("skew", [timedelta(hours=1), -timedelta(hours=1)])
async def test_a_client_whose_wall_clock_is_skewed_an_hour_still_gets_accepted_ids(
    counted_server: Make, monkeypatch: pytest.MonkeyPatch, skew: timedelta
) -> None:
    # A 60 s window: an id minted from a wall clock an hour off is refused (future or expired).
    async with counted_server(retry_window=60) as s:
        real_time, real_time_ns = time.time, time.time_ns
        monkeypatch.setattr(time, "time", lambda: real_time() + skew.total_seconds())
        monkeypatch.setattr(
            time, "time_ns", lambda: real_time_ns() + int(skew.total_seconds() * 1e9)
        )
        account = s.client().get(Account, "skew")
        naive = mint_command_id(int(time.time() * 1000), 60_000)  # the wall clock's id
        with pytest.raises(akter.ActorError) as refused:
            await account.with_command_id(naive).deposit(1)
        expected = ("InvalidCommandId", "future") if skew > timedelta(0) else ("CommandExpired",)
        assert (refused.value.reason, refused.value.code)[: len(expected)] == expected
        # The refusal's answer told the client the database clock: its own ids, minted from
        # that reading and its monotonic time since, are all accepted, with no round trip more.
        assert [await account.deposit(1) for _ in range(5)] == [1, 2, 3, 4, 5]
        assert s.counted.mints() == 0


async def test_a_future_refusal_falls_back_to_a_server_minted_id(counted_server: Make) -> None:
    async with counted_server() as s:
        client = s.client()
        account = client.get(Account, "back")
        assert await account.deposit(1) == 1  # learns the clock
        # The database clock steps back ten minutes (a failover to a host behind): the learned
        # reading is now ahead, so the next locally minted id reads as "future".
        s.t.runtime._clock.offset_ms -= 600_000
        refused_before = s.counted.commands()
        assert await account.deposit(1) == 2
        # One refused attempt, then a server-minted id and its accepted attempt.
        assert s.counted.commands() - refused_before == 2
        assert s.counted.mints() == 2
        assert RUNS["acme/Account/back/deposit"] == 2
        assert await account.deposit(1) == 3  # learned again from the answer: local ids
        assert s.counted.mints() == 2


async def test_a_declared_error_and_a_pinned_server_id_stay_available(
    counted_server: Make,
) -> None:
    async with counted_server() as s:
        client = s.client()
        account = client.get(Account, "pin")
        with pytest.raises(Overdrawn):
            await account.withdraw(5)
        pinned = await client.server_command_id()  # always a round trip to the server
        assert s.counted.mints() == 2
        assert await account.with_command_id(pinned).deposit(3) == 3
        assert await account.with_command_id(pinned).deposit(3) == 3  # a replay
        assert RUNS["acme/Account/pin/deposit"] == 1


async def test_a_dropped_answer_to_a_locally_minted_id_is_retried_and_replayed(
    counted_server: Make,
) -> None:
    async with counted_server() as s, DropOneResponse(s.url) as proxy:
        remote = s.client(url=proxy.url)
        learned = await remote.server_command_id()  # learns the clock; not a marked request
        assert await remote.get(Account, "r1").deposit(5, memo="once") == 5
        assert proxy.dropped.startswith(b"HTTP/1.1 200")
        assert len(proxy.keys) == 2 and proxy.keys[0] == proxy.keys[1] != learned
        assert s.counted.mints() == 1  # the command's id was minted by the client
        assert RUNS["acme/Account/r1/deposit"] == 1
        row = await s.t.inspect(akter.ActorRef("acme", "Account", "r1"))
        assert row.state is not None and row.state["memos"] == ["once"]
        assert [r["command_id"] for r in row.receipts] == [proxy.keys[0]]


async def test_the_openapi_document_declares_the_clock_headers(counted_server: Make) -> None:
    async with counted_server() as s, httpx.AsyncClient(base_url=s.url, timeout=15) as http:
        spec = (await http.get("/openapi.json")).json()
        deposit = spec["paths"]["/actors/Account/{id}/deposit"]["post"]["responses"]["200"]
        mint = spec["paths"]["/command-ids"]["post"]["responses"]["200"]
        query = spec["paths"]["/actors/Account/{id}/queries/balance"]["post"]["responses"]
        for declared in (deposit["headers"], mint["headers"]):
            assert set(declared) == {CLOCK_HEADER, WINDOW_HEADER}
        assert "headers" not in query["200"]  # queries take no id
        answer = await http.post("/command-ids", headers={"Authorization": f"Bearer {ALICE}"})
        for name, header in deposit["headers"].items():
            assert re.fullmatch(header["schema"]["pattern"], answer.headers[name])
