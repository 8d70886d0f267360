"""Flow control's statements (docs/flow-control.md): caps recorded, rate tokens, gauges.

Deployment-wide concurrency is counted inside the claims (``JobsGateway``); here are the
statements around it: the caps a runner records at start, the rate tokens of a claim's attempts
(taken, or booked ahead, in one statement) and the deferral of the attempts whose tokens are
booked ahead, and the sampled gauges of rows held back. All run on the framework pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

Row = dict[str, Any]
#: A rate bucket: (actor type, job, limit no, key).
Bucket = tuple[str, str, int, str]


@dataclass(frozen=True)
class TokenWant:
    """``n`` tokens a claim's attempts need from one rate bucket of one job type."""

    actor_type: str
    job: str
    limit_no: int
    key: str
    per_ms: float
    burst: float
    n: int


class FlowGateway:
    """Flow control's statements (module docstring), on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    @property
    def _off(self) -> int:
        return self._clock.offset_ms

    async def record_limits(self, limits: Sequence[tuple[str, str, int]]) -> None:
        """Write the deployment-wide caps ``(actor type, job, concurrency)`` of executed jobs."""
        if not limits:
            return
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["job_limit_upsert"],
                {
                    "types": [t for t, _, _ in limits],
                    "jobs": [j for _, j, _ in limits],
                    "caps": [c for _, _, c in limits],
                },
            )

    async def take_tokens(self, wants: Sequence[TokenWant]) -> dict[Bucket, float]:
        """Take ``n`` tokens of each bucket (``rate_take``: one statement, autocommit).

        ``wants`` name one bucket each. Returns each bucket's level before the take, by
        (actor type, job, limit no, key); the level may go below zero: tokens booked ahead.
        """
        params = {
            "types": [w.actor_type for w in wants],
            "jobs": [w.job for w in wants],
            "nos": [w.limit_no for w in wants],
            "keys": [w.key for w in wants],
            "per_ms": [w.per_ms for w in wants],
            "bursts": [w.burst for w in wants],
            "wants": [w.n for w in wants],
            "off": self._off,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["rate_take"], params)
            rows = await cur.fetchall()
        return {
            (str(r["actor_type"]), str(r["job"]), int(r["limit_no"]), str(r["key"])): float(
                r["level"]
            )
            for r in rows
        }

    async def defer_for_tokens(self, rows: Sequence[tuple[Any, int]]) -> set[str]:
        """Hand claimed attempts ``(claim, wait ms)`` back uncounted, due when their tokens are.

        Each claim (a ``ClaimedJob``) guards its write by its attempt and lease end; returns the
        job ids written (a lost claim is left alone).
        """
        params = {
            "rks": [r.routing_key for r, _ in rows],
            "job_ids": [r.intent_id for r, _ in rows],
            "attempts": [r.attempts for r, _ in rows],
            "tokens": [r.claimed_until for r, _ in rows],
            "prior_attempts": [r.prior_attempts for r, _ in rows],
            "prior_ambiguous": [r.prior_ambiguous for r, _ in rows],
            "prior_maybe_applied": [r.prior_maybe_applied for r, _ in rows],
            "prior_errors": [r.prior_error for r, _ in rows],
            "waits": [w for _, w in rows],
            "off": self._off,
        }
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(self._store.queries["defer_jobs_for_token"], params)
            return {str(r[0]) for r in await cur.fetchall()}

    async def sample_flow(self) -> list[Row]:
        """Per job type with flow control: rows waiting for a slot and for a rate token."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["sample_flow_jobs"], {"off": self._off})
            return await cur.fetchall()
