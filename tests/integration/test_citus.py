"""Citus (issue 16): ``akter citus distribute``, the layout, and claims that skip locked rows.

These need a Citus coordinator at ``$AKTER_TEST_CITUS_URL`` (``make test-citus``; CI has no
Citus, so they are skipped there and say so). The claim tests also run on the plain PostgreSQL
of ``akter_db``: the same gateway call, one statement there, scan + single-shard claims on Citus.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from akter._store.citus import DISTRIBUTED, REFERENCE, singleton_routing_key
from akter._store.gateway.jobs import JobsGateway, JobType
from akter._store.gateway.names import NamesGateway
from akter._store.gateway.outbox import OutboxGateway
from akter._store.gateway.parked import ParkedGateway, Selection, UnknownParked
from akter._store.migrate import migrate, migrate_and_distribute
from akter._store.pool import Clock, Store
from akter._store.queries import Queries
from akter.cli import app
from akter.cli.citus import TENANT_WARNING

CITUS_URL = os.environ.get("AKTER_TEST_CITUS_URL")
needs_citus = pytest.mark.skipif(
    not CITUS_URL, reason="AKTER_TEST_CITUS_URL is not set: no Citus coordinator (make test-citus)"
)

APP = """
import os, akter
from pydantic import BaseModel

class S(BaseModel):
    n: int = 0

class Tenanted(akter.Actor[S]):
    @akter.command
    async def add(self) -> None:
        self.state.n += 1

{extra}

runtime = akter.Runtime([{types}], database_url=os.environ["CITUS_APP_URL"],
                        schema=os.environ["CITUS_APP_SCHEMA"])
"""
SPREAD = """
class Spread(akter.Actor[S], placement="actor"):
    @akter.command
    async def add(self) -> None:
        self.state.n += 1
"""


def _schema() -> str:
    return f"akter_c_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def citus_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Write an app module; yields ``make(url, spread) -> (target, schema)``; drops schemas."""
    made: list[tuple[str, str]] = []

    def make(url: str, *, spread: bool = False) -> tuple[str, str]:
        name = f"citusapp_{uuid.uuid4().hex[:8]}"
        types = "Tenanted, Spread" if spread else "Tenanted"
        (tmp_path / f"{name}.py").write_text(
            APP.format(extra=SPREAD if spread else "", types=types), "utf-8"
        )
        schema = _schema()
        monkeypatch.setenv("CITUS_APP_URL", url)
        monkeypatch.setenv("CITUS_APP_SCHEMA", schema)
        made.append((url, schema))
        return f"{name}:runtime", schema

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for url, schema in made:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    for name in [m for m in sys.modules if m.startswith("citusapp_")]:
        del sys.modules[name]


