"""Flow control's statements (docs/flow-control.md): caps recorded, rate tokens, gauges.

Deployment-wide concurrency is counted inside the claims (``JobsGateway``); here are the
statements around it: the caps a runner records at start, the rate tokens of a claim's attempts
(taken, or booked at most a horizon ahead, in one statement) and the deferral of the attempts
that got none, and the sampled gauges of rows held back. All run on the framework pool.

On Citus (``queries_citus.sql``, "Flow control on Citus") the tokens are taken by one keyed
upsert per bucket, at one clock reading, in one transaction, and each deferral is its own
single-shard update: the plain statements join an ``unnest``, which Citus either refuses (the
upsert reads its own CTE) or spreads over every shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import DictRow, dict_row

from akter._store.gateway.citus_claims import each_alone, read_clock
from akter._store.gateway.jobs import ClaimedJob

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

#: A result row as the driver returns it (only ``rate_take``'s, read by ``_levels``).
Row = DictRow
#: A rate bucket: (actor type, job, limit no, key).
Bucket = tuple[str, str, int, str]


@dataclass(frozen=True, slots=True)
class FlowSample:
    """Rows of one flow-controlled (actor type, job) held back (``sample_flow_jobs``).

    ``waiting_slot``: due rows its caps hold back; ``waiting_rate``: rows waiting for a token.
    """

    actor_type: str
    job: str
    waiting_slot: int
    waiting_rate: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> FlowSample:
        """The counts from ``sample_flow_jobs``'s row."""
        return cls(
            actor_type=str(row["actor_type"]),
            job=str(row["job"]),
            waiting_slot=int(row["waiting_slot"]),
            waiting_rate=int(row["waiting_rate"]),
        )


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

    async def take_tokens(
        self, wants: Sequence[TokenWant], *, horizon_ms: int
    ) -> dict[Bucket, Take]:
        """Take up to ``n`` tokens of each bucket (``rate_take``: one statement, autocommit).

        ``wants`` name one bucket each. Only the tokens due within ``horizon_ms`` are taken
        (booked ahead when the level is below one). Returns, by (actor type, job, limit no, key),
        each bucket's level before the take and how many tokens it granted, in taker order.
        """
        if self._store.strategy == "citus":
            return _levels(await self._take_tokens_citus(wants, horizon_ms))
        params = {
            "types": [w.actor_type for w in wants],
            "jobs": [w.job for w in wants],
            "nos": [w.limit_no for w in wants],
            "keys": [w.key for w in wants],
            "per_ms": [w.per_ms for w in wants],
            "bursts": [w.burst for w in wants],
            "wants": [w.n for w in wants],
            "horizon_ms": horizon_ms,
            "off": self._off,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["rate_take"], params)
            return _levels(await cur.fetchall())

    async def _take_tokens_citus(self, wants: Sequence[TokenWant], horizon_ms: int) -> list[Row]:
        """``rate_take`` on Citus: one upsert per bucket, pipelined, all or none.

        In key order, like the plain statement (two claims never lock buckets in opposite
        orders), at one clock reading passed to each.
        """
        q = self._store.queries
        ordered = sorted(wants, key=lambda w: (w.actor_type, w.job, w.limit_no, w.key))
        async with self._store.framework.connection() as conn, conn.transaction():
            now = await read_clock(conn.cursor(row_factory=dict_row), q, self._off)
            return await each_alone(
                conn,
                q["citus_rate_take"],
                [
                    {
                        "type": w.actor_type,
                        "job": w.job,
                        "no": w.limit_no,
                        "key": w.key,
                        "per_ms": w.per_ms,
                        "burst": w.burst,
                        "n": w.n,
                        "horizon_ms": horizon_ms,
                        "now": now,
                    }
                    for w in ordered
                ],
            )

    async def defer_for_tokens(self, rows: Sequence[tuple[ClaimedJob, int]]) -> set[str]:
        """Hand claimed attempts ``(claim, wait ms)`` back uncounted, due after their wait.

        They hold no token: ``waiting_for = 'rate'`` only shows why they wait (``v_jobs``).

        Each claim guards its write by its attempt and lease end; returns the
        job ids written (a lost claim is left alone).
        """
        if self._store.strategy == "citus":
            return await self._defer_for_tokens_citus(rows)
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

    async def _defer_for_tokens_citus(self, rows: Sequence[tuple[ClaimedJob, int]]) -> set[str]:
        """``defer_jobs_for_token`` on Citus: one keyed update per claim, pipelined."""
        params = [
            {
                "rk": r.routing_key,
                "job_id": r.intent_id,
                "attempt": r.attempts,
                "token": r.claimed_until,
                "prior_attempts": r.prior_attempts,
                "prior_ambiguous": r.prior_ambiguous,
                "prior_maybe_applied": r.prior_maybe_applied,
                "prior_error": r.prior_error,
                "wait": wait,
                "off": self._off,
            }
            for r, wait in rows
        ]
        async with self._store.framework.connection() as conn:
            found = await each_alone(conn, self._store.queries["citus_defer_job_for_token"], params)
        return {str(r["intent_id"]) for r in found}

    async def sample_flow(self) -> list[FlowSample]:
        """Per job type with flow control: rows waiting for a slot and for a rate token."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["sample_flow_jobs"], {"off": self._off})
            return [FlowSample.from_row(r) for r in await cur.fetchall()]


@dataclass(frozen=True)
class Take:
    """What a take found and took in one bucket: its level before, and the tokens granted."""

    level: float
    granted: int


def _levels(rows: Sequence[Row]) -> dict[Bucket, Take]:
    """Each bucket's take, by (actor type, job, limit no, key)."""
    return {
        (str(r["actor_type"]), str(r["job"]), int(r["limit_no"]), str(r["key"])): Take(
            float(r["level"]), int(r["granted"])
        )
        for r in rows
    }
