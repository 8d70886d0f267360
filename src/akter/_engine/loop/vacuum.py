"""The lean watch: the relay vacuums the outbox itself when its dead tuples pile up (issue 45).

The outbox is a queue: a job row dies at least twice (its claim rewrites it, its settle deletes
or rewrites it) and an intent at least twice (claim, delete), while few rows live. Every dead
version stays in the claim indexes until a vacuum, and each claim's per-bucket probe steps over
them (a heap visit each, while a held snapshot keeps them from being pruned). Autovacuum comes
at most once per ``autovacuum_naptime`` (a server setting, 60 s by default), so under a steady
100 jobs/s the outbox carried some 12,000 dead tuples before each visit, and after a held
snapshot was released it stayed bloated until the next one (docs/internals/lean-tables.md).

So, after each pass, at most every ``CHECK_EVERY_S``, the watch reads the outbox's tuple counts
from the server's statistics (one row of ``pg_stat_user_tables``, no table access) and, when the
dead ones reach ``MIN_DEAD`` plus ``DEAD_SHARE`` of the live ones, runs ``VACUUM (SKIP_LOCKED,
TRUNCATE false)`` on the outbox, off the pass, on a connection of its own, one at a time. A
vacuum that removed less than half of them (a snapshot still holds them) is not repeated for
``HELD_RETRY_S``, doubling while they stay held, at most ``HELD_RETRY_MAX_S``.
``SKIP_LOCKED``: a runner whose peer or autovacuum is vacuuming the table skips.

Plain PostgreSQL only (``VacuumGateway.applies``); on Citus the shards' autovacuum keeps them,
with migration 0021's settings. A vacuum never changes a row: it removes only versions no
snapshot can see, so no claim, lease or settle depends on it; a failed vacuum (no privilege: the
server warns and skips; an outage) is logged and tried again at the next check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

import psycopg

from akter._store.gateway.vacuum import Tuples

log = logging.getLogger("akter.relay")

#: The shortest interval between two looks at the outbox's statistics.
CHECK_EVERY_S = 1.0
#: Dead tuples at which the watch vacuums, plus ``DEAD_SHARE`` of the live ones.
MIN_DEAD = 500
DEAD_SHARE = 0.1
#: After a vacuum that removed less than half of the dead tuples: wait this long, doubled after
#: each further such vacuum up to ``HELD_RETRY_MAX_S`` (a snapshot held for hours then costs a
#: futile vacuum every few seconds, not every second), back to the first after one that worked.
HELD_RETRY_S = 2.0
HELD_RETRY_MAX_S = 8.0


class _Gateway(Protocol):
    @property
    def applies(self) -> bool: ...
    async def tuples(self) -> Tuples: ...
    async def vacuum(self) -> None: ...


def due(tuples: Tuples) -> bool:
    """Whether the outbox's dead tuples call for a vacuum (module docstring)."""
    return tuples.dead >= MIN_DEAD + DEAD_SHARE * tuples.live


class VacuumWatch:
    """Vacuums the outbox when its dead tuples pile up (module docstring).

    Args:
        gateway: The outbox's tuple counts and vacuum.
        clock: A monotonic clock (tests may pass their own).
    """

    def __init__(self, gateway: _Gateway, clock: Callable[[], float] = time.monotonic) -> None:
        self._gateway = gateway
        self._clock = clock
        # The first look comes one interval after the start, not at the first pass.
        self._next = clock() + CHECK_EVERY_S
        self._task: asyncio.Task[None] | None = None
        self._held_wait = HELD_RETRY_S
        #: Vacuums this watch ran (tests, the bench).
        self.vacuums = 0

    def observe(self, *, force: bool = False) -> None:
        """After a pass: start a check unless one runs or the last was recent (``force``)."""
        now = self._clock()
        if (now < self._next and not force) or not self._gateway.applies:
            return
        if self.checking:
            return
        self._next = now + CHECK_EVERY_S
        self._task = asyncio.create_task(self.check(), name="akter.relay.vacuum")

    async def check(self) -> None:
        """Read the counts; vacuum the outbox if they call for it."""
        try:
            before = await self._gateway.tuples()
            if not due(before):
                return
            await self._gateway.vacuum()
            self.vacuums += 1
            after = await self._gateway.tuples()
        except (psycopg.OperationalError, OSError) as exc:
            # An outage: the pass that runs next says so; the watch just looks again later.
            log.info("Outbox vacuum check failed; trying again later", extra={"error": str(exc)})
            return
        except psycopg.Error as exc:
            log.warning(
                "Outbox vacuum failed; dead tuples wait for autovacuum: %s",
                exc,
                extra={"error": str(exc)},
            )
            return
        if after.dead * 2 > before.dead:
            # A snapshot (an idle transaction, a long query) still sees them: wait for it.
            self._next = max(self._next, self._clock() + self._held_wait)
            self._held_wait = min(self._held_wait * 2, HELD_RETRY_MAX_S)
        else:
            self._held_wait = HELD_RETRY_S

    @property
    def checking(self) -> bool:
        """Whether a check (and maybe its vacuum) is under way."""
        return self._task is not None and not self._task.done()

    async def settled(self) -> None:
        """Await the check under way, if any (tests, the bench)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel a check under way (a vacuum in flight ends with its connection's statement)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
