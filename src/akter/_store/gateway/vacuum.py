"""The lean watch's statements (``akter._engine.loop.vacuum``): the outbox's tuples, its vacuum.

The count runs on the framework pool, the vacuum on a connection of its own (autocommit:
``VACUUM`` cannot run inside a transaction). Plain PostgreSQL only: on Citus the coordinator's
statistics do not count the shards' tuples, and the workers' autovacuum keeps the shards (with
migration 0021's settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Store


@dataclass(frozen=True, slots=True)
class Tuples:
    """The outbox's live and dead tuples as the server's statistics count them."""

    live: int
    dead: int


class VacuumGateway:
    """Reads the outbox's tuple counts and vacuums it."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @property
    def applies(self) -> bool:
        """Whether this store's outbox is vacuumed by the watch (plain PostgreSQL)."""
        return self._store.strategy == "plain"

    async def tuples(self) -> Tuples:
        """The outbox's live and dead tuples (``outbox_tuples``; zeros before any statistics)."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["outbox_tuples"])
            row = await cur.fetchone()
        return Tuples(0, 0) if row is None else Tuples(int(row["live"]), int(row["dead"]))

    async def vacuum(self) -> None:
        """``VACUUM (SKIP_LOCKED, TRUNCATE false)`` the outbox (``vacuum_outbox``)."""
        # Its own connection, not a pooled one: a vacuum takes tens of milliseconds, which the
        # framework pool's claims, heartbeats and notifications should not wait behind.
        conn = await self._store.connect_direct()
        try:
            await conn.execute(self._store.queries["vacuum_outbox"], prepare=False)
        finally:
            await conn.close()
