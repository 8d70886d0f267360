"""Retention sweeps (semantics §7): receipts after expiry + margin, events as a prefix.

Run by the ``$maintenance`` owner every 60 s (and by ``ActorTest.cleanup()``), per actor type,
in batches of 1,000 rows with ``FOR UPDATE SKIP LOCKED``. A receipt is never deleted while an
outbox row still carries its id (a redelivery must replay it), nor before its id's expiry plus
the margin ``max(keep_receipts − retry_window, delivery_timeout)``. Outbox rows, dead letters and
actors are never pruned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akter.runtime import Runtime

log = logging.getLogger("akter.retention")

BATCH = 1_000


@dataclass
class SweepCounts:
    """Rows one sweep deleted."""

    receipts: int = 0
    events: int = 0


async def sweep(runtime: Runtime) -> SweepCounts:
    """One retention pass over every actor type this runtime hosts."""
    counts = SweepCounts()
    queries = runtime.store.queries
    now = await runtime.clock.read()
    for definition in runtime.definitions.values():
        policy = definition.policy
        margin = max(policy.keep_receipts - runtime.window_ms, policy.delivery_timeout)
        for name, cutoff in (
            ("prune_receipts", now - margin),
            ("prune_events", now - policy.keep_events),
        ):
            while True:
                async with runtime.store.framework.connection() as conn:
                    cur = await conn.execute(
                        queries[name],
                        {"type": definition.name, "cutoff": cutoff, "batch": BATCH},
                    )
                    deleted = len(await cur.fetchall())
                if name == "prune_receipts":
                    counts.receipts += deleted
                else:
                    counts.events += deleted
                runtime.metrics.count(
                    "akter.receipts.pruned" if name == "prune_receipts" else "akter.events.pruned",
                    deleted,
                    actor_type=definition.name,
                )
                if deleted < BATCH:
                    break
    if counts.receipts or counts.events:
        log.info(
            "Retention sweep",
            extra={"receipts_pruned": counts.receipts, "events_pruned": counts.events},
        )
    return counts
