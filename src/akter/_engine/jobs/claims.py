"""Claiming job rows (semantics §5.5, §5.6): uncapped claims, capped groups and their wakes.

A claim leases a row for one attempt and pre-marks it ambiguous, so a crash at any later
point leaves it honestly ambiguous with no further bookkeeping. Uncapped rows are claimed by one
cross-actor statement; capped rows group by (actor, job), and each group is claimed under the
group lock (several free groups in one transaction on plain PostgreSQL, ``claim_groups``),
which keeps live attempts within ``per_actor`` across runners and waiting rows in enqueue order.
The rows a local commit just made due may be claimed by primary key (``claim_keyed``) instead of
by the bucket probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from akter._engine.subjects import job_label
from akter._store.gateway.jobs import Group, GroupClaim, JobKey, JobsGateway, JobType
from akter.callers import ActorRef

if TYPE_CHECKING:
    from akter.jobs import Job


@dataclass(frozen=True)
class ClaimedJob:
    """A job row as a claim returned it.

    Attributes:
        attempts: ``N``: the attempt this claim runs (unchanged for a settle-only claim).
        claimed_until: The lease end the claim wrote.
        cancelled: Cancelled by a turn: settled with what is known, never attempted again.
        exhausted: Its attempts ran out, or a failure was final, before this claim.
        sent_at: Local monotonic time just before the claim was sent.
        traceparent: The W3C traceparent of the span that staged the job (``None``: none).
    """

    routing_key: int
    intent_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    command: str
    payload: str
    payload_version: int
    caller: str
    attempts: int
    last_error: str | None
    ambiguous: bool
    maybe_applied: bool
    claimed_until: int
    cancelled: bool
    exhausted: bool
    sent_at: float
    traceparent: str | None = None
    #: What the claim replaced (undone when the code cannot run the row, evolution E3).
    prior_attempts: int = 0
    prior_ambiguous: bool = False
    prior_maybe_applied: bool = False
    #: The row's error before this claim wrote its own (restored when it waits for a token).
    prior_error: str | None = None
    #: ``"rate"``: the row was handed back to wait for a rate token (it holds none, job_rates).
    prior_waiting_for: str | None = None

    @property
    def ref(self) -> ActorRef:
        """The actor that owns the job."""
        return ActorRef(self.tenant_id, self.actor_type, self.actor_id)

    @property
    def group(self) -> Group:
        """The (actor, job) group of the row."""
        return Group(self.routing_key, self.tenant_id, self.actor_type, self.actor_id, self.command)

    @property
    def subject(self) -> str:
        """How a log line names this attempt: ``job charge of Order/'o-1' (…), attempt 2``."""
        label = job_label(
            self.tenant_id, self.actor_type, self.actor_id, self.command, self.intent_id
        )
        return f"{label}, attempt {self.attempts}"

    def log_fields(self) -> dict[str, Any]:
        """The structured fields of every job log line (semantics §10.3)."""
        return {
            "actor": self.actor_type,
            "id": self.actor_id,
            "tenant": self.tenant_id,
            "job": self.command,
            "job_id": self.intent_id,
            "attempt": self.attempts,
        }


def _claimed(row: dict[str, Any], sent_at: float) -> ClaimedJob:
    return ClaimedJob(
        routing_key=int(row["routing_key"]),
        intent_id=str(row["intent_id"]),
        tenant_id=str(row["tenant_id"]),
        actor_type=str(row["actor_type"]),
        actor_id=str(row["actor_id"]),
        command=str(row["command"]),
        payload=str(row["payload"]),
        payload_version=int(row["payload_version"]),
        caller=str(row["caller"]),
        attempts=int(row["attempts"]),
        last_error=row["last_error"],
        ambiguous=bool(row["ambiguous"]),
        maybe_applied=bool(row["maybe_applied"]),
        claimed_until=int(row["claimed_until"]),
        cancelled=bool(row["cancelled"]),
        exhausted=bool(row["exhausted"]),
        sent_at=sent_at,
        traceparent=row.get("traceparent"),
        prior_attempts=int(row.get("prior_attempts", row["attempts"])),
        prior_ambiguous=bool(row.get("prior_ambiguous", row["ambiguous"])),
        prior_maybe_applied=bool(row.get("prior_maybe_applied", row["maybe_applied"])),
        prior_error=row.get("prior_error"),
        prior_waiting_for=row.get("prior_waiting_for"),
    )


def job_types(jobs: Sequence[Job[Any, Any]]) -> list[JobType]:
    """The claim statements' view of executed jobs: each under its name and its aliases.

    Rows stored under an earlier name of a job are claimed and run by the renamed job
    (evolution E2).
    """
    return [
        JobType(j.owner.name if j.owner else "", name, j.options.attempts)
        for j in jobs
        for name in (j.name, *j.aliases)
    ]


def limit_of(job: Job[Any, Any]) -> tuple[str, str, int]:
    """The ``job_limits`` key of a job with a deployment-wide cap, and the cap."""
    assert job.options.concurrency is not None
    return (job.owner.name if job.owner else "", job.name, job.options.concurrency)


def by_stored_name(jobs: Sequence[Job[Any, Any]]) -> dict[tuple[str, str], Job[Any, Any]]:
    """The executed jobs by (actor type, stored name), aliases included."""
    return {
        (j.owner.name if j.owner else "", name): j for j in jobs for name in (j.name, *j.aliases)
    }


async def claim_uncapped(
    gateway: JobsGateway,
    *,
    jobs: Sequence[Job[Any, Any]],
    free: int,
    probe: int,
    lease_ms: int,
) -> tuple[list[ClaimedJob], int]:
    """Claim due rows of uncapped ``jobs``; returns the claims and the candidate count."""
    limited = [j for j in jobs if j.options.concurrency is not None]
    # A type with a deployment-wide cap is claimed alone, under its job_limits lock.
    assert not limited or len(jobs) == 1
    rows, sent_at = await gateway.claim_uncapped(
        job_types(jobs),
        free=free,
        probe=probe,
        lease_ms=lease_ms,
        limit=limit_of(limited[0]) if limited else None,
    )
    candidates = int(rows[0]["candidates"]) if rows else 0
    return [_claimed(r, sent_at) for r in rows], candidates


async def claim_keyed(
    gateway: JobsGateway, *, jobs: Sequence[Job[Any, Any]], keys: Sequence[JobKey], lease_ms: int
) -> list[ClaimedJob]:
    """Claim the rows a local commit just made due (``keys``) among uncapped ``jobs``."""
    assert all(j.options.concurrency is None and j.options.per_actor is None for j in jobs)
    rows, sent_at = await gateway.claim_keyed(job_types(jobs), keys, lease_ms=lease_ms)
    return [_claimed(r, sent_at) for r in rows]


async def discover_groups(
    gateway: JobsGateway, *, jobs: Sequence[Job[Any, Any]], free: int
) -> list[Group]:
    """The capped groups with due rows, by their earliest due time, at most ``free``."""
    return await gateway.discover_groups(job_types(jobs), free=free)


async def claim_group(
    gateway: JobsGateway, group: Group, *, job: Job[Any, Any], free: int, lease_ms: int
) -> list[ClaimedJob]:
    """Claim one capped group in its own transaction (semantics §5.6 steps 1-7)."""
    assert job.options.per_actor is not None
    rows, sent_at = await gateway.claim_group(
        group,
        free=free,
        cap=job.options.per_actor,
        max_attempts=job.options.attempts,
        lease_ms=lease_ms,
        limit=None if job.options.concurrency is None else limit_of(job),
        names=(job.name, *job.aliases),
    )
    return [_claimed(r, sent_at) for r in rows]


async def claim_groups(
    gateway: JobsGateway,
    groups: Sequence[tuple[Group, Job[Any, Any], int]],
    *,
    lease_ms: int,
) -> dict[int, list[ClaimedJob]]:
    """Claim a batch of groups ``(group, job, free)`` in one transaction (plain PostgreSQL).

    The claims by position in ``groups``; a group whose lock another transaction holds is
    absent (claim it with :func:`claim_group`, which waits for the lock). Only for jobs
    without a deployment-wide cap: their claims lock ``job_limits`` first, one type at a time.
    """
    claims = []
    for group, job, free in groups:
        assert job.options.per_actor is not None and job.options.concurrency is None
        claims.append(GroupClaim(group, free, job.options.per_actor, job.options.attempts))
    rows, sent_at = await gateway.claim_groups(claims, lease_ms=lease_ms)
    return {i: [_claimed(r, sent_at) for r in found] for i, found in rows.items()}


async def wake_waiting(gateway: JobsGateway, group: Group) -> bool:
    """Make the group's oldest waiting row due now, under the group lock; True if one woke."""
    return await gateway.wake_waiting(group)
