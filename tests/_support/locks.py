"""Which statements on a test's schema wait for a lock, on plain PostgreSQL and on Citus.

On plain PostgreSQL the waiting backend is in ``pg_stat_activity`` with ``wait_event_type =
'Lock'``. On Citus the wait is on the worker that holds the shard, and the coordinator's backend
waits on the network, not on a lock: the cluster-wide view ``citus_lock_waits`` names the blocked
distributed statement instead.
"""

from __future__ import annotations

from akter.testing import ActorTest
from tests._support.polling import until


async def lock_waiters(t: ActorTest, *fragments: str) -> int:
    """Statements naming the test's schema and every fragment that wait for a lock now."""
    if t.on_citus:
        statement = "SELECT blocked_statement AS query FROM citus_lock_waits"
    else:
        statement = (
            "SELECT query FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
    needles = (t.schema, *fragments)
    rows = await t.rows(statement)
    return sum(1 for row in rows if all(n in str(row["query"]) for n in needles))


async def until_lock_waiter(
    t: ActorTest, *fragments: str, count: int = 1, within: float = 10.0
) -> int:
    """Return once at least ``count`` statements containing ``fragments`` wait for a lock."""
    return await until(
        lambda: lock_waiters(t, *fragments),
        within=within,
        holds=lambda n: n >= count,
        what=f"{count} statement(s) containing {fragments!r} waiting for a lock",
    )
