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
  a lease end. They run from the relay pass, at most every ``SKEW_CHECK_MS``: the job statement
  each time (it only looks at running rows, a handful by the running-jobs index), the intent
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

import logging
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from akter._store.pool import SKEW_MARGIN_MS

if TYPE_CHECKING:
    from akter.runtime import Runtime

log = logging.getLogger("akter.clock")

#: How often (monotonic) a runner probes for skew and releases skewed outbox rows.
SKEW_CHECK_MS = 5_000
#: Most outbox rows one release statement rewrites (the next check takes the rest).
SKEW_BATCH = 1_000
#: Most row identities one warning lists.
_LISTED = 20


class SkewWatch:
    """One runner's clock-skew checks, run from its relay passes."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._next_check = 0.0
        # The last probe: the framework clock and the monotonic time.
        self._last: tuple[int, float] | None = None
        #: Whether a backward clock move is suspected: the next check looks at claimed intents.
        self.suspected = False

    async def check(self, *, force: bool = False) -> None:
        """Probe for skew and release skewed rows, unless the last check is recent (``force``)."""
        started = time.monotonic()
        clock = self.rt.clock
        if (started < self._next_check and not force) or clock.jumping:
            return
        self._next_check = started + SKEW_CHECK_MS / 1000
        off = clock.offset_ms
        try:
            async with self.rt.store.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                sent = time.monotonic()  # after the pool wait: only the round trip blurs it
                await cur.execute(self.rt.store.queries["clock_skew_probe"], {"off": off})
                probe = await cur.fetchone()
                assert probe is not None
                self._judge(probe, sent)
                jobs = self.rt.jobs.executed_jobs()
                if jobs:
                    rows = await self._release(
                        cur,
                        "release_skewed_jobs",
                        {
                            "off": off,
                            "skew_ms": clock.skew_ms(self.rt.job_lease_ms),
                            "types": [j.owner.name if j.owner else "" for j in jobs],
                            "jobs": [j.name for j in jobs],
                        },
                    )
                    if rows:
                        self.suspected = True
                        _warn(
                            "Released job leases ahead of the database clock (it moved back)",
                            rows,
                            [f"{r['actor_type']}.{r['command']} {r['intent_id']}" for r in rows],
                        )
                types = sorted(self.rt.definitions) if self.rt.hosts_actors else []
                if self.suspected and types:
                    lead = max(self.rt.claim_lease_ms, self.rt.max_backoff_ms)
                    rows = await self._release(
                        cur,
                        "release_skewed_intents",
                        {"off": off, "skew_ms": clock.skew_ms(lead), "types": types},
                    )
                    if rows:
                        _warn(
                            "Released intent claims ahead of the database clock (it moved back)",
                            rows,
                            [str(r["intent_id"]) for r in rows],
                        )
                    if len(rows) < SKEW_BATCH:
                        self.suspected = False
        except (psycopg.Error, OSError) as exc:
            log.warning("Clock skew check failed", extra={"error": str(exc)})

    def _judge(self, probe: dict[str, Any], at: float) -> None:
        now = int(probe["now"])
        clock = self.rt.clock
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
                    extra={"runner_id": self.rt.runners.runner_id, "skew_ms": behind},
                )
        heartbeat = probe["heartbeat_ahead_ms"]
        lease = probe["lease_ahead_ms"]
        if heartbeat is not None and heartbeat > clock.skew_ms(0):
            self.suspected = True
        if lease is not None and lease > clock.skew_ms(self.rt.singleton_lease_ms):
            self.suspected = True

    async def _release(
        self, cur: psycopg.AsyncCursor[dict[str, Any]], name: str, params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        await cur.execute(self.rt.store.queries[name], {**params, "limit": SKEW_BATCH})
        return await cur.fetchall()


def _warn(message: str, rows: list[dict[str, Any]], names: list[str]) -> None:
    log.warning(
        message,
        extra={
            "released": len(rows),
            "skew_ms": max(int(r["ahead_ms"]) for r in rows),
            "rows": names[:_LISTED],
        },
    )
