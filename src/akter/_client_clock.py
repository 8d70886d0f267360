"""The client's command-id clock: the server's database clock as last heard, and its ids.

Every command answer carries the server's database-clock reading (``Akter-Clock``) and the retry
window (``Akter-Retry-Window``); :class:`LearnedClock` mints ids from the last reading plus the
client's own monotonic time since (``akter.client``'s docstring has the whole rule).
"""

from __future__ import annotations

import re

import httpx

from akter._ids import CLOCK_HEADER, WINDOW_HEADER, mint_command_id

__all__ = ["CLOCK_MARGIN_MS", "READING_TTL_S", "LearnedClock", "clock_reading"]

_MS = re.compile(r"[0-9]{1,15}")

#: How far behind the learned database clock the client issues its command ids (ms). The
#: reading is already a lower bound; the margin absorbs the drift between the server's and this
#: machine's monotonic clocks and small steps back of the database clock, so an id is never
#: refused as ``future``. It shortens each id's validity by as much (the window is ≥ 60 s).
CLOCK_MARGIN_MS = 1_000
#: A reading older than this (s) is not minted from: the next id comes from the server.
READING_TTL_S = 300.0


class LearnedClock:
    """The server's database clock as a client last heard it, and the ids minted from it.

    A reading ``now_ms`` that the server took before it answered, anchored at the monotonic
    time its answer arrived here, gives ``now_ms + elapsed``: a lower bound of the database
    clock (the newest reading replaces the last, so a clock that stepped back is followed).
    Ids are issued :data:`CLOCK_MARGIN_MS` behind it and span the server's retry window.
    """

    __slots__ = ("_reading",)

    def __init__(self) -> None:
        self._reading: tuple[int, int, float] | None = None

    def learn(self, now_ms: int, window_ms: int, at: float) -> None:
        """Keep a reading of the database clock, heard at monotonic time ``at`` (s)."""
        self._reading = (now_ms, window_ms, at)

    def forget(self) -> None:
        """Drop the reading (its ids were refused): the next id comes from the server."""
        self._reading = None

    def mint(self, at: float) -> str | None:
        """A command id at monotonic time ``at``, or ``None`` with no reading fresh enough."""
        if self._reading is None:
            return None
        now_ms, window_ms, heard = self._reading
        if not 0 <= at - heard <= READING_TTL_S:
            return None
        issued = now_ms + int((at - heard) * 1000) - CLOCK_MARGIN_MS
        try:
            return mint_command_id(max(issued, 0), window_ms)
        except ValueError:
            return None  # a reading out of any id's range: let the server mint


def clock_reading(headers: httpx.Headers) -> tuple[int, int] | None:
    """The ``(now_ms, window_ms)`` an answer's headers carry, if both are there and sane."""
    now, window = headers.get(CLOCK_HEADER, ""), headers.get(WINDOW_HEADER, "")
    if _MS.fullmatch(now) is None or _MS.fullmatch(window) is None:
        return None
    return int(now), int(window)
