"""A turn's writes on Citus: the state update, then each receipt as a statement of its own.

On plain PostgreSQL a warm turn writes its state and its receipts in one statement
(``update_actor_receipt``: the receipts' ``INSERT`` in a CTE beside the update). Citus routes
only ``SELECT``, ``UPDATE`` and ``DELETE`` CTEs to a shard: that statement is planned on the
coordinator as subplans (the update and the insert sent apart, their counts read back from
intermediate results), and a turn's commit took about twice as long as with the same writes as
two routed statements. So on Citus the flight queues ``update_actor`` (its fence raises unless
exactly one row changed, which aborts the flight's later statements with it) and then one
single-row ``citus_insert_receipt`` per receipt, each routed to the actor's shard as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from akter._store.pipeline import Answer, TurnPipeline
from akter._store.queries import Queries

#: ``actors.receipt_params``' arrays, and the scalar each becomes in ``one_receipt_params``.
_ARRAYS = ("command_ids", "commands", "payload_hashes", "caller_keys", "outcomes", "expires")
_SCALARS = ("command_id", "command", "payload_hash", "caller_key", "outcome", "expires_at_ms")


async def update_then_receipts(
    pipe: TurnPipeline,
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
    for values in zip(*(receipts[column] for column in _ARRAYS), strict=True):
        one = dict(zip(_SCALARS, values, strict=True))
        await pipe.execute(q["citus_insert_receipt"], {**key, **one})
    return answer
