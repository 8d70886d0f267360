"""Query watches over HTTP (SSE) and the typed client's live side (SSE watch, WebSocket)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import akter
import akter.http
from akter.client import Client, SyncClient
from akter.testing import ActorTest
from tests._support.polling import until
from tests.integration.live_actors import ACTORS, Account, Private
from tests.integration.live_serving import by_header, serving

Make = Callable[..., ActorTest]
WITHIN = 5.0


async def next_value(values: AsyncIterator[Any]) -> Any:
    async with asyncio.timeout(WITHIN):
        return await anext(values)


def client(address: str, user: str = "alice", tenant: str = "default") -> Client:
    return Client(f"http://{address}", headers={"X-Test-User": user, "X-Test-Tenant": tenant})


async def test_sse_watch_frames_and_refusals(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            headers = {"X-Test-User": "alice"}
            async with httpx.AsyncClient(base_url=f"http://{address}", headers=headers) as http:
                async with http.stream("POST", "/actors/Account/a/balance/watch", json={}) as sse:
                    assert sse.status_code == 200
                    assert sse.headers["content-type"].startswith("text/event-stream")
                    lines = sse.aiter_lines()
                    assert [await anext(lines) for _ in range(3)] == [
                        "id: 0",
                        "event: value",
                        'data: {"version":0,"value":0}',
                    ]
                    await t.get(Account, "a").deposit(3)
                    frame = [await anext(lines) for _ in range(4)][1:]
                    assert frame == ["id: 1", "event: value", 'data: {"version":1,"value":3}']
                # Refusals are problems before any stream: not watchable, unknown, anonymous.
                plain = await http.post("/actors/Account/a/plain/watch", json={})
                assert (plain.status_code, plain.json()["code"]) == (400, "not_watchable")
                unknown = await http.post("/actors/Account/a/nope/watch", json={})
                assert (unknown.status_code, unknown.json()["code"]) == (404, "unknown_member")
                bad = await http.post("/actors/Account/a/above/watch", json={"floor": "x"})
                assert bad.status_code == 400
            async with httpx.AsyncClient(base_url=f"http://{address}") as anonymous:
                refused = await anonymous.post("/actors/Account/a/balance/watch", json={})
                assert (refused.status_code, refused.json()["code"]) == (401, "missing_credentials")
            assert t.runtime.live.watching == 0


async def test_the_typed_client_watches_over_sse_and_the_socket(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            async with client(address) as remote:
                values = remote.get(Account, "a").balance.watch()
                assert await next_value(values) == 0
                await remote.get(Account, "a").deposit(2)
                assert await next_value(values) == 2
                await values.aclose()  # type: ignore[attr-defined]
                with pytest.raises(akter.ActorError) as refused:
                    await next_value(remote.get(Account, "a").plain.watch())  # type: ignore[attr-defined]
                assert refused.value.code == "not_watchable"

                async with remote.connect() as socket:
                    account = socket.get(Account, "a")
                    values = account.balance.watch()
                    assert await next_value(values) == 2
                    chat = await socket.broadcasts(Account, "a", "chat")
                    assert await account.deposit(5, note="ws") == 7
                    assert await next_value(chat) == {"deposit": 5, "note": "ws"}
                    assert await next_value(values) == 7
                    assert await account.plain() == 7
                    # The same pinned id twice over the socket: one effect, the same answer.
                    key = await remote.server_command_id()
                    pinned = account.with_command_id(key)
                    assert [await pinned.deposit(1), await pinned.deposit(1)] == [8, 8]
                    with pytest.raises(akter.DeclaredError):
                        await account.refuse_after_broadcast()
                    events = [r.event async for r in _first(account.events(after="0"), 3)]
                    assert [e.cents for e in events] == [2, 5, 1]
                    await values.aclose()  # type: ignore[attr-defined]
                    await chat.aclose()  # type: ignore[attr-defined]
            await until(lambda: t.runtime.live.watching == 0, within=5)
            assert (await t.inspect(t.get(Account, "a"))).state == {"cents": 8, "owner": ""}


async def _first(records: Any, n: int) -> AsyncIterator[Any]:
    async with contextlib.aclosing(aiter(records)) as stream:
        async for record in stream:
            yield record
            n -= 1
            if not n:
                return


async def test_the_sync_client_watches(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            first = asyncio.Event()
            loop = asyncio.get_running_loop()

            def follow() -> list[int]:
                seen: list[int] = []
                headers = {"X-Test-User": "alice"}
                with SyncClient(f"http://{address}", headers=headers) as sync:
                    values = sync.get(Account, "a").balance.watch()
                    for value in values:
                        seen.append(value)
                        if len(seen) == 1:
                            loop.call_soon_threadsafe(first.set)
                        if value == 4:
                            values.close()
                            return seen
                return seen

            follower = asyncio.create_task(asyncio.to_thread(follow))
            async with asyncio.timeout(WITHIN):
                await first.wait()
            await t.get(Account, "a").deposit(4)
            async with asyncio.timeout(WITHIN):
                assert await follower == [0, 4]


async def test_another_users_or_tenants_watch_and_socket_are_refused_alike(
    akter_test: Make,
) -> None:
    # alice@acme may read acme's "alice" only. bob's actor (which exists) and an id that never
    # existed answer her the same 403, over SSE and on the socket: no oracle. globex's "bob"
    # watching "bob" reads globex's bob, never acme's.
    async with akter_test(ACTORS) as t:
        await t.get(Private, "bob", tenant="acme").deposit(9)
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            headers = {"X-Test-User": "alice", "X-Test-Tenant": "acme"}
            answers = {}
            async with httpx.AsyncClient(base_url=f"http://{address}", headers=headers) as http:
                for actor_id in ("bob", "nobody"):
                    answer = await http.post(f"/actors/Private/{actor_id}/balance/watch", json={})
                    body = answer.json()
                    answers[actor_id] = (answer.status_code, body["code"], body["detail"])
            assert (
                answers["bob"]
                == answers["nobody"]
                == (
                    403,
                    "access_denied",
                    "User may not call Private.balance.",
                )
            )
            async with client(address, "alice", "acme") as remote, remote.connect() as socket:
                for actor_id in ("bob", "nobody"):
                    with pytest.raises(akter.ActorError) as refused:
                        await next_value(socket.get(Private, actor_id).balance.watch())
                    assert (refused.value.reason, refused.value.code) == (
                        "Unauthorized",
                        "access_denied",
                    )
                    with pytest.raises(akter.ActorError) as refused:
                        await socket.broadcasts(Private, actor_id, "chat")
                    assert refused.value.code == "access_denied"
            async with client(address, "bob", "globex") as remote:
                values = remote.get(Private, "bob").balance.watch()
                assert await next_value(values) == 0  # globex's bob, not acme's 9
                await values.aclose()  # type: ignore[attr-defined]
        assert t.runtime.live.watching == 0
