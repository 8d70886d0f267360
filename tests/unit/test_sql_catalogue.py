"""TE-03 and STYLE §3: static checks of the statement catalogue and the migrations.

The distribution rule (semantics §9.9, design principle 7): every statement that touches one
actor's rows filters on ``routing_key`` and every per-actor primary key starts with it, so the
tables can be distributed by ``routing_key`` without changing a statement. Wakeups never ride in
a turn: no catalogue statement issues ``NOTIFY``.

How a statement "filters on routing_key" (the rule checked below, per reference to a per-actor
table written ``{schema}.<table>``):

- ``INSERT INTO {schema}.<table> (<columns>)``: the column list names ``routing_key`` (the row is
  placed by its key; the values then come from parameters or from another reference that is
  itself checked).
- any other reference (``FROM``, ``JOIN``, ``UPDATE``, ``DELETE FROM``, ``USING``): the statement
  has a comparison of that table's ``routing_key`` column — unqualified, or qualified with the
  table's alias or name — with ``=``, ``IN (...)`` or ``= ANY(...)``, on either side, and the
  comparison sits in a ``WHERE`` or ``ON`` clause (the nearest clause keyword before it), not in
  a ``SET`` list or a select list.

Comments and string literals are removed before the check. Statements that need to reach many
actors on purpose (relay claims, retention sweeps) must be listed in ``CROSS_ACTOR`` with the
reason; semantics §9.8 allows them only for framework maintenance with explicit predicates.

How the code "uses" a statement: a lookup ``queries["name"]`` or ``q["name"]`` with a literal
name. Only the store (``akter._store``, its gateways in ``akter._store.gateway``) looks
statements up or takes pooled connections; every other module calls gateway functions. A computed
name (``queries[name]``) is refused everywhere, so these checks see every use. Every used name
must exist, and every statement must be used.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from akter._store.citus import DROP_IN, PLAIN_ONLY, worker_lock_wait
from akter._store.gateway.jobs import GROUP_LOCK_WAIT
from akter._store.migrate import known_migrations
from akter._store.queries import Queries, held_statements, raw_catalogue
from akter.errors import ConfigurationError

SRC = Path(__file__).resolve().parents[2] / "src" / "akter"
QUERIES_SQL = "\n".join(
    f.read_text("utf-8")
    for f in sorted(resources.files("akter._store").iterdir(), key=lambda f: f.name)
    if f.name.startswith("queries") and f.name.endswith(".sql")
)

#: Tables holding one actor's rows (semantics §1.8): keyed by routing_key first.
PER_ACTOR = frozenset(
    {
        "actors",
        "receipts",
        "events",
        "outbox",
        "dead_letters",
        "operator_audit",
        # Workflows (migration 0007): a run, its journal and signals belong to its actor.
        "workflows",
        "workflow_steps",
        "workflow_signals",
        "workflow_aliases",
        # Job output streams (migration 0018): a job's stream belongs to its actor.
        "job_streams",
        # Subscriptions (migration 0016): feeds and follows in the source's shard, cursors in
        # the subscriber's.
        "subscription_feeds",
        "subscription_follows",
        "subscription_cursors",
    }
)
#: Framework tables that belong to no actor (one row, or one per runner / type / migration).
GLOBAL = frozenset(
    {
        "deployment",
        "deployment_names",
        "runners",
        "singletons",
        "migrations",
        "job_limits",
        "rate_buckets",
        "subscriptions",
    }
)

#: Statements allowed to touch per-actor tables without a routing_key filter, with the reason.
#: None exists yet: the relay claim and the retention sweeps (semantics §3.2, §7) will belong
#: here, each with its explicit predicate (bucket, kind, due_at_ms, expiry) named in the reason.
CROSS_ACTOR: dict[str, str] = {
    "staged_locate": "runtime.outcome(cid) finds a staged command by its id alone: the outbox's "
    "id index, then the receipts' partial index of '$transaction' callers (read-only, one id, "
    "LIMIT 1; migration 0015)",
    "sample_flow_jobs": "sampled gauges (maintenance owner) count job rows held back by flow "
    "control per type across actors (read-only; kind, running, waiting_for and due_at_ms named)",
    "job_type_live": "a job type's deployment-wide cap counts its live attempts across actors "
    "(read-only, under the type lock; kind, running and the lease end named)",
    "citus_job_type_live": "Citus: job_type_live at the claim's clock reading (read-only, "
    "under the type lock; kind, running and the lease end named)",
    "claim_intents": "the relay claims due intents of every actor it hosts (semantics §3.2)",
    "any_due": "an idle relay's poll asks whether any unparked intent or job row is due across "
    "actors, by bucket, kind, due_at_ms and parked_at_ms, or any workflow run by wake_at_ms "
    "(read-only, one row per bucket at most, one index probe on the runs)",
    "next_due": "an idle relay's poll with notify=True asks how long until the first unparked "
    "intent or job row is due across actors, by bucket, kind, parked_at_ms and due_at_ms, or "
    "the first workflow run by wake_at_ms (read-only, one index entry per bucket and kind, one "
    "on the runs)",
    "wf_claim": "the workflow engine claims runs of hosted types whose wake_at_ms has come "
    "(SKIP LOCKED, bounded by free slots; like the relay's claim)",
    "citus_wf_claim_scan": "Citus: wf_claim's unlocked candidate scan, by wake_at_ms and type, "
    "bounded by free slots (each candidate is then claimed in its own shard)",
    "wf_locate": "a run is found by its id alone (run ids are unique; run_id and alias indexes)",
    "wf_list": "operators list runs across actors, by status and type, newest first (read-only, "
    "bounded by limit)",
    "sample_workflows": "the $maintenance owner samples live workflow runs per type across "
    "actors, by status and wake_at_ms (read-only, the workflows_live partial index)",
    "wf_prune": "retention deletes finished runs of one type by finished_at_ms, a bounded batch "
    "(the journal, signals and aliases follow by routing_key)",
    "count_intent_backlog_flat": "Citus: count_intent_backlog without the per-bucket probe, by "
    "kind, due_at_ms and parked_at_ms, stopping at max_outbox_backlog + 1 (read-only)",
    "count_intent_backlog": "admission backpressure counts due intents of hosted types across "
    "actors by bucket, kind and due_at_ms, stopping at max_outbox_backlog + 1 (read-only)",
    "lean_tuples": "the lean watch reads the outbox's and the actors' live and dead tuple counts "
    "from the server's statistics (pg_stat_user_tables by the tables' oids; no table is read)",
    "vacuum_outbox": "the lean watch vacuums the outbox (plain PostgreSQL; VACUUM removes only "
    "versions no snapshot sees and writes no row)",
    "vacuum_actors": "the lean watch vacuums the actors table (plain PostgreSQL; VACUUM removes "
    "only versions no snapshot sees and writes no row)",
    "prune_receipts": "retention sweeps a type's receipts across actors (semantics §7)",
    "prune_events": "retention sweeps a type's event prefixes across actors (semantics §7)",
    "stream_prune": "retention deletes a batch of a type's job output streams across actors, by "
    "actor_type and their newest item's at_ms (migration 0018)",
    "rank_unranked_jobs": "the $maintenance owner ranks a batch of job rows written without a "
    "claim rank (a pre-0006 runner in a rolling deploy) across actors, by kind and rank_ms",
    "outbox_overview": "operators' read-only listing of pending rows (akter outbox)",
    "jobs_overview": "operators' read-only listing of job rows (akter jobs list)",
    "cancel_job_by_id_unstarted": "an operator cancels one job by its id (akter jobs cancel)",
    "cancel_job_by_id_started": "an operator cancels one job by its id (akter jobs cancel)",
    "claim_jobs": "the executor claims due uncapped job rows of every actor, by bucket, kind and "
    "due_at_ms, limited to the job types it executes (semantics §5.5)",
    "discover_capped_groups": "the executor finds capped (actor, job) groups with due rows, by "
    "bucket, kind and due_at_ms; each group is then claimed by keyed statements (semantics §5.6)",
    "parked_list": "operators' read-only listing of parked outbox rows across actors, by "
    "parked_at_ms, kind, type and command (evolution E3, akter outbox parked)",
    "parked_lock": "an operator's retry or discard locks the parked rows it names (by id, unique "
    "across actors, or every parked row matching its filters); the writes are keyed (evolution E3)",
    "sample_due_jobs": "the $maintenance owner groups due unparked job rows across actors by "
    "kind, parked_at_ms and due_at_ms, to find jobs no live runner serves (evolution E3)",
    "park_undeclared_jobs": "the $maintenance owner parks a batch of one undeclared, unserved "
    "job's rows across actors, by kind, actor_type, command and parked_at_ms (evolution E3)",
    "dead_letters_list": "operator view of dead letters across actors (semantics §5.10)",
    "dead_letter_find": "operator lookup of one dead letter by its job id, which is unique "
    "across actors; later writes are keyed (semantics §5.10)",
    "sample_outbox": "the $maintenance owner samples outbox gauges across actors: rows, lag, "
    "stuck and parked rows by kind (semantics §10.1, evolution E3)",
    "sample_running_jobs": "the $maintenance owner samples running job attempts across actors, "
    "by kind, running and lease end (extends semantics §10.1)",
    "release_skewed_intents": "after a backward clock move, claimed intents of hosted types due "
    "further ahead than any claim or backoff, by kind, attempts and due_at_ms "
    "(akter._engine.loop.skew)",
    "clock_skew_probe": "the skew probe reads the newest running job lease end across actors, "
    "by kind and running (read-only, the running-jobs index; akter._engine.loop.skew)",
    "release_skewed_jobs": "after a backward clock move, running attempts of executed job types "
    "whose lease lies further ahead than any lease, by kind, running and due_at_ms "
    "(akter._engine.loop.skew)",
    "names_count_types": "the $maintenance owner counts the rows of an orphan actor type across "
    "actors, each count capped (evolution E2, akter._engine.orphans)",
    "names_count_commands": "the $maintenance owner counts pending intents to an orphan command "
    "across actors, capped (evolution E2)",
    "names_count_jobs": "the $maintenance owner counts job rows and dead letters of an orphan job "
    "across actors, capped (evolution E2)",
    "names_count_events": "the $maintenance owner counts the events of an orphan tag across "
    "actors, capped (evolution E2)",
    "console_types": "the operators' console counts actors per type across actors (read-only)",
    "console_totals": "the operators' console counts outbox rows, jobs and dead letters "
    "across actors (read-only)",
    "console_actors": "the operators' console pages through one type's actors by (tenant, id) "
    "(read-only, limited)",
    "console_outbox": "the operators' console lists pending intents across actors by due time "
    "(read-only, limited, like v_outbox)",
    "console_jobs": "the operators' console lists job rows across actors (read-only, limited, "
    "like v_jobs)",
    # akter check (evolution E5): read-only scans in READ ONLY transactions, paged by primary key.
    "check_actors_page": "akter check pages through every actor row by primary key (read-only)",
    "check_sample_states": "akter check samples the first states of one type (read-only, limited)",
    "check_outbox_page": "akter check pages through every outbox row by primary key (read-only)",
    "check_workflows_page": "akter check pages through unfinished workflow runs by primary key "
    "(read-only)",
    "check_dead_letters_page": "akter check pages through every dead letter by primary key "
    "(read-only)",
    "check_events_page": "akter check pages through every event's tag and version by primary key "
    "(read-only)",
    "citus_claim_intents_scan": "Citus: the relay's candidate scan of due intents of hosted types "
    "by kind and due_at_ms, read without locks; each is then claimed by a keyed statement",
    "citus_claim_jobs_scan": "Citus: the executor's candidate scan of due job rows of its types by "
    "kind and due_at_ms, read without locks; each is then claimed by a keyed statement",
    "citus_discover_capped_groups": "Citus: discover_capped_groups without the per-bucket probe "
    "(read only; each group is then claimed by keyed statements)",
    "citus_prune_receipts": "Citus: retention sweeps a type's receipts across actors by expiry "
    "(semantics §7); the carried ids are read by intent_id in a subplan",
    "citus_release_skewed_intents_scan": "Citus: the skew release's scan of claimed intents by "
    "kind, attempts and due_at_ms, read without locks; each is then released by a keyed statement",
    "citus_release_skewed_jobs_scan": "Citus: the skew release's scan of running attempts by kind, "
    "running and due_at_ms, read without locks; each is then released by a keyed statement",
    "citus_parked_scan": "Citus: an operator's retry or discard scans the parked rows it names "
    "across actors, without locks; each is then locked by a keyed statement (evolution E3)",
    "citus_park_undeclared_scan": "Citus: the $maintenance owner scans a batch of one undeclared "
    "job's rows across actors, without locks; each is then parked by a keyed statement",
    "citus_names_count_type": "Citus: the $maintenance owner counts one orphan actor type's rows "
    "across actors, each count capped (evolution E2)",
    "citus_names_count_command": "Citus: the $maintenance owner counts pending intents to one "
    "orphan command across actors, capped (evolution E2)",
    "citus_names_count_job": "Citus: the $maintenance owner counts one orphan job's rows and dead "
    "letters across actors, capped (evolution E2)",
    "citus_names_count_event": "Citus: the $maintenance owner counts one orphan tag's events "
    "across actors, capped (evolution E2)",
    # Subscriptions (the subscriptions spec).
    "sub_feeds_scan": "the subscription lane's candidate scan of feeds with work of its "
    "subscriber types, by head, done, parked and due_at_ms, read without locks; each is then "
    "claimed by a keyed statement",
    "sub_cursor_holders": "a routed retention gap finds the subscribers that applied events of "
    "one source, by subscription and source (read-only, rare)",
    "sub_backfill": 'a routed subscription declared start="start" and recorded now gets a '
    "feed for every source of its type with events, once (co-located INSERT ... SELECT)",
    "sub_overview": "the console, akter check and the lag gauge count feeds per subscription "
    "(read-only)",
}

#: Citus rules (design principle 7, issue 16): Citus refuses a row lock in a statement that spans
#: shards; the one-statement claims in PLAIN_ONLY (akter._store.citus) run on plain PostgreSQL
#: only, and on Citus the gateways run the named variants (an unlocked scan, then keyed claims).
#: Functions Citus refuses in an UPDATE or DELETE of a distributed or reference table (VOLATILE).
VOLATILE = ("now_ms", "clock_timestamp", "random", "gen_random_uuid", "nextval", "timeofday")
_ROW_LOCK = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|KEY\s+SHARE|UPDATE|SHARE)\b", re.IGNORECASE)
_MATERIALIZED_CTE = re.compile(r"\b[a-z_]+\s+AS\s+MATERIALIZED\s*\(", re.IGNORECASE)

#: Statements allowed to mention NOTIFY: each is its own autocommit statement sent after COMMIT
#: (semantics §3.5), never part of a turn's transaction (akter._store.gateway.notify).
MAY_NOTIFY: dict[str, str] = {
    "notify_wake": "a relay or event-feed wake, sent on a framework connection after the commit",
    "notify_progress": "a job progress message, sent on a framework connection, never in a turn",
    "notify_live": "a watched actor's version or a broadcast, sent after the commit",
}

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --$")
_TABLE_REF = re.compile(r"\{schema\}\.([a-z_][a-z0-9_]*)")
_CLAUSE = re.compile(
    r"\b(WHERE|ON|SET|SELECT|FROM|JOIN|USING|RETURNING|VALUES|GROUP|ORDER|HAVING|LIMIT|WITH|"
    r"INSERT|UPDATE|DELETE|CONFLICT|DO)\b",
    re.IGNORECASE,
)
_KEYWORDS = frozenset(
    {
        "where", "on", "set", "join", "inner", "left", "right", "full", "cross", "natural",
        "using", "returning", "order", "group", "for", "limit", "as", "lateral", "having",
        "values", "select", "union", "window", "offset", "fetch", "tablesample", "only",
    }
)  # fmt: skip


def _strip(sql: str) -> str:
    """The statement without comments and string literals (they cannot filter anything)."""
    sql = re.sub(r"--[^\n]*", " ", sql)
    sql = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    sql = re.sub(r"\$\$.*?\$\$", " '' ", sql, flags=re.DOTALL)
    return re.sub(r"'(?:[^']|'')*'", "''", sql)


def _alias_after(sql: str, end: int) -> str | None:
    match = re.match(r"\s+(?:AS\s+)?([a-z_][a-z0-9_]*)", sql[end:], re.IGNORECASE)
    if match is None or match.group(1).lower() in _KEYWORDS:
        return None
    return match.group(1)


def _filters_on_routing_key(sql: str, table: str, alias: str | None) -> bool:
    qualifiers = "|".join(re.escape(q) for q in {table, alias} if q)
    column = rf"(?<![\w.])(?:(?:{qualifiers})\.)?routing_key\b"
    comparisons = [
        rf"{column}\s*(?:=|\bIN\s*\()",  # rk = x, rk = ANY(x), rk IN (...)
        rf"(?:=|\bANY\s*\()\s*{column}",  # x = rk
    ]
    for pattern in comparisons:
        for match in re.finditer(pattern, sql, re.IGNORECASE):
            clauses = list(_CLAUSE.finditer(sql, 0, match.start()))
            if clauses and clauses[-1].group(1).upper() in ("WHERE", "ON"):
                return True
    return False


def _violations(name: str, statement: str) -> list[str]:
    sql = _strip(statement)
    found: list[str] = []
    for ref in _TABLE_REF.finditer(sql):
        table = ref.group(1)
        if table not in PER_ACTOR:
            continue
        before = sql[: ref.start()].rstrip()
        if re.search(r"\bINSERT\s+INTO$", before, re.IGNORECASE):
            columns = re.match(r"\s*\(([^)]*)\)", sql[ref.end() :])
            names = {c.strip().lower() for c in columns.group(1).split(",")} if columns else set()
            if "routing_key" not in names:
                found.append(f"{name}: INSERT INTO {table} does not supply routing_key")
        elif re.search(r"\bREFERENCES$", before, re.IGNORECASE):
            continue  # DDL: a foreign key, not a statement reading rows
        elif not _filters_on_routing_key(sql, table, _alias_after(sql, ref.end())):
            found.append(f"{name}: {table} is read or written without a routing_key filter")
    return found


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """The raw ``(name, lines)`` of every block of queries.sql, in file order."""
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            blocks.append((match.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


# --- the rule itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM {schema}.actors a WHERE a.routing_key = %(rk)s",
        "SELECT * FROM {schema}.actors WHERE tenant_id = %(t)s AND routing_key = ANY(%(rks)s)",
        "SELECT * FROM {schema}.events e WHERE %(rk)s = e.routing_key",
        "DELETE FROM {schema}.outbox WHERE routing_key IN (1, 2) AND intent_id = %(id)s",
        "UPDATE {schema}.outbox SET attempts = 1 WHERE routing_key = %(rk)s",
        "INSERT INTO {schema}.receipts (routing_key, command_id) VALUES (%(rk)s, %(c)s)",
        "SELECT 1 FROM {schema}.outbox o JOIN {schema}.actors a "
        "ON a.routing_key = o.routing_key AND a.actor_id = o.actor_id WHERE o.routing_key = 1",
    ],
)
def test_rule_accepts_keyed_statements(statement: str) -> None:
    assert _violations("example", statement) == []


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM {schema}.actors a WHERE a.actor_id = %(id)s",
        "SELECT routing_key FROM {schema}.actors WHERE actor_id = %(id)s",
        "UPDATE {schema}.outbox SET routing_key = %(rk)s WHERE intent_id = %(id)s",
        "DELETE FROM {schema}.receipts WHERE expires_at_ms < %(now)s",
        "INSERT INTO {schema}.events (tenant_id, seq) VALUES (%(t)s, 1)",
        "SELECT * FROM {schema}.events e WHERE e.seq = 1 -- AND e.routing_key = %(rk)s",
        "SELECT * FROM {schema}.events e WHERE e.tag = 'routing_key = 1'",
        "SELECT * FROM {schema}.outbox o JOIN {schema}.actors a ON a.actor_id = o.actor_id "
        "WHERE o.routing_key = 1",
        "SELECT * FROM {schema}.outbox o WHERE x.routing_key = 1",
    ],
)
def test_rule_rejects_unkeyed_statements(statement: str) -> None:
    assert _violations("example", statement) != []


# --- the catalogue -----------------------------------------------------------------------------


def test_catalogue_parses_every_block_of_the_file() -> None:
    catalogue = raw_catalogue()
    names = [name for name, _ in _blocks(QUERIES_SQL)]
    assert len(names) == len(set(names)), "a block name is used twice"
    assert names == list(catalogue)
    assert len(catalogue) >= 20
    for name, statement in catalogue.items():
        assert statement.strip(), f"{name} has no statement"


def test_every_block_has_a_one_line_description() -> None:
    for name, lines in _blocks(QUERIES_SQL):
        assert lines, f"{name} is empty"
        first = lines[0]
        assert first.startswith("-- "), f"{name}: the line after the header must describe it"
        description = first.removeprefix("-- ").strip()
        assert description and not description.endswith("--"), f"{name}: empty description"
        assert len(lines) > 1 and not lines[1].lstrip().startswith("--"), (
            f"{name}: the description must be exactly one comment line before the statement"
        )


def test_every_per_actor_statement_filters_on_routing_key() -> None:
    catalogue = raw_catalogue()
    assert set(CROSS_ACTOR) <= set(catalogue), "a whitelisted statement no longer exists"
    violations = [
        v
        for name, sql in catalogue.items()
        if name not in CROSS_ACTOR
        for v in _violations(name, sql)
    ]
    assert violations == []


def test_the_check_sees_the_turn_statements() -> None:
    # Guard against a rule that silently matches nothing: these statements touch per-actor
    # tables, so they are all subject to the check above.
    touching = {
        name
        for name, sql in raw_catalogue().items()
        if any(m.group(1) in PER_ACTOR for m in _TABLE_REF.finditer(sql))
    }
    assert {
        "ensure_actor",
        "lock_actor",
        "admission_read",
        "lock_admit",
        "update_actor",
        "insert_events",
        "delete_timers",
        "cancel_jobs_unstarted",
        "cancel_jobs_started",
        "insert_outbox",
        "insert_receipts",
        "query_actor",
    } <= touching


def test_every_referenced_table_exists() -> None:
    tables = PER_ACTOR | GLOBAL
    functions = {"now_ms", "stmt_ms", "fence_check", "admission_receipts", "turn_guard"}
    for name, sql in raw_catalogue().items():
        for ref in _TABLE_REF.finditer(sql):
            assert ref.group(1) in tables | functions, f"{name}: unknown {ref.group(0)}"


def test_no_statement_notifies() -> None:
    for name, sql in raw_catalogue().items():
        if name in MAY_NOTIFY:
            continue
        assert not re.search(r"\bNOTIFY\b|pg_notify", sql, re.IGNORECASE), name


# --- the migrations ----------------------------------------------------------------------------


def _tables(migration_sql: str) -> dict[str, str]:
    """``CREATE TABLE {schema}.<name> (<body>)`` bodies, parentheses balanced."""
    found: dict[str, str] = {}
    for match in re.finditer(r"CREATE TABLE \{schema\}\.([a-z_]+) \(", migration_sql):
        depth, start = 1, match.end()
        for i in range(start, len(migration_sql)):
            depth += {"(": 1, ")": -1}.get(migration_sql[i], 0)
            if depth == 0:
                found[match.group(1)] = migration_sql[start:i]
                break
    return found


def test_every_per_actor_primary_key_starts_with_routing_key() -> None:
    migrations = known_migrations()
    assert [m.id for m in migrations][:1] == ["0001_initial"]
    tables: dict[str, str] = {}
    for migration in migrations:
        tables.update(_tables(_strip(migration.text)))
        # A primary key changed later must keep routing_key first too.
        for alter in re.finditer(
            r"ALTER TABLE \{schema\}\.([a-z_]+)[^;]*PRIMARY KEY\s*\(\s*([a-z_]+)",
            _strip(migration.text),
        ):
            if alter.group(1) in PER_ACTOR:
                assert alter.group(2) == "routing_key", (migration.id, alter.group(0))
    # The migration ledger itself is created by the migrations_bootstrap statement.
    assert set(tables) | {"migrations"} == PER_ACTOR | GLOBAL, (
        "classify a new table as per-actor or global"
    )
    for table in PER_ACTOR:
        keys = re.findall(r"PRIMARY KEY\s*\(([^)]*)\)", tables[table])
        assert len(keys) == 1, f"{table} must declare one table-level PRIMARY KEY"
        columns = [c.strip() for c in keys[0].split(",")]
        assert columns[0] == "routing_key", f"{table} primary key is {columns}"
        for fk in re.findall(r"FOREIGN KEY\s*\(([^)]*)\)", tables[table]):
            assert fk.split(",")[0].strip() == "routing_key", f"{table} foreign key ({fk})"


def test_unique_indexes_on_per_actor_tables_include_routing_key() -> None:
    # A distributed table can only enforce uniqueness that includes its distribution column.
    for migration in known_migrations():
        for index in re.finditer(
            r"CREATE UNIQUE INDEX \w+ ON \{schema\}\.([a-z_]+)\s*\(([^)]*)\)",
            _strip(migration.text),
        ):
            if index.group(1) in PER_ACTOR:
                columns = [c.strip() for c in index.group(2).split(",")]
                assert "routing_key" in columns, (migration.id, index.group(0))


#: Migrations written before Citus deployments existed to upgrade (issue 16): several statements.
_MULTI_STATEMENT_MIGRATIONS = {f"000{n}" for n in range(1, 10)}


def test_migrations_after_0009_are_one_statement() -> None:
    # Citus sends a DDL command's query string on to the workers, and a string of several
    # commands fails there: a migration that a distributed schema takes must be one statement
    # (a DO block for several; tests/integration/test_citus.py upgrades one through 0010).
    for migration in known_migrations():
        if migration.id[:4] in _MULTI_STATEMENT_MIGRATIONS:
            continue
        # A DO block's body may be quoted with a named tag ($migration$, as 0016 does, whose
        # commands are quoted $ddl$ so that the other checks here read its tables).
        text = re.sub(r"\$(\w+)\$.*?\$\1\$", " '' ", migration.text, flags=re.DOTALL)
        statements = [s for s in _strip(text).split(";") if s.strip()]
        assert len(statements) == 1, (migration.id, statements)


# --- names used by the code --------------------------------------------------------------------

_USE = re.compile(r"\b(?:q|queries)\[\s*(['\"])([A-Za-z0-9_]+)\1\s*\]")
#: A catalogue lookup whose name is not a literal (``queries[name]``).
_DYNAMIC_USE = re.compile(r"\b(?:q|queries)\[\s*(?!['\"\s])([^\]]+)\]")
#: The one module outside the store that takes a connection itself: the turn engine holds its
#: transaction's connection across both pipelined flights (pool wait, discard on any error); its
#: statements and parameters are still the gateway's (akter._store.gateway.actors).
HOLDS_A_CONNECTION = frozenset({"_engine/turn/engine.py"})


def _outside_the_store() -> list[str]:
    """Every module but the store's own: they call gateways, never the pools or the catalogue."""
    return [module for module in _sources() if not module.startswith("_store/")]


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(SRC)): path.read_text("utf-8") for path in sorted(SRC.rglob("*.py"))
    }


