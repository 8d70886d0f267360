"""What a turn staged, queued in its commit flight: events, timer deletes, job cancels, outbox rows.

As in :mod:`akter._store.gateway.actors` (whose ``Key``, ``Executor`` and ``Cursor`` these use),
each function queues statements on the turn's pipeline and reads nothing itself. With
``rows_apart`` (Citus) a multi-row insert goes one routed statement per row
(:mod:`akter._store.gateway.citus_writes`): an ``INSERT ... SELECT`` from ``unnest`` would make
the turn's commit two-phase there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

from akter._staging import StagedEvent, StagedRow
from akter._store.gateway import citus_writes
from akter._store.gateway.actors import Cursor, Executor, Key
from akter._store.queries import Queries


def insert_events(
    conn: Executor,
    q: Queries,
    key: Key,
    now_ms: int,
    first_seq: int,
    events: Sequence[tuple[StagedEvent, str]],
    *,
    rows_apart: bool = False,
) -> Awaitable[Cursor | None]:
    """Append ``(event, command id)`` events numbered from ``first_seq``, with their versions.

    ``rows_apart`` (Citus): one routed statement per event (``citus_writes``).
    """
    if rows_apart:
        return citus_writes.events_apart(conn, q, key, now_ms, first_seq, events)
    return conn.execute(
        q["insert_events"],
        {
            **key,
            "now": now_ms,
            "seqs": list(range(first_seq, first_seq + len(events))),
            "tags": [e.tag for e, _ in events],
            "payloads": [e.payload for e, _ in events],
            "versions": [e.version for e, _ in events],
            "command_ids": [c for _, c in events],
        },
    )


def delete_timers(conn: Executor, q: Queries, key: Key, keys: list[str]) -> Awaitable[Cursor]:
    """Delete the actor's pending timers with ``keys``."""
    return conn.execute(q["delete_timers"], {**key, "keys": keys})


async def cancel_jobs(conn: Executor, q: Queries, key: Key, keys: list[str], now_ms: int) -> Cursor:
    """Cancel the actor's jobs with ``keys``; the cursor yields ``(job id, running)`` rows."""
    await conn.execute(q["cancel_jobs_unstarted"], {**key, "keys": keys})
    return await conn.execute(q["cancel_jobs_started"], {**key, "keys": keys, "now": now_ms})


async def insert_outbox(
    conn: Executor,
    q: Queries,
    key: Key,
    *,
    bucket: int,
    commit_ms: int,
    rows: Sequence[StagedRow],
    ordinals: list[int],
    traceparent: str | None,
    rows_apart: bool = False,
) -> Cursor | None:
    """Write staged intents, timers and jobs (``ordinals``: see ``turn.writes.ordinals``).

    Relative delays count from ``commit_ms``, the commit's clock as the turn bounds it from its
    one clock reading (``turn.writes.release_clock``).
    ``traceparent`` (W3C text of the span that staged them, or ``None``) goes with every row.
    ``rows_apart`` (Citus): a routed statement per row (``citus_writes``); only the capped
    jobs' rows, if any, then go in ``insert_outbox``.
    """
    if rows_apart:
        capped = await citus_writes.outbox_apart(
            conn,
            q,
            key,
            bucket=bucket,
            commit_ms=commit_ms,
            rows=rows,
            ordinals=ordinals,
            traceparent=traceparent,
        )
        if not capped:
            return None
        rows, ordinals = [row for row, _ in capped], [ordinal for _, ordinal in capped]
    return await conn.execute(
        q["insert_outbox"],
        {
            **key,
            "bucket": bucket,
            "commit": commit_ms,
            "intent_ids": [r.intent_id for r in rows],
            "kinds": [r.kind for r in rows],
            "target_types": [r.target_type for r in rows],
            "target_ids": [r.target_id for r in rows],
            "commands": [r.command for r in rows],
            "payloads": [r.payload for r in rows],
            "payload_versions": [r.payload_version for r in rows],
            "callers": [r.caller for r in rows],
            "delays": [r.delay_ms for r in rows],
            "ats": [r.at_ms for r in rows],
            "timer_keys": [r.timer_key for r in rows],
            "ords": ordinals,
            "priorities": [r.priority for r in rows],
            "max_waits": [r.max_wait_ms for r in rows],
            "traceparent": traceparent,
        },
    )
