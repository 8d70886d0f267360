"""Keyed rate limits of jobs (docs/flow-control.md): a token per limit before an attempt starts.

Claims stay as they are; between a claim and the start of its attempts, every claimed attempt of
a job with ``rate=`` takes one token from each of its limits' buckets (``rate_buckets``, shared
by all runners), all of one claim's attempts in one upsert. When a bucket is empty the token
is booked ahead (the bucket's level goes below zero) and the attempt is handed back uncounted,
with its attempt number, ambiguity and error as they were before the claim, due when its token
is and marked as holding it (``waiting_for = 'rate'``): its next claim starts it without taking
another. So attempts queue for tokens in claim order, each claimed twice at most, instead of
polling for them.

A key function that raises is a defect of the job: the attempt is recorded as a final failure
that never started, and the next claim dead-letters the row with the cause named
(``Rate key of ... raised ...``). So is a key PostgreSQL cannot store (a NUL, a lone surrogate,
more than :data:`MAX_KEY_BYTES`): it would fail the one statement that takes the tokens of the
whole claim, on every claim, and wedge every row claimed beside it.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from akter._engine.job_claims import ClaimedJob
from akter._store.gateway.job_flow import Bucket, TokenWant
from akter.callers import System, caller_from_json
from akter.jobs import AttemptCall, JobCall

if TYPE_CHECKING:
    from akter._store.gateway.job_flow import FlowGateway
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job

log = logging.getLogger("akter.jobs")

#: The longest rate key, in bytes of UTF-8 (a btree key holds at most about 2.7 kB).
MAX_KEY_BYTES = 1024


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a ``rate_buckets.key``, or None when it can."""
    if "\x00" in key:
        return "contains a NUL character"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8 (a lone surrogate)"
    if size > MAX_KEY_BYTES:
        return f"is {size} bytes long (at most {MAX_KEY_BYTES})"
    return None


@dataclass
class Admitted:
    """What one admission did: the attempts that start, and what happened to the others."""

    start: list[ClaimedJob] = field(default_factory=list)
    deferred: list[ClaimedJob] = field(default_factory=list)
    defects: list[ClaimedJob] = field(default_factory=list)


def key_call(row: ClaimedJob) -> JobCall:
    """The JobCall a rate key function sees (as the executor will: ids, attempt, principal)."""
    caller = caller_from_json(row.caller)
    return AttemptCall(
        job_id=row.intent_id,
        attempt=row.attempts,
        principal=caller.on_behalf_of if isinstance(caller, System) else None,
        ref=row.ref,
    )


def waits_ms(
    asked: Sequence[Sequence[tuple[Bucket, float]]], levels: dict[Bucket, float]
) -> list[int]:
    """Per attempt (in claim order), the ms until the last of its booked tokens is due.

    ``asked``: each attempt's buckets with their refill rate (tokens per ms); ``levels``: each
    bucket's level before the take. The k-th taker of a bucket with level L gets its token now
    if k ≤ L, else when the bucket has refilled to k: (k − L) / rate ms later.
    """
    seen: Counter[Bucket] = Counter()
    out: list[int] = []
    for buckets in asked:
        wait = 0.0
        for bucket, per_ms in buckets:
            seen[bucket] += 1
            wait = max(wait, (seen[bucket] - levels[bucket]) / per_ms)
        out.append(max(0, math.ceil(wait)))
    return out


async def admit(
    gateway: JobsGateway,
    flow: FlowGateway,
    rows: Sequence[ClaimedJob],
    job_of: dict[tuple[str, str], Job[Any, Any]],
) -> Admitted:
    """Take the tokens of ``rows`` (one claim's attempts, in claim order): one statement."""
    out = Admitted()
    asked: list[list[tuple[Bucket, float]]] = []
    asking: list[ClaimedJob] = []
    wants: dict[Bucket, TokenWant] = {}
    for row in rows:
        job = job_of[(row.actor_type, row.command)]
        rates = job.options.rates
        if not rates or row.cancelled or row.exhausted or row.prior_waiting_for == "rate":
            out.start.append(row)
            continue
        call = key_call(row)
        owner = job.owner.name if job.owner else row.actor_type
        try:
            keys = [rate.key_of(call) for rate in rates]
        except Exception as exc:
            await _key_defect(
                gateway, row, f"{owner}.{job.name}", f"raised {type(exc).__name__}: {exc}"
            )
            out.defects.append(row)
            continue
        problem = next((p for p in map(key_problem, keys) if p is not None), None)
        if problem is not None:
            await _key_defect(gateway, row, f"{owner}.{job.name}", f"returned a key that {problem}")
            out.defects.append(row)
            continue
        buckets: list[tuple[Bucket, float]] = []
        for no, (rate, key) in enumerate(zip(rates, keys, strict=True)):
            bucket = (owner, job.name, no, key)
            had = wants.get(bucket)
            n = had.n + 1 if had else 1
            wants[bucket] = TokenWant(*bucket, rate.tokens_per_ms, float(rate.burst), n)
            buckets.append((bucket, rate.tokens_per_ms))
        asked.append(buckets)
        asking.append(row)
    if not asking:
        return out
    waits = waits_ms(asked, await flow.take_tokens(list(wants.values())))
    later = [(row, wait) for row, wait in zip(asking, waits, strict=True) if wait > 0]
    out.start += [row for row, wait in zip(asking, waits, strict=True) if wait <= 0]
    if later:
        written = await flow.defer_for_tokens(later)
        out.deferred = [row for row, _ in later if row.intent_id in written]
    return out


async def _key_defect(gateway: JobsGateway, row: ClaimedJob, job: str, what: str) -> None:
    cause = f"Rate key of {job} {what}"
    log.error("A rate key function failed; the job is dead-lettered", extra=row.log_fields())
    await gateway.record_failure(
        row,
        attempt=row.attempts,
        cause=cause,
        not_started=True,
        ambiguous=False,
        final=True,
        backoff_ms=0,
    )