def _uses() -> dict[str, list[str]]:
    """Every catalogue name the code uses, with the modules using it (module docstring)."""
    used: dict[str, list[str]] = {}
    for module, text in _sources().items():
        names = [m.group(2) for m in _USE.finditer(text)]
        for name in dict.fromkeys(names):
            used.setdefault(name, []).append(module)
    # The Citus drop-ins are served under their plain names (``Queries.prefer``).
    for name in DROP_IN.values():
        used.setdefault(name, []).append("_store/pool.py")
    return used


def test_every_statement_name_used_in_the_code_exists() -> None:
    catalogue = raw_catalogue()
    used = _uses()
    assert len(used) >= 15, "the pattern no longer finds the statement lookups"
    missing = {name: files for name, files in used.items() if name not in catalogue}
    assert missing == {}


def test_every_catalogue_statement_is_used() -> None:
    catalogue = raw_catalogue()
    # A statement held whole by another ({statement:NAME}) is used where that one runs.
    held = {m.group(1) for m in _HOLD.finditer(QUERIES_SQL)}
    assert "lock_actor" in held, "the pattern no longer finds the holds"
    unused = sorted(set(catalogue) - set(_uses()) - held)
    assert unused == [], "a statement no code runs: delete it, or run it through a gateway"


_HOLD = re.compile(r"\{statement:([a-z_][a-z0-9_]*)\}")


