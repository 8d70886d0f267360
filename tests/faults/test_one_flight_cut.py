"""A warm turn's one flight cut on the wire (issue 45; conformance TU-13 for the one flight).

The warm turn sends ``BEGIN``, ``turn_guard``, its writes and ``COMMIT`` in one flight. The proxy
cuts the connection at that ``COMMIT``: before it reaches the server (rolled back), after the
server answered it (committed, the answer lost), or as it is sent (either). All or nothing, and
the caller hears ``outcome_unknown``: the retry with the same id commits once or replays.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import akter
from akter._store.pipeline import Segment, TurnPipeline
from tests.faults.pg_proxy import Cut
from tests.faults.test_commit_cut import (
    CUTS,
    RUNS,
    Register,
    assert_applied_once,
    assert_healthy,
    assert_retryable,
    proxied,
    settled,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("turn_mode", ["shared", "one_flight"], indirect=True)
@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_one_flight_is_all_or_nothing_and_its_retry_resolves_once(
    akter_db: str, cut: Cut, monkeypatch: pytest.MonkeyPatch, turn_mode: str
) -> None:
    actor = f"one-flight-{cut}"
    RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        if t.on_citus:
            pytest.skip("Citus turns keep two flights")
        handle = t.get(Register, actor)
        results = {}
        for k in (1, 2):  # cold, then warm
            cid = await t.runtime.mint_command_id()
            results[cid] = await handle.with_command_id(cid).move(k)
        before = await t.inspect(handle)
        syncs = 0
        original, queue = TurnPipeline.sync, TurnPipeline.queue

        async def counted(self: TurnPipeline, meanwhile: Callable[[], None] | None = None) -> None:
            nonlocal syncs
            syncs += 1
            await original(self, meanwhile)

        def queued(self: TurnPipeline, segment: Segment) -> None:  # a shared write's segment
            nonlocal syncs
            syncs += 1
            queue(self, segment)

        monkeypatch.setattr(TurnPipeline, "sync", counted)
        monkeypatch.setattr(TurnPipeline, "queue", queued)
        # An id minted for the call (a pinned one may have a receipt: two flights). The actor
        # id, unique to this test, picks the turn's flight.
        proxy.arm(cut, match=actor)
        with pytest.raises(akter.ActorError) as raised:
            await t.runtime.call(Register, actor, "move", {"k": 5}, retry=False)
        assert proxy.fired.is_set(), "the armed cut never met its COMMIT"
        await settled(proxy)
        monkeypatch.undo()
        cut_id = raised.value.command_id
        assert cut_id is not None
        assert_retryable(raised.value, cut_id)
        assert syncs == 1  # the cut flight was the warm turn's only one
        assert not t.runtime._engine.fallbacks

        landed = await t.inspect(handle)
        committed = cut_id in {r["command_id"] for r in landed.receipts}
        if cut == "before":
            assert not committed
        if cut == "after_reply":
            assert committed
        if committed:
            assert_applied_once(landed, {**results, cut_id: 3 + 5})
        else:
            assert landed == before
        assert await handle.with_command_id(cut_id).move(5) == 8
        results[cut_id] = 8
        assert RUNS[actor] == 3 + (0 if committed else 1)
        assert_applied_once(await t.inspect(handle), results)
        await assert_healthy(t, proxy, actor)
