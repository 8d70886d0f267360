"""What the workflow gateway's parts share: the store, the framework clock, one statement."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, LiteralString

from psycopg.rows import DictRow, dict_row

if TYPE_CHECKING:
    from akter._store.pool import Clock, Connection, Store


class GatewayBase:
    """The store and clock of a workflow gateway part; statements on the clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def _run(self, statement: LiteralString, params: Mapping[str, Any]) -> list[DictRow]:
        async with self._store.framework.connection() as conn:
            return await self._on(conn, statement, params)

    async def _on(
        self, conn: Connection, statement: LiteralString, params: Mapping[str, Any]
    ) -> list[DictRow]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(statement, {"off": self._clock.offset_ms, **params})
        return await cur.fetchall() if cur.description else []