def test_statement_names_are_literal_everywhere() -> None:
    # A computed name would hide a use from the two checks above.
    dynamic = {
        module: [m.group(0) for m in _DYNAMIC_USE.finditer(text)]
        for module, text in _sources().items()
        if _DYNAMIC_USE.search(text)
    }
    assert dynamic == {}


def test_the_dynamic_pattern_sees_computed_names() -> None:
    assert _DYNAMIC_USE.search("store.queries[name]")
    assert _DYNAMIC_USE.search("q[ kind ]")
    assert not _DYNAMIC_USE.search('q["lock_actor"]')
    assert not _DYNAMIC_USE.search("queries['clock_now']")


def test_only_the_store_touches_the_pools_and_the_catalogue() -> None:
    sources = _sources()
    modules = _outside_the_store()
    assert {"runtime.py", "_engine/relay/intents.py", "cli/jobs.py", "http/console/api.py"} <= set(
        modules
    )
    for module in modules:
        text = sources[module]
        assert not _USE.search(text) and not _DYNAMIC_USE.search(text), module
        assert "connect_direct" not in text, module
        assert "psycopg.sql" not in text and "from psycopg import sql" not in text, module
        if module not in HOLDS_A_CONNECTION:
            assert ".connection(" not in text, module


# --- the Citus rules (design principle 7, issue 16) ----------------------------------------------