def _placement(url: str, schema: str) -> dict[str, tuple[str, int | None, str | None]]:
    """The schema's Citus tables: (method, co-location group, distribution column)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname::text, p.partmethod::text, p.colocationid,"
            " column_to_column_name(p.logicalrelid, p.partkey)"
            " FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            [schema],
        ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _schema_exists(url: str, schema: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", [schema]).fetchone()
    return bool(row and row[0])


@needs_citus
def test_distribute_places_every_table_once_and_is_idempotent(citus_app: Any) -> None:
    assert CITUS_URL
    target, schema = citus_app(CITUS_URL, spread=True)
    first = CliRunner().invoke(app, ["citus", "distribute", target])
    assert first.exit_code == 0, first.output
    assert "tables placed now" in first.output
    assert "warning" not in first.output  # one type is placed by actor
    placed = _placement(CITUS_URL, schema)
    assert set(placed) == set(DISTRIBUTED) | set(REFERENCE)
    groups = {placed[t][1] for t in DISTRIBUTED}
    assert len(groups) == 1, "the per-actor tables are co-located"
    assert all(placed[t][0] == "h" and placed[t][2] == "routing_key" for t in DISTRIBUTED)
    assert all(placed[t][0] == "n" for t in REFERENCE)
    again = CliRunner().invoke(app, ["citus", "distribute", target, "--json"])
    assert again.exit_code == 0, again.output
    assert '"distributed": []' in again.output and '"reference": []' in again.output
    assert _placement(CITUS_URL, schema) == placed


@needs_citus
async def test_distribute_moves_reference_leases_into_their_actors_shards() -> None:
    """Leases of a layout older than 0008 move into their singleton actors' shards.

    That layout kept singleton leases in a reference table: a lease row written then (no
    routing key) is keyed from the placements and lands in the shard of its singleton's actor,
    co-located with actors; nothing else of the row changes, and a rerun places nothing.
    """
    assert CITUS_URL
    schema = _schema()
    queries = Queries(schema)
    placements = {"Billing": "actor"}
    conn = await psycopg.AsyncConnection.connect(CITUS_URL, autocommit=True)
    try:
        await migrate(conn, queries, retry_window_ms=86_400_000, placements=placements)
        # The layout before 0008: the lease table replicated, its rows without a key.
        await conn.execute(f"SELECT create_reference_table('\"{schema}\".singletons')")
        owner = str(uuid.uuid4())
        await conn.execute(
            f'INSERT INTO "{schema}".singletons (actor_type, owner, lease_until_ms,'
            " acquired_at_ms) VALUES ('Billing', %s, 9e12, 5), ('$maintenance', %s, 9e12, 6)",
            [owner, owner],
        )
        await migrate_and_distribute(
            CITUS_URL, queries, retry_window_ms=86_400_000, placements=placements
        )
        placed = _placement(CITUS_URL, schema)
        assert placed["singletons"][0] == "h" and placed["singletons"][2] == "routing_key"
        assert placed["singletons"][1] == placed["actors"][1], "co-located with actors"
        cur = await conn.execute(
            f"SELECT actor_type, routing_key, owner::text, lease_until_ms, acquired_at_ms"
            f' FROM "{schema}".singletons ORDER BY actor_type'
        )
        rows = await cur.fetchall()
        assert rows == [
            ("$maintenance", singleton_routing_key("$maintenance", "tenant"), owner, 9e12, 6),
            ("Billing", singleton_routing_key("Billing", "actor"), owner, 9e12, 5),
        ]
        again = await migrate_and_distribute(
            CITUS_URL, queries, retry_window_ms=86_400_000, placements=placements
        )
        assert again.distributed == [] and again.referenced == []
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


@needs_citus
def test_distribute_warns_when_every_type_is_tenant_placed(citus_app: Any) -> None:
    assert CITUS_URL
    target, _ = citus_app(CITUS_URL)
    result = CliRunner().invoke(app, ["citus", "distribute", target])
    assert result.exit_code == 0, result.output
    assert TENANT_WARNING.split(":")[0] in result.output
    assert "placement='actor'" in result.output


@needs_citus
def test_distribute_refuses_a_worker_and_writes_nothing(citus_app: Any) -> None:
    assert CITUS_URL
    with psycopg.connect(CITUS_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT node_name, node_port FROM citus_get_active_worker_nodes() LIMIT 1"
        ).fetchone()
    assert row is not None
    info = psycopg.conninfo.conninfo_to_dict(CITUS_URL)
    worker = psycopg.conninfo.make_conninfo(**{**info, "host": row[0], "port": str(row[1])})
    target, schema = citus_app(worker)
    result = CliRunner().invoke(app, ["citus", "distribute", target])
    assert result.exit_code == 1
    assert "worker, not the coordinator" in result.output
    assert not _schema_exists(worker, schema) and not _schema_exists(CITUS_URL, schema)


def test_distribute_refuses_plain_postgresql_and_writes_nothing(
    citus_app: Any, akter_db: str
) -> None:
    if CITUS_URL and CITUS_URL == akter_db:
        pytest.skip("akter_db is the Citus coordinator in this pass")
    target, schema = citus_app(akter_db)
    result = CliRunner().invoke(app, ["citus", "distribute", target])
    assert result.exit_code == 1
    assert "no citus extension" in result.output
    assert not _schema_exists(akter_db, schema)


# --- claims skip rows another claimer holds ------------------------------------------------------

_URLS = ["plain", pytest.param("citus", marks=needs_citus)]


@pytest.fixture(params=_URLS)
async def claim_store(request: pytest.FixtureRequest, akter_db: str) -> AsyncIterator[Store]:
    """A migrated schema (distributed on Citus) and an open Store on it."""
    url = CITUS_URL if request.param == "citus" else akter_db
    assert url
    if request.param == "plain" and CITUS_URL == akter_db:
        pytest.skip("akter_db is the Citus coordinator in this pass")
    schema = _schema()
    queries = Queries(schema)
    if request.param == "citus":
        await migrate_and_distribute(url, queries, retry_window_ms=86_400_000, placements={})
    else:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await migrate(conn, queries, retry_window_ms=86_400_000, placements={})
    store = Store(url, schema, min_size=1, max_size=2, framework_size=1)
    await store.open()
    assert store.strategy == request.param
    try:
        yield store
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _seed(store: Store, kind: str, n: int) -> list[tuple[int, str]]:
    """``n`` due rows of ``kind`` on ``n`` actors spread over shards; their keys."""
    q = store.queries
    keys = [((i * 0x0123456789ABCDE) % (1 << 62)) - (1 << 61) for i in range(1, n + 1)]
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        for i, rk in enumerate(keys):
            actor = {"rk": rk, "tenant": "t", "type": "T", "id": f"a{i}"}
            await conn.execute(
                q["ensure_actor"], {**actor, "state": "{}", "state_version": 0, "off": 0}
            )
            await conn.execute(
                q["dead_letter_requeue"] if kind == "job" else q["insert_ticks"],
                {**actor, "bucket": rk >> 56, "new_id": f"r{i}", "job": "work", "payload": "{}",
                 "payload_version": 0, "caller": "system", "maybe_applied": False, "off": -1000,
                 "intent_ids": [f"r{i}"], "commands": ["tick"], "dues": [0], "keys": [f"k{i}"],
                 "versions": [0]},
            )  # fmt: skip
    return [(rk, f"r{i}") for i, rk in enumerate(keys)]


async def _hold(store: Store, rk: int, intent_id: str) -> psycopg.AsyncConnection[Any]:
    """Another claimer's transaction holding one row locked (keyed: single-shard on Citus)."""
    conn = await psycopg.AsyncConnection.connect(store.url)
    await conn.execute(
        f'SELECT 1 FROM "{store.queries.schema}".outbox'
        " WHERE routing_key = %s AND intent_id = %s FOR UPDATE",
        [rk, intent_id],
    )
    return conn


