"""Running one job attempt under its lease (semantics §5.7).

The attempt is measured on this runner from when its last claim or renewal was *sent*, so the
database's lease, computed from a later instant, always ends after the local one: an attempt
that outlives its local lease is interrupted (or never started) before another runner can take
the row. While the executor runs, the lease is renewed every ``cancel_check``, or at once on
this runner's cancellation signal; a renewal also reports a cancellation committed anywhere.
Renewals are stopped and awaited before any settle write, so a late renewal cannot replace a
failure's backoff with a fresh lease.

A synchronous (plain ``def``) executor runs in a thread that nothing can stop. When its attempt
ends while the thread still runs (a timeout, a cancellation, a lost local lease, a stopping
runner), the attempt holds its slot until the thread returns: it keeps renewing the row's lease
(the row stays running, so the deployment-wide cap, ``per_actor`` and the job's next attempt all
count it) and settles only then, with the outcome the attempt ended with; whatever the thread
returns or raises after that is discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from opentelemetry import trace
from pydantic import ValidationError

from akter import telemetry
from akter._engine import parking
from akter._engine.jobs import rules
from akter._engine.jobs.claims import ClaimedJob, job_subject
from akter._engine.jobs.rules import (
    Abandoned,
    Failed,
    Failure,
    Rejected,
    Reported,
    Stop,
    Unattempted,
)
from akter._engine.jobs.settle import Settler
from akter._local_clock import LocalClock
from akter._store.gateway.streams import StreamKey
from akter._waits import wait_event
from akter.callers import System, caller_from_json
from akter.errors import JobFailure
from akter.jobs import AttemptCall
from akter.telemetry import tracer

if TYPE_CHECKING:
    from akter._engine.hooks import HookInfo, Hooks
    from akter._engine.jobs.coalescer import SettleCoalescer
    from akter._engine.jobs.progress import ProgressHub
    from akter._engine.jobs.progress_slot import ProgressSlot
    from akter._engine.jobs.streams import StreamLane, StreamWriter
    from akter._store.gateway.jobs import JobsGateway
    from akter.jobs import Job
    from akter.resources import OpenResources
    from akter.telemetry import Metrics

log = logging.getLogger("akter.jobs")

#: Too-new rows are logged once per (type, job, version) per hour.
_too_new_log = parking.OncePer(3600)

#: How long before the local lease end an attempt stops (whole-ms flooring, timer jitter).
DEADLINE_MARGIN_MS = 25


@dataclass
class Attempt:
    """One attempt in flight on this runner: its claim and the signals that reach it.

    Attributes:
        row: The claim.
        job: The job declaration.
        signal: Set by this runner's cancellation of the job (one fired since the claim counts).
        stopping: Set by a stopping runner: interrupt without settling.
        lease_until: The database lease end last written (claim, renewal or clock shift).
        confirmed: Monotonic send time of the last successful claim or renewal.
        task: The task running the attempt.
        traceparent: The attempt's span (W3C text) once started: its route continues it.
    """

    row: ClaimedJob
    job: Job[Any, Any]
    signal: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    lease_until: int = 0
    confirmed: float = 0.0
    task: asyncio.Task[None] | None = None
    traceparent: str | None = None
    #: The payload decoded under this code (migrated and validated) once the claim is usable.
    payload: dict[str, Any] = field(default_factory=dict)
    #: Its settle's transaction already woke the capped group's next waiting row.
    group_woken: bool = False
    #: Local monotonic time before which it must not start (its booked rate token is due).
    not_before: float = 0.0
    #: A synchronous executor's thread, once started (it may outlive the attempt).
    thread: asyncio.Future[Any] | None = None

    def __post_init__(self) -> None:
        self.lease_until = self.row.claimed_until
        self.confirmed = self.row.sent_at


class AttemptRunner:
    """Runs claimed rows: executes, renews, interrupts and settles (one per executor).

    Args:
        gateway: The executor's job statements.
        hooks: Fault-injection points.
        lease_ms: The executor lease.
        cancel_check_ms: The renewal interval.
        wake: Wakes the relay after a routed settle.
        progress: The runner's progress hub (frames reported by executors).
        streams: The runner's job output streams (``call.stream``).
        metrics: The runner's metrics (dead letters, job deliveries and retries).
        local: The local clock the lease deadline is measured and slept on.
        resources: The runner's job resources (``call.resource``).
        settles: The runner's settle coalescer (plain successes in batches), if any.
    """

    def __init__(
        self,
        *,
        gateway: JobsGateway,
        hooks: Hooks,
        lease_ms: int,
        cancel_check_ms: int,
        wake: Callable[[], None],
        progress: ProgressHub | None = None,
        streams: StreamLane | None = None,
        metrics: Metrics | None = None,
        local: LocalClock | None = None,
        resources: OpenResources | None = None,
        settles: SettleCoalescer | None = None,
    ) -> None:
        self.local = local or LocalClock()
        self.settles = settles
        self.resources = resources
        self.gateway = gateway
        self.hooks = hooks
        self.lease_ms = lease_ms
        self.cancel_check_ms = cancel_check_ms
        self.wake = wake
        self.progress = progress
        self.streams = streams
        self.metrics = metrics

    def settler(self, attempt: Attempt) -> Settler:
        """The settler of one claim."""
        return Settler(
            gateway=self.gateway,
            hooks=self.hooks,
            job=attempt.job,
            row=attempt.row,
            retry_every=self.cancel_check_ms / 1000,
            wake=self.wake,
            metrics=self.metrics,
            batch=self.settles,
        )

    async def run(self, attempt: Attempt) -> bool:
        """Run one claimed row and settle it; True iff the row reached a terminal settle.

        A terminal settle closes the job's progress (semantics §5.11) and its output stream;
        any other end leaves them open for a later attempt.
        """
        slot = self._open_progress(attempt)
        writer = self._open_stream(attempt)
        settler = self.settler(attempt)
        terminal = False
        try:
            terminal = await self._run(attempt, slot, settler, writer)
            return terminal
        finally:
            attempt.group_woken = settler.group_woken
            if writer is not None:
                await writer.finish()
                if terminal:
                    await writer.close(settler.outcome)
            if slot is not None:
                if terminal:
                    await slot.close(settler.outcome)
                else:
                    slot.release()

    def _open_stream(self, attempt: Attempt) -> StreamWriter | None:
        if self.streams is None:
            return None
        row = attempt.row
        key = StreamKey(row.routing_key, row.tenant_id, row.actor_type, row.actor_id, row.intent_id)
        begun = row.attempts > 1 or row.cancelled or row.exhausted
        return self.streams.writer(key, row.attempts, begun=begun)

    def _open_progress(self, attempt: Attempt) -> ProgressSlot | None:
        if self.progress is None:
            return None
        row = attempt.row
        return self.progress.open(
            ref=row.ref,
            job_id=row.intent_id,
            job=row.command,
            attempt=row.attempts,
            model=attempt.job.options.progress,
            every_ms=attempt.job.options.progress_every_ms,
            lease_until=lambda: attempt.lease_until,
        )

    async def _run(
        self,
        attempt: Attempt,
        slot: ProgressSlot | None,
        settler: Settler,
        writer: StreamWriter | None,
    ) -> bool:
        row = attempt.row
        if row.cancelled or row.exhausted:
            return await settler.settle(Unattempted())
        info = settler.info()
        decoded = parking.decode_job(attempt.job, row.payload, row.payload_version)
        if not isinstance(decoded, parking.Decoded):
            await self._undeliverable(attempt, info, decoded)
            return False
        attempt.payload = decoded.payload
        await self.hooks.at("after_claim", info)
        await self.hooks.at("before_execute", info)
        lease = self.lease_ms / 1000
        if self.local.now() - attempt.confirmed >= lease:
            _warn(row, "Job attempt outlived its lease before it started")
            return False
        if writer is not None:
            writer.start()
        execution = asyncio.create_task(
            self._execute(attempt, slot, writer),
            name=f"akter.job {row.actor_type}.{row.command} {row.intent_id}",
        )
        watchers = await self._watch(attempt, execution, slot, writer)
        # A sync executor's thread that outlived the attempt keeps its slot and its lease.
        await self._hold_thread(attempt)
        if writer is not None:
            await writer.finish()  # its chunks land before its settle (and the close)
        settler.traceparent = attempt.traceparent
        executed: Reported | None = None
        if not execution.cancelled() and execution.exception() is None:
            executed = execution.result()
            if not isinstance(executed, Failed):
                await self.hooks.at("after_execute", info)
        ended = rules.report(executed, _stop(*watchers))
        if isinstance(ended, Abandoned):
            if ended.warning is not None:
                _warn(row, ended.warning)
            return False
        return await settler.settle(ended)

    async def _watch(
        self,
        attempt: Attempt,
        execution: asyncio.Task[Reported],
        slot: ProgressSlot | None,
        writer: StreamWriter | None,
    ) -> list[asyncio.Task[Stop]]:
        """Wait until the execution ends or a lease watcher stops it; the watchers that ran.

        One turn of the event loop first: an executor that awaits nothing has then returned
        before any watcher could answer (none is due within a turn; a stop or a cancellation
        that came in it loses to the returned outcome, as in the race below), so it settles
        without three watcher tasks to start and tear down: the no-op job's common case.
        """
        watchers: list[asyncio.Task[Any]] = []
        try:
            await asyncio.sleep(0)
            if not execution.done():
                watchers = [
                    asyncio.create_task(self._renewals(attempt), name="akter.job renewals"),
                    asyncio.create_task(self._deadline(attempt), name="akter.job deadline"),
                    asyncio.create_task(attempt.stopping.wait(), name="akter.job stopping"),
                ]
                await asyncio.wait([execution, *watchers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Renewals are stopped and awaited before anything is settled.
            for task in watchers:
                task.cancel()
            if watchers:
                await asyncio.gather(*watchers, return_exceptions=True)
            if not execution.done():
                execution.cancel()
                # Whatever the interrupted executor then returns or raises is ignored.
                await asyncio.gather(execution, return_exceptions=True)
            if slot is not None:
                slot.end()
            if writer is not None:
                writer.end()
        return watchers[:2]

    async def _undeliverable(
        self,
        attempt: Attempt,
        info: HookInfo,
        outcome: parking.TooNew | parking.Unusable,
    ) -> None:
        """A claim this code cannot run (evolution E3): hand it back uncounted, or park it."""
        row = attempt.row
        if isinstance(outcome, parking.TooNew):
            await _shielded(
                self.gateway.unclaim(
                    row,
                    park=False,
                    error=f"PayloadTooNew: {outcome.message}",
                    wait_ms=parking.TOO_NEW_WAIT_MS,
                )
            )
            if _too_new_log.allow(row.actor_type, row.command, row.payload_version):
                _warn(
                    row, "Job row at a payload version above this code's; left for a newer runner"
                )
            return
        await self.hooks.at("before_park", info)
        if await _shielded(self.gateway.unclaim(row, park=True, error=outcome.cause[:2000])):
            _warn(row, "Job row parked: this code cannot run it", reason=outcome.cause)

    # --- the executor -------------------------------------------------------------------------

    async def _execute(
        self, attempt: Attempt, slot: ProgressSlot | None, writer: StreamWriter | None
    ) -> Reported:
        """Run the executor in its client span (semantics §10.2) and classify its exit."""
        row = attempt.row
        attributes: dict[str, str | int] = {
            "actor.type": row.actor_type,
            "actor.tenant": row.tenant_id,
            "actor.id": row.actor_id,
            "job.name": row.command,
            "job.id": row.intent_id,
            "job.attempt": row.attempts,
        }
        with tracer.start_as_current_span(
            f"akter.job/{row.actor_type}/{row.command}",
            context=telemetry.stored_context(row.traceparent),  # the turn that enqueued it
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            attempt.traceparent = telemetry.traceparent_of(span)
            reported = await self._classified(attempt, slot, writer)
            if isinstance(reported, Failed | Rejected):
                span.set_status(trace.StatusCode.ERROR, reported.failure.cause)
            return reported

    async def _classified(
        self, attempt: Attempt, slot: ProgressSlot | None, writer: StreamWriter | None
    ) -> Reported:
        """Run the executor under its timeout and classify its exit (semantics §5.2)."""
        row, job = attempt.row, attempt.job
        assert job.payload_model is not None
        try:
            payload = job.payload_model.model_validate(attempt.payload)
        except ValidationError as exc:
            return Failed(
                Failure(
                    f"The stored payload no longer validates: {_first_error(exc)}",
                    ambiguous=False,
                    not_started=True,
                )
            )
        caller = caller_from_json(row.caller)
        call = AttemptCall(
            job_id=row.intent_id,
            attempt=row.attempts,
            principal=caller.on_behalf_of if isinstance(caller, System) else None,
            ref=row.ref,
            report=slot.report if slot is not None else None,
            resources=self.resources,
            stream=writer.stream if writer is not None else None,
        )
        timeout_ms = job.options.timeout_ms
        try:
            async with asyncio.timeout(timeout_ms / 1000) as scope:
                if job.is_async:
                    value = await job.fn(call, payload)
                else:
                    attempt.thread = _in_thread(job.fn, call, payload)
                    # Shielded: the timeout ends the wait, never the thread; _hold_thread
                    # awaits the thread before the attempt gives its slot back.
                    value = await asyncio.shield(attempt.thread)
        except JobFailure as exc:
            return Failed(Failure(_cause(exc), ambiguous=False, final=exc.final))
        except TimeoutError as exc:
            if scope.expired():
                return Failed(Failure(f"Executor timed out after {timeout_ms} ms", ambiguous=True))
            return Failed(Failure(_cause(exc), ambiguous=True))
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the runtime interrupted the attempt
            return Failed(Failure(_cause(exc), ambiguous=True))
        except Exception as exc:
            return Failed(Failure(_cause(exc), ambiguous=True))
        return rules.classify_value(job, row, value)

    # --- the lease ----------------------------------------------------------------------------

    async def _renewals(self, attempt: Attempt) -> Stop:
        """Renew every ``cancel_check`` or at once on the local signal, until lost or cancelled."""
        row = attempt.row
        every = self.cancel_check_ms / 1000
        while True:
            await wait_event(attempt.signal, every)
            attempt.signal.clear()
            sent = self.local.now()
            try:
                await self.hooks.at("before_renew", self.settler(attempt).info())
                renewed = await _shielded(self._renew(attempt))
            except psycopg.Error as exc:
                _warn(row, "Job lease renewal failed", error=_cause(exc))
                continue
            if renewed is None:
                return "lost"
            cancelled, lease_until = renewed
            attempt.confirmed = max(attempt.confirmed, sent)
            attempt.lease_until = max(attempt.lease_until, lease_until)
            if cancelled:
                return "cancelled"

    async def _hold_thread(self, attempt: Attempt) -> None:
        """Await a sync executor's thread that outlived its attempt, renewing the lease.

        The row stays running at attempt N with a live lease, so no claim anywhere gives its
        slot away or starts the next attempt while the thread runs. A renewal that finds the row
        gone (another attempt took it over after renewals failed for a whole lease, or a settle
        ended it) stops renewing; the local slot is still held until the thread returns.
        """
        thread = attempt.thread
        if thread is None or thread.done():
            return
        row = attempt.row
        _warn(
            row,
            "Job attempt ended but its synchronous executor is still running; its slot and lease"
            " stay held until the thread returns, and what it returns then is discarded",
        )
        renewing = True
        while not thread.done():
            if renewing:
                sent = self.local.now()
                try:
                    renewed = await _shielded(self._renew(attempt))
                except psycopg.Error as exc:
                    _warn(row, "Job lease renewal failed", error=_cause(exc))
                else:
                    if renewed is None:
                        renewing = False
                    else:
                        attempt.confirmed = max(attempt.confirmed, sent)
                        attempt.lease_until = max(attempt.lease_until, renewed[1])
            await asyncio.wait([thread], timeout=self.cancel_check_ms / 1000)
        # Retrieve the discarded outcome so that asyncio does not log it as never retrieved.
        if not thread.cancelled():
            thread.exception()

    async def _renew(self, attempt: Attempt) -> tuple[bool, int] | None:
        row = attempt.row
        return await self.gateway.renew(row, attempt=row.attempts, lease_ms=self.lease_ms)

    async def _deadline(self, attempt: Attempt) -> Stop:
        """Return once the local lease (last confirmed send + lease − margin) has passed.

        The database computes its lease end from its own statement time, floored to whole
        milliseconds; the margin keeps the runner's stop strictly before it.
        """
        lease = (self.lease_ms - DEADLINE_MARGIN_MS) / 1000
        while True:
            left = attempt.confirmed + lease - self.local.now()
            if left <= 0:
                return "deadline"
            await self.local.sleep(left)


async def _shielded(operation: Any) -> Any:
    """Await a statement that must not be abandoned once sent: a cancel waits for its answer."""
    task = asyncio.ensure_future(operation)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


def _in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """Run ``fn(*args)`` in the default executor, in a copy of this context (``to_thread``)."""
    loop = asyncio.get_running_loop()
    run = functools.partial(contextvars.copy_context().run, fn, *args)
    return loop.run_in_executor(None, run)


def _stop(*watchers: asyncio.Task[Stop]) -> Stop:
    """What the first lease watcher that answered says stopped the attempt (else ``stopped``)."""
    for task in watchers:
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()
    return "stopped"


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    return str(errors[0]["msg"]) if errors else str(exc)


def _warn(row: ClaimedJob, message: str, **fields: Any) -> None:
    # The text names the job ("…: job charge of Order/'o-1' (job id '…'), attempt 2: cause");
    # ``extra`` carries the same identities for structured handlers.
    why = fields.get("reason") or fields.get("error")
    tail = f": {why}" if why else ""
    log.warning("%s: %s%s", message, job_subject(row), tail, extra={**row.log_fields(), **fields})
