"""The workflow statements a turn queues in its own commit flight (starts, live keys)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from akter._store.gateway import citus_writes

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

    from akter._staging import StagedRun
    from akter._store.pipeline import Answer, Statements
    from akter._store.queries import Queries


def start_in_turn(
    pipe: Statements,
    q: Queries,
    key: Mapping[str, Any],
    *,
    commit_ms: int,
    runs: Sequence[StagedRun],
    traceparent: str | None,
    rows_apart: bool = False,
) -> Awaitable[Answer | None]:
    """Queue a turn's workflow starts in its commit flight (``wf_start_in_turn``).

    The runs live in the turn's actor's shard (its routing key). ``rows_apart`` (Citus): one
    routed statement per run (``citus_writes``), not one ``INSERT ... SELECT`` of them all.
    A keyed start whose key a live run holds fails the flight (:func:`live_key_taken`).
    """
    if rows_apart:
        return citus_writes.runs_apart(
            pipe, q, key, commit_ms=commit_ms, runs=runs, traceparent=traceparent
        )
    return pipe.execute(
        q["wf_start_in_turn"],
        {
            **key,
            "commit": commit_ms,
            "run_ids": [r.run_id for r in runs],
            "workflows": [r.workflow for r in runs],
            "keys": [r.key for r in runs],
            "inputs": [r.input for r in runs],
            "input_hashes": [r.input_hash for r in runs],
            "callers": [r.caller for r in runs],
            "timeouts": [r.timeout_ms for r in runs],
            "traceparent": traceparent,
        },
    )


def live_key_taken(exc: BaseException) -> bool:
    """Whether a failed flight of a turn that starts keyed runs met a live key.

    ``wf_start_in_turn``'s unique violation on ``workflows_live_key`` (on Citus the shard's
    copy of the index, named with the shard's id appended). Citus re-raises a worker's error
    without the constraint's name, but with the worker's message, which names it; and it runs
    this ``INSERT ... SELECT`` through the coordinator, writing the rows to the shard with COPY,
    whose errors it re-raises as ``XX000`` (an internal error) with that message. So a violation
    counts by its constraint's name, else by the index its message names; one that says neither
    counts too (the engine's answer, one more run of the batch, is safe whatever the cause).
    """
    if not isinstance(exc, psycopg.errors.UniqueViolation | psycopg.errors.InternalError_):
        return False
    name = exc.diag.constraint_name
    if name is not None:
        return name.startswith("workflows_live_key")
    message = exc.diag.message_primary
    if message is None:
        return isinstance(exc, psycopg.errors.UniqueViolation)
    return '"workflows_live_key' in message


async def live_keys_answer(cur: Answer) -> dict[tuple[str, str], str]:
    """A :func:`live_keyed_runs` answer: the live run's id by (workflow, key)."""
    return {(str(w), str(k)): str(run) for w, k, run in await cur.fetchall()}


def live_keyed_runs(pipe: Statements, q: Queries, key: Mapping[str, Any]) -> Awaitable[Answer]:
    """Queue the read of the actor's live keyed runs (``wf_live_keys``) in a turn's flight."""
    return pipe.execute(q["wf_live_keys"], key)
