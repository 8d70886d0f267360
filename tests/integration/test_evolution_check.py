"""EVO-11: ``akter check`` against a real PostgreSQL (spec evolution.md E5).

A schema is seeded by the old code through the real paths (states, timers, jobs, events), then
with raw SQL for the cases the real path cannot produce (a state above the code's version, a
state a migration cannot read, parked rows, dead letters, payloads with a NUL or a NaN). The new
code is checked against it: every finding is reported with its severity, kind, actor type,
member and count, and the check writes nothing (row counts and ``pg_stat_user_tables`` write
counters before and after). ``akter check`` runs as a subprocess for each exit status.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import akter
from akter._store.gateway.check import CheckGateway
from akter._store.queries import Queries
from akter.check import CheckUnavailable
from akter.testing import ActorTest
from tests._support.polling import until
from tests.integration.evolution_check_actors import NEW, OLD, Gone, OldAccount

pytestmark = pytest.mark.timeout(120)

AKTER = str(Path(sys.executable).parent / "akter")
ROOT = Path(__file__).resolve().parents[2]
TABLES = (
    *("actors", "receipts", "events", "outbox", "dead_letters", "runners", "singletons"),
    *("deployment", "migrations", "operator_audit"),
)

Rows = list[dict[str, Any]]


# --- seeding ------------------------------------------------------------------------------------


async def seed_with_old_code(t: ActorTest) -> None:
    """What the old code writes through the real paths; then its runner stops."""
    for account in ("a-1", "a-2"):
        await t.get(OldAccount, account).open("Ada Lovelace")
    await t.get(OldAccount, "a-1").stage()  # timers to deposit, rename, note; jobs
    await t.get(Gone, "g-1").touch()
    await t.runtime.stop()
    await settled(t.database_url, [_app_name(t.runtime.config.database_url or "")])


async def seed_raw(t: ActorTest) -> None:
    """The cases no real path produces, written with raw SQL on one connection of its own."""
    rk = {i: t.runtime.routing_key(t.runtime.ref(OldAccount, i)) for i in _RAW_STATES}
    outbox = {r["command"]: r["intent_id"] for r in await t.rows("SELECT * FROM {schema}.outbox")}
    name = f"seed:{t.schema}"[:63]
    async with await psycopg.AsyncConnection.connect(
        t.database_url, autocommit=True, application_name=name
    ) as conn:

        async def sql(text: str, params: dict[str, Any]) -> None:
            await conn.execute(t.substitute(text), params)

        for actor_id, (state, version) in _RAW_STATES.items():
            await sql(_INSERT_ACTOR, {"rk": rk[actor_id], "id": actor_id, "sv": version,
                                     "state": json.dumps(state)})  # fmt: skip
        copies = [
            ("parked", outbox["deposit"], None, 0, 1),
            ("too-new-job", outbox["charge"], None, 7, None),
            ("nul", outbox["note"], '{"text": "a\\u0000b", "level": 1}', 0, None),
            ("nan", outbox["note"], '{"text": "ok", "level": NaN}', 0, None),
            ("deep", outbox["note"], '{"text": ' + "[" * 50_000 + "]" * 50_000 + "}", 0, None),
        ]
        for new_id, source, payload, version, parked in copies:
            await sql(_COPY_OUTBOX, {"new": new_id, "from": source, "payload": payload,
                                    "pv": version, "parked": parked})  # fmt: skip
        await sql(_INSERT_DEAD_LETTER, {"job_id": "dl-1", "payload": '{"amount": 1}'})
        await sql(_INSERT_DEAD_LETTER, {"job_id": "dl-2", "payload": '{"amount": "x"}'})
        await conn.execute("SELECT pg_stat_force_next_flush()")
    await settled(t.database_url, [name])


#: Raw actor rows of Account: (state, state version).
_RAW_STATES: dict[str, tuple[dict[str, Any], int]] = {
    "too-new": ({"first": "x", "last": "y", "balance": 0, "middle": "z"}, 5),
    "bad-migration": ({"name": 42, "balance": 0}, 0),
    "lossy": ({"first": "a", "last": "b", "balance": 0, "nickname": "x"}, 1),
    "invalid": ({"first": 5, "last": "b", "balance": 0}, 1),
}
_INSERT_ACTOR = """
INSERT INTO {schema}.actors (routing_key, tenant_id, actor_type, actor_id, version, created,
    event_seq, state, state_version, updated_at_ms)
