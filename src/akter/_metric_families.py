"""Every metric akter records (semantics §10.1): names, types, one-line help, labels, buckets.

The single source of what :class:`akter.telemetry.Metrics` accepts and what ``GET /metrics``
declares with ``# HELP`` and ``# TYPE``; OpenTelemetry instruments take the same help as their
description.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from akter._kinds import RowKind

#: Histogram buckets of every ``*_ms`` metric (semantics §10.1).
DURATION_BUCKETS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
)  # fmt: skip
#: Histogram buckets of ``akter.turn.batch_size`` (a batch holds 1 to 32 commands).
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32)

MetricType = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True, slots=True)
class Family:
    """One declared metric: its name, type, one-line help, labels and (histograms) buckets."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def prometheus(self) -> str:
        """The Prometheus family name (``.`` becomes ``_``; counters end in ``_total``)."""
        base = self.name.replace(".", "_")
        return base + "_total" if self.type == "counter" else base


#: The ``outcome`` values of ``akter.turns`` (:func:`turn_outcome`).
TURN_OUTCOMES: tuple[str, ...] = ("success", "failure", "defect", "replay", "retry", "refused")
#: The ``kind`` values of the outbox and relay counters (an outbox row's kind).
ROW_KINDS: tuple[str, ...] = tuple(k.value for k in RowKind)

_A = ("actor_type",)
_K = ("kind",)
#: Every metric (semantics §10.1): the single source of names, help texts and label sets.
FAMILIES: tuple[Family, ...] = (
    Family(
        "akter.turns", "counter", "Commands run in turns, by result.", ("actor_type", "outcome")
    ),
    Family("akter.turn.batches", "counter", "Turn batches committed or refused.", _A),
    Family("akter.receipts.written", "counter", "Receipts written by committed turns.", _A),
    Family("akter.receipts.replayed", "counter", "Commands answered from a stored receipt.", _A),
    Family("akter.receipts.pruned", "counter", "Expired receipts deleted by retention.", _A),
    Family("akter.events.appended", "counter", "Events appended by committed turns.", _A),
    Family("akter.events.pruned", "counter", "Events deleted by retention.", _A),
    Family("akter.activations.started", "counter", "Actors activated on this runner.", _A),
    Family("akter.outbox.staged", "counter", "Outbox rows staged by committed turns.", _K),
    Family("akter.relay.delivered", "counter", "Intents delivered and jobs succeeded.", _K),
    Family("akter.relay.retried", "counter", "Deliveries and job attempts that back off.", _K),
    Family("akter.job.dead_letters", "counter", "Jobs dead-lettered.", ("actor_type", "job")),
    Family(
        "akter.subscription.delivered",
        "counter",
        "Subscription deliveries whose turn committed, by subscriber type.",
        _A,
    ),
    Family(
        "akter.subscription.retried",
        "counter",
        "Subscription rounds that failed and back off, by subscriber type.",
        _A,
    ),
    Family(
        "akter.subscription.lag",
        "gauge",
        "Age of the oldest feed with undelivered events, per subscriber type (ms).",
        _A,
    ),
    Family(
        "akter.turn.duration_ms",
        "histogram",
        "Duration of the batch transaction a command ran in, per command (ms).",
        _A,
        DURATION_BUCKETS_MS,
    ),
    Family(
        "akter.turn.batch_size", "histogram", "Commands per turn batch.", _A, BATCH_SIZE_BUCKETS
    ),
    Family(
        "akter.turn.shared_write",
        "histogram",
        "Warm turns per shared write (several actors' one-flight turns sent together).",
        (),
        BATCH_SIZE_BUCKETS,
    ),
    Family(
        "akter.mailbox.age_ms",
        "histogram",
        "Time from a command's enqueue to the start of its batch (ms).",
        _A,
        DURATION_BUCKETS_MS,
    ),
    Family(
        "akter.pool.wait_ms",
        "histogram",
        "Time to acquire a database connection (ms).",
        (),
        DURATION_BUCKETS_MS,
    ),
    Family("akter.activations", "gauge", "Actors resident on this runner.", _A),
    Family("akter.outbox.rows", "gauge", "Outbox rows (sampled by the $maintenance owner).", _K),
    Family(
        "akter.relay.lag_ms",
        "gauge",
        "Age of the oldest due unclaimed outbox row, 0 if none (ms; sampled).",
        _K,
    ),
    Family("akter.relay.stuck_rows", "gauge", "Outbox rows with 8 or more attempts (sampled).", _K),
    Family(
        "akter.jobs.running",
        "gauge",
        "Job attempts running under a live lease (sampled).",
        ("actor_type", "job"),
    ),
    Family(
        "akter.outbox.parked",
        "gauge",
        "Outbox rows parked because the code cannot deliver them (sampled; evolution E3).",
        _K,
    ),
    Family(
        "akter.jobs.waiting_slot",
        "gauge",
        "Due job rows held back by their type's deployment-wide concurrency cap (sampled).",
        ("actor_type", "job"),
    ),
    Family(
        "akter.jobs.waiting_rate",
        "gauge",
        "Job rows handed back to wait for a rate-limit token (sampled).",
        ("actor_type", "job"),
    ),
    Family(
        "akter.jobs.unserved",
        "gauge",
        "Due job rows of a type no live runner executes (sampled; evolution E3).",
        ("actor_type", "job"),
    ),
    Family(
        "akter.orphans",
        "gauge",
        "Stored names (type, command, job, event tag) no definition or alias claims (E2).",
        ("kind",),
    ),
    # Workflows (the workflows spec, W4).
    Family("akter.workflows.started", "counter", "Workflow runs started.", _A),
    Family("akter.workflows.completed", "counter", "Workflow runs that completed.", _A),
    Family("akter.workflows.failed", "counter", "Workflow runs that failed.", _A),
    Family("akter.workflows.cancelled", "counter", "Workflow runs that ended cancelled.", _A),
    Family(
        "akter.workflows.running",
        "gauge",
        "Workflow runs executing under a live lease (sampled).",
        _A,
    ),
    Family(
        "akter.workflows.suspended",
        "gauge",
        "Workflow runs suspended until a wake: a timer, a signal or a job outcome (sampled).",
        _A,
    ),
    Family("akter.workflows.pruned", "counter", "Finished workflow runs deleted by retention.", _A),
    Family(
        "akter.workflow.step.duration_ms",
        "histogram",
        "Duration of a workflow's local step, from its first attempt to its result (ms).",
        (),
        DURATION_BUCKETS_MS,
    ),
)
#: Every metric by name.
METRICS: Mapping[str, Family] = {family.name: family for family in FAMILIES}
#: Every counter.
COUNTERS: Mapping[str, Family] = {f.name: f for f in FAMILIES if f.type == "counter"}
#: Every histogram and its bucket upper bounds.
HISTOGRAMS: Mapping[str, tuple[float, ...]] = {
    f.name: f.buckets for f in FAMILIES if f.type == "histogram"
}
#: Gauges sampled by the ``$maintenance`` owner (the rest are kept by every runner).
SAMPLED_GAUGES = frozenset(
    {
        "akter.outbox.rows",
        "akter.relay.lag_ms",
        "akter.relay.stuck_rows",
        "akter.jobs.running",
        "akter.outbox.parked",
        "akter.jobs.unserved",
        "akter.jobs.waiting_slot",
        "akter.jobs.waiting_rate",
        "akter.orphans",
        "akter.workflows.running",
        "akter.workflows.suspended",
        "akter.subscription.lag",
    }
)
#: Every gauge.
GAUGES = frozenset(f.name for f in FAMILIES if f.type == "gauge")
