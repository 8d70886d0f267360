"""Keyed rate limits of jobs (docs/flow-control.md): a token per limit before an attempt starts.

Claims stay as they are; between a claim and the start of its attempts, every claimed attempt of
a job with ``rate=`` takes one token from each of its limits' buckets (``rate_buckets``, shared
by all runners), all of one claim's attempts in one upsert. A take grants only the tokens due
within the claim's *horizon* (:func:`horizon_ms`): a token not there yet is booked ahead (the
level goes below zero, at most ``limit · horizon`` deep), and its attempt waits on this runner,
holding its claim, until the token is due, then starts. So every attempt starts at (or just
after) the instant its token is due in the bucket, whatever the timing of the passes, and the
starts respect every bucket in any window. The attempts a take could not grant within the horizon
are handed back uncounted, holding no token, with their attempt number, ambiguity and error as
they were before the claim, due about when their token could be (``waiting_for = 'rate'`` shows
why they wait): their next claim takes a token like any other.

Were the attempts whose tokens were booked ahead handed back holding them, they would start
whenever a later pass claimed them: a late pass would find several due and start them together,
a burst the bucket forbids.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from akter._engine.jobs.claims import ClaimedJob, job_subject
from akter._store.gateway.job_flow import Bucket, Take, TokenWant
from akter.callers import System, caller_from_json
from akter.jobs import AttemptCall, JobCall

if TYPE_CHECKING:
    from akter._store.gateway.job_flow import FlowGateway
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job

log = logging.getLogger("akter.jobs")

#: The longest rate key, in bytes of UTF-8 (a btree key holds at most about 2.7 kB).
MAX_KEY_BYTES = 1024

#: The shortest horizon: how far ahead a take books tokens for attempts that wait for them.
MIN_HORIZON_MS = 1000


def horizon_ms(poll_ms: int, cancel_check_ms: int) -> int:
    """How far ahead a claim books tokens: a poll (so the rate holds between passes), ≥ 1 s.

    At most ``cancel_check`` (a third of the lease): an attempt that waits that long for its
    token still starts, and renews, well before its claim's lease could end.
    """
    return min(max(poll_ms, MIN_HORIZON_MS), cancel_check_ms)


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
    """What one admission did: the attempts that start, and what happened to the others.

    ``not_before``: by job id, the local monotonic time before which an attempt of ``start``
    must not start (its booked token is due then); absent: at once.
    """

    start: list[ClaimedJob] = field(default_factory=list)
    deferred: list[ClaimedJob] = field(default_factory=list)
    defects: list[ClaimedJob] = field(default_factory=list)
    not_before: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Slot:
    """One asking attempt's answer: start after ``wait_ms``, or wait ``wait_ms`` for a claim."""

    start: bool
    wait_ms: int


def key_call(row: ClaimedJob) -> JobCall:
    """The JobCall a rate key function sees (as the executor will: ids, attempt, principal)."""
    caller = caller_from_json(row.caller)
    return AttemptCall(
        job_id=row.intent_id,
        attempt=row.attempts,
        principal=caller.on_behalf_of if isinstance(caller, System) else None,
        ref=row.ref,
    )


def slots(
    asked: Sequence[Sequence[tuple[Bucket, float]]], takes: dict[Bucket, Take], horizon: int
) -> list[Slot]:
    """Per attempt (in claim order), when it starts, or how long it waits to be claimed again.

    ``asked``: each attempt's buckets with their refill rate (tokens per ms); ``takes``: each
    bucket's level before the take and the tokens granted (``rate_take``, at most those due
    within ``horizon`` ms). The k-th taker of a bucket with level L has its token due
    (k − L) / rate ms after the take, and holds it if k ≤ granted. An attempt holding all its
    tokens starts once the last is due (never before: waits round up). The others hold none
    (a token granted for them in another bucket is lost) and are handed back, to be claimed
    again when their token could fall within the horizon, at least 1 ms later.
    """
    seen: Counter[Bucket] = Counter()
    out: list[Slot] = []
    for buckets in asked:
        wait = 0.0
        granted = True
        for bucket, per_ms in buckets:
            seen[bucket] += 1
            take = takes[bucket]
            wait = max(wait, (seen[bucket] - take.level) / per_ms)
            granted = granted and seen[bucket] <= take.granted
        if granted:
            out.append(Slot(True, max(0, math.ceil(wait))))
        else:
            out.append(Slot(False, max(1, math.ceil(wait - horizon))))
    return out


async def admit(
    gateway: JobsGateway,
    flow: FlowGateway,
    rows: Sequence[ClaimedJob],
    job_of: dict[tuple[str, str], Job[Any, Any]],
    *,
    horizon: int,
    now: Callable[[], float],
) -> Admitted:
    """Take the tokens of ``rows`` (one claim's attempts, in claim order): one statement.

    ``horizon``: how far ahead tokens are booked (ms); ``now``: the local monotonic clock the
    attempts' ``not_before`` is measured on (read once the take has answered, so a start is
    never earlier than its token is due in the database).
    """
    out = Admitted()
    asked: list[list[tuple[Bucket, float]]] = []
    asking: list[ClaimedJob] = []
    wants: dict[Bucket, TokenWant] = {}
    for row in rows:
        job = job_of[(row.actor_type, row.command)]
        rates = job.options.rates
        # A row handed back for a token holds none (a row deferred by older code may hold one:
        # it takes another, so the first is lost, never used twice).
        if not rates or row.cancelled or row.exhausted:
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
    takes = await flow.take_tokens(list(wants.values()), horizon_ms=horizon)
    answered = now()
    later: list[tuple[ClaimedJob, int]] = []
    for row, slot in zip(asking, slots(asked, takes, horizon), strict=True):
        if not slot.start:
            later.append((row, slot.wait_ms))
            continue
        out.start.append(row)
        if slot.wait_ms > 0:
            out.not_before[row.intent_id] = answered + slot.wait_ms / 1000
    if later:
        written = await flow.defer_for_tokens(later)
        out.deferred = [row for row, _ in later if row.intent_id in written]
    return out


async def _key_defect(gateway: JobsGateway, row: ClaimedJob, job: str, what: str) -> None:
    cause = f"Rate key of {job} {what}"
    log.error(
        "A rate key function failed; the job is dead-lettered: %s: %s",
        job_subject(row),
        cause,
        extra=row.log_fields(),
    )
    await gateway.record_failure(
        row,
        attempt=row.attempts,
        cause=cause,
        not_started=True,
        ambiguous=False,
        final=True,
        backoff_ms=0,
    )
