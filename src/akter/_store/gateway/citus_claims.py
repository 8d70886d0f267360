"""Claims on Citus (``queries_citus.sql``): an unlocked scan, then single-shard claims.

Citus has no multi-shard ``FOR UPDATE SKIP LOCKED``, so the one-statement claims of plain
PostgreSQL (``claim_intents``, ``claim_jobs``, the skew releases) become three steps on one
connection: one clock reading (``clock_now``, a table-less statement that runs on the
coordinator: the one clock of design principle 6), a scan of due candidates without locks,
then one claim per candidate, pipelined, each in its own shard with ``FOR UPDATE SKIP LOCKED``
and the scan's predicate checked again, so a row another claimer holds is skipped, never waited
for, and a row that stopped being due is left alone. Candidates are claimed oldest first until
``free`` rows are claimed or the candidates run out.

The gateways (``outbox``, ``jobs``, ``skew``) pick these when ``Store.strategy`` is ``"citus"``;
the rows returned have the columns of the plain statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from psycopg.rows import DictRow, dict_row

from akter._kinds import RowKind

if TYPE_CHECKING:
    from akter._store.queries import Queries

#: A result row as the driver returns it; the gateways turn it into their typed rows.
Row = DictRow
#: A statement's named parameters.
Params = Mapping[str, Any]
Cursor = psycopg.AsyncCursor[Row]


async def read_clock(cur: Cursor, queries: Queries, off: int) -> int:
    """The framework clock now, read once for a whole claim (``clock_now``)."""
    await cur.execute(queries["clock_now"], {"off": off})
    row = await cur.fetchone()
    assert row is not None
    return int(row["now_ms"])


async def claim_each(
    cur: Cursor,
    statement: LiteralString,
    candidates: Sequence[Row],
    free: int,
    params: Callable[[Row], Params],
) -> list[Row]:
    """Claim candidates in order, a pipelined batch at a time, until ``free`` are claimed.

    Each claim is its own transaction (a ``Sync`` after each): one shard each, so no claim
    waits for another's commit and none needs a two-phase commit across workers.
    """
    claimed: list[Row] = []
    pending = list(candidates)
    while pending and len(claimed) < free:
        take = free - len(claimed)
        batch, pending = pending[:take], pending[take:]
        claimed.extend(await each_alone(cur.connection, statement, [params(c) for c in batch]))
    return claimed


async def each_alone(
    conn: psycopg.AsyncConnection[Any], statement: LiteralString, params: Sequence[Params]
) -> list[Row]:
    """Run ``statement`` once per parameter set, pipelined, each in its own transaction."""
    cursors: list[Cursor] = []
    async with conn.pipeline() as pipeline:
        for p in params:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(statement, p)
            await pipeline.sync()
            cursors.append(cur)
    rows: list[Row] = []
    for cur in cursors:
        if cur.description is not None:
            rows.extend(await cur.fetchall())
    return rows


async def claim_intents(
    conn: psycopg.AsyncConnection[Any], queries: Queries, params: Params
) -> list[Row]:
    """``claim_intents`` on Citus: the same parameters, the same returned columns."""
    cur = conn.cursor(row_factory=dict_row)
    now = await read_clock(cur, queries, int(params["off"]))
    base = {**params, "now": now}
    await cur.execute(queries["citus_claim_intents_scan"], base, prepare=False)
    candidates = await cur.fetchall()
    rows = await claim_each(
        cur,
        queries["citus_claim_intent"],
        candidates,
        int(params["free"]),
        lambda c: {**base, "rk": c["routing_key"], "intent_id": c["intent_id"]},
    )
    return [{**row, "candidates": len(candidates)} for row in rows]


async def claim_intents_keyed(
    conn: psycopg.AsyncConnection[Any],
    queries: Queries,
    params: Params,
    keys: Sequence[tuple[int, str]],
) -> list[Row]:
    """Intents named by ``(routing_key, intent_id)``, claimed without a scan.

    The rows a local commit just made due (``Relay``'s keyed passes): ``citus_claim_intent_keyed``
    per key, pipelined, each in its own shard and its own transaction, ``SKIP LOCKED`` and only
    while the row is still due and unparked, at the coordinator's clock (read by the statement
    itself: one round trip in all). Returns the claimed rows with the columns of
    ``claim_intents``.
    """
    if not keys:
        return []
    rows = await each_alone(
        conn,
        queries["citus_claim_intent_keyed"],
        [{**params, "rk": rk, "intent_id": intent_id} for rk, intent_id in keys],
    )
    return [{**row, "candidates": len(keys)} for row in rows]


async def claim_jobs(
    conn: psycopg.AsyncConnection[Any], queries: Queries, params: Params
) -> list[Row]:
    """``claim_jobs`` on Citus: the same parameters, the same returned columns."""
    candidates = await job_candidates(conn, queries, params)
    return await claim_job_candidates(conn, queries, params, candidates)


async def job_candidates(
    conn: psycopg.AsyncConnection[Any], queries: Queries, params: Params
) -> list[Row]:
    """Step 1 of ``claim_jobs`` on Citus: the due rows of the declared pairs, without locks.

    Each candidate carries the scan's clock reading (``now``), which the claims use unless
    their caller read the clock again (under a capped type's lock).
    """
    pairs = set(zip(params["types"], params["jobs"], strict=True))
    cur = conn.cursor(row_factory=dict_row)
    now = await read_clock(cur, queries, int(params["off"]))
    base = {k: v for k, v in params.items() if k != "max_attempts"} | {"now": now}
    await cur.execute(queries["citus_claim_jobs_scan"], base, prepare=False)
    # The scan matches types and jobs separately; only the declared pairs are claimed.
    found = await cur.fetchall()
    return [{**c, "now": now} for c in found if (c["actor_type"], c["command"]) in pairs]


async def claim_job_candidates(
    conn: psycopg.AsyncConnection[Any],
    queries: Queries,
    params: Params,
    candidates: Sequence[Row],
    *,
    now: int | None = None,
) -> list[Row]:
    """Step 2 of ``claim_jobs`` on Citus: single-shard claims of ``candidates``, in order.

    ``slots`` (not None: a capped type's free slots) bounds the claim like ``free``; ``now``
    (not None) replaces the scan's clock reading.
    """
    free = int(params["free"])
    if params.get("slots") is not None:
        free = min(free, int(params["slots"]))
    if not candidates or free <= 0:
        return []
    pairs = zip(params["types"], params["jobs"], strict=True)
    limits = dict(zip(pairs, params["max_attempts"], strict=True))
    base = {k: v for k, v in params.items() if k != "max_attempts"}
    rows = await claim_each(
        conn.cursor(row_factory=dict_row),
        queries["citus_claim_job"],
        candidates,
        free,
        lambda c: {
            **base,
            "now": c["now"] if now is None else now,
            "rk": c["routing_key"],
            "intent_id": c["intent_id"],
            "type": c["actor_type"],
            "job": c["command"],
            "max_attempts": limits[(c["actor_type"], c["command"])],
        },
    )
    return [{**row, "candidates": len(candidates)} for row in rows]


async def discover_groups(
    conn: psycopg.AsyncConnection[Any], queries: Queries, params: Params
) -> list[Row]:
    """``discover_capped_groups`` on Citus (read only): the declared pairs' groups, oldest first."""
    pairs = set(zip(params["types"], params["jobs"], strict=True))
    cur = conn.cursor(row_factory=dict_row)
    now = await read_clock(cur, queries, int(params["off"]))
    await cur.execute(
        queries["citus_discover_capped_groups"], {**params, "now": now}, prepare=False
    )
    return [r for r in await cur.fetchall() if (r["actor_type"], r["command"]) in pairs]


async def release_skewed(cur: Cursor, queries: Queries, kind: RowKind, params: Params) -> list[Row]:
    """``release_skewed_intents`` / ``release_skewed_jobs`` (``kind``) on Citus."""
    now = await read_clock(cur, queries, int(params["off"]))
    base = {**params, "now": now}
    if kind == RowKind.INTENT:
        scan = queries["citus_release_skewed_intents_scan"]
        claim = queries["citus_release_skewed_intent"]
    else:
        scan = queries["citus_release_skewed_jobs_scan"]
        claim = queries["citus_release_skewed_job"]
    await cur.execute(scan, base)
    candidates = await cur.fetchall()
    if kind == RowKind.JOB:
        pairs = set(zip(params["types"], params["jobs"], strict=True))
        candidates = [c for c in candidates if (c["actor_type"], c["command"]) in pairs]
    return await claim_each(
        cur,
        claim,
        candidates,
        len(candidates),
        lambda c: {**base, "rk": c["routing_key"], "intent_id": c["intent_id"]},
    )
