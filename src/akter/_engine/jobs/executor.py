"""The job executor: claims job rows, runs attempts under a lease, settles them (semantics §5).

Interface used by the rest of the runtime (keep it stable):

- ``JobExecutor(services, wake=...)``; ``await start()`` / ``await stop()`` (stop interrupts running
  attempts *without* settling: their rows stay running and ambiguous, taken over after the lease);
- ``await run_pass(keys=()) -> int``: claim due job rows of the job types this runner executes
  (``config.executes``), up to free executor slots, start their attempts as tasks; returns how
  many rows it claimed. ``await claim(p)`` runs it for the pass loop (``akter._engine.lanes``).
  ``keys``: rows a local commit just made due (a jobs-only wake); when they can be, they are
  claimed by primary key, and the full claims run only if that did not take them all;
- ``await wait_idle()``: await every attempt task started so far;
- ``running -> int``: attempts holding an executor slot on this runner;
- ``cancel_signal(job_ids)``: a turn on this runner committed the cancellation of these running
  jobs (semantics §5.8.3): their attempts notice at once;
- ``shift(ms)``: ``ActorTest.advance`` moved the clock: push the leases of attempts this runner is
  executing by ``ms`` so a clock jump never steals a live lease;
- ``progress``: the runner's :class:`~akter._engine.jobs.progress.ProgressHub` (progress
  frames of its attempts; ``subscribe(job_id)``); stopped with the executor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from akter._engine.jobs import rates
from akter._engine.jobs.attempt import Attempt, AttemptRunner
from akter._engine.jobs.claims import (
    ClaimedJob,
    by_stored_name,
    claim_group,
    claim_groups,
    claim_keyed,
    claim_uncapped,
    discover_groups,
    limit_of,
    wake_waiting,
)
from akter._engine.jobs.coalescer import SettleCoalescer
from akter._engine.jobs.progress import ProgressHub
from akter._engine.jobs.streams import StreamLane
from akter._engine.lanes import Claimed, Pass
from akter._store.gateway.job_flow import FlowGateway
from akter._store.gateway.jobs import Group, JobKey, JobsGateway
from akter._store.gateway.streams import StreamsGateway
from akter.errors import InjectedCrash

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter.jobs import Job

log = logging.getLogger("akter.jobs")

#: Largest factor by which a claim widens its per-bucket probe (semantics §3.2).
MAX_WIDEN = 64


class JobExecutor:
    """Runs the job attempts of one runner.

    Args:
        services: The runner's services.
        wake: Asks the pass loop for a pass (a woken group, a routed settle).
        wake_jobs: Asks the pass loop for a pass that need only claim jobs (a freed slot);
            ``wake`` when not given.
    """

    def __init__(
        self,
        services: Services,
        *,
        wake: Callable[[], None],
        wake_jobs: Callable[[], None] | None = None,
    ) -> None:
        self._services = services
        self._relay_wake = wake
        self._slot_wake = wake_jobs or wake
        self.gateway = JobsGateway(services.store, services.clock, services.local)
        self.flow = FlowGateway(services.store, services.clock)
        self._attempts: dict[tuple[str, int], Attempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pass_lock = asyncio.Lock()
        self._widen = 1
        # The last full uncapped claim may have left due rows behind (or none has run yet): a
        # keyed claim would then take fresh rows ahead of them, so the full claim runs.
        self._uncapped_backlog = True
        self._capped_first = False
        self._stopping = False
        #: Admitted attempts that wait for their booked rate token: local start time by job id.
        self._not_before: dict[str, float] = {}
        #: Attempts that ended on this runner (a drain can tell that work finished mid-pass).
        self.finished = 0
        #: Progress frames of this runner's attempts and their subscribers (semantics §5.11).
        self.progress = ProgressHub(services)
        #: Output streams of this runner's attempts (docs/guides/job-streams.md).
        self.streams = StreamLane(StreamsGateway(services.store, services.clock))
        config = services.config
        #: Plain successes settled many per statement (semantics §5.9); per row on Citus.
        self.settles = (
            SettleCoalescer(
                self.gateway,
                services.hooks,
                size=config.settle_batch,
                wait_ms=config.settle_wait_ms,
                freed=self._slot_wake,
            )
            if self.gateway.batched_settles
            else None
        )
        self.runner = AttemptRunner(
            gateway=self.gateway,
            hooks=services.hooks,
            lease_ms=config.job_lease_ms,
            cancel_check_ms=config.cancel_check_ms,
            wake=self._wake,
            progress=self.progress,
            streams=self.streams,
            metrics=services.metrics,
            local=services.local,
            resources=services.resources,
            settles=self.settles,
        )

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Record the executed jobs' deployment-wide caps; passes come from the pass loop."""
        self._stopping = False
        limited = [j for j in self.executed_jobs() if j.options.concurrency is not None]
        await self.flow.record_limits([limit_of(j) for j in limited])
        self.progress.start()

    async def stop(self) -> None:
        """Interrupt running attempts without settling them; settles already started finish."""
        self._stopping = True
        for attempt in list(self._attempts.values()):
            attempt.stopping.set()
        pending = list(self._tasks)
        if pending:
            deadline = self._services.config.drain_deadline_ms / 1000
            _, late = await asyncio.wait(pending, timeout=deadline)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self.settles is not None:
            await self.settles.drain()  # successes queued by attempts cut off above still land
        await self.progress.stop()

    @property
    def running(self) -> int:
        """Attempts that hold an executor slot on this runner.

        An attempt whose success waits for its batched settle holds none (at most
        ``executor_concurrency`` such attempts; ``akter._engine.jobs.coalescer``).
        """
        tasks = len(self._tasks)
        if self.settles is None:
            return tasks
        limit = self._services.config.executor_concurrency
        return tasks - min(self.settles.pending, limit)

    @property
    def unfinished(self) -> int:
        """Attempts started on this runner whose task has not ended.

        Unlike :attr:`running`, a success waiting for its batched settle counts: its row and
        its outcome's route are not written until the flush commits (a test drain waits).
        """
        return len(self._tasks)

    async def wait_idle(self) -> None:
        """Await every attempt started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def cancel_signal(self, job_ids: Iterable[str]) -> None:
        """Cancellations committed on this runner for running jobs: their attempts renew now."""
        wanted = set(job_ids)
        for (job_id, _), attempt in self._attempts.items():
            if job_id in wanted:
                attempt.signal.set()

    async def shift(self, ms: int) -> None:
        """Push the leases of this runner's running attempts by ``ms`` (test clock jumps)."""
        attempts = [a for a in self._attempts.values() if not (a.row.cancelled or a.row.exhausted)]
        if not attempts or ms <= 0:
            return
        moved = await self.gateway.shift_leases(ms, [(a.row, a.row.attempts) for a in attempts])
        for attempt in attempts:
            if attempt.row.intent_id in moved:
                attempt.lease_until = moved[attempt.row.intent_id]

    # --- passes -------------------------------------------------------------------------------

    def executed_jobs(self) -> list[Job[Any, Any]]:
        """The declared jobs this runner executes (``config.executes``)."""
        return self._services.executed_jobs()

    async def claim(self, p: Pass) -> Claimed:
        """A pass's claim (``akter._engine.lanes.Lane``): due rows, unless the pass is quiet."""
        if p.quiet:
            return Claimed()
        return Claimed(await self.run_pass(p.job_keys))

    async def run_pass(self, keys: Sequence[JobKey] = ()) -> int:
        """Claim and start due attempts; returns how many rows were claimed (module docstring)."""
        async with self._pass_lock:
            if self._stopping:
                return 0
            jobs = self.executed_jobs()
            uncapped = [j for j in jobs if j.options.per_actor is None]
            capped = [j for j in jobs if j.options.per_actor is not None]
            # Uncapped types with a deployment-wide cap are claimed one type per claim.
            free_types = [j for j in uncapped if j.options.concurrency is None]
            claimed = await self._claim_keyed(free_types, keys) if keys else 0
            if keys and claimed == len(keys):
                return claimed
            batches = [free_types] if free_types else []
            batches += [[j] for j in uncapped if j.options.concurrency is not None]
            order = [("uncapped", batch) for batch in batches] + [("capped", capped)]
            if batches and capped:
                if self._capped_first:
                    order.reverse()
                self._capped_first = not self._capped_first
            for kind, chosen in order:
                free = self._services.config.executor_concurrency - self.running
                if not chosen or free <= 0:
                    continue
                try:
                    if kind == "uncapped":
                        claimed += await self._claim_uncapped(chosen, free)
                    else:
                        claimed += await self._claim_capped(chosen, free)
                except psycopg.Error as exc:
                    log.warning(
                        "Job claim failed; retrying at the next pass",
                        extra={"error": f"{type(exc).__name__}: {exc}"},
                    )
            return claimed

    async def _claim_uncapped(self, jobs: list[Job[Any, Any]], free: int) -> int:
        cap = jobs[0].options.concurrency if len(jobs) == 1 else None
        if cap is not None:
            # A capped type's claim takes at most its cap, and falls short of ``free`` by design
            # when the cap is full: widening the probe for it would only scan more rows.
            free = min(free, cap)
        try:
            rows, candidates = await claim_uncapped(
                self.gateway,
                jobs=jobs,
                free=free,
                probe=2 * free * (1 if cap is not None else self._widen),
                lease_ms=self._services.config.job_lease_ms,
            )
        except psycopg.errors.LockNotAvailable:
            # Another claimer holds the type's lock past GROUP_LOCK_WAIT (frozen, or slow): the
            # type waits for a later pass, the pass goes on with the other types.
            log.info("A capped job type's lock is held; left for a later pass")
            return 0
        if cap is None:
            if len(rows) < free and candidates > len(rows):
                self._widen = min(self._widen * 2, MAX_WIDEN)
            else:
                self._widen = 1
            self._uncapped_backlog = len(rows) == free or candidates > len(rows)
        by_key = by_stored_name(jobs)
        for row in await self._admit(rows, by_key):
            self._start(row, by_key[(row.actor_type, row.command)])
        return len(rows)

    async def _claim_keyed(self, jobs: list[Job[Any, Any]], keys: Sequence[JobKey]) -> int:
        """Claim the rows a local commit just made due, by key, if nothing else should go first.

        Only rows of uncapped types without a deployment-wide cap, with a free slot each, on
        plain PostgreSQL, and when the last full claim left no due rows behind. Returns how many
        it claimed (0 when it did not try: the caller then runs the full claims).
        """
        by_key = by_stored_name(jobs)
        free = self._services.config.executor_concurrency - self.running
        if (
            self._uncapped_backlog
            or len(keys) > free
            or not self.gateway.keyed_claims
            or any((k.actor_type, k.job) not in by_key for k in keys)
        ):
            return 0
        try:
            rows = await claim_keyed(
                self.gateway, jobs=jobs, keys=keys, lease_ms=self._services.config.job_lease_ms
            )
        except psycopg.Error as exc:
            log.warning(
                "Job claim failed; retrying at the next pass",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            return 0
        for row in await self._admit(rows, by_key):
            self._start(row, by_key[(row.actor_type, row.command)])
        return len(rows)

    async def _claim_capped(self, jobs: list[Job[Any, Any]], free: int) -> int:
        groups = await discover_groups(self.gateway, jobs=jobs, free=free)
        by_key = by_stored_name(jobs)
        claimed, alone = await self._claim_batch(groups, by_key, free)
        for group in alone:
            left = free - claimed
            if left <= 0:
                break
            job = by_key[(group.actor_type, group.command)]
            try:
                rows = await claim_group(
                    self.gateway,
                    group,
                    job=job,
                    free=left,
                    lease_ms=self._services.config.job_lease_ms,
                )
            except psycopg.errors.LockNotAvailable:
                continue  # a turn holds the actor: the group waits for a later pass
            claimed += await self._start_group(rows, job, by_key)
        return claimed

    async def _claim_batch(
        self, groups: list[Group], by_key: dict[tuple[str, str], Job[Any, Any]], free: int
    ) -> tuple[int, list[Group]]:
        """Claim the groups nobody holds in one transaction; (rows claimed, groups left).

        Each group in the batch is given ``min(per_actor, free slots left)``: a group that
        takes fewer leaves its share to the next pass. The groups left over (their lock was
        held, their type has a deployment-wide cap, the batch failed, or Citus) are claimed one
        at a time, each waiting for its lock, as before batching.
        """
        batch: list[tuple[Group, Job[Any, Any], int]] = []
        alone: list[Group] = []
        left = free
        for group in groups:
            job = by_key[(group.actor_type, group.command)]
            if job.options.concurrency is not None or left <= 0:
                alone.append(group)
                continue
            assert job.options.per_actor is not None
            share = min(left, job.options.per_actor)
            batch.append((group, job, share))
            left -= share
        if len(batch) < 2 or not self.gateway.batched_group_claims:
            return 0, groups
        try:
            found = await claim_groups(
                self.gateway, batch, lease_ms=self._services.config.job_lease_ms
            )
        except psycopg.Error as exc:
            # A renewal or settle outlasting the lock wait is expected under load; anything
            # else is worth a warning. Either way nothing of the batch committed (or, if only
            # its commit's answer was lost, its rows are live and the claims below count them).
            level = (
                logging.INFO
                if isinstance(exc, psycopg.errors.LockNotAvailable)
                else logging.WARNING
            )
            log.log(
                level,
                "A batched group claim failed; claiming its groups one at a time",
                extra={"error": f"{type(exc).__name__}: {exc}"},
            )
            return 0, groups
        claimed = 0
        for i, (group, job, _) in enumerate(batch):
            if i in found:
                claimed += await self._start_group(found[i], job, by_key)
            else:
                alone.append(group)
        return claimed, alone

    async def _start_group(
        self,
        rows: list[ClaimedJob],
        job: Job[Any, Any],
        by_key: dict[tuple[str, str], Job[Any, Any]],
    ) -> int:
        """Start a group's claimed attempts that got their rate tokens; how many were claimed."""
        started = await self._admit(rows, by_key)
        for row in started:
            self._start(row, job)
        if len(started) < len(rows):
            # A row handed back for want of a token frees its group's place: the group's
            # next waiting row may start now rather than at its fallback re-check.
            await self._wake_row_group(rows[0])
        return len(rows)

    async def _admit(
        self, rows: list[ClaimedJob], by_key: dict[tuple[str, str], Job[Any, Any]]
    ) -> list[ClaimedJob]:
        """The claimed attempts that got their rate tokens (``job_rates``); the rest wait."""
        if not any(by_key[(r.actor_type, r.command)].options.rates for r in rows):
            return rows
        config = self._services.config
        admitted = await rates.admit(
            self.gateway,
            self.flow,
            rows,
            by_key,
            horizon=rates.horizon_ms(config.poll_ms, config.cancel_check_ms),
            now=self._services.local.now,
        )
        self._not_before.update(admitted.not_before)
        if admitted.defects:
            self._wake()  # the next pass dead-letters them
        return admitted.start

    # --- attempts -----------------------------------------------------------------------------

    def _start(self, row: ClaimedJob, job: Job[Any, Any]) -> None:
        attempt = Attempt(row=row, job=job, not_before=self._not_before.pop(row.intent_id, 0.0))
        key = (row.intent_id, row.attempts)
        self._attempts[key] = attempt
        task = asyncio.create_task(
            self._run(attempt), name=f"akter.job {row.actor_type}.{row.command} #{row.attempts}"
        )
        attempt.task = task
        self._tasks.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self.finished += 1
            self._tasks.discard(finished)
            if self._attempts.get(key) is attempt:
                del self._attempts[key]
            # A freed executor slot may let due rows start now (jobs without routes wake
            # nothing else): ask for a pass instead of waiting for the poll. Only the job claim
            # gains a slot: a routed settle woke the intent lane itself (``Settler.wake``).
            if not self._stopping:
                self._slot_wake()

        task.add_done_callback(done)

    async def _run(self, attempt: Attempt) -> None:
        row = attempt.row
        try:
            if not await self._until_token(attempt):
                return
            await self.runner.run(attempt)
        except InjectedCrash:
            return  # a simulated process death: no further write; the lease runs out
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Job attempt failed unexpectedly", extra=row.log_fields())
        capped = attempt.job.options.per_actor is not None
        if capped and not self._stopping and not attempt.group_woken:
            await self._wake_group(attempt)

    async def _until_token(self, attempt: Attempt) -> bool:
        """Wait, holding the claim, until the attempt's booked rate token is due (F3.3).

        False when the runner stopped first: the attempt is then handed back uncounted (its
        token is lost), as one that got no token is, instead of being left to its lease end and
        taken over as ambiguous though it never started.
        """
        local = self._services.local
        left = attempt.not_before - local.now()
        if left <= 0:
            return True
        sleep = asyncio.create_task(local.sleep(left), name="akter.job rate token")
        stopping = asyncio.create_task(attempt.stopping.wait(), name="akter.job stopping")
        try:
            await asyncio.wait([sleep, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleep, stopping):
                task.cancel()
            await asyncio.gather(sleep, stopping, return_exceptions=True)
        if not attempt.stopping.is_set():
            return True
        # Shielded: a drain that gives up on this task must not abandon the write once sent.
        await asyncio.shield(self.flow.defer_for_tokens([(attempt.row, 0)]))
        return False

    async def _wake_group(self, attempt: Attempt) -> None:
        await self._wake_row_group(attempt.row)

    async def _wake_row_group(self, row: ClaimedJob) -> None:
        try:
            woke = await wake_waiting(self.gateway, row.group)
        except psycopg.Error as exc:
            # A missed wake only delays the waiting row until its fallback re-check.
            log.warning(
                "Waking a waiting job failed",
                extra={**row.log_fields(), "error": f"{type(exc).__name__}: {exc}"},
            )
            return
        if woke:
            self._wake()

    def _wake(self) -> None:
        self._relay_wake()
