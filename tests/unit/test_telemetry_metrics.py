"""The in-process metrics and their Prometheus text (semantics §10.1), without a database.

The text is ``prometheus_client``'s exposition (its number format: ``1.0``, ``1.234567e+06``).
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from akter._metric_families import (
    COUNTERS,
    FAMILIES,
    GAUGES,
    SAMPLED_GAUGES,
    TURN_OUTCOMES,
)
from akter.telemetry import ALLOWED_ATTRIBUTES, DURATION_BUCKETS_MS, Metrics


def test_histogram_buckets_are_upper_inclusive_and_cumulative() -> None:
    metrics = Metrics()
    for value in (0.4, 1, 1.5, 60_000, 60_001):
        metrics.observe("akter.turn.duration_ms", value, actor_type="A")
    found = metrics.histogram("akter.turn.duration_ms", actor_type="A")
    assert found.bounds == DURATION_BUCKETS_MS
    assert found.buckets == (2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 5)
    assert found.count == 5 and found.sum == pytest.approx(120_003.9)
    assert metrics.histogram("akter.turn.duration_ms", actor_type="B").count == 0


def test_prometheus_text_of_every_metric_type() -> None:
    metrics = Metrics()
    metrics.count("akter.turns", actor_type="A", outcome="success")
    metrics.count("akter.relay.delivered", 1_234_567, kind="intent")
    metrics.observe("akter.turn.batch_size", 3, actor_type="A")
    metrics.observe("akter.pool.wait_ms", 0.25)
    metrics.set("akter.activations", 2, actor_type='A"b')
    lines = metrics.render().splitlines()
    start = lines.index("# TYPE akter_relay_delivered_total counter")
    assert lines[start - 1 : start + 3] == [
        "# HELP akter_relay_delivered_total Intents delivered and jobs succeeded.",
        "# TYPE akter_relay_delivered_total counter",
        'akter_relay_delivered_total{kind="intent"} 1.234567e+06',
        'akter_relay_delivered_total{kind="job"} 0.0',
    ]
    assert 'akter_turns_total{actor_type="A",outcome="success"} 1.0' in lines
    assert "# TYPE akter_pool_wait_ms histogram" in lines
    assert 'akter_pool_wait_ms_bucket{le="1"} 1.0' in lines
    assert "akter_pool_wait_ms_sum 0.25" in lines and "akter_pool_wait_ms_count 1.0" in lines
    assert [ln for ln in lines if ln.startswith("akter_turn_batch_size")] == [
        'akter_turn_batch_size_bucket{actor_type="A",le="1"} 0.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="2"} 0.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="4"} 1.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="8"} 1.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="16"} 1.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="32"} 1.0',
        'akter_turn_batch_size_bucket{actor_type="A",le="+Inf"} 1.0',
        'akter_turn_batch_size_sum{actor_type="A"} 3.0',
        'akter_turn_batch_size_count{actor_type="A"} 1.0',
    ]
    assert lines[-2:] == [
        "# TYPE akter_activations gauge",
        'akter_activations{actor_type="A\\"b"} 2.0',
    ]


def test_gauge_replacement_and_clearing() -> None:
    metrics = Metrics()
    metrics.replace("akter.jobs.running", [({"actor_type": "A", "job": "j"}, 2)])
    metrics.replace("akter.jobs.running", [({"actor_type": "A", "job": "k"}, 1)])
    assert metrics.gauge("akter.jobs.running", actor_type="A", job="j") == 0  # settled: 0
    assert metrics.gauge("akter.jobs.running", actor_type="A", job="k") == 1
    metrics.clear(["akter.jobs.running"])
    assert metrics.gauge("akter.jobs.running", actor_type="A", job="k") is None
    assert "akter_jobs_running" not in metrics.render()


def test_names_and_attributes_are_checked() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError, match="not a histogram"):
        metrics.observe("akter.turns", 1)
    with pytest.raises(ValueError, match="not a gauge"):
        metrics.set("akter.turns", 1)
    with pytest.raises(ValueError, match="not allowed"):
        metrics.set("akter.activations", 1, tenant="t")
    with pytest.raises(ValueError, match="not allowed"):
        metrics.replace("akter.outbox.rows", [({"command_id": "c"}, 1)])
    with pytest.raises(ValueError, match="not a counter"):
        metrics.count("akter.turn.retries", actor_type="A")
    with pytest.raises(ValueError, match="takes the labels"):
        metrics.count("akter.turns", actor_type="A")


def test_every_family_is_declared_once_with_help_and_its_labels() -> None:
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    for family in FAMILIES:
        assert family.help.endswith(".") and "\n" not in family.help, family.name
        assert ALLOWED_ATTRIBUTES.issuperset(family.labels), family.name
        assert (family.type == "histogram") == bool(family.buckets), family.name
    assert SAMPLED_GAUGES <= GAUGES


def test_a_fresh_registry_exposes_every_counter_at_zero_with_help() -> None:
    metrics = Metrics(["A", "B"], [("A", "pay")])
    metrics.observe("akter.pool.wait_ms", 3)
    metrics.set("akter.activations", 1, actor_type="A")
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    for family in families.values():
        assert family.documentation, family.name
    declared = {f.prometheus.removesuffix("_total"): f for f in COUNTERS.values()}
    for name, counter in declared.items():
        parsed = families[name]  # the parser drops a counter's _total suffix
        assert parsed.type == "counter" and parsed.documentation == counter.help
        assert parsed.samples and all(s.value == 0 for s in parsed.samples), name
    turns = {(s.labels["actor_type"], s.labels["outcome"]) for s in families["akter_turns"].samples}
    assert turns == {(a, o) for a in ("A", "B") for o in TURN_OUTCOMES}
    assert [s.labels for s in families["akter_job_dead_letters"].samples] == [
        {"actor_type": "A", "job": "pay"}
    ]
    assert {s.labels["kind"] for s in families["akter_relay_retried"].samples} == {"intent", "job"}
    assert families["akter_pool_wait_ms"].type == "histogram"
    assert families["akter_activations"].type == "gauge"


@pytest.mark.parametrize(
    "outcomes",
    [["success"], ["success", "replay", "failure"], ["replay", "replay"], ["defect"]],
)
def test_a_batchs_turn_metrics_equal_the_separate_counts(outcomes: list[str]) -> None:
    """``Metrics.turns`` (every turn's fast path) records what the separate calls would."""
    fast, separate = Metrics(actor_types=["A"]), Metrics(actor_types=["A"])
    for metrics in (fast, separate):
        metrics.count("akter.turns", actor_type="A", outcome="success")  # an earlier batch
    fast.turns("A", outcomes, 12.5)
    separate.count("akter.turn.batches", actor_type="A")
    separate.observe("akter.turn.batch_size", len(outcomes), actor_type="A")
    for outcome in outcomes:
        separate.count("akter.turns", actor_type="A", outcome=outcome)
        separate.observe("akter.turn.duration_ms", 12.5, actor_type="A")
        if outcome == "replay":
            separate.count("akter.receipts.replayed", actor_type="A")
    assert fast.render() == separate.render()
    assert fast.value("akter.turns", actor_type="A", outcome="success") == 1 + outcomes.count(
        "success"
    )
    assert fast.histogram("akter.turn.duration_ms", actor_type="A").count == len(outcomes)
