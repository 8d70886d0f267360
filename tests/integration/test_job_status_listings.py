"""One job status, three derivations: ``v_jobs``, ``akter jobs list`` and the console agree.

The view (migration 0006) counts live attempts per row; the two listings (``jobs_overview`` in
queries.sql, ``console_jobs`` in queries_console.sql) count them once in a CTE, because they scan
the whole outbox. The three CASE expressions are written out three times, so this test puts a row
in every status the view knows and checks that each listing names it the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from akter.testing import ActorTest
from tests.integration.flow_actors import LIVE, Lanes, Slots

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: The state each staged ``capped`` row is put in, by its index, and the status it must show.
#: Two rows hold live leases, so the type's two slots (concurrency=2) are taken.
SHAPES: list[tuple[str, str]] = [
    ("parked_at_ms = now", "parked"),
    ("cancelled_at_ms = now", "cancelled"),
    ("running = true, attempts = 1, due_at_ms = now + 600000", "running"),
    ("running = true, attempts = 1, due_at_ms = now + 600000", "running"),
    ("waiting = true, attempts = 1", "waiting"),
    ("waiting_for = 'rate'", "waiting_rate"),
    ("due_at_ms = now - 1", "waiting_slot"),
    ("attempts = 1, due_at_ms = now + 600000", "backoff"),
]


async def test_every_status_reads_the_same_in_the_view_and_both_listings(
    akter_test: Make,
) -> None:
    LIVE.reset()
    async with akter_test([Slots, Lanes], relay=False) as t:
        capped = await t.get(Slots, "s").fill(len(SHAPES))
        [free] = await t.get(Lanes, "l").fill(1, "free")  # uncapped: pending however full
        now = (await t.rows("SELECT {schema}.now_ms(0) AS now"))[0]["now"]
        for job_id, (change, _) in zip(capped, SHAPES, strict=True):
            sets = change.replace("now", str(now))
            await t.rows(
                f"UPDATE {{schema}}.outbox SET {sets} WHERE intent_id = %(id)s RETURNING 1",
                {"id": job_id},
            )
        expected = {job_id: status for job_id, (_, status) in zip(capped, SHAPES, strict=True)}
        expected[free] = "pending"

        # 0009: v_jobs as Citus can plan it (0006's correlated live count could not be).
        view = await t.rows("SELECT job_id, status FROM {schema}.v_jobs")
        assert {r["job_id"]: r["status"] for r in view} == expected
        q = t.runtime._store.queries
        for name in ("jobs_overview", "console_jobs"):
            shown = await t.rows(q[name], {"limit": 100})
            assert {r["job_id"]: r["status"] for r in shown} == expected, name
