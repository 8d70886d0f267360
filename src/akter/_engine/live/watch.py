"""One query watch: the value now, then after each commit that changes it (docs/guides/live.md).

A watch re-reads its query (one unlocked read, the query path's access check before and after)
when it is woken: at once by a local commit of its actor, by another runner's commit heard on
the live channel, or, failing those, by its poll — ``poll`` without ``notify``, else
``watch_recheck`` — and in any case every ``watch_recheck`` (the access bound). It yields a
value only when the row version it read is newer than the last one yielded and the value
differs from it, so values never go back in time; and at most one per ``watch_min_interval``:
commits in between are coalesced into the newest value. A slow consumer is coalesced the same
way: the watch reads again only when asked for its next value. Watches of one query with the
same arguments and caller share their reads: one woken by a commit whose version another has
already read (at least) takes that read instead of reading again; the poll always reads. A
retryable refusal of a read (``pool_exhausted`` while many watches read at once,
``database_unreachable``) is waited out with backoff and the read made again; a terminal one
(access revoked) ends the watch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from akter._retry import Backoff
from akter._waits import wait_event
from akter.callers import ActorRef
from akter.errors import ActorError

#: Waits before reading again after a retryable refusal (doubling).
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 2.0
#: Reads the query: its value, the row version it read, and the value's JSON (to compare).
#: Its argument is the version a commit announced (a read of the same watch at that version or
#: newer may be reused), or ``None``: read the database (and the access policy) now.
Evaluate = Callable[[int | None], Awaitable[tuple[Any, int, bytes]]]


@dataclass(frozen=True)
class WatchValue:
    """One value of a watch: the query's result and the actor row version it was read at."""

    version: int
    value: Any


class Watch:
    """A registered watch (:class:`akter._engine.live.Live` opens it; ``values`` reads it)."""

    def __init__(
        self,
        group: tuple[Any, ...],
        ref: ActorRef,
        evaluate: Evaluate,
        *,
        min_interval: float,
        idle_poll: float,
        release: Callable[[Watch], None],
        retried: Callable[[ActorError], None] = lambda exc: None,
    ) -> None:
        #: Alike watches (one query, arguments and caller of one actor) share their reads.
        self.group = group
        self.ref = ref
        self._evaluate = evaluate
        self._min_interval = min_interval
        self._idle_poll = idle_poll
        self._release = release
        self._retried = retried
        self._flag = asyncio.Event()
        # What the next read must see: at least this announced version, or (None) a fresh read.
        self._floor: int | None = None
        self._fresh = True
        #: The row version of the last value yielded (-1: none yet).
        self.version = -1
        self.closed = False

    def changed(self, version: int | None) -> None:
        """The actor committed (``version`` ``None``: unknown): read again unless known."""
        if version is None:
            self._fresh = True
        elif version > self.version:
            self._floor = max(self._floor or 0, version)
        else:
            return
        self._flag.set()

    def close(self) -> None:
        """End the watch (idempotent): its reader's iteration ends, its slot is freed."""
        if not self.closed:
            self.closed = True
            self._flag.set()
            self._release(self)

    async def values(self) -> AsyncIterator[WatchValue]:
        """Yield values until closed; raises what the query raises (a revoked caller's refusal)."""
        last_text: bytes | None = None
        backoff = Backoff(_RETRY_FIRST_S, _RETRY_MAX_S)
        last_sent = -float("inf")
        try:
            while not self.closed:
                self._flag.clear()
                at_least = None if self._fresh else self._floor
                self._fresh, self._floor = False, None
                read = await self._read(backoff, at_least)
                if read is None:
                    continue  # a retryable refusal was waited out
                value, version, text = read
                if version > self.version or last_text is None:
                    self.version = max(version, self.version)
                    if text != last_text:
                        last_text = text
                        yield WatchValue(version, value)
                        last_sent = time.monotonic()
                if not await wait_event(self._flag, self._idle_poll):
                    self._fresh = True  # the poll and the access recheck: a fresh read
                wait = last_sent + self._min_interval - time.monotonic()
                if wait > 0 and not self.closed:
                    await asyncio.sleep(wait)  # coalesce: the commits meanwhile read as one
        finally:
            self.close()

    async def _read(self, backoff: Backoff, at_least: int | None) -> tuple[Any, int, bytes] | None:
        """One read, or ``None`` after waiting out a retryable refusal.

        A full pool or a lost database is waited out (the watch then reads again); a terminal
        refusal (access revoked) is raised and ends the watch.
        """
        try:
            read = await self._evaluate(at_least)
        except ActorError as exc:
            if not exc.retryable:
                raise
            self._retried(exc)
            self._fresh = True
            self._flag.set()  # read again after the wait, whatever committed meanwhile
            await asyncio.sleep(max(backoff.next(), exc.retry_after or 0.0))
            return None
        backoff.reset()
        return read