VALUES (%(rk)s, 'default', 'Account', %(id)s, 1, true, 0, %(state)s::jsonb, %(sv)s, 0)
"""
_COPY_OUTBOX = """
INSERT INTO {schema}.outbox (routing_key, intent_id, bucket, kind, tenant_id, actor_type, actor_id,
    target_type, target_id, command, payload, payload_version, caller, due_at_ms,
    scheduled_at_ms, ready_at_ms, attempts, last_error, timer_key, parked_at_ms)
SELECT routing_key, %(new)s, bucket, kind, tenant_id, actor_type, actor_id, target_type,
       target_id, command, coalesce(%(payload)s::text, payload), %(pv)s, caller, due_at_ms,
       scheduled_at_ms, ready_at_ms, attempts,
       CASE WHEN %(parked)s::bigint IS NOT NULL THEN 'InvalidInput: cents: field required' END,
       NULL, %(parked)s::bigint
FROM {schema}.outbox WHERE intent_id = %(from)s
"""
_INSERT_DEAD_LETTER = """
INSERT INTO {schema}.dead_letters (routing_key, job_id, tenant_id, actor_type, actor_id, job,
    payload, payload_version, attempts, cause, ambiguous, dead_at_ms)
SELECT routing_key, %(job_id)s, tenant_id, actor_type, actor_id, 'charge', %(payload)s, 0, 1,
       'declined by the provider', false, 0
FROM {schema}.actors WHERE actor_type = 'Account' AND actor_id = 'a-1'
"""


def _app_name(url: str) -> str:
    query = urllib.parse.urlsplit(url).query
    return dict(urllib.parse.parse_qsl(query)).get("application_name", "")


async def settled(url: str, names: list[str]) -> None:
    """Wait until no session of ``names`` remains: a backend flushes its statistics as it ends."""

    async def sessions() -> int:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)", (names,)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    await until(sessions, holds=lambda n: n == 0, what=f"sessions {names} ended")


async def snapshot(url: str, schema: str) -> dict[str, Any]:
    """Row counts and write counters of every akter table (statistics flushed first)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd"
            " FROM pg_stat_user_tables WHERE schemaname = %s ORDER BY relname",
            (schema,),
        )
        counters = await cur.fetchall()
        counts = {}
        for table in TABLES:
            await cur.execute(f'SELECT count(*) AS n FROM "{schema}".{table}')
            row = await cur.fetchone()
            counts[table] = row["n"] if row else None
    assert {c["relname"] for c in counters} >= set(TABLES)
    return {"counters": counters, "counts": counts}


@asynccontextmanager
async def seeded(akter_test: Callable[..., ActorTest]) -> AsyncIterator[ActorTest]:
    """A schema written by the old code, plus the raw cases; no runner is live."""
    async with akter_test(OLD, jobs=[]) as t:
        await seed_with_old_code(t)
        await seed_raw(t)
        yield t


def new_runtime(t: ActorTest, **options: Any) -> akter.Runtime:
    """The new code, never started, on the seeded schema."""
    return akter.Runtime(NEW, database_url=t.database_url, schema=t.schema, **options)


def one(report: akter.CheckReport, kind: str, member: str | None = None) -> akter.Finding:
    found = [f for f in report.of(kind) if member is None or f.member == member]
    assert len(found) == 1, (kind, member, report.findings)
    return found[0]


# --- EVO-11: every finding ------------------------------------------------------------------------