async def test_an_intent_claim_skips_a_row_another_claimer_holds(claim_store: Store) -> None:
    keys = await _seed(claim_store, "intent", 4)
    held = await _hold(claim_store, *keys[1])
    try:
        gateway = OutboxGateway(claim_store, Clock(claim_store))
        rows = await asyncio.wait_for(
            gateway.claim(types=["T"], probe=16, free=16, lease_ms=30_000, max_backoff_ms=60_000),
            timeout=10,
        )  # waiting for the held row would time out
        await gateway.close()
    finally:
        await held.rollback()
        await held.close()
    claimed = {(r.routing_key, r.intent_id) for r in rows}
    assert claimed == set(keys) - {keys[1]}
    assert all(r.attempts == 1 and r.claimed_until > r.now for r in rows)
    assert {r.candidates for r in rows} <= {3, 4}


async def test_a_job_claim_skips_a_row_another_claimer_holds(claim_store: Store) -> None:
    keys = await _seed(claim_store, "job", 3)
    held = await _hold(claim_store, *keys[0])
    try:
        gateway = JobsGateway(claim_store, Clock(claim_store))
        rows = await asyncio.wait_for(
            gateway.claim_uncapped(
                [JobType("T", "work", 3), JobType("U", "other", 3)], free=2, probe=16,
                lease_ms=30_000,
            ),
            timeout=10,
        )  # fmt: skip
    finally:
        await held.rollback()
        await held.close()
    assert {(r.routing_key, r.intent_id) for r in rows} == set(keys[1:])
    assert all(r.attempts == 1 and r.ambiguous and not r.exhausted for r in rows)
    assert all(r.last_error == "Attempt 1 ended without reporting an outcome" for r in rows)


async def test_a_claim_takes_at_most_free_rows_oldest_first(claim_store: Store) -> None:
    await _seed(claim_store, "intent", 5)
    gateway = OutboxGateway(claim_store, Clock(claim_store))
    first = await gateway.claim(
        types=["T"], probe=16, free=2, lease_ms=30_000, max_backoff_ms=60_000
    )
    second = await gateway.claim(
        types=["T"], probe=16, free=16, lease_ms=30_000, max_backoff_ms=60_000
    )
    third = await gateway.claim(
        types=["T"], probe=16, free=16, lease_ms=30_000, max_backoff_ms=60_000
    )
    await gateway.close()
    assert len(first) == 2 and len(second) == 3 and third == []
    assert not {r.intent_id for r in first} & {r.intent_id for r in second}


# --- the evolution statements: parked rows, undeclared jobs, orphan counts ------------------------


