"""Keyed intent claims (semantics §3.5.4, issue 45): the intents a local commit named, no scan.

On Citus a scan of due intents reads every shard, so a pass woken by local commits claims the
intents they named by key, one single-shard ``SKIP LOCKED`` statement each. The gateway cases
run on both strategies (the statement is plain SQL; only Citus's relay uses it): a named row
another claimer holds is skipped without waiting, a row claimed already, parked, or not named
is left alone, and two runners naming the same rows claim each once. The runtime case checks
that on Citus the intent is claimed by key and on plain PostgreSQL by the one-statement claim.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from akter._store.gateway.outbox import ClaimedIntent, IntentKey, OutboxGateway
from akter._store.pool import Clock, Store
from akter.testing import ActorTest
from tests._support import until
from tests._support.counting import count_calls
from tests.integration.relay_actors import ALL, Sender, reset
from tests.integration.test_citus import _hold, _park, _seed, claim_store

__all__ = ["claim_store"]  # the fixture, shared with test_citus (plain and Citus)

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


def _keys(keys: list[tuple[int, str]]) -> list[IntentKey]:
    return [IntentKey(rk, intent_id, "T") for rk, intent_id in keys]


async def _claim(store: Store, keys: list[IntentKey]) -> list[ClaimedIntent]:
    gateway = OutboxGateway(store, Clock(store))
    try:
        return await asyncio.wait_for(
            gateway.claim_keyed(keys, lease_ms=30_000, max_backoff_ms=60_000), timeout=10
        )  # waiting for a held row would time out
    finally:
        await gateway.close()


async def test_a_keyed_claim_takes_the_named_due_rows_and_skips_a_held_one(
    claim_store: Store,
) -> None:
    keys = await _seed(claim_store, "intent", 4)
    held = await _hold(claim_store, *keys[1])
    try:
        rows = await _claim(claim_store, _keys(keys[:3]))
    finally:
        await held.rollback()
        await held.close()
    assert {(r.routing_key, r.intent_id) for r in rows} == {keys[0], keys[2]}  # not 3: unnamed
    assert all(r.attempts == 1 and r.claimed_until > r.now > 0 for r in rows)
    assert {r.candidates for r in rows} == {3}


async def test_a_named_row_claimed_already_or_parked_is_not_claimed_again(
    claim_store: Store,
) -> None:
    keys = await _seed(claim_store, "intent", 3)
    first = await _claim(claim_store, _keys(keys[:1]))
    await _park(claim_store, keys[1:2])
    rows = await _claim(claim_store, _keys(keys))
    assert [(r.routing_key, r.intent_id) for r in first] == keys[:1]
    assert [(r.routing_key, r.intent_id) for r in rows] == keys[2:]


async def test_two_runners_naming_the_same_rows_claim_each_once(claim_store: Store) -> None:
    keys = await _seed(claim_store, "intent", 8)
    named = _keys(keys)
    a, b = await asyncio.gather(_claim(claim_store, named), _claim(claim_store, named[::-1]))
    taken = [(r.routing_key, r.intent_id) for r in a + b]
    assert sorted(taken) == sorted(keys)  # every row once, none twice


# --- the relay: a local commit's intent -----------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    reset()
    yield
    reset()


async def _received(t: ActorTest, actor_id: str) -> list[Any]:
    rows = await t.rows(
        "SELECT state FROM {schema}.actors WHERE actor_type = 'Receiver' AND actor_id = %(id)s",
        {"id": actor_id},
    )
    return list(rows[0]["state"]["received"]) if rows else []


async def test_an_intent_a_local_commit_made_due_is_claimed_by_key_on_citus_only(
    akter_test: Make,
) -> None:
    async with akter_test(ALL, poll=30) as t:
        outbox = t.runtime._relay._outbox
        calls = count_calls(outbox, ["claim", "claim_keyed"])
        by_key: list[str] = []
        keyed = outbox.claim_keyed

        async def recording(keys: Any, **kw: Any) -> list[ClaimedIntent]:
            rows = await keyed(keys, **kw)
            by_key.extend(r.intent_id for r in rows)
            return rows

        outbox.claim_keyed = recording  # type: ignore[method-assign]
        sender = t.get(Sender, "kc-s1")
        # The loop's first pass is a full one (a poll is due at start); the next ones are keyed.
        await sender.send_to("kc-r1", 1)
        await until(lambda: _received(t, "kc-r1"), what="the first intent delivered")
        await sender.send_to("kc-r1", 7)
        delivered = await until(
            lambda: _received_k(t, "kc-r1", 7), what="the second intent delivered"
        )
        assert delivered is not None
        if t.on_citus:
            assert delivered["cid"] in by_key  # claimed by key, no scan
        else:
            assert calls["claim_keyed"] == 0 and calls["claim"] >= 2 and by_key == []


async def _received_k(t: ActorTest, actor_id: str, k: int) -> dict[str, Any] | None:
    return next((d for d in await _received(t, actor_id) if d["k"] == k), None)
