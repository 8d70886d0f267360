"""Migrations on a real PostgreSQL: the documented schema (semantics §1.8) and startup checks.

Each test works in its own fresh schema and drops it afterwards. "No table changed" is checked
by comparing snapshots of every akter table's rows and of the schema's relations.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel

import akter
from akter._store.migrate import SCHEMA_VERSION, known_migrations, migrate
from akter._store.queries import Queries

pytestmark = pytest.mark.timeout(120)

ACTOR_KEY = {"routing_key", "tenant_id", "actor_type", "actor_id"}

#: Columns per table, as documented in semantics §1.8.
COLUMNS: dict[str, set[str]] = {
    "deployment": {
        "singleton",
        "schema_version",
        "retry_window_ms",
        "deployment_id",
        "placements",
        "created_at_ms",
    },
    "actors": ACTOR_KEY
    | {"version", "created", "event_seq", "state", "state_version", "updated_at_ms"},
    "receipts": ACTOR_KEY
    | {"command_id", "command", "payload_hash", "caller_key", "outcome", "expires_at_ms"},
    "events": ACTOR_KEY
    | {"seq", "tag", "payload", "payload_version", "command_id", "emitted_at_ms"},
    "outbox": ACTOR_KEY
    | {
        "intent_id",
        "bucket",
        "kind",
        "target_type",
        "target_id",
        "command",
        "payload",
        "payload_version",
        "caller",
        "due_at_ms",
        "scheduled_at_ms",
        "ready_at_ms",
        "attempts",
        "last_error",
        "ambiguous",
        "maybe_applied",
        "running",
        "waiting",
        "final_failure",
        "cancelled_at_ms",
        "timer_key",
        "traceparent",
        "parked_at_ms",
        "priority",
        "rank_ms",
        "waiting_for",
    },
    "job_limits": {"actor_type", "job", "concurrency"},
    "rate_buckets": {"actor_type", "job", "limit_no", "key", "tokens", "at_ms", "granted"},
    "deployment_names": {"actor_type", "kind", "name", "recorded_at_ms"},
    "operator_audit": {
        "audit_id",
        "routing_key",
        "at_ms",
        "operator",
        "action",
        "kind",
        "tenant_id",
        "actor_type",
        "actor_id",
        "command",
        "row_json",
        "reason",
    },
    "dead_letters": ACTOR_KEY
    | {
        "job_id",
        "job",
        "payload",
        "payload_version",
        "attempts",
        "cause",
        "ambiguous",
        "dead_at_ms",
    },
    "runners": {
        "runner_id",
        "started_at_ms",
        "heartbeat_at_ms",
        "http_address",
        "actor_types",
        "job_types",
        "version",
        "draining",
        # 0014: per hosted type, the state version and the key paths its model declares.
        "models",
    },
    # 0008: the routing key of the singleton's actor (the row's shard on Citus).
    "singletons": {"routing_key", "actor_type", "owner", "lease_until_ms", "acquired_at_ms"},
    "migrations": {"id", "applied_at_ms", "checksum"},
    # Workflows (migration 0007, the workflows spec W3).
    "workflows": {
        "routing_key",
        "run_id",
        "tenant_id",
        "actor_type",
        "actor_id",
        "workflow",
        "run_key",
        "input",
        "input_hash",
        "caller",
        "status",
        "wake_at_ms",
        "waiting",
        "cancel_requested",
        "pending_wake",
        "deadline_ms",
        "lease_owner",
        "token",
        "attempts",
        "result",
        "error",
        "started_at_ms",
        "updated_at_ms",
        "finished_at_ms",
        "traceparent",
    },
    "workflow_steps": {
        "routing_key",
        "run_id",
        "seq",
        "kind",
        "name",
        "status",
        "detail",
        "outcome",
        "started_at_ms",
        "recorded_at_ms",
    },
    "workflow_signals": {
        "routing_key",
        "run_id",
        "signal_id",
        "signal_seq",
        "name",
        "payload",
        "sent_at_ms",
        "consumed_seq",
    },
    "workflow_aliases": {"routing_key", "run_id", "target_run_id"},
    # Job output streams (migration 0018, docs/guides/job-streams.md).
    "job_streams": {
        "routing_key",
        "job_id",
        "seq",
        "tenant_id",
        "actor_type",
        "actor_id",
        "attempt",
        "item",
        "data",
        "at_ms",
    },
    # 0016: subscriptions (the subscriptions spec's data model)
    "subscription_feeds": {
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription", "head", "done"),
        *("due_at_ms", "claim_token", "claimed_until_ms", "attempts", "last_error", "parked"),
        "updated_at_ms",
        "rewound",  # 0022: a follow committed during the running round (S2)
    },
    "subscription_follows": {
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription", "subscriber_id"),
        "start_after",
    },
    "subscription_cursors": {
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription", "source_type"),
        *("source_id", "applied", "updated_at_ms"),
    },
    "subscriptions": {"name", "source_type", "shape", "start", "recorded_at_ms"},
}

#: Primary keys, in order (semantics §1.8: per-actor tables lead with routing_key).
PRIMARY_KEYS: dict[str, list[str]] = {
    "deployment": ["singleton"],
    "actors": ["routing_key", "tenant_id", "actor_type", "actor_id"],
    "receipts": ["routing_key", "tenant_id", "actor_type", "actor_id", "command_id"],
    "events": ["routing_key", "tenant_id", "actor_type", "actor_id", "seq"],
    "outbox": ["routing_key", "intent_id"],
    "dead_letters": ["routing_key", "job_id"],
    "operator_audit": ["routing_key", "audit_id"],
    "runners": ["runner_id"],
    "singletons": ["actor_type"],
    "migrations": ["id"],
    "deployment_names": ["actor_type", "kind", "name"],
    "job_limits": ["actor_type", "job"],
    "rate_buckets": ["actor_type", "job", "limit_no", "key"],
    "workflows": ["routing_key", "run_id"],
    "workflow_steps": ["routing_key", "run_id", "seq"],
    "workflow_signals": ["routing_key", "run_id", "signal_id"],
    "workflow_aliases": ["routing_key", "run_id"],
    "job_streams": ["routing_key", "job_id", "seq"],
    "subscription_feeds": [
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription"),
    ],
    "subscription_follows": [
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription", "subscriber_id"),
    ],
    "subscription_cursors": [
        *("routing_key", "tenant_id", "actor_type", "actor_id", "subscription", "source_type"),
        "source_id",
    ],
    "subscriptions": ["name"],
}

#: Secondary indexes by name: (table, unique, columns, partial predicate or None).
INDEXES: dict[str, tuple[str, bool, list[str], str | None]] = {
    "outbox_due": (
        "outbox",
        False,
        ["bucket", "kind", "due_at_ms"],
        "(parked_at_ms IS NULL)",
    ),
    "outbox_parked": ("outbox", False, ["kind", "parked_at_ms"], "(parked_at_ms IS NOT NULL)"),
    "operator_audit_at": ("operator_audit", False, ["at_ms"], None),
    "singletons_routing": ("singletons", True, ["routing_key", "actor_type"], None),
    "outbox_timer_key": (
        "outbox",
        True,
        ["routing_key", "tenant_id", "actor_type", "actor_id", "timer_key"],
        "(timer_key IS NOT NULL)",
    ),
    "outbox_intent_id": ("outbox", False, ["intent_id"], None),
    "outbox_jobs_running": (
        "outbox",
        False,
        ["routing_key", "tenant_id", "actor_type", "actor_id", "command"],
        "((kind = 'job'::text) AND running)",
    ),
    "outbox_jobs_ready": (
        "outbox",
        False,
        [
            "routing_key",
            "tenant_id",
            "actor_type",
            "actor_id",
            "command",
            "ready_at_ms",
            "intent_id",
        ],
        "((kind = 'job'::text) AND (NOT running))",
    ),
    "outbox_jobs_rank": (
        "outbox",
        False,
        ["bucket", "rank_ms"],
        "((kind = 'job'::text) AND (parked_at_ms IS NULL))",
    ),
    "outbox_jobs_type_running": (
        "outbox",
        False,
        ["actor_type", "command"],
        "((kind = 'job'::text) AND running)",
    ),
    "receipts_expiry": ("receipts", False, ["expires_at_ms"], None),
    # 0015: the receipts of commands staged in an application's transaction, by id alone.
    "receipts_staged": (
        "receipts",
        False,
        ["command_id"],
        '(caller_key ~~ \'["System","transaction",%\'::text)',
    ),
    "events_emitted": ("events", False, ["actor_type", "emitted_at_ms"], None),
    "workflows_live": (
        "workflows",
        False,
        ["actor_type", "status"],
        "(status = ANY (ARRAY['running'::text, 'suspended'::text]))",
    ),
    "subscription_feeds_due": (
        "subscription_feeds",
        False,
        ["due_at_ms"],
        "((head > done) AND (parked IS NULL))",
    ),
}

DEFAULT_WINDOW_MS = 86_400_000


class Counter(BaseModel):
    n: int = 0


class Tally(akter.Actor[Counter]):
    @akter.command
    async def add(self, by: int) -> int:
        self.state.n += by
        return self.state.n


class Placed(akter.Actor[Counter], name="Placed", placement="tenant"):
    @akter.command
    async def touch(self) -> None:
        return None


class Replaced(akter.Actor[Counter], name="Placed", placement="actor"):
    @akter.command
    async def touch(self) -> None:
        return None


class Newcomer(akter.Actor[Counter]):
    @akter.command
    async def touch(self) -> None:
        return None


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture
async def schema(akter_db: str) -> AsyncIterator[str]:
    """A fresh schema name; the schema is dropped after the test."""
    name = f"akter_m_{uuid.uuid4().hex[:12]}"
    yield name
    async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


async def _fetch(
    url: str, query: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(query.encode(), params or {})
        return await cur.fetchall()


async def _start(url: str, schema: str, actors: list[type[Any]], **options: Any) -> None:
    """Start a runtime on the schema and stop it again."""
    async with akter.Runtime(actors, database_url=url, schema=schema, **options) as runtime:
        assert runtime.readiness == "ready"


async def _snapshot(url: str, schema: str) -> dict[str, Any]:
    """Every row of every table of the schema, plus its relations and their identities."""
    relations = await _fetch(
        url,
        "SELECT c.relname, c.relkind, c.oid::bigint AS oid, c.relfilenode::bigint AS relfilenode"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %(schema)s ORDER BY c.relname",
        {"schema": schema},
    )
    rows: dict[str, Any] = {"relations": relations}
    for rel in relations:
        if rel["relkind"] == "r":
            table = sql.Identifier(schema, rel["relname"]).as_string(None)
            rows[rel["relname"]] = await _fetch(url, f"SELECT * FROM {table} ORDER BY 1")
    return rows


async def _deployment(url: str, schema: str) -> dict[str, Any]:
    table = sql.Identifier(schema, "deployment").as_string(None)
    (row,) = await _fetch(url, f"SELECT * FROM {table}")
    return row


# --- the documented schema ---------------------------------------------------------------------


async def test_migrations_yield_the_documented_tables_and_columns(
    akter_db: str, schema: str
) -> None:
    await _start(akter_db, schema, [Tally])

    tables = await _fetch(
        akter_db,
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = %(schema)s AND table_type = 'BASE TABLE'",
        {"schema": schema},
    )
    assert {t["table_name"] for t in tables} == set(COLUMNS)
    columns = await _fetch(
        akter_db,
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = %(schema)s",
        {"schema": schema},
    )
    found: dict[str, set[str]] = {}
    for c in columns:
        found.setdefault(c["table_name"], set()).add(c["column_name"])
    for table, expected in COLUMNS.items():
        assert found.get(table) == expected, table


async def test_0003_adds_a_nullable_traceparent_to_the_outbox(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    [column] = await _fetch(
        akter_db,
        "SELECT data_type, is_nullable, column_default FROM information_schema.columns"
        " WHERE table_schema = %(schema)s AND table_name = 'outbox'"
        " AND column_name = 'traceparent'",
        {"schema": schema},
    )
    # Rows written before 0003 read NULL (no rewrite of the table, no default).
    assert column == {"data_type": "text", "is_nullable": "YES", "column_default": None}
    applied = await _fetch(akter_db, f'SELECT id FROM "{schema}".migrations ORDER BY id')
    assert "0003_outbox_trace" in [r["id"] for r in applied]


async def test_0004_adds_parking_and_the_operator_audit(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    [column] = await _fetch(
        akter_db,
        "SELECT data_type, is_nullable, column_default FROM information_schema.columns"
        " WHERE table_schema = %(schema)s AND table_name = 'outbox'"
        " AND column_name = 'parked_at_ms'",
        {"schema": schema},
    )
    # Rows written before 0004 are not parked (no rewrite of the table, no default).
    assert column == {"data_type": "bigint", "is_nullable": "YES", "column_default": None}
    assert await _fetch(akter_db, f'SELECT * FROM "{schema}".v_operator_audit') == []
    applied = await _fetch(akter_db, f'SELECT id FROM "{schema}".migrations ORDER BY id')
    assert "0004_evolution" in [r["id"] for r in applied]


async def test_primary_keys_lead_with_routing_key(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    keys = await _fetch(
        akter_db,
        "SELECT c.relname AS table_name, array_agg(a.attname ORDER BY k.ord)::text[] AS columns"
        " FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
        " WHERE n.nspname = %(schema)s AND i.indisprimary"
        " GROUP BY c.relname",
        {"schema": schema},
    )
    assert {k["table_name"]: k["columns"] for k in keys} == PRIMARY_KEYS


async def test_indexes_and_storage_options(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    indexes = await _fetch(
        akter_db,
        "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s",
        {"schema": schema},
    )
    by_name = {i["indexname"]: i for i in indexes}
    for name, (table, unique, columns, predicate) in INDEXES.items():
        assert name in by_name, f"index {name} is missing"
        index = by_name[name]
        assert index["tablename"] == table
        match = re.fullmatch(
            r"CREATE (UNIQUE )?INDEX \S+ ON \S+ USING btree \(([^)]*)\)(?: WHERE (.*))?",
            index["indexdef"],
        )
        assert match is not None, index["indexdef"]
        assert bool(match.group(1)) is unique, name
        assert [c.strip() for c in match.group(2).split(",")] == columns, name
        assert match.group(3) == predicate, name

    (actors,) = await _fetch(
        akter_db,
        "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %(schema)s AND c.relname = 'actors'",
        {"schema": schema},
    )
    assert actors["reloptions"] == ["fillfactor=80"]
    # 0021: the outbox is vacuumed at a fixed dead-tuple bound, at once, never truncated.
    (outbox,) = await _fetch(
        akter_db,
        "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %(schema)s AND c.relname = 'outbox'",
        {"schema": schema},
    )
    assert sorted(outbox["reloptions"]) == [
        "autovacuum_vacuum_cost_delay=0",
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=1000",
        "vacuum_truncate=false",
    ]


async def test_outbox_bucket_is_checked_against_the_routing_key(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    outbox = sql.Identifier(schema, "outbox").as_string(None)
    insert = (
        f"INSERT INTO {outbox} (routing_key, intent_id, bucket, kind, tenant_id, actor_type,"
        " actor_id, target_type, target_id, command, payload, caller, due_at_ms,"
        " scheduled_at_ms) VALUES (%(rk)s, %(id)s, %(bucket)s, 'intent', 'default', 'Tally',"
        " 't', 'Tally', 't', 'add', '{}', '[]', 0, 0)"
    )
    rk = -6062870058202291897  # semantics §1.2: bucket -85
    with pytest.raises(psycopg.errors.CheckViolation):
        await _fetch(akter_db, insert + " RETURNING 1", {"rk": rk, "id": "a", "bucket": 85})
    rows = await _fetch(
        akter_db, insert + " RETURNING bucket", {"rk": rk, "id": "b", "bucket": -85}
    )
    assert rows == [{"bucket": -85}]


# --- the ledger, repeated and concurrent starts ------------------------------------------------


async def test_migrations_are_recorded_with_checksums(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    (now,) = await _fetch(akter_db, "SELECT floor(extract(epoch FROM now()) * 1000) AS ms")
    table = sql.Identifier(schema, "migrations").as_string(None)
    rows = await _fetch(akter_db, f"SELECT id, applied_at_ms, checksum FROM {table} ORDER BY id")
    known = known_migrations()
    assert [r["id"] for r in rows] == [m.id for m in known]
    assert rows[0]["id"] == "0001_initial"
    for row, migration in zip(rows, known, strict=True):
        assert row["checksum"] == migration.checksum
        assert re.fullmatch(r"[0-9a-f]{64}", row["checksum"])
        assert 0 <= int(now["ms"]) - row["applied_at_ms"] < 60_000

    deployment = await _deployment(akter_db, schema)
    assert deployment["schema_version"] == SCHEMA_VERSION
    assert deployment["retry_window_ms"] == DEFAULT_WINDOW_MS
    assert deployment["placements"] == {"Tally": "tenant"}
    assert isinstance(deployment["deployment_id"], uuid.UUID)


async def test_a_second_start_is_a_no_op(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    before = await _snapshot(akter_db, schema)
    assert before["migrations"] and before["deployment"]

    await _start(akter_db, schema, [Tally])

    after = await _snapshot(akter_db, schema)
    # Runner bookkeeping (registry rows, lease times) changes with every start by design.
    for volatile in ("runners", "singletons"):
        before.pop(volatile, None)
        after.pop(volatile, None)
    assert after == before


async def test_a_later_start_records_new_placements_only(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    first = await _deployment(akter_db, schema)
    await _start(akter_db, schema, [Tally, Newcomer])
    second = await _deployment(akter_db, schema)
    assert second["placements"] == {"Tally": "tenant", "Newcomer": "tenant"}
    assert {k: v for k, v in second.items() if k != "placements"} == {
        k: v for k, v in first.items() if k != "placements"
    }


async def test_concurrent_migrations_apply_each_migration_once(akter_db: str, schema: str) -> None:
    queries = Queries(schema)
    first = await psycopg.AsyncConnection.connect(akter_db, autocommit=True)
    second = await psycopg.AsyncConnection.connect(akter_db, autocommit=True)
    try:
        deployments = await asyncio.gather(
            migrate(
                first, queries, retry_window_ms=DEFAULT_WINDOW_MS, placements={"Tally": "tenant"}
            ),
            migrate(
                second, queries, retry_window_ms=DEFAULT_WINDOW_MS, placements={"Tally": "tenant"}
            ),
        )
    finally:
        await first.close()
        await second.close()

    assert deployments[0] == deployments[1]
    assert deployments[0].placements == {"Tally": "tenant"}
    table = sql.Identifier(schema, "migrations").as_string(None)
    rows = await _fetch(akter_db, f"SELECT id FROM {table} ORDER BY id")
    assert [r["id"] for r in rows] == [m.id for m in known_migrations()]
    deployment = await _deployment(akter_db, schema)
    assert str(deployment["deployment_id"]) == deployments[0].deployment_id
    # The advisory lock was released by both: a third start does not wait for it.
    async with asyncio.timeout(30):
        await _start(akter_db, schema, [Tally])


async def test_concurrent_runtimes_start_on_a_fresh_schema(akter_db: str, schema: str) -> None:
    await asyncio.gather(*(_start(akter_db, schema, [Tally]) for _ in range(3)))
    table = sql.Identifier(schema, "migrations").as_string(None)
    rows = await _fetch(akter_db, f"SELECT id FROM {table} ORDER BY id")
    assert [r["id"] for r in rows] == [m.id for m in known_migrations()]
    assert (await _deployment(akter_db, schema))["placements"] == {"Tally": "tenant"}


# --- refusals ----------------------------------------------------------------------------------


async def test_an_applied_unknown_migration_is_refused(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    table = sql.Identifier(schema, "migrations").as_string(None)
    await _fetch(
        akter_db,
        f"INSERT INTO {table} (id, applied_at_ms, checksum) VALUES ('9999_future', 0, 'x')"
        " RETURNING id",
    )
    before = await _snapshot(akter_db, schema)

    with pytest.raises(akter.ConfigurationError, match=r"9999_future"):
        await _start(akter_db, schema, [Tally])

    assert await _snapshot(akter_db, schema) == before


async def test_a_retry_window_mismatch_is_refused(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Tally])
    before = await _snapshot(akter_db, schema)

    with pytest.raises(akter.ConfigurationError, match=r"retry window of 86400000 ms .* 3600000"):
        # A new type too: a refused start must not record its placement either.
        await _start(akter_db, schema, [Tally, Newcomer], retry_window=timedelta(hours=1))

    assert await _snapshot(akter_db, schema) == before
    assert (await _deployment(akter_db, schema))["retry_window_ms"] == DEFAULT_WINDOW_MS


async def test_a_placement_mismatch_is_refused(akter_db: str, schema: str) -> None:
    await _start(akter_db, schema, [Placed])
    before = await _snapshot(akter_db, schema)
    assert before["deployment"][0]["placements"] == {"Placed": "tenant"}

    with pytest.raises(
        akter.ConfigurationError,
        match=r"'Placed' is recorded with placement 'tenant' but declared with 'actor'",
    ):
        await _start(akter_db, schema, [Replaced, Newcomer])

    assert await _snapshot(akter_db, schema) == before
    # The recorded placement still starts.
    await _start(akter_db, schema, [Placed])
