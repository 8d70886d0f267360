"""A shared write cut on the wire at one of its turns' ``COMMIT`` (issue 45, shared-flights.md).

Three actors' warm turns go in one write (the writer is held until they queue). The proxy cuts
the connection around the ``COMMIT`` of the first, the middle or the last of them: ``before``
it reaches the server, ``after_reply`` (committed, the answer lost) or as it is sent (``race``).
A turn whose Sync was read has its outcome; every other one is answered "may have committed"
(a retryable ``ActorUnavailable``), never a wrong outcome. The ledger: each call, retried with
its own id until it is answered, is applied exactly once, and the rows hold every
acknowledged call and nothing else.
"""

from __future__ import annotations

import asyncio

import pytest

import akter
from akter._engine.turn.engine import TurnEngine
from akter.testing import ActorTest
from tests._support.shared_line import Line
from tests.faults.pg_proxy import Cut
from tests.faults.test_commit_cut import (
    CUTS,
    RUNS,
    Register,
    assert_applied_once,
    assert_retryable,
    proxied,
    settled,
)

pytestmark = pytest.mark.timeout(90)

ACTORS = ["hold", "first", "middle", "last"]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_shared_write_answers_each_turn_honestly_and_the_retries_apply_once(
    akter_db: str, cut: Cut, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TurnEngine, "shared_writes", True)
    monkeypatch.setattr(TurnEngine, "hold_connections", False)
    tag = f"shared-{cut}-{where}"
    ids = {name: f"{tag}-{name}" for name in ACTORS}
    for actor in ids.values():
        RUNS.pop(actor, None)
    async with proxied(akter_db) as (t, proxy):
        if t.on_citus:
            pytest.skip("Citus turns keep two flights")
        engine = t.runtime._engine
        engine.shared.connections = 1
        ledgers: dict[str, dict[str, int]] = {actor: {} for actor in ids.values()}
        for actor in ids.values():  # cold, then warm
            for k in (1, 2):
                cid = await t.runtime.mint_command_id()
                ledgers[actor][cid] = await t.get(Register, actor).with_command_id(cid).move(k)

        line = Line.of(engine)
        held = t.pause_next("before_shared_write")
        hold = asyncio.create_task(t.get(Register, ids["hold"]).move(4))
        await held.wait()
        calls = {}
        for n, name in enumerate(ACTORS[1:], start=1):
            calls[name] = asyncio.create_task(
                t.runtime.call(Register, ids[name], "move", {"k": 5}, retry=False)
            )
            await line.reach(n)  # in this order
        proxy.arm(cut, match=ids[where])
        held.release()
        assert await hold == 3 + 4  # alone in the write before the armed one
        await note_receipt(t, ids["hold"], ledgers, 3 + 4)
        settled_calls = await asyncio.gather(*calls.values(), return_exceptions=True)
        answers = dict(zip(calls, settled_calls, strict=True))
        assert proxy.fired.is_set(), "the armed cut never met its COMMIT"
        await settled(proxy)

        assert not isinstance(answers[where], int)  # its COMMIT's answer never arrived
        for name, answer in answers.items():
            actor = ids[name]
            if isinstance(answer, int):
                assert answer == 3 + 5
                await note_receipt(t, actor, ledgers, answer)
                continue
            assert isinstance(answer, akter.ActorError), answer
            unknown = answer.command_id
            assert unknown is not None
            assert_retryable(answer, unknown)
            # The retry with the same id settles it: committed once, or run now, once.
            ledgers[actor][unknown] = await t.get(Register, actor).with_command_id(unknown).move(5)
            assert ledgers[actor][unknown] == 3 + 5
        for actor, ledger in ledgers.items():
            assert_applied_once(await t.inspect(t.get(Register, actor)), ledger)


async def note_receipt(
    t: ActorTest, actor: str, ledgers: dict[str, dict[str, int]], answer: int
) -> None:
    """Enter an answered call, whose id was minted for it, in the ledger by its receipt."""
    rows = await t.inspect(t.get(Register, actor))
    (cid,) = (r["command_id"] for r in rows.receipts if r["command_id"] not in ledgers[actor])
    ledgers[actor][cid] = answer
