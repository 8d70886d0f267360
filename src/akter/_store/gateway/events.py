"""Event reads (semantics §6): one actor's committed events after a cursor.

A read is a caller's read like a query: it waits at most ``query_pool_wait`` for a pooled
connection, then the caller gets ``pool_exhausted`` (``wrap_errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._store.gateway.errors import wrap_errors

if TYPE_CHECKING:
    from akter._store.pool import Store

Row = dict[str, Any]


class EventsGateway:
    """Reads of the events table."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def read(
        self, actor: Mapping[str, Any], *, after: int, limit: int, wait_s: float, what: str
    ) -> Row | None:
        """The actor's ``event_seq``, first retained seq and up to ``limit`` events after ``after``.

        ``actor`` holds ``rk``, ``tenant``, ``type`` and ``id``; ``what`` names the read in a
        ``pool_exhausted`` refusal.
        """
        with wrap_errors(self._store, wait_s=wait_s, what=what):
            async with self._store.pool.connection(timeout=wait_s) as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    self._store.queries["read_events"], {**actor, "after": after, "limit": limit}
                )
                return await cur.fetchone()
