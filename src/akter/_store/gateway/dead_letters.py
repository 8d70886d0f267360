"""Operators' dead-letter statements (semantics §5.10), on the callers' pool.

A retry takes the letter and re-enqueues its payload as a new job in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._ids import bucket

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


@dataclass(frozen=True, slots=True)
class LetterRow:
    """One dead letter as stored (``dead_letters_list``, ``dead_letter_find``).

    ``payload``: the job's payload as stored JSON text; ``dead_at_ms``: framework clock.
    """

    routing_key: int
    job_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    job: str
    payload: str
    payload_version: int
    attempts: int
    cause: str
    ambiguous: bool
    dead_at_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LetterRow:
        """The letter from a dead-letter statement's row."""
        return cls(
            routing_key=int(row["routing_key"]),
            job_id=str(row["job_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            job=str(row["job"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            attempts=int(row["attempts"]),
            cause=str(row["cause"]),
            ambiguous=bool(row["ambiguous"]),
            dead_at_ms=int(row["dead_at_ms"]),
        )


class DeadLettersGateway:
    """List, find, take and re-enqueue dead letters."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def list(self, limit: int) -> list[LetterRow]:
        """The newest ``limit`` letters, newest first."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["dead_letters_list"], {"limit": limit})
            return [LetterRow.from_row(r) for r in await cur.fetchall()]

    async def find(self, job_id: str) -> LetterRow | None:
        """One letter by its job id (unique across actors)."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["dead_letter_find"], {"job_id": job_id})
            row = await cur.fetchone()
            return None if row is None else LetterRow.from_row(row)

    async def take(self, routing_key: int, job_id: str) -> bool:
        """Delete a letter; False when it was already gone."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["dead_letter_take"], {"rk": routing_key, "job_id": job_id}
            )
            return await cur.fetchone() is not None

    async def requeue(
        self,
        routing_key: int,
        job_id: str,
        *,
        new_id: str,
        tenant: str,
        actor_type: str,
        actor_id: str,
        job: str,
        payload: str,
        payload_version: int,
        caller: str,
    ) -> bool:
        """Take a letter and enqueue its job as ``new_id``, due now, in one transaction.

        The new row is ``maybe_applied`` when the letter was ambiguous. False (nothing written)
        when the letter was already gone.
        """
        q = self._store.queries
        async with self._store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q["dead_letter_take"], {"rk": routing_key, "job_id": job_id})
            taken = await cur.fetchone()
            if taken is None:
                return False
            await cur.execute(
                q["dead_letter_requeue"],
                {
                    "rk": routing_key,
                    "new_id": new_id,
                    "bucket": bucket(routing_key),
                    "tenant": tenant,
                    "type": actor_type,
                    "id": actor_id,
                    "job": job,
                    "payload": payload,
                    "payload_version": payload_version,
                    "caller": caller,
                    "maybe_applied": bool(taken["ambiguous"]),
                    "off": self._clock.offset_ms,
                },
            )
        return True
