"""Admission backpressure on the outbox backlog (``max_outbox_backlog``).

When senders commit intents faster than the relays deliver them, the due rows pile up without
bound and every intent's latency grows with the pile. The gate refuses new *external* commands
with ``RunnerAtCapacity`` (retryable, with ``retry_after``) while the backlog this runner's relay
sees is at the bound, or would reach it within one sample interval at the last measured growth.
Deliveries, singleton loops and job routes are internal and always admitted: they are what drains
the backlog.

How the backlog is measured, cheaply:

- a relay claim that took fewer rows than it asked for has seen every due row of the hosted
  types, so the backlog is below one lane and the gate opens at once, with no statement;
- only while claims come back full (the relay is saturated) does the gate count the due rows,
  at most once per ``SAMPLE_EVERY_S``, with a bounded statement (``count_intent_backlog``: 256
  bucket probes that stop after ``bound + 1`` rows), off the pass and on the framework pool.

An idle runner therefore never runs the count. A runner without a relay has no view of the
backlog and admits everything (the runners that relay refuse for it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

import psycopg

from akter.errors import ActorError

log = logging.getLogger("akter.backlog")

#: The shortest interval between two counts while the relay is saturated.
SAMPLE_EVERY_S = 0.5

Count = Callable[[int], Awaitable[int]]


class BacklogGate:
    """Refuses external commands while the sampled outbox backlog is at its bound.

    Args:
        bound: Reads ``max_outbox_backlog``: the due, undelivered intents at which admission
            stops (``None``: never). Read at each use, so a ``reconfigure`` before start holds.
        count: Counts due intents of the hosted types, stopping at the limit it is given.
        clock: A monotonic clock (tests may pass their own).
    """

    def __init__(
        self,
        bound: Callable[[], int | None],
        count: Count,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._bound = bound
        self._count = count
        self._clock = clock
        #: The last sampled backlog (0 once a claim saw every due row).
        self.backlog = 0
        #: Growth over the next sample interval, projected from the last two samples.
        self._growth = 0.0
        self._sampled_at = -SAMPLE_EVERY_S
        self._counted_at = 0.0
        self._task: asyncio.Task[None] | None = None
        #: How many counts this gate has run.
        self.samples = 0
        #: How many commands it refused.
        self.refused = 0
        self._changed = asyncio.Event()

    @property
    def refusing(self) -> bool:
        """True while new external commands are refused."""
        bound = self._bound()
        return bound is not None and self.backlog + self._growth >= bound

    def admit(self, command_id: str) -> None:
        """Raise ``RunnerAtCapacity`` if the backlog is at its bound (an external command)."""
        if not self.refusing:
            return
        self.refused += 1
        raise ActorError(
            "RunnerAtCapacity",
            f"The outbox holds about {self.backlog} undelivered intents "
            f"(max_outbox_backlog={self._bound()}); retry after the relays catch up.",
            # Within a handle's own wait limit (akter._ids.FUTURE_WAIT_MS), so handles retry.
            retry_after=SAMPLE_EVERY_S * random.uniform(0.8, 1.2),
            command_id=command_id,
        )

    def observe(self, saturated: bool) -> None:
        """After a pass: ``saturated`` when a lane's last claim took every row it asked for."""
        if self._bound() is None:
            return
        if not saturated:
            if self.backlog:
                self.backlog, self._growth = 0, 0.0
                self._counted_at = self._clock()
                self._signal()
            return
        now = self._clock()
        if now - self._sampled_at < SAMPLE_EVERY_S or self._busy:
            return
        self._sampled_at = now
        self._task = asyncio.create_task(self._sample(), name="akter.relay.backlog")

    @property
    def _busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _sample(self) -> None:
        bound = self._bound()
        if bound is None:
            return
        try:
            counted = await self._count(bound + 1)
        except (psycopg.Error, OSError) as exc:
            # The last sample stands; the next saturated pass tries again.
            log.warning("Outbox backlog sample failed", extra={"error": str(exc)})
            return
        now = self._clock()
        elapsed = max(now - self._counted_at, SAMPLE_EVERY_S)
        self._growth = max(0, counted - self.backlog) * SAMPLE_EVERY_S / elapsed
        self.backlog, self._counted_at = counted, now
        self.samples += 1
        self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, samples: int) -> None:
        """Wait until this gate has run ``samples`` counts (tests)."""
        while self.samples < samples:
            await self._changed.wait()

    async def stop(self) -> None:
        """Cancel a count under way."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
