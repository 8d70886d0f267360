"""Job rows written without a claim rank (rolling deploy across migration 0006) are ranked.

A runner whose code predates migration 0006 keeps running while a newer one applies it, and its
``insert_outbox`` writes job rows with ``rank_ms`` NULL. Claims order by ``rank_ms``, where NULL
sorts after every ranked row: under a steady backlog of newer rows such a row would never be
claimed. The ``$maintenance`` owner's sweep (``runtime.cleanup()``, every 60 s) gives it the rank
its ready time and priority would have had (docs/flow-control.md F1), and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from akter.testing import ActorTest
from tests.integration.flow_actors import STARTS, Lanes

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    STARTS.clear()
    yield
    STARTS.clear()


async def ranks(t: ActorTest) -> dict[str, int]:
    rows = await t.rows("SELECT intent_id, rank_ms FROM {schema}.outbox WHERE kind = 'job'")
    assert all(r["rank_ms"] is not None for r in rows)
    return {r["intent_id"]: int(r["rank_ms"]) for r in rows}


async def test_a_row_an_older_runner_wrote_without_a_rank_is_ranked_in_its_enqueue_order(
    akter_test: Make,
) -> None:
    # The test runs the sweep itself: a maintenance owner's own first sweep, started whenever
    # its lease is won (later on a slow server), would rank the rows before the test looks.
    async with akter_test([Lanes], relay=False, maintenance=False) as t:
        [old] = await t.get(Lanes, "l").fill(1, "old", priority=0)
        [high] = await t.get(Lanes, "h").fill(1, "high", priority=5)
        # What a pre-0006 runner's insert leaves (its INSERT names no rank column).
        await t.rows(
            "UPDATE {schema}.outbox SET rank_ms = NULL WHERE intent_id IN (%(a)s, %(b)s)"
            " RETURNING 1",
            {"a": old, "b": high},
        )
        newer = await t.get(Lanes, "n").fill(3, "new")
        before = await t.rows(
            "SELECT intent_id, ready_at_ms, priority, payload, attempts, due_at_ms"
            " FROM {schema}.outbox ORDER BY intent_id"
        )

        counts = await t.runtime.cleanup()
        assert counts.ranked == 2
        ranked = await ranks(t)
        ready = {r["intent_id"]: r["ready_at_ms"] for r in before}
        assert ranked[old] == ready[old]
        assert ranked[high] == ready[high] - 5 * 10**13
        assert all(ranked[old] < ranked[n] for n in newer)  # its enqueue order holds again
        # Only the rank was written.
        after = await t.rows(
            "SELECT intent_id, ready_at_ms, priority, payload, attempts, due_at_ms"
            " FROM {schema}.outbox ORDER BY intent_id"
        )
        assert after == before
        assert (await t.runtime.cleanup()).ranked == 0  # nothing left to rank

        await t.advance(0)
        assert sorted(tag for _, tag in STARTS) == ["high-0", "new-0", "new-1", "new-2", "old-0"]
