"""Citus: which claim strategy a server needs, and the distribution of a schema's tables.

Design principle 7: every per-actor table leads its primary key with ``routing_key``, so on
Citus those tables are distributed by ``routing_key``, co-located with ``actors`` (a turn is a
single-shard transaction, foreign keys hold inside a shard). Singleton leases are distributed
too, each row in the shard of its singleton's actor (tenant ``"default"``, id ``""``), so a
loop's fence is a row lock in the shard of its own turns (migration 0008). The tables that
belong to no actor (the deployment row, the migration ledger, runners, job limits and rate
buckets) are reference tables, replicated to every node. ``docs/citus.md`` describes the layout.

The strategy is read from the server once at start (:func:`detect_strategy`): ``"citus"`` when
the ``citus`` extension is installed in the database, else ``"plain"``. Plain PostgreSQL keeps
its one-statement claims; Citus has no multi-shard ``FOR UPDATE SKIP LOCKED``, so there a claim
is an unlocked candidate scan followed by single-shard claims (``queries_citus.sql``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg import sql

from akter._ids import placement_key, routing_key
from akter._store.pipeline import Statements
from akter._store.queries import Queries
from akter.errors import ConfigurationError

Strategy = Literal["plain", "citus"]

#: Per-actor tables, distributed by ``routing_key`` and co-located with the first one.
DISTRIBUTED = (
    "actors",
    "receipts",
    "events",
    "outbox",
    "dead_letters",
    "operator_audit",
    "workflows",
    "workflow_steps",
    "workflow_signals",
    "workflow_aliases",
    # A job's output stream lives in its actor's shard (0018): fenced appends stay single-shard.
    "job_streams",
    # Keyed by the routing key of the singleton's actor (0008); ``distribute`` fills and rekeys it.
    "singletons",
    # Subscriptions (0016): feeds and follows in the source's shard, cursors in the subscriber's.
    "subscription_feeds",
    "subscription_follows",
    "subscription_cursors",
)
#: Tables that belong to no actor: reference tables (a copy on every node).
REFERENCE = (
    "migrations",
    "deployment",
    "deployment_names",
    "runners",
    "job_limits",
    "rate_buckets",
    "subscriptions",
)
#: Statements that lock or write rows across shards, run on plain PostgreSQL only; on Citus the
#: gateways run these variants instead (an unlocked scan, then keyed single-shard statements).
PLAIN_ONLY: dict[str, tuple[str, ...]] = {
    "claim_intents": (
        "citus_claim_intents_scan",
        "citus_claim_intent",
        "citus_claim_intent_keyed",
    ),
    "claim_jobs": ("citus_claim_jobs_scan", "citus_claim_job"),
    # Not run on Citus (a join with unnest() spans every shard): its wake runs the full claim.
    "claim_jobs_keyed": ("citus_claim_job",),
    "discover_capped_groups": ("citus_discover_capped_groups",),
    "prune_receipts": ("citus_prune_receipts",),
    "release_skewed_intents": ("citus_release_skewed_intents_scan", "citus_release_skewed_intent"),
    "release_skewed_jobs": ("citus_release_skewed_jobs_scan", "citus_release_skewed_job"),
    # Not a lock: a join with unnest() spans every shard (a two-phase commit across workers).
    "settle_intents": ("citus_settle_intent",),
    # Batched job settles (issue 45): on Citus each success is settled by its own keyed statement.
    "settle_jobs_route_batch": ("settle_job_route",),
    "settle_jobs_delete_batch": ("settle_job_delete",),
    # Evolution, queries_citus_ops.sql: an operator's parked rows, undeclared jobs.
    "parked_lock": ("citus_parked_scan", "citus_parked_lock"),
    "park_undeclared_jobs": ("citus_park_undeclared_scan", "citus_park_undeclared_job"),
    # Not locks: unnest() joined with correlated counts, which Citus cannot push down.
    "names_count_types": ("citus_names_count_type",),
    "names_count_commands": ("citus_names_count_command",),
    "names_count_jobs": ("citus_names_count_job",),
    "names_count_events": ("citus_names_count_event",),
    # Workflows: the run claim, like the job claim.
    "wf_claim": ("citus_wf_claim_scan", "citus_wf_claim"),
    # Singleton leases (0008): keyed by actor type alone they would lock across shards.
    "singleton_takeover": ("citus_singleton_takeover",),
    "acquire_singleton": ("citus_acquire_singleton",),
    "release_singleton": ("citus_release_singleton",),
    "check_singleton_fence": ("citus_check_singleton_fence",),
    "hold_singleton_fence": ("citus_hold_singleton_fence",),
    # Flow control (queries_citus.sql, "Flow control on Citus"). The claims' lock wait must
    # reach the workers, where the type and group locks wait: SET LOCAL, propagated.
    "job_group_settings": ("citus_job_group_settings", "citus_job_lock_wait"),
    # The settings folded into the group lock: on Citus the two statements above, then
    # job_group_lock (JobsGateway._lock_group).
    "job_group_lock_bounded": ("citus_job_group_settings", "citus_job_lock_wait"),
    # Batched group claims lock actor rows across shards: on Citus each group is claimed in a
    # transaction of its own (JobsGateway.claim_group).
    "job_groups_lock_skip": ("job_group_lock",),
    "job_groups_lock_running": ("job_group_lock_running",),
    # Not a lock: the live count at the claim's one clock reading (clock_now), not the workers'.
    "job_type_live": ("citus_job_type_live",),
    # Citus cannot read the upsert's own CTE in ON CONFLICT: one keyed upsert per bucket.
    "rate_take": ("citus_rate_take",),
    # Not a lock: a join with unnest() spans every shard (a two-phase commit across workers).
    "defer_jobs_for_token": ("citus_defer_job_for_token",),
}
#: Plain statements whose Citus variant takes the same parameters (plus ``rk``, which the plain
#: one ignores) and answers the same rows: on Citus the catalogue serves the variant under the
#: plain name (``Queries.prefer``), so their callers need no branch.
DROP_IN = {
    name: variants[0]
    for name, variants in PLAIN_ONLY.items()
    if name
    in ("singleton_takeover", "acquire_singleton", "check_singleton_fence", "hold_singleton_fence")
}


def singleton_routing_key(actor_type: str, placement: str) -> int:
    """The routing key of a singleton type's actor (tenant ``"default"``, id ``""``).

    ``placement`` is the type's (``"tenant"`` for ``$maintenance``, which is no actor type).
    """
    if placement == "tenant":
        return routing_key(placement_key("tenant", "default", actor_type, ""))
    if placement == "actor":
        return routing_key(placement_key("actor", "default", actor_type, ""))
    raise ConfigurationError(f"Unknown placement {placement!r} of {actor_type!r}.")


async def detect_strategy(conn: psycopg.AsyncConnection[Any], queries: Queries) -> Strategy:
    """``"citus"`` when the server has the ``citus`` extension in this database, else plain."""
    cur = await conn.execute(queries["citus_detect"])
    return "citus" if await cur.fetchone() is not None else "plain"


@dataclass
class Distribution:
    """What :func:`distribute` did: tables it distributed or made reference tables now."""

    distributed: list[str] = field(default_factory=list)
    referenced: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)


async def check_coordinator(conn: psycopg.AsyncConnection[Any], queries: Queries) -> None:
    """Refuse a server without Citus, or a Citus worker (DDL needs the coordinator)."""
    if await detect_strategy(conn, queries) != "citus":
        raise ConfigurationError(
            "This database has no citus extension: run `CREATE EXTENSION citus` on the "
            "coordinator (Citus comes from its own packages), or use plain PostgreSQL without "
            "`akter citus distribute`."
        )
    cur = await conn.execute(queries["citus_is_coordinator"])
    row = await cur.fetchone()
    if row is None or not row[0]:
        raise ConfigurationError(
            "This server is a Citus worker, not the coordinator: point the URL at the "
            "coordinator (migrations and distribution run there; a worker refuses CREATE SCHEMA)."
        )


async def distribute(
    conn: psycopg.AsyncConnection[Any], queries: Queries, placements: dict[str, str]
) -> Distribution:
    """Distribute a migrated schema's tables (idempotent: a table already placed is left alone).

    ``conn`` is an autocommit connection to the coordinator; the schema's migrations must have
    been applied (``akter.cli.citus`` runs them first). ``placements`` are the deployment's
    type placements, which key the singleton leases (a type not among them: ``"tenant"``).
    """
    await check_coordinator(conn, queries)
    done = Distribution()
    placed = await _placed(conn, queries)
    if "singletons" not in placed or "singletons" in await _references(conn, queries):
        await _key_singletons(conn, queries, placements, placed)
        placed.discard("singletons")
    missing = [t for t in (*DISTRIBUTED, *REFERENCE) if not await _exists(conn, queries, t)]
    if missing:
        raise ConfigurationError(
            f"Schema {queries.schema!r} lacks tables {missing!r}: apply the migrations first."
        )
    for table in REFERENCE:
        if table in placed:
            done.already.append(table)
            continue
        await conn.execute(queries["citus_create_reference"], {"table": _qualified(queries, table)})
        done.referenced.append(table)
    anchor = DISTRIBUTED[0]
    for table in DISTRIBUTED:
        if table in placed:
            done.already.append(table)
            continue
        await conn.execute(
            queries["citus_create_distributed"],
            {
                "table": _qualified(queries, table),
                "with": "default" if table == anchor else _qualified(queries, anchor),
            },
        )
        done.distributed.append(table)
    return done


async def _references(conn: psycopg.AsyncConnection[Any], queries: Queries) -> set[str]:
    cur = await conn.execute(queries["citus_reference_tables"], {"schema": queries.schema})
    return {str(r[0]) for r in await cur.fetchall()}


async def _key_singletons(
    conn: psycopg.AsyncConnection[Any],
    queries: Queries,
    placements: dict[str, str],
    placed: set[str],
) -> None:
    """Make the lease rows distributable: every row keyed, the key ``(routing_key, actor_type)``.

    A schema distributed before 0008 holds them in a reference table, which is turned back into
    a local table first (its rows kept). Runs in one transaction with the rekey, so a failure
    leaves the table as it was.
    """
    if "singletons" in placed:
        await conn.execute(
            queries["citus_undistribute"], {"table": _qualified(queries, "singletons")}
        )
    async with conn.transaction():
        cur = await conn.execute(queries["singletons_unkeyed"])
        for (actor_type,) in await cur.fetchall():
            key = singleton_routing_key(actor_type, placements.get(actor_type, "tenant"))
            await conn.execute(queries["singletons_key"], {"rk": key, "actor_type": actor_type})
        # Rekeyed once: the unique index becomes the primary key (a rerun finds it gone).
        if await _exists(conn, queries, "singletons_routing"):
            await conn.execute(queries["singletons_rekey"])


async def is_distributed(conn: psycopg.AsyncConnection[Any], queries: Queries) -> bool:
    """Whether the schema's ``outbox`` is a Citus table (the schema was distributed)."""
    return "outbox" in await _placed(conn, queries)


