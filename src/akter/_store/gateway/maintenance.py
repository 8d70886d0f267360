"""The ``$maintenance`` owner's statements: retention sweeps (semantics §7) and sampled gauges.

Both run on the framework pool, cross-actor by design (each is listed in the catalogue test's
``CROSS_ACTOR`` with its predicate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


@dataclass(frozen=True, slots=True)
class OutboxSample:
    """The outbox gauges of one row kind (``sample_outbox``).

    ``lag_ms``: the age of the oldest due row (0: none); ``stuck_rows``: rows with at least the
    sample's ``stuck`` attempts.
    """

    kind: str
    outbox_rows: int
    lag_ms: int
    stuck_rows: int
    parked: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OutboxSample:
        """The gauges from ``sample_outbox``'s row."""
        return cls(
            kind=str(row["kind"]),
            outbox_rows=int(row["outbox_rows"]),
            lag_ms=int(row["lag_ms"]),
            stuck_rows=int(row["stuck_rows"]),
            parked=int(row["parked"]),
        )


@dataclass(frozen=True, slots=True)
class RunningJobs:
    """Attempts running under a live lease, of one (actor type, job) (``sample_running_jobs``)."""

    actor_type: str
    job: str
    running: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunningJobs:
        """The count from ``sample_running_jobs``'s row."""
        return cls(
            actor_type=str(row["actor_type"]), job=str(row["job"]), running=int(row["running"])
        )


class MaintenanceGateway:
    """Retention batches and gauge samples, on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def prune_receipts(self, actor_type: str, *, cutoff: int, batch: int) -> int:
        """Delete one batch of a type's expired receipts; how many were deleted."""
        params = {"type": actor_type, "cutoff": cutoff, "batch": batch}
        q = self._store.queries
        # Citus cannot join receipts to the outbox across shards: its variant reads the carried
        # ids in a subplan (queries_citus.sql).
        statement = q["citus_prune_receipts"] if self._store.strategy == "citus" else None
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(statement or q["prune_receipts"], params)
            return len(await cur.fetchall())

    async def rank_unranked_jobs(self, *, batch: int) -> int:
        """Rank one batch of job rows an older runner wrote without a rank; how many."""
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(self._store.queries["rank_unranked_jobs"], {"batch": batch})
            return len(await cur.fetchall())

    async def prune_events(
        self, actor_type: str, *, cutoff: int, batch: int, held: int | None = None
    ) -> int:
        """Delete one batch of a type's events older than ``cutoff``; how many were deleted.

        Events a subscription feed has not delivered are kept unless older than ``held``
        (the subscriptions spec S5; ``None``: ``cutoff``, no hold).
        """
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(
                self._store.queries["prune_events"],
                {
                    "type": actor_type,
                    "cutoff": cutoff,
                    "batch": batch,
                    "held": cutoff if held is None else held,
                },
            )
            return len(await cur.fetchall())

    async def sample(self, *, stuck: int) -> list[OutboxSample]:
        """The outbox gauges by kind: rows, relay lag, stuck rows and parked rows."""
        params = {"off": self._clock.offset_ms, "stuck": stuck}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["sample_outbox"], params)
            return [OutboxSample.from_row(r) for r in await cur.fetchall()]

    async def running_jobs(self) -> list[RunningJobs]:
        """The job attempts running under a live lease, by actor type and job."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["sample_running_jobs"], {"off": self._clock.offset_ms}
            )
            return [RunningJobs.from_row(r) for r in await cur.fetchall()]