async def test_evo_11_every_finding_has_its_severity_kind_type_member_and_count(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with seeded(akter_test) as t:
        before = await snapshot(t.database_url, t.schema)
        report = await new_runtime(t).check()
        await settled(t.database_url, [f"akter-check:{t.schema}"])
        after = await snapshot(t.database_url, t.schema)

    assert after == before, "the check wrote something"
    assert not report.ok
    got = {
        (f.severity, f.kind, f.actor_type, f.member, f.version): f.count for f in report.findings
    }
    assert got == {
        # stored names no definition or alias claims
        ("error", "unknown_type", "Gone", None, None): 1,
        ("error", "unknown_command", "Account", "rename", None): 1,
        ("error", "unknown_job", "Account", "refund", None): 1,
        ("error", "unknown_event", "Account", "evo-check.Withdrawn", None): 2,
        # states
        ("error", "state_too_new", "Account", None, None): 1,
        ("error", "state_migration", "Account", None, None): 1,
        ("error", "state_invalid", "Account", None, None): 1,
        ("error", "state_lost", "Account", None, None): 1,
        ("info", "state_version", "Account", None, 0): 3,
        ("info", "state_version", "Account", None, 1): 2,
        ("info", "state_version", "Account", None, 5): 1,
        # pending payloads: the note rows lack the new level (or hold a NUL, a NaN, a deep list)
        ("error", "invalid_payload", "Account", "note", None): 4,
        ("warning", "payload_too_new", "Account", "charge", None): 1,
        ("info", "payload_version", "Account", "deposit", 0): 1,
        ("info", "payload_version", "Account", "note", 0): 4,
        ("info", "payload_version", "Account", "charge", 0): 1,
        ("info", "payload_version", "Account", "charge", 7): 1,
        # rows an operator should look at
        ("warning", "parked", "Account", "deposit", None): 1,
        ("warning", "dead_letters", "Account", "charge", None): 2,
        ("warning", "dead_letter_invalid", "Account", "charge", None): 1,
        ("warning", "unserved_job", "Account", "charge", None): 2,
        ("warning", "unknown_schedule", "Account", "hourly", None): 2,
    }
    severities = [f.severity for f in report.findings]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    # The examples name the actors and the causes; the messages say the fix.
    (too_new,) = one(report, "state_too_new").examples
    assert too_new.startswith("Account/'too-new': ") and "state version 5" in too_new
    (migration,) = one(report, "state_migration").examples
    assert migration.startswith("Account/'bad-migration': ") and "_split" in migration
    (lost,) = one(report, "state_lost").examples
    assert "'nickname'" in lost and "Account/'lossy'" in lost
    assert "Account/'invalid'" in one(report, "state_invalid").examples[0]
    notes = " ".join(one(report, "invalid_payload", "note").examples)
    assert "level" in notes and "text" in notes and "NUL" in notes and "nested too deeply" in notes
    assert "aliases=('rename',)" in one(report, "unknown_command").fix
    assert "name='Gone'" in one(report, "unknown_type").fix
    assert "1 in actors" in one(report, "unknown_type").message
    assert "aliases=('evo-check.Withdrawn',)" in one(report, "unknown_event").fix
    assert "declined by the provider" in one(report, "dead_letters").examples[0]
    (retry,) = one(report, "dead_letter_invalid").examples
    assert retry.startswith("dead letter dl-2 of Account/'a-1': ") and "'amount'" in retry
    assert "cents: field required" in one(report, "parked").examples[0]
    assert "$cron:" in one(report, "unknown_schedule").examples[0]
    assert json.loads(json.dumps(report.to_json()))["ok"] is False


async def test_evo_11_clean_database_is_ok_through_the_test_kit(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with akter_test(OLD) as t:
        for account in ("a-1", "a-2"):
            await t.get(OldAccount, account).open("Ada Lovelace")
        await t.get(OldAccount, "a-1").deposit(5)
        before = await t.rows("SELECT count(*) AS n FROM {schema}.runners")
        report = await t.check()
        assert await t.rows("SELECT count(*) AS n FROM {schema}.runners") == before
        # A started runtime checks the same way, over a connection of its own.
        assert (await t.runtime.check()).findings == report.findings
    assert report.ok, report.findings
    assert {f.severity for f in report.findings} == {"info"}
    assert one(report, "state_version").count == 2
    assert report.of("unknown_type") == []


async def test_a_sample_decodes_the_first_states_of_each_type_and_still_counts_all(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with seeded(akter_test) as t:
        full = await new_runtime(t).check()
        sampled = await new_runtime(t).check(sample=1)
    decoding = ("state_migration", "state_invalid", "state_lost")
    assert sum(len(full.of(k)) for k in decoding) == 3
    assert sum(f.count for k in decoding for f in sampled.of(k)) <= 1
    # Counts and versions above the code's come from the full scan, sampled or not.
    assert sampled.of("state_version") == full.of("state_version")
    assert one(sampled, "state_too_new").count == 1
    assert not sampled.ok


async def test_scans_page_by_primary_key_with_a_small_batch(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with seeded(akter_test) as t:
        pages: list[tuple[str, int]] = []
        report = await new_runtime(t).check(
            batch_size=2, progress=lambda what, done, _total: pages.append((what, done))
        )
        whole = await new_runtime(t).check()
    assert report.findings == whole.findings
    outbox = [done for what, done in pages if what == "outbox"]
    actors = [done for what, done in pages if what == "actors"]
    assert outbox == [2, 4, 6, 8, 10, 12]  # 5 staged rows, 2 ticks, 5 raw copies
    assert actors == [2, 4, 6, 7]


# --- could not run ------------------------------------------------------------------------------


async def test_a_missing_or_older_schema_is_refused_and_nothing_is_created(akter_db: str) -> None:
    schema = f"missing_{uuid.uuid4().hex[:8]}"
    runtime = akter.Runtime(NEW, database_url=akter_db, schema=schema)
    with pytest.raises(CheckUnavailable, match="does not exist"):
        await runtime.check()
    async with await psycopg.AsyncConnection.connect(akter_db, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
        assert await cur.fetchone() == (0,)
        # An older schema: its ledger lacks the newest migrations.
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            await conn.execute(
                f'CREATE TABLE "{schema}".migrations (id text PRIMARY KEY, applied_at_ms bigint,'
                " checksum text)"
            )
            await conn.execute(
                f"INSERT INTO \"{schema}\".migrations VALUES ('0001_initial', 0, '')"
            )
            with pytest.raises(CheckUnavailable, match="older than this code"):
                await runtime.check()
            cur = await conn.execute(f'SELECT id FROM "{schema}".migrations')
            assert await cur.fetchall() == [("0001_initial",)]
        finally:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_a_read_past_the_statement_timeout_is_refused(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with seeded(akter_test) as t:
        async with await psycopg.AsyncConnection.connect(t.database_url) as holder:
            # A lock the check's outbox read waits on: the timeout ends the wait, not a sleep.
            await holder.execute(f'LOCK TABLE "{t.schema}".outbox IN ACCESS EXCLUSIVE MODE')
            with pytest.raises(CheckUnavailable, match="Reading the outbox took longer"):
                await new_runtime(t).check(statement_timeout=0.2)
            await holder.rollback()


async def test_bad_arguments_are_refused(akter_db: str) -> None:
    runtime = akter.Runtime(NEW, database_url=akter_db, schema="akter_unused")
    for kwargs in ({"sample": 0}, {"sample": True}, {"batch_size": 0}, {"statement_timeout": 0}):
        with pytest.raises(akter.ConfigurationError):
            await runtime.check(**kwargs)


# --- the CLI as a subprocess --------------------------------------------------------------------

APP = """
import os, akter
from tests.integration.evolution_check_actors import NEW, OLD

runtime = akter.Runtime(
    NEW if os.environ["CHECK_CODE"] == "new" else OLD,
    database_url=os.environ["CLI_URL"],
    schema=os.environ["CLI_SCHEMA"],
)
"""


async def akter_check(
    tmp_path: Path, url: str, schema: str, code: str, *args: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "checkapp.py").write_text(APP)
    path = os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CLI_URL": url, "CLI_SCHEMA": schema, "CHECK_CODE": code}
    env["PYTHONPATH"] = path
    return await asyncio.to_thread(
        subprocess.run,
        [AKTER, "check", "checkapp:runtime", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_cli_exit_statuses_and_json(
    akter_test: Callable[..., ActorTest], tmp_path: Path
) -> None:
    async with seeded(akter_test) as t:
        found = await akter_check(tmp_path, t.database_url, t.schema, "new", "--json")
        table = await akter_check(tmp_path, t.database_url, t.schema, "new")
        sampled = await akter_check(tmp_path, t.database_url, t.schema, "new", "--sample", "1")
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    assert report["ok"] is False
    kinds = {(f["severity"], f["kind"], f["actor_type"], f["member"]) for f in report["findings"]}
    assert ("error", "unknown_command", "Account", "rename") in kinds
    assert found.stderr == ""  # no progress lines off a terminal
    assert table.returncode == 1
    assert "unknown_command" in table.stdout and "fix:" in table.stdout
    assert table.stdout.index("error") < table.stdout.index("warning")
    assert "not ok" in table.stdout
    assert sampled.returncode == 1 and "state_too_new" in sampled.stdout


async def test_cli_exits_0_on_a_clean_database(
    akter_test: Callable[..., ActorTest], tmp_path: Path
) -> None:
    async with akter_test(OLD) as t:
        await t.get(OldAccount, "a-1").open("Ada Lovelace")
        done = await akter_check(tmp_path, t.database_url, t.schema, "old")
        as_json = await akter_check(tmp_path, t.database_url, t.schema, "old", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: nothing would be refused, parked or lost" in done.stdout
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["ok"] is True


async def test_cli_exits_2_when_it_cannot_run(akter_db: str, tmp_path: Path) -> None:
    unreachable = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2"
    down = await akter_check(tmp_path, unreachable, "akter", "new")
    missing = await akter_check(tmp_path, akter_db, f"nope_{uuid.uuid4().hex[:8]}", "new")
    for done in (down, missing):
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
        assert done.stderr.startswith("error: ")
    assert "Cannot connect to the database" in down.stderr
    assert "does not exist" in missing.stderr


async def test_cli_exits_2_on_a_statement_timeout(
    akter_test: Callable[..., ActorTest], tmp_path: Path
) -> None:
    async with seeded(akter_test) as t:
        async with await psycopg.AsyncConnection.connect(t.database_url) as holder:
            await holder.execute(f'LOCK TABLE "{t.schema}".outbox IN ACCESS EXCLUSIVE MODE')
            done = await akter_check(tmp_path, t.database_url, t.schema, "new", "--timeout", "0.3")
            await holder.rollback()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "took longer than the check's statement timeout (300 ms)" in done.stderr


async def test_every_read_is_read_only_under_the_statement_timeout(akter_db: str) -> None:
    gateway = CheckGateway(akter_db, Queries("akter_unused"), timeout_ms=1234, batch_size=1)
    async with gateway:
        (row,) = await gateway._read(
            "the settings",
            "SELECT current_setting('transaction_read_only') AS ro,"
            " current_setting('statement_timeout') AS timeout",
            {},
        )
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await gateway._read("a write", "CREATE TABLE akter_check_never (x int)", {})
    assert row == {"ro": "on", "timeout": "1234ms"}


async def test_a_newer_schema_and_a_recorded_type_without_rows(
    akter_test: Callable[..., ActorTest],
) -> None:
    async with akter_test(OLD) as t:
        await t.get(OldAccount, "a-1").open("Ada Lovelace")
        await t.rows(
            "INSERT INTO {schema}.migrations (id, applied_at_ms, checksum)"
            " VALUES ('9999_future', 0, '')"
        )
        await t.rows(
            'UPDATE {schema}.deployment SET placements = placements || \'{"Ghost": "tenant"}\''
        )
        report = await t.check()
    newer = one(report, "schema_newer")
    assert (newer.severity, newer.count, newer.examples) == ("error", 1, ("9999_future",))
    ghost = one(report, "unknown_type")
    assert (ghost.severity, ghost.actor_type, ghost.count) == ("warning", "Ghost", 0)
    assert not report.ok