def _without_clock_ctes(sql: str) -> str:
    """The statement without its table-free materialised CTEs (the one clock reading)."""
    out, pos = [], 0
    for match in _MATERIALIZED_CTE.finditer(sql):
        if match.start() < pos:
            continue
        depth, end = 1, match.end()
        while depth and end < len(sql):
            depth += {"(": 1, ")": -1}.get(sql[end], 0)
            end += 1
        body = sql[match.end() : end]
        if not any(r.group(1) in PER_ACTOR | GLOBAL for r in _TABLE_REF.finditer(body)):
            out.append(sql[pos : match.start()])
            pos = end
    return "".join(out) + sql[pos:]


def _citus_violations(name: str, statement: str) -> list[str]:
    sql = _strip(statement)
    found: list[str] = []
    modifies = re.search(r"\b(UPDATE\s+\{schema\}|DELETE\s+FROM\s+\{schema\})", sql, re.I)
    inserts_select = re.search(r"\bINSERT\s+INTO\s+\{schema\}[^;]*?\)\s*SELECT\b", sql, re.I | re.S)
    if modifies or inserts_select:
        rest = _without_clock_ctes(sql)
        for function in VOLATILE:
            if re.search(rf"\b{function}\s*\(", rest, re.IGNORECASE):
                found.append(
                    f"{name}: volatile {function}() in a modification (read it once "
                    "in a table-free MATERIALIZED CTE, or pass it as a parameter)"
                )
    if _ROW_LOCK.search(sql) and name in CROSS_ACTOR and name not in PLAIN_ONLY:
        found.append(f"{name}: a row lock in a statement that spans shards")
    return found


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {schema}.runners SET heartbeat_at_ms = {schema}.now_ms(0) WHERE runner_id = 1",
        "DELETE FROM {schema}.runners WHERE heartbeat_at_ms < {schema}.now_ms(0)",
        "WITH clock AS MATERIALIZED (SELECT 1 FROM {schema}.runners WHERE {schema}.now_ms(0) > 0) "
        "UPDATE {schema}.runners SET draining = true FROM clock",
        "INSERT INTO {schema}.runners (runner_id, heartbeat_at_ms) SELECT 1, {schema}.now_ms(0)",
    ],
)
def test_citus_rule_rejects_volatile_functions_in_modifications(statement: str) -> None:
    assert _citus_violations("example", statement) != []


