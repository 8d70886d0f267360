"""Live messages between runners: ``LISTEN``/``NOTIFY`` on ``<schema>_live`` (``notify=True``).

Each notification is an autocommit statement on a framework connection, sent strictly after the
commit it announces (never inside a turn); the listener holds a dedicated connection outside
both pools, as the wake and progress listeners do. A payload is at most 8000 bytes (PostgreSQL's
limit): the caller keeps each message under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akter._store.pool import Connection, Store

#: PostgreSQL's bound on a ``NOTIFY`` payload, in bytes (less one: the server counts the NUL).
MAX_PAYLOAD_BYTES = 7999


class LiveNotifier:
    """The schema's live channel."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def notify(self, payloads: Sequence[str]) -> None:
        """Send live messages (JSON texts), one statement each, on one framework connection."""
        queries = self._store.queries
        channel = queries.channel("live_channel")
        async with self._store.framework.connection() as conn:
            cur = conn.cursor()
            await cur.executemany(
                queries["notify_live"], [{"channel": channel, "payload": p} for p in payloads]
            )

    async def listen(self) -> Connection:
        """A new dedicated connection listening on the live channel (the caller closes it)."""
        conn = await self._store.connect_direct()
        try:
            await conn.execute(self._store.queries["listen_live"])
        except BaseException:
            await conn.close()
            raise
        return conn
