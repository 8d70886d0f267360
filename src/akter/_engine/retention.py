"""Retention sweeps (semantics §7): receipts after expiry + margin, events as a prefix.

A job's output stream goes whole ``keep_streams`` after its newest item (migration 0018,
docs/guides/job-streams.md).

Finished workflow runs (completed, failed, cancelled) go with their journal, signals and aliases
``keep_workflows`` after their end (the workflows spec W3); running, suspended and diverged runs
have no end and are never pruned.

Run by the ``$maintenance`` owner every 60 s (and by ``ActorTest.cleanup()``), per actor type,
in batches of 1,000 rows with ``FOR UPDATE SKIP LOCKED``. A receipt is never deleted while an
outbox row still carries its id (a redelivery must replay it), nor before its id's expiry plus
the margin ``max(keep_receipts − retry_window, delivery_timeout)``. Outbox rows, dead letters and
actors are never pruned.

The sweep also ranks job rows written without a claim rank (``rank_ms``, migration 0006) by a
runner that predates it during a rolling deploy: a NULL rank sorts after every ranked row, so
under a steady backlog such a row would never be claimed (docs/flow-control.md F1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from akter._store.gateway.maintenance import MaintenanceGateway
from akter._store.gateway.streams import StreamsGateway
from akter._store.gateway.workflows import WorkflowsGateway

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.retention")

BATCH = 1_000


@dataclass
class SweepCounts:
    """Rows one sweep deleted (and job rows it ranked)."""

    receipts: int = 0
    events: int = 0
    ranked: int = 0
    workflows: int = 0
    #: Jobs whose output stream was deleted.
    streams: int = 0


async def sweep(services: Services) -> SweepCounts:
    """One retention pass over every actor type this runtime hosts."""
    counts = SweepCounts()
    gateway = MaintenanceGateway(services.store, services.clock)
    runs = WorkflowsGateway(services.store, services.clock)
    streams = StreamsGateway(services.store, services.clock)
    now = await services.clock.read()
    for definition in services.registry.definitions.values():
        policy = definition.policy
        margin = max(policy.keep_receipts - services.config.window_ms, policy.delivery_timeout)
        name = definition.name
        while True:
            deleted = await gateway.prune_receipts(name, cutoff=now - margin, batch=BATCH)
            counts.receipts += deleted
            services.metrics.count("akter.receipts.pruned", deleted, actor_type=name)
            if deleted < BATCH:
                break
        while True:
            deleted = await gateway.prune_events(
                name,
                cutoff=now - policy.keep_events,
                batch=BATCH,
                held=now - policy.keep_events - policy.hold_events_for_subscribers,
            )
            counts.events += deleted
            services.metrics.count("akter.events.pruned", deleted, actor_type=name)
            if deleted < BATCH:
                break
        while True:
            deleted = await runs.prune(name, keep_ms=policy.keep_workflows, limit=BATCH)
            counts.workflows += deleted
            services.metrics.count("akter.workflows.pruned", deleted, actor_type=name)
            if deleted < BATCH:
                break
        cutoff = now - policy.keep_streams
        while (deleted := await streams.prune(name, cutoff=cutoff, batch=BATCH)) > 0:
            counts.streams += deleted
            if deleted < BATCH:
                break
    while True:
        ranked = await gateway.rank_unranked_jobs(batch=BATCH)
        counts.ranked += ranked
        if ranked < BATCH:
            break
    if counts.ranked:
        log.warning(
            "Ranked job rows written without a claim rank (a runner older than migration 0006)",
            extra={"jobs_ranked": counts.ranked},
        )
    if counts.receipts or counts.events or counts.workflows:
        log.info(
            "Retention sweep",
            extra={
                "receipts_pruned": counts.receipts,
                "events_pruned": counts.events,
                "workflows_pruned": counts.workflows,
            },
        )
    return counts
