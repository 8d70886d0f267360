"""A runtime's metrics as ``prometheus_client`` families: the page ``GET /metrics`` serves.

:class:`PrometheusCollector` is a ``prometheus_client`` collector: an application registers it
in its own ``CollectorRegistry`` beside its own metrics (``registry.register(
runtime.metrics.collector())``), and ``GET /metrics`` renders it with ``prometheus_client``'s
``generate_latest``. Either way the page is the same: every family of
:data:`akter._metric_families.FAMILIES` with its ``# HELP`` and ``# TYPE`` lines (``.`` becomes
``_``, counters end in ``_total``); every counter at 0 before its first increment, a histogram or
gauge once it has a series.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from akter._metric_families import FAMILIES, METRICS, Family

#: The media type of the page: the Prometheus text format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: One series: its ``(label, value)`` pairs, sorted by label.
Key = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class HistogramSeries:
    """One histogram series as recorded: per-bucket counts (the last is ``+Inf``) and sum."""

    counts: Sequence[int]
    sum: float


@dataclass(frozen=True, slots=True)
class Reading:
    """A consistent copy of every series of one runtime's metrics, by akter metric name."""

    counters: Mapping[str, Mapping[Key, float]]
    histograms: Mapping[str, Mapping[Key, HistogramSeries]]
    gauges: Mapping[str, Mapping[Key, float]]


class Readable(Protocol):
    """What the collector reads: :class:`akter.telemetry.Metrics`."""

    def reading(self) -> Reading:
        """Every series, copied under one lock."""
        ...


class PrometheusCollector:
    """One runtime's metrics as a ``prometheus_client`` collector.

    Get one with ``runtime.metrics.collector()`` and register it in your registry::

        registry = prometheus_client.CollectorRegistry()
        registry.register(runtime.metrics.collector())

    Each scrape reads the runtime's live values. ``describe()`` names every family, so a
    metric of your own with one of akter's names, or a second runtime's collector in the same
    registry, fails at registration (``ValueError``: duplicated timeseries) rather than
    producing a page with two series of one name. Keep the returned object to unregister it.
    """

    __slots__ = ("_source",)

    def __init__(self, source: Readable) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        """Every family that has a series, in the page's order: counters, histograms, gauges."""
        reading = self._source.reading()
        for name in sorted(reading.counters):
            family = METRICS[name]
            metric = _metric(family)
            for key, value in sorted(reading.counters[name].items()):
                metric.add_sample(family.prometheus, dict(key), value)
            yield metric
        for name in sorted(reading.histograms):
            family = METRICS[name]
            metric = _metric(family)
            for key, series in sorted(reading.histograms[name].items()):
                _add_histogram(metric, family, key, series)
            yield metric
        for name in sorted(reading.gauges):
            if not reading.gauges[name]:
                continue
            family = METRICS[name]
            metric = _metric(family)
            for key, value in sorted(reading.gauges[name].items()):
                metric.add_sample(family.prometheus, dict(key), value)
            yield metric

    def describe(self) -> Iterator[Metric]:
        """Every family akter may expose, without samples (for clash checks at registration)."""
        for family in FAMILIES:
            yield _metric(family)


def render(collector: PrometheusCollector) -> str:
    """The collector's page in the Prometheus text format (``prometheus_client``'s exposition)."""
    return generate_latest(collector).decode("utf-8")


def _metric(family: Family) -> Metric:
    # prometheus_client names a counter family without "_total" and adds it back on the page.
    return Metric(family.prometheus.removesuffix("_total"), family.help, family.type)


def _add_histogram(metric: Metric, family: Family, key: Key, series: HistogramSeries) -> None:
    running = 0
    for bound, n in zip((*family.buckets, None), series.counts, strict=True):
        running += n
        le = "+Inf" if bound is None else _number(bound)
        metric.add_sample(f"{metric.name}_bucket", {**dict(key), "le": le}, running)
    metric.add_sample(f"{metric.name}_sum", dict(key), series.sum)
    metric.add_sample(f"{metric.name}_count", dict(key), running)


def _number(value: float) -> str:
    # A bucket bound as the page always wrote it: exact integers as integers ("1", not "1.0").
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))
