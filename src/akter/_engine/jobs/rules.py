"""A job attempt's settle decisions: pure functions of plain values, no database (semantics §5.9).

An attempt ends as a :data:`Reported` value: :func:`report` from the executor's exit and the
lease watchers, :func:`classify_value` for a returned value. :func:`decide` turns it into the
settle's plan (a frozen :data:`Settle`), once per attempt. The plan's guarded writes are tried
in order and the first that changes the row wins; what a write answers is decided here too:
:func:`after_record` for a failure recorded at its attempt, :func:`cancelled_end` for a
cancelled row, :func:`after_lost_letter` for a dead letter a cancellation beat, and
:func:`late` for a success that found its row already ended. ``settle.Settler`` performs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from akter._engine.jobs import routes
from akter._engine.jobs.routes import Route, RouteRejected
from akter._retry import Backoff

if TYPE_CHECKING:
    from akter._engine.jobs.claims import ClaimedJob
    from akter.jobs import Job

# --- what an attempt reports -------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A failed attempt: what it reports and whether the provider may have applied it."""

    cause: str
    ambiguous: bool
    final: bool = False
    not_started: bool = False


@dataclass(frozen=True)
class Succeeded:
    """The executor returned a value its routes accept (``success`` may be none)."""

    success: Route | None
    cancelled: Route | None


@dataclass(frozen=True)
class Rejected:
    """The executor returned a value ``on_success`` cannot accept: applied, final, ambiguous."""

    failure: Failure
    cancelled: Route | None


@dataclass(frozen=True)
class Failed:
    """The attempt failed (typed, defect, timeout, or its payload no longer validates)."""

    failure: Failure


@dataclass(frozen=True)
class Interrupted:
    """The attempt was stopped by its cancellation."""


@dataclass(frozen=True)
class Unattempted:
    """A cancelled or exhausted row claimed only to be settled."""


Reported = Succeeded | Rejected | Failed | Interrupted | Unattempted

#: Why an attempt stopped before its executor returned (the lease watchers, a stopping runner).
Stop = Literal["lost", "cancelled", "deadline", "stopped"]


@dataclass(frozen=True)
class Abandoned:
    """The attempt ends without a settle: its row is left for a later claim.

    ``warning``: what the runner logs (``None``: a stopping runner, nothing to say).
    """

    warning: str | None


# --- what the settle does ----------------------------------------------------------------------


@dataclass(frozen=True)
class Deliver:
    """A success: the first write that ends the row routes it.

    The uncancelled row into ``success`` (at any attempt: the first success wins), else the
    cancelled row into ``fallback``; else the success is :func:`late`.
    """

    success: Route | None
    fallback: Route | None
    #: The ``on_cancelled`` report of the result (what a late success records).
    cancelled: Route | None


@dataclass(frozen=True)
class RecordFailure:
    """A failure: recorded at its attempt; :func:`after_record` decides what follows.

    ``first``: tried before the record, it ends the cancelled row when its route takes the
    result as is.

    ``rejected``: the executor returned a value ``on_success`` refused (it was applied), so a
    stale record is a :func:`late` success; ``cancelled`` is its ``on_cancelled`` report.
    """

    failure: Failure
    first: Route | None
    cancelled: Route | None
    rejected: bool
    #: The wait before the next attempt, written with the record.
    backoff_ms: int


@dataclass(frozen=True)
class EndCancelled:
    """A cancelled row at ``attempt`` ends reporting ``outcome`` (:func:`cancelled_end`).

    ``first``: a route that takes the result as is, tried before the report of ``outcome``.
    """

    attempt: int
    outcome: Known
    cause: str
    first: Route | None = None


@dataclass(frozen=True)
class Drop:
    """A row cancelled before any attempt ends without a report."""


@dataclass(frozen=True)
class Exhaust:
    """The last attempt failed (or a final failure): dead-letter the row.

    A dead letter that a cancellation beat settles the row as cancelled instead
    (:func:`after_lost_letter`).
    """

    attempt: int
    cause: str
    ambiguous: bool


@dataclass(frozen=True)
class Retry:
    """The recorded failure leaves the row due after its backoff, for the next attempt."""

    cause: str
    ambiguous: bool


@dataclass(frozen=True)
class Stale:
    """A newer attempt or a settle took the row before the failure was recorded."""

    #: The executor's value was applied: a late success.
    late: bool


#: The plan :func:`decide` gives an attempt.
Settle = Deliver | RecordFailure | EndCancelled | Drop | Exhaust
#: What a recorded failure leads to.
AfterRecord = EndCancelled | Exhaust | Retry | Stale

Known = Literal["Failed", "Unknown"]


@dataclass(frozen=True)
class Recorded:
    """What ``record_job_failure`` answered of the row it recorded the failure on."""

    cancelled: bool
    maybe_applied: bool
    ambiguous: bool


@dataclass(frozen=True)
class Report:
    """How a cancelled row's report ends it: into ``route``, or without one.

    Without a route, an ``Unknown`` outcome is dead-lettered as ambiguous (nobody else is told),
    a ``Failed`` one is dropped: nothing can have applied.
    """

    route: Route | None
    dead_letter: bool


# --- the rules ---------------------------------------------------------------------------------


def report(executed: Reported | None, stop: Stop) -> Reported | Abandoned:
    """An attempt's end: what its executor reported, else what its stop means.

    Args:
        executed: The executor's classified exit; ``None`` when it was interrupted.
        stop: What interrupted it (a watcher's answer; ``stopped`` when none answered).
    """
    if executed is not None:
        return executed
    if stop == "cancelled":
        return Interrupted()
    if stop == "lost":
        return Abandoned("Job attempt lost its lease")
    if stop == "deadline":
        return Abandoned("Job attempt outlived its lease; interrupted")
    return Abandoned(None)


