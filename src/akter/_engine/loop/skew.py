"""Clock skew: lease-like rows written before the database clock moved back (semantics §1.7).

Every lease, claim and heartbeat is written from the framework clock, so on a correct clock none
lies further ahead of "now" than the lead its writer gives it (the bounds are listed on
:class:`akter._store.pool.Clock`). When the database clock moves back (an NTP step, a failover
to a host with another clock; ``clock_offset`` in drills), rows written before the move stay
ahead by the whole jump, and a takeover that waits for them to end would stall that long. So a
row further ahead than twice its lead + ``SKEW_MARGIN_MS`` (``Clock.skew_ms``) is treated as
ended, with a warning naming the skew:

- singleton leases: in ``acquire_singleton`` itself (every contender agrees, row by row);
- runner heartbeats: in ``live_runners`` (not live) and ``prune_runners`` (forgotten);
- job attempt leases and relay claims (outbox rows): ``release_skewed_jobs`` and
  ``release_skewed_intents`` make them due now, so the ordinary claims take them over as after
  a lease end. A pass starts a check at most every ``SKEW_CHECK_MS``, beside itself (the next
  passes claim what it released; a test's drain waits for it instead): the job statement
  when the probe sees a running attempt's lease end further ahead than a lease can (the probe
  reads the newest by the running-jobs index; statements later in the session see a later clock,
  so a lease the probe does not see skewed is not skewed for the release either), the intent
  statement only when a skew is suspected, because claimed intents have no index of their own
  and a scan would read every sleeping timer. A skew is suspected when this runner's probe sees
  the database clock behind where it was (less the monotonic time elapsed), a heartbeat or
  singleton lease ahead of the clock, or a skewed job lease.

A live owner whose row is taken this way (it was written just before the move, and the owner
has not rewritten it yet) loses it as if its lease had ended: its commands are fenced
(singletons), its settles are guarded by attempt (jobs) and claim token (intents), and an
intent's delivery replays under its receipt. Only the overlap of the old and new owner's
*work* is not prevented, as after any lost lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from akter._store.gateway.skew import Released, SkewGateway, SkewProbe, SkewSession
from akter._store.pool import SKEW_MARGIN_MS

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter.jobs import Job

log = logging.getLogger("akter.clock")

#: How often (monotonic) a runner probes for skew and releases skewed outbox rows.
SKEW_CHECK_MS = 5_000
#: Most outbox rows one release statement rewrites (the next check takes the rest).
SKEW_BATCH = 1_000
#: Most row identities one warning lists.
_LISTED = 20


class SkewWatch:
    """One runner's clock-skew checks, run from its passes (``akter._engine.loop.passes``).

    Args:
        services: The runner's services.
        executed_jobs: The job types this runner executes (the executor's).
        runner_id: This runner's id (named in the warning of a backward clock move).
    """

    def __init__(
        self,
        services: Services,
        *,
        executed_jobs: Callable[[], Sequence[Job[Any, Any]]],
        runner_id: str,
    ) -> None:
        self._services = services
        self._gateway = SkewGateway(services.store, services.clock)
        self._executed_jobs = executed_jobs
        self._runner_id = runner_id
        self._next_check = 0.0
        self._task: asyncio.Task[None] | None = None
        # The last probe: the framework clock and the monotonic time.
        self._last: tuple[int, float] | None = None
        #: Whether a backward clock move is suspected: the next check looks at claimed intents.
        self.suspected = False

    def _due(self, now: float, *, force: bool = False) -> bool:
        """Whether a check may run at monotonic ``now``: never during a clock jump."""
        return (force or now >= self._next_check) and not self._services.clock.jumping

    def observe(self) -> None:
        """From a live pass: start a due check in the background; the pass does not wait.

        The probe reads across the shards on Citus (hundreds of milliseconds under load): run
        inside the pass, every claim behind it waited that long once per check.
        """
        if self._task is not None and not self._task.done():
            return
        if not self._due(time.monotonic()):
            return
        self._task = asyncio.create_task(self._checked(), name="akter.relay.skew")

    async def _checked(self) -> None:
        try:
            await self.check()
        except Exception:
            # A bug, not an outage (check() says those): loudly; the next check runs anyway.
            log.exception("Clock skew check raised unexpectedly")

    async def stop(self) -> None:
        """Cancel a check under way."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def check(self, *, force: bool = False) -> None:
        """Probe for skew and release skewed rows, unless the last check is recent (``force``)."""
        started = time.monotonic()
        if not self._due(started, force=force):
            return
        self._next_check = started + SKEW_CHECK_MS / 1000
        try:
            async with self._gateway.session() as session:
                probe, sent = await session.probe()
                self._judge(probe, sent)
                await self._release_jobs(session, probe)
                if self.suspected:
                    await self._release_intents(session)
        except (psycopg.Error, OSError) as exc:
            log.warning("Clock skew check failed", extra={"error": str(exc)})

    async def _release_jobs(self, session: SkewSession, probe: SkewProbe) -> None:
        jobs = self._executed_jobs()
        if not jobs:
            return
        config = self._services.config
        skew_ms = self._services.clock.skew_ms(config.job_lease_ms)
        ahead = probe.job_lease_ahead_ms
        if ahead is None or ahead <= skew_ms:
            return  # no running attempt's lease lies ahead further than a lease can
        rows = await session.release_jobs(
            skew_ms=skew_ms,
            types=[j.owner.name if j.owner else "" for j in jobs],
            jobs=[j.name for j in jobs],
            limit=SKEW_BATCH,
        )
        if rows:
            self.suspected = True
            _warn(
                "Released job leases ahead of the database clock (it moved back)",
                rows,
                [r.name for r in rows],
            )

    async def _release_intents(self, session: SkewSession) -> None:
        config = self._services.config
        types = sorted(self._services.registry.definitions) if config.host_actors else []
        if not types:
            return
        lead = max(config.claim_lease_ms, config.max_backoff_ms)
        rows = await session.release_intents(
            skew_ms=self._services.clock.skew_ms(lead), types=types, limit=SKEW_BATCH
        )
        if rows:
            _warn(
                "Released intent claims ahead of the database clock (it moved back)",
                rows,
                [r.name for r in rows],
            )
        if len(rows) < SKEW_BATCH:
            self.suspected = False

    def _judge(self, probe: SkewProbe, at: float) -> None:
        now = probe.now
        clock = self._services.clock
        # The framework clock, offset included: a drill's offset moved back is a clock moved
        # back; ActorTest.advance only moves it forward.
        last, self._last = self._last, (now, at)
        if last is not None:
            expected = last[0] + int((at - last[1]) * 1000)
            behind = expected - now
            if behind > SKEW_MARGIN_MS:
                self.suspected = True
                log.warning(
                    "The database clock moved back",
                    extra={"runner_id": self._runner_id, "skew_ms": behind},
                )
        heartbeat = probe.heartbeat_ahead_ms
        lease = probe.lease_ahead_ms
        if heartbeat is not None and heartbeat > clock.skew_ms(0):
            self.suspected = True
        if lease is not None and lease > clock.skew_ms(self._services.config.singleton_lease_ms):
            self.suspected = True


def _warn(message: str, rows: list[Released], names: list[str]) -> None:
    log.warning(
        message,
        extra={
            "released": len(rows),
            "skew_ms": max(r.ahead_ms for r in rows),
            "rows": names[:_LISTED],
        },
    )
