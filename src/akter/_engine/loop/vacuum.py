"""The lean watch: the relay vacuums the tables that churn once dead tuples pile up (issue 45).

Two tables churn under jobs and routes (docs/internals/lean-tables.md, "What churns"). The
outbox is a queue: a job row dies at least twice (its claim rewrites it, its settle deletes or
rewrites it) and an intent at least twice (claim, delete), while few rows live; every dead
version stays in the claim indexes until a vacuum, and each claim's per-bucket probe steps over
them. The actors table: every turn rewrites its actor's row (a HOT update, which page pruning
reclaims on its own while no snapshot holds the old version; under a held snapshot the versions
pile up, more dead than live rows, and pruning comes back only when a page fills). Autovacuum
comes at most once per ``autovacuum_naptime`` (a server setting, 60 s by default).

So, after each pass, at most every ``CHECK_EVERY_S``, the watch reads both tables' tuple counts
from the server's statistics (one statement, one row of ``pg_stat_user_tables`` each, no table
access) and vacuums, off the pass, on a connection of its own, one at a time, the tables whose
dead tuples reach ``MIN_DEAD`` plus ``DEAD_SHARE`` of their live ones (``VACUUM (SKIP_LOCKED,
TRUNCATE false)``; ``SKIP_LOCKED``: a runner whose peer or autovacuum is vacuuming a table skips).

A vacuum that left more than half of the dead tuples it ran for is futile: a snapshot still sees
them. Then the watch reads the database's removal horizon (``VacuumGateway.horizon``: the oldest
``backend_xmin``/``backend_xid`` of the other sessions, prepared transactions, replication
slots) and, at each later check, only that (one cheap statement a second): once a look has seen
the same horizon again (a holder that stays, not the passing transactions of a busy database)
and a later look sees it moved, the holder is gone and the watch vacuums at once (``retry``).
For holders it cannot follow (what the statement does not read, as PostgreSQL 15's
``vacuum_defer_cleanup_age``; one gone before a second look), a bounded fallback: it vacuums
again ``HELD_RETRY_S`` after the futile vacuum, doubling while they stay held, at most every
``HELD_RETRY_MAX_S``. The vacuum after a futile one takes every table past
``AFTER_HOLD_MIN_DEAD`` (not ``MIN_DEAD``) plus the share: what the hold kept in all of them
becomes removable at once.

Plain PostgreSQL only (``VacuumGateway.applies``); on Citus the shards' autovacuum keeps them,
with migration 0021's settings. A vacuum never changes a row: it removes only versions no
snapshot can see, so no claim, lease or settle depends on it; a failed vacuum (an outage) is
logged and tried again at the next check; one the server skips (a role that does not own the
table: a warning, no error) is logged once and retried as a futile one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import psycopg

from akter._store.gateway.vacuum import Table, Tuples

log = logging.getLogger("akter.relay")

#: The shortest interval between two looks at the statistics (or, after a futile vacuum, at
#: the removal horizon).
CHECK_EVERY_S = 1.0
#: Dead tuples at which the watch vacuums a table, plus ``DEAD_SHARE`` of its live ones.
MIN_DEAD = 500
DEAD_SHARE = 0.1
#: The floor instead of ``MIN_DEAD`` for the vacuum that follows a futile one (its holder may be
#: gone): what a hold kept becomes removable all at once, in every table, and one vacuum takes
#: it, also from a table whose steady churn alone stays under ``MIN_DEAD`` (the actors' HOT
#: versions, which page pruning leaves until a page fills).
AFTER_HOLD_MIN_DEAD = 100
#: The fallback after a futile vacuum: vacuum again after this long, doubled after each further
#: futile one up to ``HELD_RETRY_MAX_S`` (a holder the watch cannot see, held for hours, then
#: costs a futile vacuum every few seconds, not every second).
HELD_RETRY_S = 2.0
HELD_RETRY_MAX_S = 8.0


class _Gateway(Protocol):
    @property
    def applies(self) -> bool: ...
    async def tuples(self) -> dict[Table, Tuples]: ...
    async def horizon(self) -> str | None: ...
    async def vacuum(self, tables: Sequence[Table]) -> list[str]: ...


def due(tuples: Tuples, floor: int = MIN_DEAD) -> bool:
    """Whether a table's dead tuples call for a vacuum (module docstring)."""
    return tuples.dead >= floor + DEAD_SHARE * tuples.live


def due_tables(counts: Mapping[Table, Tuples], floor: int = MIN_DEAD) -> list[Table]:
    """The tables whose dead tuples call for a vacuum, in the watch's order."""
    return [table for table, tuples in counts.items() if due(tuples, floor)]


