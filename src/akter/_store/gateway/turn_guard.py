"""A warm turn's guard: one statement checks, under the row lock, what its handlers assumed.

See ``docs/internals/one-flight-turn.md`` and migration 0019: ``turn_guard`` raises a SQLSTATE
of class ``AK`` per failed check, which aborts the rest of the flight it leads.
"""

from __future__ import annotations

from collections.abc import Awaitable

from akter._store.gateway.actors import BigintArray, Cursor, Executor, Key, TextArray
from akter._store.queries import Queries

#: The SQLSTATE of each failed check (``turn_guard``).
STALE_ACTIVATION = "AK001"
RECEIPT_EXISTS = "AK002"
ID_EXPIRED = "AK003"
CLOCK_BOUND = "AK004"


def guard_failed(sqlstate: str | None) -> bool:
    """Whether an error's SQLSTATE is one of ``turn_guard``'s (class ``AK``)."""
    return sqlstate is not None and sqlstate.startswith("AK")


def turn_guard(
    conn: Executor,
    q: Queries,
    key: Key,
    *,
    cached_version: int,
    settings: Key,
    command_ids: list[str],
    expires: list[int],
    handler_now: int,
    bound_ms: int,
    off: int,
) -> Awaitable[Cursor]:
    """Queue the guard: the turn's settings (``turn_settings``), the row lock and its checks.

    ``command_ids``: the ids that may have a receipt; ``expires``: the external ids' expiries;
    ``handler_now``: the clock the handlers saw, which the database clock must be at or above by
    at most ``bound_ms``.
    """
    return conn.execute(
        q["turn_guard"],
        {
            **key,
            **settings,
            "cached_version": cached_version,
            "command_ids": TextArray(command_ids),
            "expires": BigintArray(expires),
            "handler_now": handler_now,
            "bound_ms": bound_ms,
            "off": off,
        },
    )


async def guard_answer(cur: Cursor) -> int:
    """The database clock the guard checked."""
    row = await cur.fetchone()
    assert row is not None  # a table-less statement: always one row
    return int(row[0])