async def _placed(conn: psycopg.AsyncConnection[Any], queries: Queries) -> set[str]:
    if await detect_strategy(conn, queries) != "citus":
        return set()
    cur = await conn.execute(queries["citus_placed"], {"schema": queries.schema})
    return {str(r[0]) for r in await cur.fetchall()}


async def _exists(conn: psycopg.AsyncConnection[Any], queries: Queries, table: str) -> bool:
    cur = await conn.execute(queries["citus_table_exists"], {"table": _qualified(queries, table)})
    row = await cur.fetchone()
    return row is not None and bool(row[0])


def _qualified(queries: Queries, table: str) -> str:
    return f'"{queries.schema}".{table}'


def all_tenant_placed(placements: dict[str, str]) -> bool:
    """Whether every type is placed by tenant (then one tenant's actors share one shard)."""
    return bool(placements) and all(p == "tenant" for p in placements.values())


def worker_lock_wait(queries: Queries, lock_wait_ms: int) -> bytes:
    """The ``SET LOCAL`` bounding a transaction's lock waits on the workers (``citus_lock_wait``).

    A row lock of a distributed table waits on the worker that holds its shard, out of reach of
    the coordinator's ``lock_timeout`` (``set_config``). ``SET LOCAL`` reaches the workers once
    ``citus_propagate_set_local`` ran in the transaction. ``SET`` takes no parameter, so callers
    build the statement once per wait and keep it.
    """
    literal = sql.Literal(f"{max(lock_wait_ms, 1)}ms")
    return sql.SQL(queries["citus_lock_wait"]).format(lock_timeout=literal).as_bytes(None)


async def bound_worker_locks(
    conn: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any] | Statements,
    queries: Queries,
    lock_wait: bytes,
) -> None:
    """Bound this transaction's lock waits on every worker it will touch by ``lock_wait``.

    ``lock_wait`` is a :func:`worker_lock_wait` statement; send this before the first statement
    that reaches a shard.
    """
    await conn.execute(queries["citus_propagate_set_local"])
    await conn.execute(lock_wait)