@pytest.mark.parametrize(
    "statement",
    [
        "WITH clock AS MATERIALIZED (SELECT {schema}.now_ms(%(off)s) AS now) "
        "UPDATE {schema}.runners r SET heartbeat_at_ms = clock.now FROM clock WHERE r.id = 1",
        "UPDATE {schema}.outbox SET due_at_ms = {schema}.stmt_ms(0) WHERE routing_key = 1",
        "INSERT INTO {schema}.deployment (singleton, created_at_ms) VALUES (true, "
        "{schema}.now_ms(0))",
        "SELECT {schema}.now_ms(0) AS now_ms",
    ],
)
def test_citus_rule_accepts_one_clock_reading(statement: str) -> None:
    assert _citus_violations("example", statement) == []


def test_citus_rule_rejects_a_row_lock_spanning_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CROSS_ACTOR, "example", "a sweep")
    locked = "SELECT 1 FROM {schema}.outbox WHERE kind = 'job' FOR UPDATE SKIP LOCKED"
    assert _citus_violations("example", locked) != []
    assert _citus_violations("example", locked.replace(" FOR UPDATE SKIP LOCKED", "")) == []


def test_every_statement_follows_the_citus_rules() -> None:
    # Citus evaluates an INSERT's VALUES on the coordinator (once): allowed. An UPDATE, a
    # DELETE or an INSERT ... SELECT must read the clock once, outside the modified rows.
    violations = [v for name, sql in raw_catalogue().items() for v in _citus_violations(name, sql)]
    assert violations == []


