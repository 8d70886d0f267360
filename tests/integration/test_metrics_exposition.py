"""``GET /metrics`` as Prometheus reads it (semantics §10.1): HELP on every family, counters at 0.

The text is parsed with ``prometheus_client``'s parser, not by string matching: a family without
HELP, a malformed sample or a counter that appears only after its first increment fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import akter
import akter.http
from akter._metric_families import COUNTERS, FAMILIES, ROW_KINDS
from akter.telemetry import Metrics
from akter.testing import ActorTest
from tests.integration.test_jobs_actors import ALL, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


async def scrape(t: ActorTest) -> str:
    app = akter.http.app(t.runtime)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


async def test_a_fresh_runtime_exposes_every_counter_at_zero_with_help(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        parsed = {f.name: f for f in text_string_to_metric_families(await scrape(t))}
        help_of = {f.prometheus.removesuffix("_total"): f.help for f in FAMILIES}
        for name, family in parsed.items():
            assert family.documentation == help_of[name], name
        for counter in COUNTERS.values():
            family = parsed[counter.prometheus.removesuffix("_total")]
            assert family.type == "counter" and family.samples, counter.name
            assert {s.value for s in family.samples} == {0.0}, counter.name
        retried = parsed["akter_relay_retried"].samples
        assert {s.labels["kind"] for s in retried} == set(ROW_KINDS)
        letters = {
            (s.labels["actor_type"], s.labels["job"])
            for s in parsed["akter_job_dead_letters"].samples
        }
        assert ("Shop", "charge") in letters and ("Hot", "two") in letters
        turns = {s.labels["actor_type"] for s in parsed["akter_turns"].samples}
        assert turns == {"Shop", "Hot", "Rejecting"}


async def test_counted_series_keep_their_help_after_increments(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        await t.get(Shop, "m").buy(100, key="k-1")
        parsed = {f.name: f for f in text_string_to_metric_families(await scrape(t))}
        assert all(f.documentation for f in parsed.values())
        ok = [
            s.value
            for s in parsed["akter_turns"].samples
            if s.labels == {"actor_type": "Shop", "outcome": "success"}
            and s.name.endswith("_total")
        ]
        assert ok == [1.0]
        assert parsed["akter_turn_duration_ms"].type == "histogram"
        assert parsed["akter_activations"].type == "gauge"


# --- the page pinned: every family, HELP and TYPE line, label set and value ---------------------

#: The page of :func:`populated` as the hand-written renderer wrote it before ``/metrics`` moved
#: to ``prometheus_client``'s exposition (issue 43, scope 7): its ``# HELP``/``# TYPE`` lines in
#: order, and every sample as parsed (name, labels, value). Pinned, never regenerated to make a
#: change pass: a family, help text, type, label or series that changes fails here.
GOLDEN = Path(__file__).with_name("metrics_page.golden.json")
#: The label value each label gets in :func:`populated` (an ``actor_type`` that needs escaping).
VALUES = {"actor_type": "Shop", "kind": "intent", "job": "charge", "outcome": "success"}


def populated() -> Metrics:
    """Metrics with a series in every family: counters, histograms (two buckets) and gauges."""
    metrics = Metrics(["Shop", "Hot"], [("Shop", "charge")])
    for family in FAMILIES:
        labels = {name: VALUES[name] for name in family.labels}
        if family.type == "counter":
            metrics.count(family.name, 2, **labels)
        elif family.type == "histogram":
            metrics.observe(family.name, 3, **labels)
            metrics.observe(family.name, 70_000.5, **labels)
        else:
            metrics.set(family.name, 5, **labels)
    metrics.set("akter.activations", 1.25, actor_type='Sh"op\\1\n')
    return metrics


def page_of(text: str) -> dict[str, Any]:
    """The page as pinned: its HELP/TYPE lines in order and its samples, parsed and sorted."""
    heads = [line for line in text.splitlines() if line.startswith(("# HELP ", "# TYPE "))]
    samples = sorted(
        [s.name, sorted(s.labels.items()), s.value]
        for family in text_string_to_metric_families(text)
        for s in family.samples
    )
    return {"heads": heads, "samples": json.loads(json.dumps(samples))}


def label_sets(page: dict[str, Any]) -> set[tuple[str, tuple[str, ...]]]:
    """Each sample name with the names of its labels."""
    return {(name, tuple(k for k, _ in labels)) for name, labels, _ in page["samples"]}


def test_the_page_keeps_every_family_help_type_label_and_value() -> None:
    golden = json.loads(GOLDEN.read_text("utf-8"))
    page = page_of(populated().render())
    assert page["heads"] == golden["heads"]
    assert page["samples"] == golden["samples"]
    declared = {f.prometheus for f in FAMILIES}
    assert {h.split()[2] for h in golden["heads"]} == declared  # every family, each once
    assert len(golden["heads"]) == 2 * len(FAMILIES)


async def test_the_served_page_has_the_pinned_heads_and_label_sets(akter_test: Make) -> None:
    golden = json.loads(GOLDEN.read_text("utf-8"))
    async with akter_test(ALL) as t:
        await t.get(Shop, "m").buy(100, key="k-1")
        metrics = t.runtime.metrics
        for family in FAMILIES:  # a series in every family, as in populated()
            labels = {name: VALUES[name] for name in family.labels}
            if family.type == "histogram":
                metrics.observe(family.name, 3, **labels)
            elif family.type == "gauge":
                metrics.set(family.name, 5, **labels)
        page = page_of(await scrape(t))
    assert sorted(page["heads"]) == sorted(golden["heads"])
    assert label_sets(page) <= label_sets(golden)


# --- an application's own registry ----------------------------------------------------------------


def test_an_application_registers_akters_collector_beside_its_own_metric() -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()
    orders = Counter("shop_orders", "Orders placed.", registry=registry)
    orders.inc(3)
    registry.register(populated().collector())
    page = page_of(generate_latest(registry).decode())
    golden = json.loads(GOLDEN.read_text("utf-8"))
    ours = [h for h in page["heads"] if h.split()[2] == "shop_orders_total"]
    assert ours == ["# HELP shop_orders_total Orders placed.", "# TYPE shop_orders_total counter"]
    assert [h for h in page["heads"] if h.split()[2].startswith("akter_")] == golden["heads"]
    assert ["shop_orders_total", [], 3.0] in page["samples"]
    assert [s for s in page["samples"] if s[0].startswith("akter_")] == golden["samples"]


def test_the_collector_describes_every_family_so_clashes_fail_at_registration() -> None:
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    registry.register(Metrics().collector())
    with pytest.raises(ValueError, match="akter_relay_lag_ms"):
        Gauge("akter_relay_lag_ms", "An application's own, clashing name.", registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(Metrics().collector())  # a second runtime's metrics: same series


async def test_a_runtimes_collector_reads_its_live_counts(akter_test: Make) -> None:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    async with akter_test(ALL) as t:
        registry.register(t.runtime.metrics.collector())
        labels = {"actor_type": "Shop", "outcome": "success"}
        assert registry.get_sample_value("akter_turns_total", labels) == 0
        await t.get(Shop, "m").buy(100, key="k-1")
        assert registry.get_sample_value("akter_turns_total", labels) == 1
        count = registry.get_sample_value("akter_turn_duration_ms_count", {"actor_type": "Shop"})
        assert count is not None and count >= 1
