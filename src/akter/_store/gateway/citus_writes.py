"""A turn's writes on Citus: every statement routed to the actor's shard, one row each.

On plain PostgreSQL a warm turn writes its state and its receipts in one statement
(``update_actor_receipt``: the receipts' ``INSERT`` in a CTE beside the update). Citus routes
only ``SELECT``, ``UPDATE`` and ``DELETE`` CTEs to a shard: that statement is planned on the
coordinator as subplans (the update and the insert sent apart, their counts read back from
intermediate results), and a turn's commit took about twice as long as with the same writes as
two routed statements. So on Citus the flight queues ``update_actor`` (its fence raises unless
exactly one row changed, which aborts the flight's later statements with it) and then one
single-row ``citus_insert_receipt`` per receipt, each routed to the actor's shard as it is.

The multi-row inserts (``insert_events``, ``insert_outbox``, ``insert_receipts``,
``wf_start_in_turn``) read their rows from ``unnest``: Citus plans such an ``INSERT ... SELECT``
as "pull to coordinator" and writes the rows with COPY over a second connection to the worker,
so the turn's commit becomes two-phase (a ``pg_dist_transaction`` record, ``PREPARE`` and
``COMMIT PREPARED``). On Citus each row is an ``INSERT ... VALUES`` of its own instead, all in
the same flight. Capped jobs (an enqueue ordinal above 0) keep ``insert_outbox``: their ready
time reads the actor's other rows of the job in the same statement, which ``VALUES`` cannot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from akter._store.pipeline import Answer, Statements
from akter._store.queries import Queries

if TYPE_CHECKING:
    from akter._staging import StagedEvent, StagedRow, StagedRun

#: ``actors.receipt_params``' arrays, and the scalar each becomes in ``one_receipt_params``.
_ARRAYS = ("command_ids", "commands", "payload_hashes", "caller_keys", "outcomes", "expires")
_SCALARS = ("command_id", "command", "payload_hash", "caller_key", "outcome", "expires_at_ms")


async def update_then_receipts(
    pipe: Statements,
    q: Queries,
    params: Mapping[str, Any],
    key: Mapping[str, Any],
    receipts: Mapping[str, Any],
) -> Answer:
    """Queue ``update_actor`` with ``params``, then the receipts, one insert each.

    ``receipts`` are ``actors.one_receipt_params`` or ``actors.receipt_params``; returns the
    update's answer.
    """
    answer = await pipe.execute(q["update_actor"], params)
    if "command_id" in receipts:  # one receipt, as scalars
        await pipe.execute(q["citus_insert_receipt"], {**key, **receipts})
        return answer
    await receipts_apart(pipe, q, key, receipts)
    return answer


async def receipts_apart(
    pipe: Statements, q: Queries, key: Mapping[str, Any], receipts: Mapping[str, Any]
) -> None:
    """Queue ``actors.receipt_params``' receipts, one ``citus_insert_receipt`` each."""
    for values in zip(*(receipts[column] for column in _ARRAYS), strict=True):
        await pipe.execute(
            q["citus_insert_receipt"], {**key, **dict(zip(_SCALARS, values, strict=True))}
        )


async def events_apart(
    pipe: Statements,
    q: Queries,
    key: Mapping[str, Any],
    now_ms: int,
    first_seq: int,
    events: Sequence[tuple[StagedEvent, str]],
) -> None:
    """Queue ``(event, command id)`` events numbered from ``first_seq``, one statement each."""
    for seq, (event, command_id) in enumerate(events, start=first_seq):
        await pipe.execute(
            q["citus_insert_event"],
            {
                **key,
                "now": now_ms,
                "seq": seq,
                "tag": event.tag,
                "payload": event.payload,
                "payload_version": event.version,
                "command_id": command_id,
            },
        )


async def outbox_apart(
    pipe: Statements,
    q: Queries,
    key: Mapping[str, Any],
    *,
    bucket: int,
    commit_ms: int,
    rows: Sequence[StagedRow],
    ordinals: Sequence[int],
    traceparent: str | None,
) -> list[tuple[StagedRow, int]]:
    """Queue the rows without an ordinal, one statement each; return the capped jobs' rows."""
    capped: list[tuple[StagedRow, int]] = []
    for row, ordinal in zip(rows, ordinals, strict=True):
        if ordinal > 0:
            capped.append((row, ordinal))
            continue
        await pipe.execute(
            q["citus_insert_outbox_row"],
            {
                **key,
                "bucket": bucket,
                "commit": commit_ms,
                "intent_id": row.intent_id,
                "kind": row.kind,
                "target_type": row.target_type,
                "target_id": row.target_id,
                "command": row.command,
                "payload": row.payload,
                "payload_version": row.payload_version,
                "caller": row.caller,
                "delay": row.delay_ms,
                "at": row.at_ms,
                "timer_key": row.timer_key,
                "priority": row.priority,
                "max_wait": row.max_wait_ms,
                "traceparent": traceparent,
            },
        )
    return capped


async def runs_apart(
    pipe: Statements,
    q: Queries,
    key: Mapping[str, Any],
    *,
    commit_ms: int,
    runs: Sequence[StagedRun],
    traceparent: str | None,
) -> Answer | None:
    """Queue the turn's workflow starts, one ``citus_wf_start_in_turn`` each; the last answer."""
    answer = None
    for run in runs:
        answer = await pipe.execute(
            q["citus_wf_start_in_turn"],
            {
                **key,
                "commit": commit_ms,
                "run_id": run.run_id,
                "workflow": run.workflow,
                "run_key": run.key,
                "input": run.input,
                "input_hash": run.input_hash,
                "caller": run.caller,
                "timeout_ms": run.timeout_ms,
                "traceparent": traceparent,
            },
        )
    return answer
