"""Settling many plain successes in one statement: the executor's settle coalescer (issue 45).

A finished attempt whose plan is a plain success (semantics §5.9, Succeeded step 1: the
uncancelled row, any attempt, of a job without ``per_actor``) is handed to the runner's
:class:`SettleCoalescer`, which ends many such rows in one statement
(``JobsGateway.end_successes``) under exactly that step's guard and answers, per row, whether the
batch took it. A row it did not take, or every row of a batch that failed, goes on through the
:class:`~akter._engine.jobs.settle.Settler`'s own per-row writes, so cancellation, ended rows, late
successes and ambiguity keep their rules (semantics §5.9).

Group commit: when no flush is in flight a success is flushed at once, with whatever else arrived
in the same turn of the event loop; the successes that arrive while a flush is in flight wait for
it to end, then go together. A second flush starts beside the first only when ``size`` are
waiting or the oldest has waited ``wait_ms``, so a slow statement delays a success by at most one
flush plus ``wait_ms``.

Renewals have stopped when a success is queued (``AttemptRunner`` stops them before any settle),
and no renewal is needed: the batch's guard takes the uncancelled row at *any* attempt, so a
lease that ends while the success waits only lets another runner start the next attempt, the
overlap that an ended lease always allows (semantics §5.7.8); the first success still routes,
once. Should this process die with successes queued, their rows stay running under the lease the
claim or last renewal wrote, and are claimed again once it ends: the attempt runs again
(at-least-once, semantics §5.7.8), and its success routes once.

A job id already queued or in flight is not queued again (another attempt of the same job on this
runner): that success is settled on its own, so one statement never names a row twice.

A success handed to the coalescer has finished executing: the executor does not count it among
its busy slots (:attr:`SettleCoalescer.pending`, at most ``executor_concurrency`` of them), and
``freed`` asks for a pass at once, so the next claim runs beside the flush instead of after it,
as the intent lane frees a delivery's slot while its delete is under way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from akter.errors import InjectedCrash

if TYPE_CHECKING:
    from akter._engine.hooks import Hooks
    from akter._store.gateway.jobs import ClaimedJob, JobsGateway, RouteWrite

log = logging.getLogger("akter.jobs")

#: What a queued success is answered: taken, not taken, the batch failed (``None``), or a
#: simulated process death at ``before_settle_flush`` (re-raised in the attempt's task).
Answer = bool | InjectedCrash | None


@dataclass(frozen=True, slots=True)
class _Waiting:
    row: ClaimedJob
    route: RouteWrite | None
    answer: asyncio.Future[Answer]
    since: float


class SettleCoalescer:
    """Ends many plain successes in one statement (module docstring); one per executor.

    Args:
        gateway: The executor's job statements.
        hooks: Fault-injection points (``before_settle_flush``).
        size: The most successes one statement ends; also starts a flush beside one in flight.
        wait_ms: The longest a success waits behind a flush in flight before its own starts.
        freed: Called when a success is queued: its executor slot is free (module docstring).
    """

    def __init__(
        self,
        gateway: JobsGateway,
        hooks: Hooks,
        *,
        size: int,
        wait_ms: int,
        freed: Callable[[], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.hooks = hooks
        self.freed = freed
        self.size = size
        self.wait = wait_ms / 1000
        self._queue: list[_Waiting] = []
        self._ids: set[str] = set()
        self._flushes: set[asyncio.Task[None]] = set()
        #: Flushes started that have not taken their batch yet (each will take up to ``size``).
        self._unstarted = 0
        self._timer: asyncio.TimerHandle | None = None
        #: Statements sent and successes they carried (what a test or a bench reads).
        self.flushed = 0
        self.carried = 0

    @property
    def waiting(self) -> int:
        """Successes queued for a flush that has not taken them yet."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Successes queued or in a flush in flight (their attempts await the answer)."""
        return len(self._ids)

    async def settle(self, row: ClaimedJob, route: RouteWrite | None) -> bool | None:
        """Queue a plain success; True iff a batch ended its row, None: settle it on its own.

        False: the batch's guard did not hold (the row is cancelled or already ended). A caller
        cancelled while it waits does not withdraw the success: it is flushed all the same.
        """
        if row.intent_id in self._ids:
            return None
        loop = asyncio.get_running_loop()
        waiting = _Waiting(row, route, loop.create_future(), loop.time())
        self._ids.add(row.intent_id)
        self._queue.append(waiting)
        if not self._flushes or len(self._queue) >= self.size * (self._unstarted + 1):
            self._start()
        elif self._timer is None:
            self._timer = loop.call_at(self._queue[0].since + self.wait, self._on_timer)
        if self.freed is not None:
            self.freed()
        answer = await asyncio.shield(waiting.answer)
        if isinstance(answer, InjectedCrash):
            raise InjectedCrash(answer.point)
        return answer

    async def drain(self) -> None:
        """Flush every queued success and await the flushes in flight (a stopping executor)."""
        while self._queue or self._flushes:
            if self._queue and not self._flushes:
                self._start()
            await asyncio.gather(*list(self._flushes), return_exceptions=True)

    # --- flushes ------------------------------------------------------------------------------

    def _start(self) -> None:
        # The flush takes its batch when it first runs: successes queued in the same turn of
        # the event loop go with it.
        task = asyncio.get_running_loop().create_task(self._flush(), name="akter.job settle flush")
        self._flushes.add(task)
        self._unstarted += 1
        task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._flushes.discard(task)
        if self._queue and not self._flushes:
            self._start()  # what arrived while the flush was in flight goes now

    def _on_timer(self) -> None:
        self._timer = None
        if self._queue:
            self._start()

    async def _flush(self) -> None:
        self._unstarted -= 1
        batch = self._queue[: self.size]
        del self._queue[: self.size]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queue:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(self._queue[0].since + self.wait, self._on_timer)
        if not batch:
            return
        answers: dict[str, Answer] = {}
        try:
            answers = await self._write(batch)
        finally:
            for waiting in batch:
                self._ids.discard(waiting.row.intent_id)
                if not waiting.answer.done():
                    waiting.answer.set_result(answers.get(waiting.row.intent_id))

    async def _write(self, batch: list[_Waiting]) -> dict[str, Answer]:
        """The statement of one batch: each success's answer by job id."""
        # In key order: two flushes in flight lock the rows they share in the same order.
        batch = sorted(batch, key=lambda w: (w.row.routing_key, w.row.intent_id))
        ids = [w.row.intent_id for w in batch]
        try:
            await self.hooks.at("before_settle_flush", {"job_ids": ids, "size": len(ids)})
        except InjectedCrash as crash:
            return dict.fromkeys(ids, crash)
        try:
            taken = await self.gateway.end_successes([(w.row, w.route) for w in batch])
        except Exception as exc:
            # Nothing of the batch changed (or only its answer was lost): each success is
            # settled by its own guarded writes, which find what the batch did.
            log.warning(
                "A batched settle of %d job successes failed; each is settled on its own: %s",
                len(batch),
                f"{type(exc).__name__}: {exc}",
                extra={"jobs": len(batch), "error": f"{type(exc).__name__}: {exc}"},
            )
            return {}
        self.flushed += 1
        self.carried += len(batch)
        return {job_id: job_id in taken for job_id in ids}
