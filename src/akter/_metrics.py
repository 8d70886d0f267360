"""One runtime's metrics, kept in-process, and the same instruments through OpenTelemetry.

:class:`Metrics` holds the counters, histograms and gauges of :mod:`akter._metric_families`
(the names, labels and buckets of :mod:`akter.telemetry`'s docstring) under one lock, for
``GET /metrics`` and a ``prometheus_client`` registry; every count and observation is also
recorded through the OpenTelemetry meter (:func:`use_meter_provider`), a no-op call when none is
configured. :mod:`akter.telemetry` re-exports the public names.
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics as otel_metrics

from akter._metric_families import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    METRICS,
    ROW_KINDS,
    TURN_OUTCOMES,
    Family,
)
from akter._prometheus import HistogramSeries, PrometheusCollector, Reading, render

ALLOWED_ATTRIBUTES = frozenset({"actor_type", "outcome", "kind", "job"})

_Key = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class HistogramValue:
    """One histogram series: cumulative bucket counts (the last is ``+Inf``), sum and count."""

    bounds: tuple[float, ...]
    buckets: tuple[int, ...]
    sum: float
    count: int


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * (size + 1)
        self.sum = 0.0


def _bucket(bounds: Sequence[float], value: float) -> int:
    # Prometheus buckets are upper-inclusive (le); bounds are few, a linear scan is cheapest.
    for index, bound in enumerate(bounds):
        if value <= bound:
            return index
    return len(bounds)


class Metrics:
    """One runtime's metrics; ``collector()`` for a ``prometheus_client`` registry, ``render()``.

    Every counter of :data:`FAMILIES` starts at 0 for each series a runner can count: every
    ``kind`` and ``outcome`` value, each of ``actor_types`` and each ``(actor_type, job)`` of
    ``jobs`` (the runner's registry), so a scrape sees a counter before its first increment.
    """

    def __init__(
        self, actor_types: Iterable[str] = (), jobs: Iterable[tuple[str, str]] = ()
    ) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[_Key, float]] = defaultdict(dict)
        self._histograms: dict[str, dict[_Key, _Histogram]] = defaultdict(dict)
        self._gauges: dict[str, dict[_Key, float]] = defaultdict(dict)
        domains = {"kind": ROW_KINDS, "outcome": TURN_OUTCOMES, "actor_type": tuple(actor_types)}
        pairs = tuple(jobs)
        for family in COUNTERS.values():
            self._counters[family.name] = dict.fromkeys(_series(family, domains, pairs), 0.0)
        _LIVE.add(self)

    def count(self, name: str, value: float = 1, **attributes: str) -> None:
        """Add ``value`` to a counter (one of :data:`COUNTERS`, with exactly its labels)."""
        # A series counted before was checked then: its sorted key is remembered (every turn
        # counts the same few series).
        seen = (name, *attributes.items())
        key = _CHECKED.get(seen)
        if key is None:
            _check(name, attributes)
            family = COUNTERS.get(name)
            if family is None:
                raise ValueError(f"{name!r} is not a counter; use one of {sorted(COUNTERS)}.")
            if set(attributes) != set(family.labels):
                raise ValueError(f"Counter {name!r} takes the labels {list(family.labels)}.")
            key = _CHECKED[seen] = tuple(sorted(attributes.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0) + value
        _otel.add(name, value, attributes)

    def observe(self, name: str, value: float, **attributes: str) -> None:
        """Record one observation of a histogram (one of :data:`HISTOGRAMS`)."""
        bounds = HISTOGRAMS.get(name)
        if bounds is None:
            raise ValueError(f"{name!r} is not a histogram; use one of {sorted(HISTOGRAMS)}.")
        seen = (name, *attributes.items())
        key = _CHECKED.get(seen)
        if key is None:
            _check(name, attributes)
            key = _CHECKED[seen] = tuple(sorted(attributes.items()))
        with self._lock:
            _add_observation(self._histograms[name], key, bounds, value)
        _otel.record(name, value, attributes)

    def turns(self, actor_type: str, outcomes: Sequence[str], duration_ms: float) -> None:
        """One batch's turn metrics under one lock (what ``telemetry.record_turns`` counts).

        ``akter.turn.batches`` and ``akter.turn.batch_size`` once; per command ``akter.turns``
        (its outcome), ``akter.turn.duration_ms`` and, for a replay, ``akter.receipts.replayed``.
        The same as the separate :meth:`count` and :meth:`observe` calls, at a fraction of
        their cost on every turn.
        """
        by_type = (("actor_type", actor_type),)
        attributes = {"actor_type": actor_type}
        durations = HISTOGRAMS["akter.turn.duration_ms"]
        sizes = HISTOGRAMS["akter.turn.batch_size"]
        with self._lock:
            counters, histograms = self._counters, self._histograms
            series = counters["akter.turn.batches"]
            series[by_type] = series.get(by_type, 0) + 1
            _add_observation(histograms["akter.turn.batch_size"], by_type, sizes, len(outcomes))
            turns = counters["akter.turns"]
            duration_series = histograms["akter.turn.duration_ms"]
            for outcome in outcomes:
                key = (("actor_type", actor_type), ("outcome", outcome))
                turns[key] = turns.get(key, 0) + 1
                _add_observation(duration_series, by_type, durations, duration_ms)
                if outcome == "replay":
                    replayed = counters["akter.receipts.replayed"]
                    replayed[by_type] = replayed.get(by_type, 0) + 1
        _otel.add("akter.turn.batches", 1, attributes)
        _otel.record("akter.turn.batch_size", len(outcomes), attributes)
        for outcome in outcomes:
            _otel.add("akter.turns", 1, {"actor_type": actor_type, "outcome": outcome})
            _otel.record("akter.turn.duration_ms", duration_ms, attributes)
            if outcome == "replay":
                _otel.add("akter.receipts.replayed", 1, attributes)

    def set(self, name: str, value: float, **attributes: str) -> None:
        """Set one series of a gauge (one of :data:`GAUGES`)."""
        _check_gauge(name, attributes)
        with self._lock:
            self._gauges[name][tuple(sorted(attributes.items()))] = value

    def replace(self, name: str, series: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Replace every series of a gauge: series not given again read 0."""
        values: dict[_Key, float] = {}
        for attributes, value in series:
            _check_gauge(name, attributes)
            values[tuple(sorted(attributes.items()))] = value
        with self._lock:
            previous = self._gauges[name]
            self._gauges[name] = {**dict.fromkeys(previous, 0.0), **values}

    def clear(self, names: Iterable[str]) -> None:
        """Forget gauges (a runner that no longer owns the sampling reports none)."""
        with self._lock:
            for name in names:
                self._gauges.pop(name, None)

    def value(self, name: str, **attributes: str) -> float:
        """The current value of one counter or gauge series (0 if never counted or set)."""
        key = tuple(sorted(attributes.items()))
        with self._lock:
            if name in GAUGES:
                return self._gauges.get(name, {}).get(key, 0)
            return self._counters.get(name, {}).get(key, 0)

    def gauge(self, name: str, **attributes: str) -> float | None:
        """One gauge series, or ``None`` when this runner does not report it."""
        with self._lock:
            return self._gauges.get(name, {}).get(tuple(sorted(attributes.items())))

    def histogram(self, name: str, **attributes: str) -> HistogramValue:
        """One histogram series (empty if never observed)."""
        bounds = HISTOGRAMS[name]
        with self._lock:
            found = self._histograms.get(name, {}).get(tuple(sorted(attributes.items())))
            counts = list(found.counts) if found else [0] * (len(bounds) + 1)
            total = found.sum if found else 0.0
        cumulative: list[int] = []
        running = 0
        for n in counts:
            running += n
            cumulative.append(running)
        return HistogramValue(bounds, tuple(cumulative), total, running)

    def _gauge_series(self, name: str) -> list[tuple[_Key, float]]:
        with self._lock:
            return list(self._gauges.get(name, {}).items())

    def reading(self) -> Reading:
        """Every series, copied under one lock (what :meth:`collector` exposes)."""
        with self._lock:
            return Reading(
                counters={name: dict(series) for name, series in self._counters.items()},
                histograms={
                    name: {key: HistogramSeries(tuple(h.counts), h.sum) for key, h in hs.items()}
                    for name, hs in self._histograms.items()
                },
                gauges={name: dict(series) for name, series in self._gauges.items()},
            )

    def collector(self) -> PrometheusCollector:
        """These metrics as a ``prometheus_client`` collector, for an application's registry.

        ``registry.register(runtime.metrics.collector())`` puts akter's families beside the
        application's own; each scrape reads the live values. ``GET /metrics`` serves the same
        page. Each call returns a new collector: keep it to unregister it.
        """
        return PrometheusCollector(self)

    def render(self) -> str:
        """Every metric in the Prometheus text exposition format (``.`` becomes ``_``).

        ``prometheus_client``'s exposition of :meth:`collector`: each family has its ``# HELP``
        and ``# TYPE`` lines; every counter is present (at 0 before its first increment), a
        histogram or gauge once it has a series.
        """
        return render(self.collector())


def _series(
    family: Family, domains: Mapping[str, tuple[str, ...]], jobs: tuple[tuple[str, str], ...]
) -> list[_Key]:
    """The label sets a counter starts with at 0 (``job`` goes with its ``actor_type``)."""
    if "job" in family.labels:
        return [(("actor_type", a), ("job", j)) for a, j in jobs]
    keys: list[_Key] = [()]
    for label in sorted(family.labels):
        keys = [(*key, (label, value)) for key in keys for value in domains[label]]
    return keys


#: Series already checked by ``Metrics.count``/``observe``: ``(name, *attribute items)`` to the
#: sorted key. Bounded: past the limit it is cleared (attribute values are few in practice).
_CHECKED: dict[tuple[str, ...] | tuple[Any, ...], _Key] = {}
_CHECKED_LIMIT = 10_000


def _check(name: str, attributes: Mapping[str, str]) -> None:
    if len(_CHECKED) > _CHECKED_LIMIT:
        _CHECKED.clear()
    if not ALLOWED_ATTRIBUTES.issuperset(attributes):
        bad = sorted(set(attributes) - ALLOWED_ATTRIBUTES)
        raise ValueError(f"Metric attributes {bad} are not allowed on {name!r}.")


def _check_gauge(name: str, attributes: Mapping[str, str]) -> None:
    if name not in GAUGES:
        raise ValueError(f"{name!r} is not a gauge; use one of {sorted(GAUGES)}.")
    _check(name, attributes)


def _add_observation(
    series: dict[_Key, _Histogram], key: _Key, bounds: Sequence[float], value: float
) -> None:
    """Record ``value`` in one histogram series (under the metrics' lock)."""
    histogram = series.get(key)
    if histogram is None:
        histogram = series[key] = _Histogram(len(bounds))
    histogram.counts[_bucket(bounds, value)] += 1
    histogram.sum += value


# --- OpenTelemetry metrics ------------------------------------------------------------------------

_LIVE: weakref.WeakSet[Metrics] = weakref.WeakSet()


class _OtelInstruments:
    """The same instruments through an OpenTelemetry meter (a no-op one unless configured).

    Counters and histograms are shared by every :class:`Metrics` of the process (attributes tell
    series apart); each gauge is one observable gauge summing the live runtimes' values.
    """

    def __init__(self, meter: otel_metrics.Meter) -> None:
        self._meter = meter
        self._lock = threading.Lock()
        self._counters: dict[str, otel_metrics.Counter] = {}
        self._histograms: dict[str, otel_metrics.Histogram] = {}
        for name in sorted(GAUGES):
            meter.create_observable_gauge(
                name, callbacks=[_observer(name)], description=METRICS[name].help
            )

    def add(self, name: str, value: float, attributes: Mapping[str, str]) -> None:
        counter = self._counters.get(name)
        if counter is None:
            with self._lock:
                counter = self._counters.get(name)
                if counter is None:
                    counter = self._counters[name] = self._meter.create_counter(
                        name, description=METRICS[name].help
                    )
        counter.add(value, attributes)

    def record(self, name: str, value: float, attributes: Mapping[str, str]) -> None:
        histogram = self._histograms.get(name)
        if histogram is None:
            with self._lock:
                histogram = self._histograms.get(name)
                if histogram is None:
                    histogram = self._histograms[name] = self._meter.create_histogram(
                        name,
                        unit="ms" if name.endswith("_ms") else "",
                        description=METRICS[name].help,
                        explicit_bucket_boundaries_advisory=list(HISTOGRAMS[name]),
                    )
        histogram.record(value, attributes)


def _observer(
    name: str,
) -> Any:  # a CallbackT; the API types it as a union of callables and generators
    def observe(options: otel_metrics.CallbackOptions) -> Iterator[otel_metrics.Observation]:
        totals: dict[_Key, float] = {}
        for metrics in list(_LIVE):
            for key, value in metrics._gauge_series(name):
                totals[key] = totals.get(key, 0.0) + value
        for key, value in totals.items():
            yield otel_metrics.Observation(value, dict(key))

    return observe


_otel = _OtelInstruments(otel_metrics.get_meter("akter"))


def use_meter_provider(provider: otel_metrics.MeterProvider | None) -> None:
    """Record through ``provider`` from now on (``None``: the global meter provider again).

    For tests and for applications that keep a private provider rather than a global one.
    """
    global _otel
    meter = (provider or otel_metrics.get_meter_provider()).get_meter("akter")
    _otel = _OtelInstruments(meter)
