"""Settling a job attempt (semantics §5.9): guarded writes in a fixed order, first write wins.

An attempt's exit is first classified as a :data:`Reported` value, decided from the executor's
exit and the claim alone. Settling then applies guarded writes until one changes a row:

- a success tries the uncancelled row (any attempt: the first success wins), then the cancelled
  one, and is otherwise *late*: it marks the dead letter ambiguous, or records an ambiguous one
  when the cancellation's report was already routed; it never routes a second outcome;
- a failure is recorded at its attempt first (so a stale failure never touches a newer attempt,
  and a failed dead-letter transaction is finished later by a settle-only claim with this cause,
  without calling the provider again), then ends the row when it was cancelled, final or the
  last attempt;
- a dead letter that loses to a cancellation settles the row as cancelled instead.

A settle statement or transaction that fails changes nothing: the row is settled later by a
claim from what it records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from akter._engine.jobs import routes
from akter._engine.jobs.claims import ClaimedJob
from akter._engine.jobs.routes import Route, RouteRejected
from akter._retry import Backoff
from akter._store.gateway.jobs import RouteWrite

if TYPE_CHECKING:
    from akter._engine.hooks import HookInfo, Hooks
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job
    from akter.telemetry import Metrics

log = logging.getLogger("akter.jobs")


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

Known = Literal["Failed", "Unknown"]


def _write(route: Route | None, traceparent: str | None, job: Job[Any, Any]) -> RouteWrite | None:
    if route is None:
        return None
    # The route intent is staged by this code: it carries the route command's payload version.
    member = job.owner.members.get(route.command) if job.owner else None
    version = member.version if member is not None else 0
    return RouteWrite(route.command, route.payload, traceparent, version)


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


class Settler:
    """Settles one claim of one job.

    Args:
        gateway: The executor's job statements.
        hooks: Fault-injection points (``before_dead_letter_commit``).
        job: The job declaration.
        row: The claim.
        retry_every: Seconds between a capped success's tries while a newer attempt is live.
        wake: Wakes the relay after a routed write.
        metrics: Counts dead letters, job successes and backoffs (semantics §10.1).
    """

    def __init__(
        self,
        *,
        gateway: JobsGateway,
        hooks: Hooks,
        job: Job[Any, Any],
        row: ClaimedJob,
        retry_every: float,
        wake: Callable[[], None],
        metrics: Metrics | None = None,
    ) -> None:
        self.gateway = gateway
        self.metrics = metrics
        self.hooks = hooks
        self.job = job
        self.row = row
        self.retry_every = retry_every
        self.wake = wake
        self.capped = job.options.per_actor is not None
        #: The workflow step the job belongs to: every outcome is routed to it.
        self.workflow = routes.workflow_of(row.caller)
        self.routes_cancelled = routes.has_route(job, "cancelled", self.workflow)
        #: How the job ended once a settle was terminal (``succeeded``, ``dead_lettered``,
        #: ``cancelled``): what the progress close tells readers (semantics §5.11).
        self.outcome: str | None = None
        #: The attempt's span (W3C text) once it ran: a route's delivery continues it.
        self.traceparent: str | None = None
        #: A capped row's terminal settle also woke its group (``JobsGateway.end``).
        self.group_woken = False

    # --- entry --------------------------------------------------------------------------------

    async def settle(self, reported: Reported) -> bool:
        """Apply the settle order of ``reported``; True iff the row reached a terminal settle."""
        try:
            match reported:
                case Succeeded(success, cancelled):
                    return await self._succeeded(success, cancelled)
                case Rejected(failure, cancelled):
                    return await self._failed(failure, cancelled, rejected=True)
                case Failed(failure):
                    return await self._failed(failure, None, rejected=False)
                case Interrupted():
                    self._log(logging.INFO, "Job attempt interrupted by its cancellation")
                    n = self.row.attempts
                    return await self._settle_cancelled(n, "Unknown", cancelled_cause(n))
                case Unattempted():
                    return await self._unattempted()
        except psycopg.Error as exc:
            self._log(
                logging.WARNING,
                "Job settle failed; a later claim settles the row",
                error=f"{type(exc).__name__}: {exc}",
            )
        return False

    # --- report orders ------------------------------------------------------------------------

    async def _succeeded(self, success: Route | None, cancelled: Route | None) -> bool:
        if await self._terminal(success, cancelled=False, attempt=None):
            self._count("akter.relay.delivered", kind="job")
            return True
        route = cancelled if self.routes_cancelled else success
        if await self._terminal(route, cancelled=True, attempt=None):
            return True
        await self._late(cancelled)
        return False

    async def _failed(self, failure: Failure, cancelled: Route | None, *, rejected: bool) -> bool:
        n = self.row.attempts
        routes_result = cancelled is not None and self.routes_cancelled
        if routes_result and await self._terminal(cancelled, cancelled=True, attempt=None):
            return True
        recorded = await self._record(failure)
        if recorded is None:
            if rejected:
                await self._late(cancelled)
            else:
                self._log(
                    logging.WARNING,
                    "Job attempt failed after a newer attempt or a settle took its row",
                    cause=failure.cause,
                )
            return False
        was_cancelled, maybe_applied, ambiguous = recorded
        if was_cancelled:
            if routes_result and await self._terminal(cancelled, cancelled=True, attempt=n):
                return True
            return await self._settle_cancelled(n, known(ambiguous, maybe_applied), failure.cause)
        if failure.final or n >= self.job.options.attempts:
            return await self._exhaust(n, failure.cause, ambiguous)
        self._log(
            logging.WARNING,
            "Job attempt failed; retrying with backoff",
            cause=failure.cause,
            ambiguous=ambiguous,
        )
        self._count("akter.relay.retried", kind="job")
        return False

    async def _unattempted(self) -> bool:
        row = self.row
        n = row.attempts
        if row.cancelled and n == 0:
            return await self._terminal(None, cancelled=True, attempt=0)
        if row.cancelled:
            maybe = row.ambiguous or row.maybe_applied
            cause = row.last_error or (
                cancelled_cause(n) if maybe else "Failed before it was cancelled"
            )
            return await self._settle_cancelled(n, known(row.ambiguous, row.maybe_applied), cause)
        return await self._exhaust(n, row.last_error or "No attempt reported", row.ambiguous)

    # --- building blocks ----------------------------------------------------------------------

    async def _settle_cancelled(self, n: int, outcome: Known, cause: str) -> bool:
        if self.routes_cancelled:
            try:
                route = routes.cancelled(
                    self.job,
                    self.row.intent_id,
                    self.row.payload,
                    n,
                    {"kind": outcome, "cause": cause},
                    self.workflow,
                )
            except RouteRejected:
                route = None  # the stored payload no longer validates
            if route is not None:
                return await self._terminal(route, cancelled=True, attempt=n)
        if outcome == "Unknown":
            return await self._dead_letter(n, cause, True, cancelled=True)
        dropped = await self._terminal(None, cancelled=True, attempt=n)
        if dropped:
            self._log(
                logging.INFO, "Cancelled job dropped after a failed attempt", cause=cause, attempt=n
            )
        return dropped

    async def _exhaust(self, n: int, cause: str, ambiguous: bool) -> bool:
        if await self._dead_letter(n, cause, ambiguous, cancelled=False):
            return True
        maybe_applied = await self.gateway.cancelled_at(self.row, attempt=n)
        if maybe_applied is None:
            return False
        return await self._settle_cancelled(n, known(ambiguous, maybe_applied), cause)

    async def _dead_letter(self, n: int, cause: str, ambiguous: bool, *, cancelled: bool) -> bool:
        row = self.row
        route = routes.dead_letter(
            self.job, row.intent_id, row.payload, n, cause, ambiguous, self.workflow
        )
        armed = self.hooks.armed("before_dead_letter_commit")
        written = await self.gateway.dead_letter(
            row,
            _write(route, self.traceparent, self.job),
            cancelled=cancelled,
            attempt=n,
            cause=cause,
            ambiguous=ambiguous,
            before_commit=self._before_dead_letter_commit if armed else None,
        )
        if not written:
            return False
        self._log(
            logging.WARNING,
            "Job dead-lettered after its last attempt",
            cause=cause,
            ambiguous=ambiguous,
            attempt=n,
        )
        self._count("akter.job.dead_letters", actor_type=row.actor_type, job=row.command)
        self.outcome = "dead_lettered"
        if route is not None:
            self.wake()
        return True

    async def _before_dead_letter_commit(self) -> None:
        await self.hooks.at("before_dead_letter_commit", self.info())

    async def _late(self, cancelled: Route | None) -> None:
        if await self.gateway.mark_letter_ambiguous(self.row):
            self._log(logging.WARNING, "Job succeeded after it was dead-lettered")
            return
        if not self.routes_cancelled or cancelled is None:
            return
        if self.workflow is not None:
            # The step already took the cancellation (JobCancelled was raised in the workflow).
            self._log(logging.WARNING, "Job of a workflow step succeeded after its cancellation")
            return
        route_command = self.job.routes["cancelled"].__name__
        recorded = await self.gateway.insert_late_letter(
            self.row, attempts=self.row.attempts, route=route_command
        )
        if recorded:
            self._log(logging.WARNING, "Job succeeded after its cancellation settled")

    async def _record(self, failure: Failure) -> tuple[bool, bool, bool] | None:
        return await self.gateway.record_failure(
            self.row,
            attempt=self.row.attempts,
            cause=failure.cause,
            not_started=failure.not_started,
            ambiguous=failure.ambiguous,
            final=failure.final,
            backoff_ms=backoff_ms(self.job, self.row.attempts),
        )

    async def _terminal(self, route: Route | None, *, cancelled: bool, attempt: int | None) -> bool:
        """End the row under its guard: rewrite into ``route`` or delete; True iff it changed.

        A capped job's write at any attempt also waits while a newer attempt holds a live lease:
        ending the row then would free its slot while that attempt still calls the provider.
        """
        after = self.row.attempts if self.capped and attempt is None else None
        while True:
            ended = await self.gateway.end(
                self.row,
                _write(route, self.traceparent, self.job),
                cancelled=cancelled,
                attempt=attempt,
                after=after,
                wake=self.row.group if self.capped else None,
            )
            if ended.changed or after is None:
                break
            if ended.held is None:
                return False
            if ended.held:
                await asyncio.sleep(self.retry_every)
        if ended.changed:
            self.outcome = "cancelled" if cancelled else "succeeded"
            # The settle's own transaction woke the group's next waiting row (its last write):
            # the executor need not wake the group again.
            self.group_woken = ended.woke is not None
            if route is not None or ended.woke:
                self.wake()
        return ended.changed

    def info(self) -> HookInfo:
        """What fault-injection matchers see."""
        return {
            "ref": self.row.ref,
            "job": self.row.command,
            "job_id": self.row.intent_id,
            "attempt": self.row.attempts,
        }

    def _count(self, name: str, **attributes: str) -> None:
        if self.metrics is not None:
            self.metrics.count(name, 1, **attributes)

    def _log(self, level: int, message: str, **fields: Any) -> None:
        log.log(level, message, extra={**self.row.log_fields(), **fields})
