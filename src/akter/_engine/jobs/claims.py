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
from typing import TYPE_CHECKING, Any

from akter._engine.subjects import job_label
from akter._store.gateway.jobs import ClaimedJob as ClaimedJob  # the lane's claim row
from akter._store.gateway.jobs import (
    Group,
    GroupClaim,
    JobKey,
    JobsGateway,
    JobType,
)

if TYPE_CHECKING:
    from akter.jobs import Job


def job_subject(job: ClaimedJob) -> str:
    """How a log line names a claimed attempt: ``job charge of Order/'o-1' (…), attempt 2``."""
    label = job_label(job.tenant_id, job.actor_type, job.actor_id, job.command, job.intent_id)
    return f"{label}, attempt {job.attempts}"


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
    rows = await gateway.claim_uncapped(
        job_types(jobs),
        free=free,
        probe=probe,
        lease_ms=lease_ms,
        limit=limit_of(limited[0]) if limited else None,
    )
    candidates = rows[0].candidates if rows else 0
    return rows, candidates


async def claim_keyed(
    gateway: JobsGateway, *, jobs: Sequence[Job[Any, Any]], keys: Sequence[JobKey], lease_ms: int
) -> list[ClaimedJob]:
    """Claim the rows a local commit just made due (``keys``) among uncapped ``jobs``."""
    assert all(j.options.concurrency is None and j.options.per_actor is None for j in jobs)
    return await gateway.claim_keyed(job_types(jobs), keys, lease_ms=lease_ms)


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
    return await gateway.claim_group(
        group,
        free=free,
        cap=job.options.per_actor,
        max_attempts=job.options.attempts,
        lease_ms=lease_ms,
        limit=None if job.options.concurrency is None else limit_of(job),
        names=(job.name, *job.aliases),
    )


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
    return await gateway.claim_groups(claims, lease_ms=lease_ms)


async def wake_waiting(gateway: JobsGateway, group: Group) -> bool:
    """Make the group's oldest waiting row due now, under the group lock; True if one woke."""
    return await gateway.wake_waiting(group)