async def _park(store: Store, keys: list[tuple[int, str]]) -> None:
    """Park rows as the relay would (keyed: single-shard on Citus)."""
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        for rk, intent_id in keys:
            await conn.execute(
                f'UPDATE "{store.queries.schema}".outbox SET parked_at_ms = 1, last_error = %s'
                " WHERE routing_key = %s AND intent_id = %s",
                ["UnknownCommand", rk, intent_id],
            )


async def _rows(store: Store) -> dict[str, dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(f'SELECT * FROM "{store.queries.schema}".outbox')
        return {str(r["intent_id"]): r for r in await cur.fetchall()}


async def _nothing(_ids: list[str]) -> None:
    return None


async def test_a_retry_naming_an_unknown_id_refuses_and_a_retry_by_id_writes_keyed(
    claim_store: Store,
) -> None:
    keys = await _seed(claim_store, "intent", 3)
    await _park(claim_store, keys[:2])
    before = await _rows(claim_store)
    parked = ParkedGateway(claim_store, Clock(claim_store))
    with pytest.raises(UnknownParked) as refused:
        # r2 is not parked: the whole call is refused before anything is written.
        await parked.retry(Selection(ids=["r0", "r2", "nope"]), before_commit=_nothing)
    assert refused.value.missing == ("r2", "nope")
    assert await _rows(claim_store) == before
    assert await parked.retry(Selection(ids=["r0", "r1"]), before_commit=_nothing) == 2
    after = await _rows(claim_store)
    assert all(after[i]["parked_at_ms"] is None for i in ("r0", "r1"))
    assert after["r2"] == before["r2"]


async def test_a_discard_of_every_parked_row_of_a_type_audits_each(claim_store: Store) -> None:
    keys = await _seed(claim_store, "intent", 3)
    await _park(claim_store, keys)
    parked = ParkedGateway(claim_store, Clock(claim_store))
    assert await parked.retry(Selection(actor_type="Other"), before_commit=_nothing) == 0
    done = await parked.discard(
        Selection(actor_type="T"), operator="ops", reason="probe", before_commit=_nothing
    )
    assert done == 3 and await _rows(claim_store) == {}
    async with await psycopg.AsyncConnection.connect(claim_store.url, autocommit=True) as conn:
        cur = await conn.execute(
            f'SELECT routing_key, actor_id FROM "{claim_store.queries.schema}".operator_audit'
        )
        audited = sorted(await cur.fetchall())
    assert audited == sorted((rk, f"a{i}") for i, (rk, _) in enumerate(keys))


async def test_parking_an_undeclared_job_skips_a_row_another_claimer_holds(
    claim_store: Store,
) -> None:
    keys = await _seed(claim_store, "job", 3)
    held = await _hold(claim_store, *keys[0])
    parked = ParkedGateway(claim_store, Clock(claim_store))
    try:
        done = await asyncio.wait_for(
            parked.park_undeclared("T", "work", error="UnknownJob", batch=10), timeout=10
        )  # waiting for the held row would time out
    finally:
        await held.rollback()
        await held.close()
    assert done == 2
    rows = await _rows(claim_store)
    assert rows["r0"]["parked_at_ms"] is None
    assert all(
        rows[i]["parked_at_ms"] and rows[i]["last_error"] == "UnknownJob" for i in ("r1", "r2")
    )
    assert await parked.park_undeclared("T", "other", error="x", batch=10) == 0


async def test_orphan_counts_are_capped_per_name_on_both_strategies(claim_store: Store) -> None:
    await _seed(claim_store, "job", 3)
    names = NamesGateway(claim_store)
    counts = await names.count_types(["T", "Gone"], cap=2)
    assert counts == {
        "T": {"actors": 2, "outbox": 2, "dead_letters": 0, "events": 0},
        "Gone": {"actors": 0, "outbox": 0, "dead_letters": 0, "events": 0},
    }
    jobs = await names.count_members("job", [("T", "work"), ("T", "gone")], cap=10)
    assert jobs == {
        ("T", "work"): {"outbox": 3, "dead_letters": 0},
        ("T", "gone"): {"outbox": 0, "dead_letters": 0},
    }
    assert await names.count_members("command", [("T", "work")], cap=10) == {
        ("T", "work"): {"outbox": 0}
    }
    assert await names.count_members("event", [("T", "tag")], cap=10) == {
        ("T", "tag"): {"events": 0}
    }


@needs_citus
async def test_a_distributed_schema_takes_the_migrations_after_0009() -> None:
    """A schema distributed at 0009 takes 0010's index change on every shard, and 0011-0013.

    Citus sends a DDL command's query string on to the workers, where a string of two commands
    fails; every migration since is one statement (a DO block) for this upgrade.
    """
    assert CITUS_URL
    schema = _schema()
    queries = Queries(schema)
    conn = await psycopg.AsyncConnection.connect(CITUS_URL, autocommit=True)
    try:
        await migrate_and_distribute(CITUS_URL, queries, retry_window_ms=86_400_000, placements={})
        assert _placement(CITUS_URL, schema)["receipts"][0] == "h"
        # Back to the layout of 0009: its expiry index, no probe function, neither recorded.
        # (Citus runs a function's DDL over one connection per node: not in a transaction
        # that already ran the index's parallel DDL on the shards.)
        await conn.execute(f'DROP FUNCTION "{schema}".admission_receipts')
        # 0012 is an UPDATE (it runs again unchanged); 0013's column goes. A later migration
        # must be undone here too, or the recorded list has a gap that migrate() refuses.
        await conn.execute(f'ALTER TABLE "{schema}".rate_buckets DROP COLUMN granted')
        # 0015: the staged receipts' index.
        await conn.execute(f'DROP INDEX "{schema}".receipts_staged')
        # 0014: the runners' models and the registry's 'state' kind (no such row yet).
        await conn.execute(f'ALTER TABLE "{schema}".runners DROP COLUMN models')
        await conn.execute(
            f'ALTER TABLE "{schema}".deployment_names DROP CONSTRAINT deployment_names_kind_check'
        )
        await conn.execute(
            f'ALTER TABLE "{schema}".deployment_names ADD CONSTRAINT deployment_names_kind_check'
            " CHECK (kind IN ('command', 'job', 'event'))"
        )
        # 0016: the subscriptions' tables (the upgrade creates them again, to be distributed;
        # 0022 adds its column to them again).
        for table in ("subscription_feeds", "subscription_follows", "subscription_cursors"):
            await conn.execute(f'DROP TABLE "{schema}".{table}')
        await conn.execute(f'DROP TABLE "{schema}".subscriptions')
        # 0018: the job output streams' table (created again, to be distributed).
        await conn.execute(f'DROP TABLE "{schema}".job_streams')
        # 0019: the warm turn's guard function.
        await conn.execute(f'DROP FUNCTION "{schema}".turn_guard')
        # 0021: the outbox's autovacuum settings (set again on the table and its shards).
        await conn.execute(
            f'ALTER TABLE "{schema}".outbox RESET (autovacuum_vacuum_scale_factor,'
            " autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay, vacuum_truncate)"
        )
        async with conn.transaction():
            await conn.execute(
                f"DO $$ BEGIN EXECUTE 'DROP INDEX \"{schema}\".receipts_expiry';"
                f' EXECUTE \'CREATE INDEX receipts_expiry ON "{schema}".receipts'
                f" (actor_type, expires_at_ms)'; END $$"
            )
            await conn.execute(
                f'DELETE FROM "{schema}".migrations'
                " WHERE id IN ('0010_receipts_expiry', '0011_admission_receipts',"
                " '0012_workflow_deadline_wakes', '0013_rate_grants', '0014_runner_models',"
                " '0015_staged_receipts', '0016_subscriptions', '0018_job_streams',"
                " '0019_turn_guard', '0021_lean_outbox', '0022_feed_rewound')"
            )
        await migrate(conn, queries, retry_window_ms=86_400_000, placements={})
        cur = await conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'admission_receipts'"
            " AND pronamespace = %s::regnamespace",
            [f'"{schema}"'],
        )
        assert await cur.fetchone() == (1,)
        cur = await conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'rate_buckets' AND column_name = 'granted'",
            [schema],
        )
        assert await cur.fetchone() == (1,)
        # On each shard (format(): %s is the shard's name, %% a percent sign).
        per_shard = (
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = '%s'::regclass"
            " AND pg_get_indexdef(indexrelid) LIKE '%%_expiry%%'"
        )
        cur = await conn.execute(
            "SELECT result FROM run_command_on_shards(%s::regclass, %s)",
            [f'"{schema}".receipts', per_shard],
        )
        shards = [str(row[0]) for row in await cur.fetchall()]
        assert shards and all(s.endswith("(expires_at_ms)") for s in shards), shards
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
