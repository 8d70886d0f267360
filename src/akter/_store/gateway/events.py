"""Event reads (semantics §6): one actor's committed events after a cursor.

A read is a caller's read like a query: it waits at most ``query_pool_wait`` for a pooled
connection, then the caller gets ``pool_exhausted`` (``wrap_errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._store.gateway.errors import wrap_errors

if TYPE_CHECKING:
    from akter._store.pool import Store


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One retained event as ``read_events`` returns it; ``payload``: its decoded JSON value."""

    seq: int
    tag: str
    payload: Any
    payload_version: int
    command_id: str
    emitted_at_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredEvent:
        """The event from one element of ``read_events``'s ``events`` array."""
        return cls(
            seq=int(row["seq"]),
            tag=str(row["tag"]),
            payload=row["payload"],
            payload_version=int(row.get("payload_version", 0)),
            command_id=str(row["command_id"]),
            emitted_at_ms=int(row["emitted_at_ms"]),
        )


@dataclass(frozen=True, slots=True)
class EventPage:
    """One actor's event bounds and a page of its events (``read_events``).

    ``first_seq``: the oldest retained event's seq (``None``: none retained).
    """

    event_seq: int
    first_seq: int | None
    events: list[StoredEvent]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EventPage:
        """The page from ``read_events``'s row."""
        first = row["first_seq"]
        return cls(
            event_seq=int(row["event_seq"]),
            first_seq=None if first is None else int(first),
            events=[StoredEvent.from_row(e) for e in row["events"]],
        )


class EventsGateway:
    """Reads of the events table."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def read(
        self, actor: Mapping[str, Any], *, after: int, limit: int, wait_s: float, what: str
    ) -> EventPage | None:
        """The actor's ``event_seq``, first retained seq and up to ``limit`` events after ``after``.

        ``None`` when the actor has no row. ``actor`` holds ``rk``, ``tenant``, ``type`` and
        ``id``; ``what`` names the read in a ``pool_exhausted`` refusal.
        """
        with wrap_errors(self._store, wait_s=wait_s, what=what):
            async with self._store.pool.connection(timeout=wait_s) as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    self._store.queries["read_events"], {**actor, "after": after, "limit": limit}
                )
                row = await cur.fetchone()
        return None if row is None else EventPage.from_row(row)