def decide(
    reported: Reported, row: ClaimedJob, *, routes_cancelled: bool, backoff_ms: int
) -> Settle:
    """The settle plan of one attempt (module docstring), decided once.

    Args:
        reported: How the attempt ended.
        row: The claim (its attempt number and, for a settle-only claim, what it recorded).
        routes_cancelled: The job's cancellation is routed (``on_cancelled``, or a workflow step).
        backoff_ms: The wait after this attempt's failure (:func:`backoff_ms`).
    """
    n = row.attempts
    match reported:
        case Succeeded(success, cancelled):
            return Deliver(success, cancelled if routes_cancelled else success, cancelled)
        case Rejected(failure, cancelled):
            first = cancelled if routes_cancelled else None
            return RecordFailure(failure, first, cancelled, True, backoff_ms)
        case Failed(failure):
            return RecordFailure(failure, None, None, False, backoff_ms)
        case Interrupted():
            return EndCancelled(n, "Unknown", cancelled_cause(n))
        case Unattempted():
            return _unattempted(row)


def _unattempted(row: ClaimedJob) -> Settle:
    n = row.attempts
    if row.cancelled and n == 0:
        return Drop()
    if row.cancelled:
        maybe = row.ambiguous or row.maybe_applied
        cause = row.last_error or (
            cancelled_cause(n) if maybe else "Failed before it was cancelled"
        )
        return EndCancelled(n, known(row.ambiguous, row.maybe_applied), cause)
    return Exhaust(n, row.last_error or "No attempt reported", row.ambiguous)


def after_record(
    plan: RecordFailure, recorded: Recorded | None, *, attempt: int, attempts: int
) -> AfterRecord:
    """What a failure recorded at ``attempt`` (of ``attempts`` allowed) leads to.

    A row cancelled meanwhile ends as cancelled (its route takes the result first, if it
    does); a final failure or the last attempt dead-letters it; otherwise it waits for a retry.
    """
    failure = plan.failure
    if recorded is None:
        return Stale(late=plan.rejected)
    if recorded.cancelled:
        outcome = known(recorded.ambiguous, recorded.maybe_applied)
        return EndCancelled(attempt, outcome, failure.cause, first=plan.first)
    if failure.final or attempt >= attempts:
        return Exhaust(attempt, failure.cause, recorded.ambiguous)
    return Retry(failure.cause, recorded.ambiguous)


def cancelled_end(outcome: Known, route: Route | None) -> Report:
    """How a cancelled row ends: into its ``on_cancelled`` report ``route`` when there is one."""
    return Report(route, dead_letter=route is None and outcome == "Unknown")


def after_lost_letter(plan: Exhaust, maybe_applied: bool | None) -> EndCancelled | None:
    """A dead letter that found its row cancelled at the attempt ends it as cancelled.

    ``maybe_applied``: the cancelled row's, or ``None`` when the row is not cancelled at the
    attempt (a newer attempt or a settle took it: nothing more to do).
    """
    if maybe_applied is None:
        return None
    return EndCancelled(plan.attempt, known(plan.ambiguous, maybe_applied), plan.cause)


LateLetter = Literal["none", "workflow", "letter"]


def late(cancelled: Route | None, *, routes_cancelled: bool, in_workflow: bool) -> LateLetter:
    """A success after its cancellation settled (no dead letter to mark ambiguous).

    ``letter``: an ambiguous letter is recorded beside the delivered cancellation report;
    ``workflow``: the step already took the cancellation, the success is only logged;
    ``none``: no cancellation report was routed, nothing to record.
    """
    if not routes_cancelled or cancelled is None:
        return "none"
    return "workflow" if in_workflow else "letter"


def known(ambiguous: bool, maybe_applied: bool) -> Known:
    """What a cancelled job without a result reports: ``Failed`` iff nothing can have applied."""
    return "Unknown" if ambiguous or maybe_applied else "Failed"


def cancelled_cause(attempt: int) -> str:
    """The cause of a cancellation that interrupted (or may have interrupted) an attempt."""
    return f"Cancelled while attempt {attempt} was running; the provider may have applied it"


def backoff_ms(job: Job[Any, Any], attempt: int) -> int:
    """The wait after failed attempt ``attempt``: ``min(base × 2^(n−1), max)``."""
    options = job.options
    return int(Backoff.nth(options.backoff_base_ms, options.backoff_max_ms, attempt))


def classify_value(job: Job[Any, Any], row: ClaimedJob, value: Any) -> Succeeded | Rejected:
    """A returned value: Succeeded with its routes, or Rejected when ``on_success`` refuses it.

    Its ``on_cancelled`` report carries the result; when that route refuses the result, the
    report is of an ``Unknown`` outcome instead (``None`` if that too is refused).
    """
    workflow = routes.workflow_of(row.caller)
    try:
        cancelled = routes.cancelled(
            job,
            row.intent_id,
            row.payload,
            row.attempts,
            {"kind": "Succeeded", "value": value},
            workflow,
        )
    except RouteRejected as exc:
        cause = f"The on_cancelled route cannot accept the result: {exc}"
        cancelled = _unknown_cancelled(job, row, cause)
    try:
        success = routes.success(job, value, workflow)
    except RouteRejected as exc:
        cause = f"The on_success route cannot accept the result: {exc}"
        return Rejected(Failure(cause, ambiguous=True, final=True), cancelled)
    return Succeeded(success, cancelled)


def _unknown_cancelled(job: Job[Any, Any], row: ClaimedJob, cause: str) -> Route | None:
    try:
        return routes.cancelled(
            job,
            row.intent_id,
            row.payload,
            row.attempts,
            {"kind": "Unknown", "cause": cause},
            routes.workflow_of(row.caller),
        )
    except RouteRejected:
        return None
