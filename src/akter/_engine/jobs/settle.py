"""Settling a job attempt (semantics §5.9): guarded writes in a fixed order, first write wins.

:func:`akter._engine.jobs.rules.decide` gives each attempt its plan; the :class:`Settler`
performs its guarded writes until one changes a row, asking the rules what each answer leads to:

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
from typing import TYPE_CHECKING, Any

import psycopg

from akter._engine.jobs import routes, rules
from akter._engine.jobs.claims import ClaimedJob, job_subject
from akter._engine.jobs.routes import Route, RouteRejected
from akter._engine.jobs.rules import (
    Deliver,
    Drop,
    EndCancelled,
    Exhaust,
    Interrupted,
    Recorded,
    RecordFailure,
    Reported,
    Retry,
    Stale,
)
from akter._kinds import RowKind
from akter._store.gateway.jobs import RouteWrite

if TYPE_CHECKING:
    from akter._engine.hooks import HookInfo, Hooks
    from akter._engine.jobs.coalescer import SettleCoalescer
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job
    from akter.telemetry import Metrics

log = logging.getLogger("akter.jobs")


def _write(route: Route | None, traceparent: str | None, job: Job[Any, Any]) -> RouteWrite | None:
    if route is None:
        return None
    # The route intent is staged by this code: it carries the route command's payload version.
    member = job.owner.members.get(route.command) if job.owner else None
    version = member.version if member is not None else 0
    return RouteWrite(route.command, route.payload, traceparent, version)


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
        batch: The runner's settle coalescer: an uncapped job's plain success is ended by it
            (semantics §5.9, "Batched successes"); ``None``: every write on its own.
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
        batch: SettleCoalescer | None = None,
    ) -> None:
        self.gateway = gateway
        self.batch = batch
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
        """Perform the settle plan of ``reported``; True iff the row reached a terminal settle."""
        n = self.row.attempts
        plan = rules.decide(
            reported,
            self.row,
            routes_cancelled=self.routes_cancelled,
            backoff_ms=rules.backoff_ms(self.job, n),
        )
        if isinstance(reported, Interrupted):
            self._log(logging.INFO, "Job attempt interrupted by its cancellation")
        try:
            match plan:
                case Deliver():
                    return await self._deliver(plan)
                case RecordFailure():
                    return await self._record_failure(plan)
                case EndCancelled():
                    return await self._end_cancelled(plan)
                case Drop():
                    return await self._terminal(None, cancelled=True, attempt=0)
                case Exhaust():
                    return await self._exhaust(plan)
        except psycopg.Error as exc:
            self._log(
                logging.WARNING,
                "Job settle failed; a later claim settles the row",
                error=f"{type(exc).__name__}: {exc}",
            )
        return False

    # --- the plans ----------------------------------------------------------------------------

    async def _deliver(self, plan: Deliver) -> bool:
        # Step 1 in a batch with other successes, or alone; a batch that did not take the row
        # (False) leaves it cancelled or ended, so the per-row writes go on from step 2.
        taken = await self._batched(plan.success) if self.batch and not self.capped else None
        if taken or (
            taken is None and await self._terminal(plan.success, cancelled=False, attempt=None)
        ):
            self._count("akter.relay.delivered", kind=RowKind.JOB)
            return True
        if await self._terminal(plan.fallback, cancelled=True, attempt=None):
            return True
        await self._late(plan.cancelled)
        return False

    async def _batched(self, route: Route | None) -> bool | None:
        """Step 1 of a plain success through the coalescer: taken, not taken, or None (alone)."""
        assert self.batch is not None
        write = _write(route, self.traceparent, self.job)
        taken = await self.batch.settle(self.row, write)
        if taken:
            self.outcome = "succeeded"
            if write is not None:
                self.wake()
        return taken

    async def _record_failure(self, plan: RecordFailure) -> bool:
        if plan.first is not None and await self._terminal(
            plan.first, cancelled=True, attempt=None
        ):
            return True
        n = self.row.attempts
        recorded = await self._record(plan)
        then = rules.after_record(plan, recorded, attempt=n, attempts=self.job.options.attempts)
        match then:
            case Stale(late=True):
                await self._late(plan.cancelled)
            case Stale():
                self._log(
                    logging.WARNING,
                    "Job attempt failed after a newer attempt or a settle took its row",
                    cause=plan.failure.cause,
                )
            case EndCancelled():
                return await self._end_cancelled(then)
            case Exhaust():
                return await self._exhaust(then)
            case Retry(cause, ambiguous):
                self._log(
                    logging.WARNING,
                    "Job attempt failed; retrying with backoff",
                    cause=cause,
                    ambiguous=ambiguous,
                )
                self._count("akter.relay.retried", kind=RowKind.JOB)
        return False

    async def _end_cancelled(self, plan: EndCancelled) -> bool:
        n, cause = plan.attempt, plan.cause
        if plan.first is not None and await self._terminal(plan.first, cancelled=True, attempt=n):
            return True
        route = self._cancelled_report(plan) if self.routes_cancelled else None
        end = rules.cancelled_end(plan.outcome, route)
        if end.route is not None:
            return await self._terminal(end.route, cancelled=True, attempt=n)
        if end.dead_letter:
            return await self._dead_letter(n, cause, True, cancelled=True)
        dropped = await self._terminal(None, cancelled=True, attempt=n)
        if dropped:
            self._log(
                logging.INFO, "Cancelled job dropped after a failed attempt", cause=cause, attempt=n
            )
        return dropped

    def _cancelled_report(self, plan: EndCancelled) -> Route | None:
        """The ``on_cancelled`` report of ``plan``; ``None`` when the payload no longer fits."""
        try:
            return routes.cancelled(
                self.job,
                self.row.intent_id,
                self.row.payload,
                plan.attempt,
                {"kind": plan.outcome, "cause": plan.cause},
                self.workflow,
            )
        except RouteRejected:
            return None

    async def _exhaust(self, plan: Exhaust) -> bool:
        n = plan.attempt
        if await self._dead_letter(n, plan.cause, plan.ambiguous, cancelled=False):
            return True
        maybe_applied = await self.gateway.cancelled_at(self.row, attempt=n)
        then = rules.after_lost_letter(plan, maybe_applied)
        return then is not None and await self._end_cancelled(then)

    # --- building blocks ----------------------------------------------------------------------

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
        letter = rules.late(
            cancelled, routes_cancelled=self.routes_cancelled, in_workflow=self.workflow is not None
        )
        if letter == "workflow":
            # The step already took the cancellation (JobCancelled was raised in the workflow).
            self._log(logging.WARNING, "Job of a workflow step succeeded after its cancellation")
        elif letter == "letter":
            route_command = self.job.routes["cancelled"].__name__
            recorded = await self.gateway.insert_late_letter(
                self.row, attempts=self.row.attempts, route=route_command
            )
            if recorded:
                self._log(logging.WARNING, "Job succeeded after its cancellation settled")

    async def _record(self, plan: RecordFailure) -> Recorded | None:
        failure = plan.failure
        found = await self.gateway.record_failure(
            self.row,
            attempt=self.row.attempts,
            cause=failure.cause,
            not_started=failure.not_started,
            ambiguous=failure.ambiguous,
            final=failure.final,
            backoff_ms=plan.backoff_ms,
        )
        return None if found is None else Recorded(*found)

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
        # The text names the job and the cause ("Job dead-lettered after its last attempt: job
        # charge of Order/'o-1' (job id '…'), attempt 3: …"); ``extra`` carries the same fields.
        log.log(
            level,
            "%s: %s%s",
            message,
            job_subject(self.row),
            _detail(fields),
            extra={**self.row.log_fields(), **fields},
        )


def _detail(fields: dict[str, Any]) -> str:
    """The cause (or error) of a job log line, as the tail of its text."""
    cause = fields.get("cause") or fields.get("error")
    tail = f": {cause}" if cause else ""
    return tail + (" (the provider may have applied it)" if fields.get("ambiguous") else "")
