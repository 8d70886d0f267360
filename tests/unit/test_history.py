"""The console's chart history: rates and growth per interval from a runner's own metrics."""

from __future__ import annotations

from akter._engine.history import History
from akter.telemetry import Metrics


def test_points_turn_counters_into_rates_and_keep_unreported_gauges_apart() -> None:
    metrics = Metrics(["Order"], [("Order", "charge")])
    now = [1_000_000]
    history = History(metrics, every_s=15, keep_s=60, wall=lambda: now[0])
    history.record()
    assert history.series() == []  # one point is only the base of the first interval

    metrics.count("akter.receipts.written", 30, actor_type="Order")
    metrics.count("akter.relay.delivered", 4, kind="job")
    metrics.count("akter.relay.delivered", 9, kind="intent")  # not a job: not charted
    metrics.count("akter.relay.retried", 2, kind="job")
    metrics.count("akter.job.dead_letters", 1, actor_type="Order", job="charge")
    metrics.count("akter.workflows.completed", 3, actor_type="Order")
    now[0] += 15_000
    history.record()
    (first,) = history.series()
    assert first == {
        "at_ms": 1_015_000,
        "commits_per_s": 2.0,
        "relay_lag_ms": None,  # not the $maintenance owner: no sample, not a zero
        "outbox_rows": None,
        "jobs": {"succeeded": 4.0, "retried": 2.0, "dead": 1.0},
        "workflows": {"running": None, "suspended": None, "completed": 3.0, "failed": 0.0},
    }

    metrics.replace("akter.relay.lag_ms", [({"kind": "intent"}, 120.0), ({"kind": "job"}, 80.0)])
    metrics.replace("akter.outbox.rows", [({"kind": "intent"}, 5.0), ({"kind": "job"}, 7.0)])
    metrics.replace("akter.workflows.running", [({"actor_type": "Order"}, 2.0)])
    metrics.replace("akter.workflows.suspended", [({"actor_type": "Order"}, 6.0)])
    now[0] += 15_000
    history.record()
    second = history.series()[-1]
    assert (second["commits_per_s"], second["relay_lag_ms"], second["outbox_rows"]) == (0, 120, 12)
    assert second["workflows"] == {"running": 2, "suspended": 6, "completed": 0, "failed": 0}
    assert [p["at_ms"] for p in history.series(since_ms=1_015_000)] == [1_030_000]


def test_the_ring_keeps_the_last_hour_only() -> None:
    metrics = Metrics()
    now = [0]
    history = History(metrics, every_s=15, keep_s=60, wall=lambda: now[0])
    for _ in range(10):
        history.record()
        now[0] += 15_000
    # 60 s of 15 s intervals: 4 intervals, from the 5 newest points.
    assert [p["at_ms"] for p in history.series()] == [90_000, 105_000, 120_000, 135_000]
