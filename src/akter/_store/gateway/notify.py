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


#: The most sending connections remembered (a pool's worth, with room for its churn).
_SENDERS_KEPT = 256


class Notifier:
    """The schema's two channels: relay and event-feed wakes, and job progress messages."""

    def __init__(self, store: Store) -> None:
        self._store = store
        # Server process ids of the connections this runner sent wakes from: its own listener
        # hears them too, and ``sent_here`` tells them apart from other runners'.
        self._senders: set[int] = set()

    async def notify_wake(self) -> None:
        """Wake other runners' relays and event feeds (a framework connection)."""
        async with self._store.framework.connection() as conn:
            # Noted before the statement: the listener may hear it before it returns.
            if len(self._senders) >= _SENDERS_KEPT:
                self._senders.clear()  # pool churn: at worst one wake is taken for another's
            self._senders.add(conn.info.backend_pid)
            await conn.execute(self._store.queries["notify_wake"])

    def sent_here(self, pid: int) -> bool:
        """Whether a wake heard from server process ``pid`` was sent by this runner."""
        return pid in self._senders

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
