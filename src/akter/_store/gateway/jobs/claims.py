"""Job claims: uncapped, keyed and capped-group claims, their locks, and group wakes.

Capped groups are claimed and woken under the group lock, in a transaction of their own or, on
plain PostgreSQL, several free groups in one (``claim_groups``, docs/flow-control.md F2.9),
waiting at most ``GROUP_LOCK_WAIT`` for it (so does a capped type's claim for its type lock),
and end on the server if their session goes silent inside them for ``CLAIM_IDLE_BOUND``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg.rows import DictRow, dict_row

from akter._store.gateway import citus_claims
from akter._store.gateway.jobs.base import GatewayBase
from akter._store.gateway.jobs.rows import (
    ClaimedJob,
    Group,
    GroupClaim,
    JobKey,
    JobType,
    group_arrays,
)

if TYPE_CHECKING:
    from psycopg import AsyncCursor

    from akter._store.pool import Connection


#: Longest wait for a capped group's or capped type's lock before it is left for a later pass.
GROUP_LOCK_WAIT = "2000ms"
#: How long a claim's transaction may sit idle inside it before the server ends it: a claimer
#: frozen between two statements gives its group and type locks back (tests/integration/
#: test_frozen_claimer.py).
CLAIM_IDLE_BOUND = "10000ms"
#: The parameters of ``job_group_settings``.
CLAIM_SETTINGS = {"lock_timeout": GROUP_LOCK_WAIT, "idle_bound": CLAIM_IDLE_BOUND}


class JobClaims(GatewayBase):
    """The claim statements of the job gateway."""

    async def claim_uncapped(
        self,
        jobs: Sequence[JobType],
        *,
        free: int,
        probe: int,
        lease_ms: int,
        limit: tuple[str, str, int] | None = None,
    ) -> list[ClaimedJob]:
        """Claim due rows of uncapped ``jobs``.

        ``limit``: the (actor type, job, cap) of a type with a deployment-wide cap (``jobs``
        are its names): its ``job_limits`` row is locked first, and the claim takes at most
        the cap minus the attempts still live.
        """
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "probe": probe,
            "free": free,
            "lease": lease_ms,
            "slots": None,
        }
        if self._store.strategy == "citus":
            return await self._claim_uncapped_citus(params, limit, [j.job for j in jobs])
        q = self._store.queries
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            if limit is None:
                sent_at = self._local.now()
                # Planned per pass (no cached generic plan), like the intent claim: outbox.py.
                await cur.execute(q["claim_jobs"], params, prepare=False)
                return [ClaimedJob.from_row(r, sent_at) for r in await cur.fetchall()]
            async with conn.transaction():
                await self._settings(conn)
                params["slots"] = await self._slots(cur, limit, [j.job for j in jobs])
                sent_at = self._local.now()
                await cur.execute(q["claim_jobs"], params, prepare=False)
                return [ClaimedJob.from_row(r, sent_at) for r in await cur.fetchall()]

    @property
    def keyed_claims(self) -> bool:
        """Whether :meth:`claim_keyed` runs here (plain PostgreSQL; on Citus the full claim)."""
        return self._store.strategy != "citus"

    async def claim_keyed(
        self, jobs: Sequence[JobType], keys: Sequence[JobKey], *, lease_ms: int
    ) -> list[ClaimedJob]:
        """Claim the rows ``keys`` names that are due, unparked, unlocked and of uncapped ``jobs``.

        The rows and the monotonic time they were sent. For the rows a local commit just made
        due: found by primary key, not by the bucket probe of :meth:`claim_uncapped`, so the
        statement is prepared like any other.
        """
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "rks": [k.routing_key for k in keys],
            "ids": [k.intent_id for k in keys],
            "lease": lease_ms,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            sent_at = self._local.now()
            await cur.execute(self._store.queries["claim_jobs_keyed"], params)
            return [ClaimedJob.from_row(r, sent_at) for r in await cur.fetchall()]

    async def _slots(self, cur: Any, limit: tuple[str, str, int], names: Sequence[str]) -> int:
        """Lock a capped type's ``job_limits`` row; its free slots under the declared cap.

        Live attempts are counted after the lock, in a statement of their own: READ COMMITTED
        gives it a snapshot taken after the previous holder committed its claim.
        """
        q = self._store.queries
        actor_type, job, cap = limit
        await cur.execute(q["job_limit_lock"], {"type": actor_type, "job": job, "cap": cap})
        await cur.execute(
            q["job_type_live"], {"type": actor_type, "jobs": list(names), "off": self._off}
        )
        live = await cur.fetchone()
        assert live is not None
        return max(0, cap - int(live["live"]))

    async def _slots_citus(
        self, cur: Any, limit: tuple[str, str, int], names: Sequence[str]
    ) -> tuple[int, int]:
        """``_slots`` on Citus: also the clock, read once after the lock, for the claim.

        The live count compares lease ends with the coordinator's reading (``clock_now``), the
        clock every Citus claim writes them with, not with each worker's own.
        """
        q = self._store.queries
        actor_type, job, cap = limit
        await cur.execute(q["job_limit_lock"], {"type": actor_type, "job": job, "cap": cap})
        now = await citus_claims.read_clock(cur, q, self._off)
        await cur.execute(
            q["citus_job_type_live"], {"type": actor_type, "jobs": list(names), "now": now}
        )
        live = await cur.fetchone()
        assert live is not None
        return max(0, cap - int(live["live"])), now

    async def _settings(self, conn: Connection) -> None:
        """A capped claim's or wake's lock wait and idle bound (``CLAIM_SETTINGS``).

        On Citus the type and group locks wait on a worker, which ``set_config`` does not
        reach: a ``SET LOCAL``, propagated to every worker the transaction touches, bounds the
        wait there (pipelined with the rest: no round trip of its own).
        """
        q = self._store.queries
        if self._store.strategy == "citus":
            await conn.execute(q["citus_job_group_settings"], CLAIM_SETTINGS)
            await conn.execute(q["citus_job_lock_wait"])
        else:
            await conn.execute(q["job_group_settings"], CLAIM_SETTINGS)

    async def _lock_group(self, conn: Connection, params: dict[str, object]) -> None:
        """:meth:`_settings`, then the group lock (``job_group_lock``), in a transaction.

        On plain PostgreSQL one statement does both (``job_group_lock_bounded``): a capped claim
        or wake sends one statement fewer.
        """
        if self._store.strategy == "citus":
            await self._settings(conn)
            await conn.execute(self._store.queries["job_group_lock"], params)
        else:
            await conn.execute(
                self._store.queries["job_group_lock_bounded"], {**params, **CLAIM_SETTINGS}
            )

    async def discover_groups(self, jobs: Sequence[JobType], *, free: int) -> list[Group]:
        """The capped groups with due rows, by their earliest due time, at most ``free``."""
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "probe": 2 * free,
            "free": free,
        }
        if self._store.strategy == "citus":
            rows = await self._discover_groups_citus(params)
        else:
            async with self._store.framework.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    self._store.queries["discover_capped_groups"], params, prepare=False
                )
                rows = await cur.fetchall()
        return [
            Group(
                int(r["routing_key"]),
                str(r["tenant_id"]),
                str(r["actor_type"]),
                str(r["actor_id"]),
                str(r["command"]),
            )
            for r in rows
        ]

    async def _claim_uncapped_citus(
        self, params: dict[str, object], limit: tuple[str, str, int] | None, names: Sequence[str]
    ) -> list[ClaimedJob]:
        """The uncapped claim on Citus: a scan, then single-shard claims (``citus_claims``).

        A type with a deployment-wide cap is claimed in one transaction under its type lock,
        as on plain PostgreSQL: the lock is released only once the claims have committed on
        every worker, so the next claimer's live count sees them. The candidates are scanned
        first, without the lock: a type with no due row costs no locked transaction (one
        writes the job_limits reference table on every node, a two-phase commit), and a row
        that stopped being due meanwhile is skipped by its claim.
        """
        q = self._store.queries
        async with self._store.framework.connection() as conn:
            sent_at = self._local.now()  # before the clock reading: a lease starts no earlier
            if limit is None:
                rows = await citus_claims.claim_jobs(conn, q, params)
                return [ClaimedJob.from_row(r, sent_at) for r in rows]
            candidates = await citus_claims.job_candidates(conn, q, params)
            if not candidates:
                return []
            async with conn.transaction():
                await self._settings(conn)
                cur = conn.cursor(row_factory=dict_row)
                params["slots"], now = await self._slots_citus(cur, limit, names)
                rows = await citus_claims.claim_job_candidates(conn, q, params, candidates, now=now)
            return [ClaimedJob.from_row(r, sent_at) for r in rows]

    async def _discover_groups_citus(self, params: dict[str, object]) -> list[DictRow]:
        """The capped groups' discovery on Citus (``citus_claims``)."""
        async with self._store.framework.connection() as conn:
            return await citus_claims.discover_groups(conn, self._store.queries, params)

    async def claim_group(
        self,
        group: Group,
        *,
        free: int,
        cap: int,
        max_attempts: int,
        lease_ms: int,
        limit: tuple[str, str, int] | None = None,
        names: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        """Claim one capped group in its own transaction (semantics §5.6 steps 1-7).

        ``limit``: the group's job type also has a deployment-wide cap; its ``job_limits``
        row is locked after the group lock (the one lock order), and the claim also stays
        within the cap minus the type's live attempts.
        """
        params = {
            **group.params(),
            "off": self._off,
            "free": free,
            "cap": cap,
            "max_attempts": max_attempts,
            "lease": lease_ms,
            "slots": None,
        }
        async with self._store.framework.connection() as conn:
            if limit is None:
                return await self._claim_group_pipelined(conn, params)
            return await self._claim_group_limited(conn, params, limit, names)

    @property
    def batched_group_claims(self) -> bool:
        """Whether :meth:`claim_groups` runs here (plain PostgreSQL; on Citus one group each)."""
        return self._store.strategy != "citus"

    async def claim_groups(
        self, claims: Sequence[GroupClaim], *, lease_ms: int
    ) -> dict[int, list[ClaimedJob]]:
        """Claim a batch of capped groups in one transaction of two round trips (plain only).

        The first round trip takes the group locks nobody holds (``job_groups_lock_skip``); the
        second waits for those groups' in-flight renewals and settles, then sends each locked
        group's own ``claim_capped_group`` and the commit. A claim's snapshot is thus taken
        after its group lock was granted, as in :meth:`claim_group`: a claim sharing a statement
        with its lock could miss the rows the previous holder had just claimed and run more
        attempts than the cap. Returns the claimed rows by position in ``claims`` (a group
        whose lock another transaction held is absent: the caller claims it on its own, which
        waits for the lock).
        """
        q = self._store.queries
        groups = [c.group for c in claims]
        async with self._store.framework.connection() as conn:
            lock = conn.cursor(row_factory=dict_row)
            pending: list[tuple[int, AsyncCursor[Any]]] = []
            sent_at = self._local.now()
            async with conn.pipeline(), conn.transaction():
                await lock.execute(
                    q["job_groups_lock_skip"], {**group_arrays(groups), **CLAIM_SETTINGS}
                )
                locked = [int(r["i"]) - 1 for r in await lock.fetchall()]
                if locked:
                    await conn.execute(
                        q["job_groups_lock_running"], group_arrays([groups[i] for i in locked])
                    )
                    sent_at = self._local.now()
                    for i in locked:
                        claim = claims[i]
                        cur = conn.cursor(row_factory=dict_row)
                        await cur.execute(
                            q["claim_capped_group"],
                            {
                                **claim.group.params(),
                                "off": self._off,
                                "free": claim.free,
                                "cap": claim.cap,
                                "max_attempts": claim.max_attempts,
                                "lease": lease_ms,
                                "slots": None,
                            },
                        )
                        pending.append((i, cur))
            return {
                i: [ClaimedJob.from_row(r, sent_at) for r in await cur.fetchall()]
                for i, cur in pending
            }

    async def _claim_group_pipelined(
        self, conn: Connection, params: dict[str, object]
    ) -> list[ClaimedJob]:
        """The group claim's statements in one round trip.

        Sent one at a time, the settings, lock and defer round trips were most of a capped
        claim's cost (docs/benchmarks.md, "Jobs vs peers"); the settings now ride in the lock
        statement and the defer in the claim's.
        """
        q = self._store.queries
        claim = conn.cursor(row_factory=dict_row)
        async with conn.pipeline(), conn.transaction():
            await self._lock_group(conn, params)
            await conn.execute(q["job_group_lock_running"], params)
            sent_at = self._local.now()
            await claim.execute(q["claim_capped_group"], params)
        return [ClaimedJob.from_row(r, sent_at) for r in await claim.fetchall()]

    async def _claim_group_limited(
        self,
        conn: Connection,
        params: dict[str, object],
        limit: tuple[str, str, int],
        names: Sequence[str],
    ) -> list[ClaimedJob]:
        """The group claim of a type with a deployment-wide cap: its free slots first."""
        q = self._store.queries
        async with conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await self._lock_group(conn, params)
            await cur.execute(q["job_group_lock_running"], params)
            if self._store.strategy == "citus":
                params["slots"], _ = await self._slots_citus(cur, limit, names or [limit[1]])
            else:
                params["slots"] = await self._slots(cur, limit, names or [limit[1]])
            sent_at = self._local.now()
            # Rows the type's deployment-wide cap held back stay due, for the next pass: a
            # deferred row waits for a wake from its own group, which may have none running
            # (the statement defers only when it took fewer rows than ``slots``).
            await cur.execute(q["claim_capped_group"], params)
            rows = await cur.fetchall()
        return [ClaimedJob.from_row(r, sent_at) for r in rows]

    async def wake_waiting(self, group: Group) -> bool:
        """Make the group's oldest waiting row due now, under the group lock; True if one woke."""
        q = self._store.queries
        params = {**group.params(), "off": self._off}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor()
            # One round trip, like the group claim: the lock waits inside the pipeline.
            async with conn.pipeline(), conn.transaction():
                await self._lock_group(conn, params)
                await cur.execute(q["wake_waiting_job"], params)
            return bool(await cur.fetchall())