def test_every_plain_only_claim_has_its_citus_variants_used_beside_it() -> None:
    catalogue = raw_catalogue()
    uses = _uses()
    for plain, variants in PLAIN_ONLY.items():
        assert plain in catalogue, plain
        for variant in variants:
            assert variant in catalogue, f"{plain}: its Citus variant {variant} is missing"
            assert uses.get(variant), f"{variant} is never run"
            locks = bool(_ROW_LOCK.search(_strip(catalogue[variant])))
            assert not locks or not _violations(variant, catalogue[variant]), (
                f"{variant}: a row lock in a statement that is not keyed by routing_key"
            )


#: Columns a Citus gateway adds to the rows of its variant (``citus_claims``: the scan's count).
_ADDED_BY_GATEWAY = frozenset({"candidates"})


def _returned(sql: str) -> set[str]:
    """The names of the columns a statement's last ``RETURNING`` yields."""
    tail = re.split(r"\bRETURNING\b", _strip(sql), flags=re.IGNORECASE)[-1].rstrip().rstrip(";")
    items, depth, start = [], 0, 0
    for i, ch in enumerate(tail):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(tail[start:i])
            start = i + 1
    items.append(tail[start:])
    return {re.findall(r"\w+", item)[-1] for item in items if item.strip()}


def test_every_citus_variant_returns_the_columns_of_its_plain_statement() -> None:
    # The gateways hand a variant's rows to the same callers: a column the plain statement
    # returns and the variant forgets (payload_version once) breaks delivery only on Citus.
    catalogue = raw_catalogue()
    checked = 0
    for plain, variants in PLAIN_ONLY.items():
        final = variants[-1]
        if not re.search(r"\bRETURNING\b", catalogue[plain], re.IGNORECASE):
            continue
        missing = _returned(catalogue[plain]) - _returned(catalogue[final]) - _ADDED_BY_GATEWAY
        assert missing == set(), f"{final} lacks {sorted(missing)} that {plain} returns"
        checked += 1
    assert checked >= 4  # the claims, the skew releases, the parking: the check sees them


