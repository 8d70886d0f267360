"""The lean watch's statements (``akter._engine.loop.vacuum``): tuple counts, vacuums, the horizon.

The counts and the horizon run on the framework pool, the vacuums on a connection of their own
(autocommit: ``VACUUM`` cannot run inside a transaction). Plain PostgreSQL only: on Citus the
coordinator's statistics do not count the shards' tuples, and the workers' autovacuum keeps the
shards (with migration 0021's settings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, LiteralString

import psycopg
from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Store

#: The tables the watch keeps (docs/internals/lean-tables.md, "What churns").
Table = Literal["outbox", "actors"]
TABLES: tuple[Table, ...] = ("outbox", "actors")


@dataclass(frozen=True, slots=True)
class Tuples:
    """A table's live and dead tuples as the server's statistics count them."""

    live: int
    dead: int


class VacuumGateway:
    """Reads the watched tables' tuple counts and the removal horizon; vacuums the tables."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @property
    def applies(self) -> bool:
        """Whether this store's tables are vacuumed by the watch (plain PostgreSQL)."""
        return self._store.strategy == "plain"

    async def tuples(self) -> dict[Table, Tuples]:
        """Each watched table's live and dead tuples (``lean_tuples``; zeros before statistics)."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["lean_tuples"])
            rows = await cur.fetchall()
        found = {str(r["name"]): Tuples(int(r["live"]), int(r["dead"])) for r in rows}
        return {table: found.get(table, Tuples(0, 0)) for table in TABLES}

    async def horizon(self) -> str | None:
        """The oldest transaction id that holds this database's dead rows (``xmin_horizon``).

        ``None`` when no session, prepared transaction or replication slot the server shows
        holds one; the watch compares the values for equality only (a ``xid`` has no order).
        """
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(self._store.queries["xmin_horizon"])
            row = await cur.fetchone()
        return None if row is None or row[0] is None else str(row[0])

    async def vacuum(self, tables: Sequence[Table]) -> list[str]:
        """``VACUUM (SKIP_LOCKED, TRUNCATE false)`` each of ``tables``, in order.

        Returns the server's warnings (a role that does not own a table: the server warns and
        skips it, no error).
        """
        statements: dict[Table, LiteralString] = {
            "outbox": self._store.queries["vacuum_outbox"],
            "actors": self._store.queries["vacuum_actors"],
        }
        warnings: list[str] = []

        def notice(diag: psycopg.errors.Diagnostic) -> None:
            if diag.severity_nonlocalized == "WARNING" and diag.message_primary:
                warnings.append(diag.message_primary)

        # Its own connection, not a pooled one: a vacuum takes tens of milliseconds, which the
        # framework pool's claims, heartbeats and notifications should not wait behind. One
        # statement per table (the catalogue's texts are fixed), one connection for them all.
        conn = await self._store.connect_direct()
        try:
            conn.add_notice_handler(notice)
            for table in tables:
                await conn.execute(statements[table], prepare=False)
        finally:
            await conn.close()
        return warnings
