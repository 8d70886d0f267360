"""Job output streams (docs/guides/job-streams.md, migration 0018): fenced appends and reads.

Appends and reads run on the callers' pool, not the framework's: a job that streams a lot must
not hold up the lease renewals and settles of the framework pool. An append is one statement
(autocommit): it writes a whole batch or, when the job row no longer runs at the appending
attempt, nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

#: What a stored item is: an attempt's segment marker, a chunk, or the close.
ItemKind = Literal["attempt", "chunk", "closed"]


@dataclass(frozen=True, slots=True)
class StreamKey:
    """One job of one actor: where its stream lives."""

    rk: int
    tenant: str
    type: str
    id: str
    job_id: str

    def params(self) -> dict[str, Any]:
        """The statement parameters naming the job."""
        return {
            "rk": self.rk,
            "tenant": self.tenant,
            "type": self.type,
            "id": self.id,
            "job_id": self.job_id,
        }


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One row of ``stream_read``."""

    seq: int
    attempt: int
    kind: ItemKind
    #: The chunk's canonical JSON, the close's outcome, or ``None`` for a marker.
    data: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredItem:
        """The item from ``stream_read``'s row."""
        kind = str(row["item"])
        assert kind in ("attempt", "chunk", "closed")
        data = row["data"]
        return cls(
            seq=int(row["seq"]),
            attempt=int(row["attempt"]),
            kind=kind,  # type: ignore[arg-type]
            data=None if data is None else str(data),
        )


@dataclass(frozen=True, slots=True)
class Appended:
    """What one ``stream_append`` did."""

    #: The job row runs at the appending attempt (else nothing was written: superseded).
    held: bool
    #: The job's last seq before the append.
    last_seq: int
    #: The attempt's marker was stored before the append.
    marked: bool
    #: Items written (all of the batch, or none).
    written: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Appended:
        """The answer from ``stream_append``'s one row."""
        return cls(
            held=bool(row["held"]),
            last_seq=int(row["last_seq"]),
            marked=bool(row["marked"]),
            written=int(row["written"]),
        )


class StreamsGateway:
    """The statements of job output streams, on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def append(
        self,
        key: StreamKey,
        attempt: int,
        items: Sequence[tuple[ItemKind, str | None]],
        *,
        expect: int | None,
        if_begun: bool = False,
    ) -> Appended:
        """Append ``items`` under the attempt's fence, after seq ``expect`` (see ``stream_append``).

        ``expect`` is the last seq the writer knows (``None`` before its first append); with
        ``if_begun``, nothing is written unless the job already has items.
        """
        params = {
            **key.params(),
            "attempt": attempt,
            "kinds": [kind for kind, _ in items],
            "data": [data for _, data in items],
            "expect": expect,
            "if_begun": if_begun,
            "off": self._clock.offset_ms,
        }
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["stream_append"], params)
            row = await cur.fetchone()
        assert row is not None  # the statement always returns one row
        return Appended.from_row(row)

    async def close(self, key: StreamKey, attempt: int, outcome: str) -> int | None:
        """Close the job's stream with ``outcome`` (if it has items and no close); its seq."""
        params = {
            **key.params(),
            "attempt": attempt,
            "outcome": outcome,
            "off": self._clock.offset_ms,
        }
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["stream_close"], params)
            row = await cur.fetchone()
        return None if row is None else int(row["seq"])

    async def read(self, key: StreamKey, after: int, limit: int) -> list[StoredItem]:
        """The job's items after seq ``after``, at most ``limit``, in order (read only)."""
        params = {**key.params(), "after": after, "limit": limit}
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["stream_read"], params)
            return [StoredItem.from_row(row) for row in await cur.fetchall()]

    async def last(self, key: StreamKey) -> StoredItem | None:
        """The job's newest item, if it has any (read only)."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["stream_last"], key.params())
            row = await cur.fetchone()
        return None if row is None else StoredItem.from_row(row)

    async def prune(self, actor_type: str, *, cutoff: int, batch: int) -> int:
        """Delete the streams of a batch of a type's jobs last written before ``cutoff``.

        Returns how many jobs' streams were deleted.
        """
        params = {"type": actor_type, "cutoff": cutoff, "batch": batch}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["stream_prune"], params)
            return len({(row["routing_key"], row["job_id"]) for row in await cur.fetchall()})
