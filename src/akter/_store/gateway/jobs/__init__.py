"""The job executor's statements (semantics §5): claims, group locks, renewals and settles.

Every statement runs on the framework pool (README, "Connections"): user turns never hold up a
claim, a renewal or a settle. Capped groups are claimed and woken under the group lock, in a
transaction of their own or, on plain PostgreSQL, several free groups in one (``claim_groups``,
docs/flow-control.md F2.9), waiting at most ``GROUP_LOCK_WAIT`` for it (so does a capped
type's claim for its type lock), and end on the server if their session goes silent inside them for
``CLAIM_IDLE_BOUND``. Also here: an operator's
cancellation of one job by its id (``akter jobs cancel``), on the callers' pool.
"""

from __future__ import annotations

from akter._store.gateway.jobs.claims import (
    CLAIM_IDLE_BOUND,
    CLAIM_SETTINGS,
    GROUP_LOCK_WAIT,
    JobClaims,
)
from akter._store.gateway.jobs.rows import (
    Cancelled,
    ClaimedJob,
    Ended,
    Group,
    GroupClaim,
    JobKey,
    JobRow,
    JobType,
    RouteWrite,
)
from akter._store.gateway.jobs.settles import JobSettles

__all__ = [
    "CLAIM_IDLE_BOUND",
    "CLAIM_SETTINGS",
    "GROUP_LOCK_WAIT",
    "Cancelled",
    "ClaimedJob",
    "Ended",
    "Group",
    "GroupClaim",
    "JobKey",
    "JobRow",
    "JobType",
    "JobsGateway",
    "RouteWrite",
]


class JobsGateway(JobClaims, JobSettles):
    """The executor's statements (module docstring), on the framework clock's offset."""

    async def cancel_by_id(self, job_id: str) -> Cancelled:
        """Cancel a job by id in its own transaction on a pooled connection (``akter jobs``)."""
        q = self._store.queries
        async with self._store.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(q["cancel_job_by_id_unstarted"], {"job_id": job_id})
            if await cur.fetchall():
                return Cancelled("deleted")
            cur = await conn.execute(
                q["cancel_job_by_id_started"], {"job_id": job_id, "off": self._off}
            )
            rows = await cur.fetchall()
        if not rows:
            return Cancelled("unknown")
        return Cancelled("cancelled", running=any(bool(r[1]) for r in rows))