def test_the_returned_columns_are_read_by_name() -> None:
    sql = "UPDATE {schema}.outbox SET a = 1 RETURNING o.x, f(o.y, 2) AS y, (o.z > 0) AS z;"
    assert _returned(sql) == {"x", "y", "z"}


def test_the_citus_lock_wait_is_the_claims_lock_wait() -> None:
    # SET takes no parameter: the statement spells GROUP_LOCK_WAIT out, and must agree with it.
    statement = raw_catalogue()["citus_job_lock_wait"]
    assert f"SET LOCAL lock_timeout = '{GROUP_LOCK_WAIT}'" in statement


def test_the_worker_lock_wait_is_formatted_as_a_literal() -> None:
    # SET takes no parameter: the type's lock wait is quoted in (at least 1 ms: 0 would disable).
    queries = Queries("akter")
    assert worker_lock_wait(queries, 250) == b"SET LOCAL lock_timeout = '250ms';"
    assert worker_lock_wait(queries, 0) == b"SET LOCAL lock_timeout = '1ms';"


def test_a_statement_holds_another_whole_without_its_semicolon() -> None:
    held = held_statements({"a": "SELECT 1;", "b": "WITH x AS ({statement:a}) SELECT 2;"})
    assert held == {"a": "SELECT 1;", "b": "WITH x AS (SELECT 1) SELECT 2;"}
    lock = Queries("akter")["lock_actor"].removesuffix(";")
    assert lock in Queries("akter")["lock_admit"]


@pytest.mark.parametrize(
    "blocks",
    [
        {"b": "WITH x AS ({statement:a}) SELECT 2;"},
        {"a": "{statement:c}", "b": "{statement:a}", "c": "SELECT 1;"},
    ],
    ids=["unknown", "nested"],
)
def test_a_held_statement_must_exist_and_hold_none(blocks: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match="unknown or holds another"):
        held_statements(blocks)