def futile(
    before: Mapping[Table, Tuples], after: Mapping[Table, Tuples], tables: Sequence[Table]
) -> bool:
    """Whether a vacuum of ``tables`` left more than half of their dead tuples (held).

    Summed over the tables: the counts after a vacuum include what concurrent turns killed
    meanwhile (other sessions report theirs up to a second late), which in a table vacuumed
    from a low count could pass for half of it.
    """
    left = sum(after[t].dead for t in tables)
    return left * 2 > sum(before[t].dead for t in tables)


@dataclass(frozen=True, slots=True)
class Held:
    """After a futile vacuum: the horizon last seen and the fallback (module docstring).

    Attributes:
        horizon: The removal horizon at the last look (``None``: none the server shows).
        seen_again: Whether two looks in a row saw ``horizon`` (a holder that stays).
        retry_at: When the fallback vacuums again, whatever the horizon.
        wait: The fallback's present wait (doubles after each futile vacuum).
    """

    horizon: str | None
    seen_again: bool
    retry_at: float
    wait: float


def held_after(previous: Held | None, horizon: str | None, now: float) -> Held:
    """The state after a futile vacuum that saw ``horizon`` (``previous``: the one before)."""
    if previous is None:
        return Held(horizon, seen_again=False, retry_at=now + HELD_RETRY_S, wait=HELD_RETRY_S)
    wait = min(previous.wait * 2, HELD_RETRY_MAX_S)
    # A futile fallback under the same horizon: the holder stays, its release is worth a look.
    return Held(horizon, horizon == previous.horizon, now + wait, wait)


def retry(held: Held, horizon: str | None, now: float) -> tuple[bool, Held]:
    """Whether to vacuum again now, and the state with this look at ``horizon`` recorded.

    Again when the fallback's time came, or when a horizon two looks saw has moved (its holder
    released it). A horizon that moves at every look (a busy database's short transactions in
    front of a holder the watch cannot see) never counts: the fallback bounds those.
    """
    if now >= held.retry_at:
        return True, held
    if held.seen_again and held.horizon is not None and horizon != held.horizon:
        return True, held
    return False, replace(held, horizon=horizon, seen_again=horizon == held.horizon)


class VacuumWatch:
    """Vacuums the tables that churn when their dead tuples pile up (module docstring).

    Args:
        gateway: The tables' tuple counts, the removal horizon and the vacuums.
        clock: A monotonic clock (tests may pass their own).
    """

    def __init__(self, gateway: _Gateway, clock: Callable[[], float] = time.monotonic) -> None:
        self._gateway = gateway
        self._clock = clock
        # The first look comes one interval after the start, not at the first pass.
        self._next = clock() + CHECK_EVERY_S
        self._task: asyncio.Task[None] | None = None
        #: After a futile vacuum, until one that worked (or nothing is due any more).
        self.held: Held | None = None
        self._warned: set[str] = set()
        #: Checks that vacuumed (tests, the bench); ``last_vacuumed``: the last one's tables.
        self.vacuums = 0
        self.last_vacuumed: list[Table] = []

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
        """Read the counts (after a futile vacuum: the horizon first); vacuum the due tables."""
        warnings: list[str] = []
        try:
            if self.held is not None:
                again, self.held = retry(self.held, await self._gateway.horizon(), self._clock())
                if not again:
                    return
            before = await self._gateway.tuples()
            tables = due_tables(before, MIN_DEAD if self.held is None else AFTER_HOLD_MIN_DEAD)
            if not tables:
                self.held = None
                return
            warnings = await self._gateway.vacuum(tables)
            self.vacuums += 1
            self.last_vacuumed = tables
            after = await self._gateway.tuples()
            if futile(before, after, tables):
                # A snapshot (an idle transaction, a long query) still sees them: note who holds.
                horizon = await self._gateway.horizon()
                self.held = held_after(self.held, horizon, self._clock())
            else:
                self.held = None
        except (psycopg.OperationalError, OSError) as exc:
            # An outage: the pass that runs next says so; the watch just looks again later.
            log.info(
                "Lean-table vacuum check failed; trying again later: %s",
                exc,
                extra={"error": str(exc)},
            )
            return
        except psycopg.Error as exc:
            log.warning(
                "Lean-table vacuum failed; dead tuples wait for autovacuum: %s",
                exc,
                extra={"error": str(exc)},
            )
            return
        for warning in warnings:
            if warning not in self._warned:  # once per message: the fallback repeats them
                self._warned.add(warning)
                log.warning(
                    "Lean-table vacuum skipped by the server; dead tuples wait for autovacuum "
                    "(give the runner's role ownership of the schema's tables): %s",
                    warning,
                    extra={"error": warning},
                )

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
