"""The app's WebSocket (docs/guides/live.md) on a real PostgreSQL and a real uvicorn server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import websockets

import akter
import akter.http
from akter._engine.live import channel
from akter._store.gateway.live import LiveNotifier
from akter.testing import ActorTest
from tests._support.polling import until
from tests.integration.live_actors import ACTORS, REVOKED, Account
from tests.integration.live_serving import answer_to, by_header, receive, send, serving, socket

Make = Callable[..., ActorTest]


async def test_a_socket_command_watch_and_broadcast(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            async with socket(address) as ws:
                await send(ws, type="subscribe", id="w", kind="watch", actor="Account",
                           actor_id="a", query="balance")  # fmt: skip
                assert await answer_to(ws, "w", {"subscribed"}) == {"type": "subscribed", "id": "w"}
                first = await answer_to(ws, "w", {"value"})
                assert first["value"] == 0
                await send(ws, type="subscribe", id="b", kind="broadcast", actor="Account",
                           actor_id="a", topic="chat")  # fmt: skip
                await answer_to(ws, "b", {"subscribed"})
                await send(ws, type="subscribe", id="e", kind="events", actor="Account",
                           actor_id="a", after="0")  # fmt: skip
                await answer_to(ws, "e", {"subscribed"})
                key = await t.runtime.mint_command_id()
                await send(ws, type="command", id="c", actor="Account", actor_id="a",
                           command="deposit", args={"cents": 5, "note": "hi"},
                           idempotency_key=key)  # fmt: skip
                assert (await answer_to(ws, "c", {"result", "error"})) == {
                    "type": "result",
                    "id": "c",
                    "value": 5,
                }
                assert (await answer_to(ws, "b", {"broadcast"}))["message"] == {
                    "deposit": 5,
                    "note": "hi",
                }
                assert (await answer_to(ws, "w", {"value"}))["value"] == 5
                event = await answer_to(ws, "e", {"event"})
                assert (event["cursor"], event["event"]) == ("1", {"cents": 5})
                await send(ws, type="query", id="q", actor="Account", actor_id="a", query="plain")
                assert (await answer_to(ws, "q", {"result"}))["value"] == 5
                await send(ws, type="unsubscribe", id="w")
                assert (await answer_to(ws, "w", {"unsubscribed"}))["type"] == "unsubscribed"
            await until(lambda: t.runtime.live.watching == 0, within=5)


async def test_the_same_idempotency_key_twice_is_one_effect(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            key = await t.runtime.mint_command_id()
            answers = []
            for _ in range(2):  # the second on another socket, as a reconnecting client would
                async with socket(address) as ws:
                    await send(ws, type="command", id="c", actor="Account", actor_id="a",
                               command="deposit", args={"cents": 5},
                               idempotency_key=key)  # fmt: skip
                    answers.append(await answer_to(ws, "c", {"result", "error"}))
            assert answers == [{"type": "result", "id": "c", "value": 5}] * 2
            inspected = await t.inspect(t.get(Account, "a"))
            assert inspected.state == {"cents": 5, "owner": ""}
            assert len(inspected.receipts) == 1
            # The same key with other arguments is the HTTP path's conflict, not a second effect.
            async with socket(address) as ws:
                await send(ws, type="command", id="c", actor="Account", actor_id="a",
                           command="deposit", args={"cents": 6}, idempotency_key=key)  # fmt: skip
                refused = await answer_to(ws, "c", {"result", "error"})
                assert refused["problem"]["reason"] == "CommandConflict"
                await send(ws, type="command", id="d", actor="Account", actor_id="a",
                           command="deposit", args={"cents": 6})  # fmt: skip
                missing = await answer_to(ws, "d", {"result", "error"})
                assert missing["problem"]["code"] == "missing_idempotency_key"
            assert (await t.inspect(t.get(Account, "a"))).state == {"cents": 5, "owner": ""}


async def test_a_rolled_back_turn_broadcasts_nothing(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        account = t.get(Account, "a")
        messages = await account.broadcasts("chat")
        try:
            with pytest.raises(akter.DeclaredError):
                await account.refuse_after_broadcast()
            await account.shout("after")  # a later broadcast arrives; the refused one never did
            async with asyncio.timeout(5):
                assert await anext(messages) == {"text": "after"}
            assert (await t.inspect(account)).state == {"cents": 0, "owner": ""}
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_a_turn_abandoned_before_its_commit_broadcasts_nothing(akter_test: Make) -> None:
    # The first attempt dies before COMMIT (rolled back); the handle's retry under the same id
    # commits: exactly one broadcast, the committed one's.
    async with akter_test(ACTORS) as t:
        account = t.get(Account, "a")
        messages = await account.broadcasts("chat")
        try:
            t.crash_next("before_commit")
            assert await account.deposit(3, note="once") == 3
            await account.shout("after")
            async with asyncio.timeout(5):
                assert await anext(messages) == {"deposit": 3, "note": "once"}
                assert await anext(messages) == {"text": "after"}
            assert t.runtime.hooks.fired == [("before_commit", "crash")]
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_broadcast_messages_and_topics(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        account = t.get(Account, "a")
        messages = await account.broadcasts("chat")
        try:
            assert await account.shout_model() == "invalid_topic"
            async with asyncio.timeout(5):
                assert await anext(messages) == {"cents": 1}
            with pytest.raises(akter.ActorError) as refused:
                await account.broadcasts("bad topic!")
            assert refused.value.code == "invalid_topic"
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_a_broadcast_reaches_followers_on_another_runner(akter_test: Make) -> None:
    async with akter_test(ACTORS, poll=60, notify=True) as t:
        other = await t.add_runtime()
        messages = await t.get(Account, "a").broadcasts("chat")
        try:
            await other.get(Account, "a").shout("from afar")
            async with asyncio.timeout(5):
                assert await anext(messages) == {"text": "from afar"}
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_a_follow_returns_only_once_this_runner_listens_for_other_runners(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by CI: the follow returned while this runner's LISTEN was still on its way, and the
    # other runner's broadcast, sent after the follow, was missed. The LISTEN is held here:
    # the follow must wait for it, then hear what the other runner sends.
    entered, gate = asyncio.Event(), asyncio.Event()
    real = LiveNotifier.listen

    async def held_listen(self: LiveNotifier) -> Any:
        entered.set()
        await gate.wait()
        return await real(self)

    monkeypatch.setattr(LiveNotifier, "listen", held_listen)
    async with akter_test(ACTORS, poll=60, notify=True) as t:
        other = await t.add_runtime()
        following = asyncio.create_task(t.get(Account, "a").broadcasts("chat"))
        await asyncio.wait_for(entered.wait(), 5)
        for _ in range(20):  # the loop goes round: nothing but the held LISTEN holds the follow
            await asyncio.sleep(0)
        assert not following.done()
        gate.set()
        messages = await asyncio.wait_for(following, 5)
        try:
            await other.get(Account, "a").shout("from afar")
            async with asyncio.timeout(5):
                assert await anext(messages) == {"text": "from afar"}
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_a_follow_whose_listener_cannot_connect_follows_after_its_wait(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database refuses the listener's connection: the follow waits its bound, not forever,
    # and this runner's own broadcasts still reach it.
    tried = 0

    async def refused(self: LiveNotifier) -> Any:
        nonlocal tried
        tried += 1
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(LiveNotifier, "listen", refused)
    monkeypatch.setattr(channel, "LISTEN_WAIT_S", 0.2)
    async with akter_test(ACTORS, poll=60, notify=True) as t:
        account = t.get(Account, "a")
        messages = await asyncio.wait_for(account.broadcasts("chat"), 5)
        try:
            assert tried >= 1
            await account.shout("nearby")
            async with asyncio.timeout(5):
                assert await anext(messages) == {"text": "nearby"}
        finally:
            await messages.aclose()  # type: ignore[attr-defined]


async def test_a_broadcast_too_large_fails_the_command(akter_test: Make) -> None:
    # Refused at the call, inside the handler (which may catch it): uncaught, the command is a
    # defect and commits nothing.
    async with akter_test(ACTORS) as t:
        with pytest.raises(akter.ActorError) as refused:
            await t.get(Account, "a").shout("x" * 8000)
        assert refused.value.reason == "Defect"
        assert "is 8011 bytes of JSON, over 7000" in refused.value.message
        assert not (await t.inspect(t.get(Account, "a"))).exists


async def test_a_foreign_origin_is_refused_before_the_upgrade(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        app = akter.http.app(t.runtime, by_header, allowed_origins=["https://ok.example"])
        async with serving(app) as address:
            with pytest.raises(websockets.InvalidStatus) as refused:
                async with socket(address, origin="https://evil.example"):
                    pass
            assert refused.value.response.status_code == 403
            assert b"origin_denied" in refused.value.response.body
            async with socket(address, origin="https://ok.example") as ws:
                await send(ws, type="query", id="q", actor="Account", actor_id="a", query="plain")
                assert (await answer_to(ws, "q", {"result"}))["value"] == 0
            async with socket(address, origin=f"http://{address}") as ws:  # the app's own page
                await send(ws, type="query", id="q", actor="Account", actor_id="a", query="plain")
                assert (await answer_to(ws, "q", {"result"}))["value"] == 0


async def test_missing_credentials_and_revoked_access(akter_test: Make) -> None:
    async with akter_test(ACTORS, watch_recheck=0.2) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            # Without credentials the socket opens as Anonymous, whom this policy refuses.
            async with socket(address, user=None) as ws:
                await send(ws, type="subscribe", id="w", kind="watch", actor="Account",
                           actor_id="a", query="balance")  # fmt: skip
                refused = await answer_to(ws, "w", {"error", "subscribed"})
                assert (refused["problem"]["status"], refused["problem"]["code"]) == (
                    401,
                    "missing_credentials",
                )
            async with socket(address, user="bob") as ws:
                await send(ws, type="subscribe", id="w", kind="watch", actor="Account",
                           actor_id="a", query="balance")  # fmt: skip
                await answer_to(ws, "w", {"value"})
                REVOKED.add("bob")
                try:
                    ended = await answer_to(ws, "w", {"error", "closed"})
                finally:
                    REVOKED.discard("bob")
                assert (ended["problem"]["status"], ended["problem"]["code"]) == (
                    403,
                    "access_denied",
                )
            await until(lambda: t.runtime.live.watching == 0, within=5)


async def test_another_tenant_sees_only_its_own_actor(akter_test: Make) -> None:
    # The tenant comes from the credential: a socket of tenant "globex" addressing "a" reads
    # globex's "a" (never created), exactly as for an id no tenant ever used: no oracle.
    async with akter_test(ACTORS, watch_min_interval=0.001) as t:
        await t.get(Account, "a", tenant="acme").deposit(7)
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            seen = {}
            for name, tenant, actor_id in (("own", "acme", "a"), ("foreign", "globex", "a"),
                                           ("never", "globex", "zz")):  # fmt: skip
                async with socket(address, tenant=tenant) as ws:
                    await send(ws, type="subscribe", id="w", kind="watch", actor="Account",
                               actor_id=actor_id, query="balance")  # fmt: skip
                    seen[name] = (await answer_to(ws, "w", {"value", "error"}))["value"]
                    await send(ws, type="subscribe", id="b", kind="broadcast", actor="Account",
                               actor_id=actor_id, topic="chat")  # fmt: skip
                    await answer_to(ws, "b", {"subscribed"})
                    if name == "foreign":
                        await t.get(Account, "a", tenant="acme").shout("acme only")
                        await send(ws, type="query", id="q", actor="Account",
                                   actor_id="a", query="plain")  # fmt: skip
                        # The query's answer comes; acme's broadcast never does.
                        assert (await answer_to(ws, "q", {"result", "broadcast"}))["value"] == 0
            assert seen == {"own": 7, "foreign": 0, "never": 0}


async def test_malformed_messages_get_named_errors(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        async with serving(akter.http.app(t.runtime, by_header)) as address:
            async with socket(address) as ws:
                await ws.send("not json")
                assert (await receive(ws))["problem"]["code"] == "malformed_message"
                await send(ws, type="subscribe", id="s", kind="nope", actor="Account")
                assert (await receive(ws))["problem"]["code"] == "unknown_subscription_kind"
                await send(ws, type="subscribe", id="s", kind="watch", actor="Account",
                           actor_id="a", query="plain")  # fmt: skip
                assert (await receive(ws))["problem"]["code"] == "not_watchable"
                await send(ws, type="subscribe", id="s", kind="watch", actor="Nope",
                           actor_id="a", query="balance")  # fmt: skip
                assert (await receive(ws))["problem"]["status"] == 404
