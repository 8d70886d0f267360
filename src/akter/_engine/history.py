"""The last hour of a runner's metrics, kept in memory for the console's overview charts.

Every ``every_s`` (15 s, the sampling interval) the runner copies its own metrics into a ring of
points that holds ``keep_s`` (an hour). A point keeps the counters as they stood (the charts
show their rate or their growth per interval) and the sampled gauges, which only the
``$maintenance`` owner reports (``akter._engine.sampling``): on another runner those series are
``None``, and the chart says so rather than drawing a zero.

What the overview draws (:meth:`History.series`):

- ``commits_per_s``: commands committed per second on this runner (``akter.receipts.written``);
- ``relay_lag_ms``: the age of the oldest due unclaimed outbox row (the largest over kinds);
- ``outbox_rows``: the outbox backlog, every kind;
- ``jobs``: job outcomes on this runner per interval: ``succeeded``, ``retried``, ``dead``;
- ``workflows``: runs ``running`` and ``suspended`` (sampled), and runs that ``completed`` or
  ``failed`` per interval on this runner.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from akter.telemetry import Metrics

log = logging.getLogger("akter.runtime")

#: The interval between points, and how long they are kept.
EVERY_S, KEEP_S = 15.0, 3600.0

_COUNTERS = {
    "commits": ("akter.receipts.written", None),
    "succeeded": ("akter.relay.delivered", ("kind", "job")),
    "retried": ("akter.relay.retried", ("kind", "job")),
    "dead": ("akter.job.dead_letters", None),
    "completed": ("akter.workflows.completed", None),
    "failed": ("akter.workflows.failed", None),
}
#: Each chart gauge: its family and whether its series combine by their largest value (else sum).
_GAUGES = {
    "relay_lag_ms": ("akter.relay.lag_ms", True),
    "outbox_rows": ("akter.outbox.rows", False),
    "running": ("akter.workflows.running", False),
    "suspended": ("akter.workflows.suspended", False),
}


@dataclass(frozen=True)
class Point:
    """One copy of the metrics: wall time (ms), counter totals, gauges (``None``: unreported)."""

    at_ms: int
    counters: Mapping[str, float]
    gauges: Mapping[str, float | None]


def point_of(metrics: Metrics, at_ms: int) -> Point:
    """The values the charts need, read from ``metrics`` at ``at_ms``."""
    reading = metrics.reading()
    counters: dict[str, float] = {}
    for name, (family, only) in _COUNTERS.items():
        series = reading.counters.get(family, {})
        counters[name] = sum(v for key, v in series.items() if only is None or only in key)
    gauges: dict[str, float | None] = {}
    for name, (family, largest) in _GAUGES.items():
        values = list(reading.gauges.get(family, {}).values())
        if family not in reading.gauges:
            gauges[name] = None  # this runner does not report it (not the $maintenance owner)
        else:
            gauges[name] = float(max(values, default=0.0) if largest else sum(values))
    return Point(at_ms, counters, gauges)


def series_of(points: list[Point]) -> list[dict[str, Any]]:
    """The charts' values per point after the first: rates and growth since the one before."""
    out: list[dict[str, Any]] = []
    for before, now in itertools.pairwise(points):
        seconds = max((now.at_ms - before.at_ms) / 1000, 1e-3)

        def grew(name: str, before: Point = before, now: Point = now) -> float:
            # A counter never shrinks; a restart of the runtime's metrics would: count from 0.
            return max(now.counters[name] - before.counters[name], 0.0)

        out.append(
            {
                "at_ms": now.at_ms,
                "commits_per_s": round(grew("commits") / seconds, 3),
                "relay_lag_ms": now.gauges["relay_lag_ms"],
                "outbox_rows": now.gauges["outbox_rows"],
                "jobs": {name: grew(name) for name in ("succeeded", "retried", "dead")},
                "workflows": {
                    "running": now.gauges["running"],
                    "suspended": now.gauges["suspended"],
                    "completed": grew("completed"),
                    "failed": grew("failed"),
                },
            }
        )
    return out


class History:
    """A runner's last hour of chart points (module docstring); ``start`` / ``stop`` its loop.

    Args:
        metrics: The runner's metrics.
        every_s: The interval between points.
        keep_s: How long points are kept.
        wall: The wall clock in ms (tests pass their own).
    """

    def __init__(
        self,
        metrics: Metrics,
        *,
        every_s: float = EVERY_S,
        keep_s: float = KEEP_S,
        wall: Callable[[], int] | None = None,
    ) -> None:
        self._metrics = metrics
        self.every_s = every_s
        self._wall = wall or (lambda: int(time.time() * 1000))
        # One more than fits in keep_s: the oldest kept point is the base of the first interval.
        self._points: deque[Point] = deque(maxlen=int(keep_s / every_s) + 1)
        self._task: asyncio.Task[None] | None = None

    def record(self) -> Point:
        """Take a point now (the loop does every ``every_s``; tests call it)."""
        point = point_of(self._metrics, self._wall())
        self._points.append(point)
        return point

    def series(self, since_ms: int | None = None) -> list[dict[str, Any]]:
        """The charts' values, oldest first, of the intervals that end after ``since_ms``."""
        points = list(self._points)
        return [p for p in series_of(points) if since_ms is None or p["at_ms"] > since_ms]

    def start(self) -> None:
        """Take the first point and record every ``every_s`` until :meth:`stop`."""
        if self._task is None:
            self.record()
            self._task = asyncio.create_task(self._run(), name="akter.history")

    async def stop(self) -> None:
        """Stop recording (the points stay readable)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                self.record()
            except Exception:
                # A bug, not an outage: say so; charts are not worth stopping the runner for.
                log.exception("Recording the console's chart history raised unexpectedly")
