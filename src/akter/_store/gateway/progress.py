"""The durable trace of one job, for progress readers (semantics §5.11): one read-only statement.

One statement is one snapshot, so a job that ends while it is read is seen either still holding
its row or already traced by what its end wrote (the route intent replaces the job row in the
settle's transaction, the route's receipt commits before that intent is deleted, the dead letter
is written with the settle).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._kinds import RowKind

if TYPE_CHECKING:
    from akter._store.pool import Store


@dataclass(frozen=True, slots=True)
class JobTrace:
    """What the rows say of one job; all empty when none names it."""

    #: ``"job"`` while the job is pending, running or backing off; ``"intent"`` while its route
    #: waits for delivery; ``None`` without a row.
    row_kind: str | None
    #: The route intent's command (with ``row_kind == "intent"``) or the job's name.
    row_command: str | None
    #: The job row was cancelled.
    row_cancelled: bool
    #: The command of the receipt whose command id is the job id (its delivered route).
    receipt_command: str | None
    #: The job has a dead letter.
    lettered: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobTrace:
        """The trace from ``job_trace``'s one row."""
        return cls(
            row_kind=_text(row["row_kind"]),
            row_command=_text(row["row_command"]),
            row_cancelled=bool(row["row_cancelled"]),
            receipt_command=_text(row["receipt_command"]),
            lettered=bool(row["lettered"]),
        )

    @property
    def route_command(self) -> str | None:
        """The route the job's end wrote (pending or delivered), if any."""
        if self.row_kind == RowKind.INTENT:
            return self.row_command
        return self.receipt_command


class JobTraces:
    """Reads :class:`JobTrace` rows on the pool (no transaction, no lock)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def read(self, actor: Mapping[str, Any], job_id: str) -> JobTrace:
        """The trace of ``job_id`` of ``actor`` (rk, tenant, type, id)."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["job_trace"], {**actor, "job_id": job_id})
            row = await cur.fetchone()
        assert row is not None  # the statement always returns one row
        return JobTrace.from_row(row)


def _text(value: object) -> str | None:
    return None if value is None else str(value)
