"""Keyed rate limits of jobs (docs/flow-control.md): a token per limit before an attempt starts.

Claims stay as they are; between a claim and the start of its attempts, every claimed attempt of
a job with ``rate=`` takes one token from each of its limits' buckets (``rate_buckets``, shared
by all runners) in one statement, all or none. An attempt that finds none is handed back
uncounted, with its attempt number, ambiguity and error as they were before the claim, due when
a token will be: the i-th refusal of one bucket in a pass waits i further refill intervals, so
the refused rows come back spread over the refill instead of all at once. A key function that
raises is a defect of the job: the attempt is recorded as a final failure that never started,
and the next claim dead-letters the row with the cause named (``Rate key of ... raised ...``).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from akter._engine.job_claims import ClaimedJob
from akter.callers import System, caller_from_json
from akter.jobs import JobCall

if TYPE_CHECKING:
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job

log = logging.getLogger("akter.jobs")


@dataclass
class Admitted:
    """What one admission did: the attempts that start, and what happened to the others."""

    start: list[ClaimedJob] = field(default_factory=list)
    deferred: list[ClaimedJob] = field(default_factory=list)
    defects: list[ClaimedJob] = field(default_factory=list)


def key_call(row: ClaimedJob) -> JobCall:
    """The JobCall a rate key function sees (as the executor will: ids, attempt, principal)."""
    caller = caller_from_json(row.caller)
    return JobCall(
        job_id=row.intent_id,
        attempt=row.attempts,
        principal=caller.on_behalf_of if isinstance(caller, System) else None,
        ref=row.ref,
    )


def wait_ms(levels: Sequence[dict[str, Any]], queued: int) -> int:
    """How long a refused attempt waits, in ms.

    Until every empty bucket refills one token, plus ``queued`` refill intervals of the slowest
    (the refusals of the same bucket before it in this pass).
    """
    waits = [
        (max(0.0, 1.0 - float(r["level"])) / float(r["per_ms"]), 1.0 / float(r["per_ms"]))
        for r in levels
        if float(r["level"]) < 1.0
    ]
    if not waits:
        return 1
    deficit, interval = max(waits)
    return max(1, math.ceil(deficit + queued * interval))


async def admit(
    gateway: JobsGateway,
    rows: Sequence[ClaimedJob],
    job_of: dict[tuple[str, str], Job[Any, Any]],
) -> Admitted:
    """Take the tokens of ``rows`` (one claim's attempts, in claim order)."""
    out = Admitted()
    queued: Counter[tuple[str, str, int, str]] = Counter()
    for row in rows:
        job = job_of[(row.actor_type, row.command)]
        rates = job.options.rates
        if not rates or row.cancelled or row.exhausted:
            out.start.append(row)
            continue
        call = key_call(row)
        try:
            keys = [rate.key_of(call) for rate in rates]
        except Exception as exc:
            await _key_defect(gateway, row, job, exc)
            out.defects.append(row)
            continue
        buckets = [
            (no, key, rate.tokens_per_ms, float(rate.burst))
            for no, (rate, key) in enumerate(zip(rates, keys, strict=True))
        ]
        owner = job.owner.name if job.owner else row.actor_type
        granted, levels = await gateway.take_tokens(owner, job.name, buckets)
        if granted:
            out.start.append(row)
            continue
        names = [(owner, job.name, no, key) for no, key, _, _ in buckets]
        wait = wait_ms(levels, max(queued[name] for name in names))
        for name in names:
            queued[name] += 1
        if await gateway.defer_for_token(row, wait_ms=wait):
            out.deferred.append(row)
    return out


async def _key_defect(
    gateway: JobsGateway, row: ClaimedJob, job: Job[Any, Any], exc: Exception
) -> None:
    owner = job.owner.name if job.owner else row.actor_type
    cause = f"Rate key of {owner}.{job.name} raised {type(exc).__name__}: {exc}"
    log.error("A rate key function raised; the job is dead-lettered", extra=row.log_fields())
    await gateway.record_failure(
        row,
        attempt=row.attempts,
        cause=cause,
        not_started=True,
        ambiguous=False,
        final=True,
        backoff_ms=0,
    )
