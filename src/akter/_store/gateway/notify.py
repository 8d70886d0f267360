"""Wakeups and progress messages between runners: ``LISTEN`` and ``NOTIFY`` (``notify=True``).

Every notification is its own autocommit statement on a framework connection, sent strictly
after the commit it announces: never inside a turn's transaction (design principle 5). Each
listener holds a dedicated connection outside both pools (README, "Connections").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, LiteralString

if TYPE_CHECKING:
    from akter._store.pool import Connection, Store


class Notifier:
    """The schema's two channels: relay and event-feed wakes, and job progress messages."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def notify_wake(self) -> None:
        """Wake other runners' relays and event feeds (a framework connection)."""
        async with self._store.framework.connection() as conn:
            await conn.execute(self._store.queries["notify_wake"])

    async def listen_wake(self) -> Connection:
        """A new dedicated connection listening for wakes (the caller closes it)."""
        return await self._listen(self._store.queries["listen_wake"])

    async def notify_progress(self, payloads: Sequence[str]) -> None:
        """Send progress messages (JSON texts), one statement each, on one framework connection."""
        queries = self._store.queries
        channel = queries.channel("progress_channel")
        async with self._store.framework.connection() as conn:
            cur = conn.cursor()
            await cur.executemany(
                queries["notify_progress"],
                [{"channel": channel, "payload": payload} for payload in payloads],
            )

    async def listen_progress(self) -> Connection:
        """A new dedicated connection listening for progress messages (the caller closes it)."""
        return await self._listen(self._store.queries["listen_progress"])

    async def _listen(self, statement: LiteralString) -> Connection:
        conn = await self._store.connect_direct()
        try:
            await conn.execute(statement)
        except BaseException:
            await conn.close()
            raise
        return conn
