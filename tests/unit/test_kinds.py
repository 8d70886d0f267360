"""The outbox and journal vocabularies (``akter._kinds``) and the SQL that uses them.

The SQL catalogue (``queries*.sql``) and the migrations (``schema/*.sql``) compare, constrain and
write kinds as literals. Every such literal must be a member of the vocabulary of its table: an
outbox row's ``kind`` of :class:`RowKind`, a journal record's of :class:`StepKind`; every ``'$…'``
literal must start with a prefix named in ``akter._kinds`` (and a view that strips the ``$job:``
prefix strips exactly it). The outbox's CHECK constraint names
exactly the members of :class:`RowKind`.

How a literal is found and placed (comments and ``{schema}`` placeholders aside):

- a comparison ``[alias.]kind = '…'`` / ``<> '…'`` / ``IN ('…', …)`` (also ``SET kind = '…'``);
- a ``VALUES ('…'), … AS t(kind)`` list;
- the value at ``kind``'s place in ``INSERT INTO {schema}.<table> (… kind …) VALUES/SELECT …``.

The alias names a table (``{schema}.outbox o``, ``(SELECT * FROM {schema}.outbox) o``), a CTE
(``step AS (… {schema}.workflow_steps …)``, and an alias of it) or the rows an insert stages
(``unnest(…) AS o(…, kind, …)``); an unqualified ``kind`` belongs to the one kinded table the
statement names. A literal that cannot be placed fails the test: qualify it.
"""

from __future__ import annotations

import re
from enum import StrEnum

import pytest

from akter._kinds import (
    CRON_PREFIX,
    JOB_PREFIX,
    WORKFLOW_PREFIX,
    ActorCommand,
    CronTick,
    RowKind,
    StepKind,
    WorkflowCommand,
    WorkflowIntent,
    cron_timer_key,
    decode_intent,
    job_timer_key,
)
from akter._store.migrate import known_migrations
from akter._store.queries import raw_catalogue

#: The tables with a kind column and their vocabulary (None: not one of ``akter._kinds``).
KINDED: dict[str, type[StrEnum] | None] = {
    "outbox": RowKind,
    "workflow_steps": StepKind,
    "deployment_names": None,  # member kinds: akter._store.gateway.names
}
_NOT_ALIAS = frozenset(
    "where set on using join left right inner full cross group order limit returning for with "
    "select values union and or as from into natural lateral having window offset fetch "
    "default".split()
)


def _statements() -> list[tuple[str, str]]:
    """Every catalogue statement, and every statement of every migration, by a readable name."""
    found = list(raw_catalogue().items())
    for migration in known_migrations():
        for i, part in enumerate(_split(migration.text)):
            found.append((f"{migration.id}#{i}", part))
    return [(name, _strip_comments(sql)) for name, sql in found]


def _split(sql: str) -> list[str]:
    """A migration's statements: split on ``;`` outside strings and ``$$`` bodies."""
    parts, start, quoted, dollar, i = [], 0, False, False, 0
    while i < len(sql):
        if not dollar and sql[i] == "'":
            quoted = not quoted
        elif not quoted and sql.startswith("$$", i):
            dollar = not dollar
            i += 1
        elif not quoted and not dollar and sql[i] == ";":
            parts.append(sql[start:i])
            start = i + 1
        i += 1
    parts.append(sql[start:])
    return [p for p in parts if p.strip()]


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _aliases(sql: str) -> dict[str, set[str]]:
    """The names (tables, their aliases, CTEs) a statement gives to each table it names."""
    names: dict[str, set[str]] = {}
    for m in re.finditer(r"\{schema\}\.(\w+)(?:\s+(?:AS\s+)?(\w+))?", sql, re.IGNORECASE):
        table, alias = m[1], m[2]
        names.setdefault(table, set()).add(table)
        if alias and alias.lower() not in _NOT_ALIAS:
            names.setdefault(alias, set()).add(table)
    for m in re.finditer(r"\b(\w+)\s+AS\s+(?:MATERIALIZED\s+)?\(", sql, re.IGNORECASE):
        inner = re.search(r"\{schema\}\.(\w+)", sql[m.end() :])
        if inner is not None:
            names.setdefault(m[1], set()).add(inner[1])
    for m in re.finditer(
        r"\(\s*SELECT\s+\*\s+FROM\s+\{schema\}\.(\w+)\s*\)\s+(?:AS\s+)?(\w+)", sql, re.IGNORECASE
    ):
        names.setdefault(m[2], set()).add(m[1])
    for m in re.finditer(r"\b(?:FROM|JOIN)\s+(\w+)\s+(?:AS\s+)?(\w+)", sql, re.IGNORECASE):
        if m[1] in names and m[2].lower() not in _NOT_ALIAS:
            names.setdefault(m[2], set()).update(names[m[1]])
    # Rows staged for an insert (``unnest(…) AS s(…, kind, …)``) hold the target's kinds.
    target = re.search(r"INSERT\s+INTO\s+\{schema\}\.(\w+)", sql, re.IGNORECASE)
    if target is not None:
        for m in re.finditer(r"\bAS\s+(\w+)\s*\(([^)]*)\)", sql, re.IGNORECASE):
            if "kind" in (c.strip() for c in m[2].split(",")):
                names.setdefault(m[1], set()).add(target[1])
    return names


def _place(name: str, sql: str, qualifier: str | None) -> str:
    """The kinded table a ``kind`` reference (``qualifier.kind`` or bare) belongs to."""
    aliases = _aliases(sql)
    if qualifier is not None:
        tables = {t for t in aliases.get(qualifier, set()) if t in KINDED}
    else:
        tables = {t for t in KINDED if t in aliases}
    assert len(tables) == 1, (
        f"{name}: cannot tell which table's kind {qualifier or ''}.kind is ({tables}); qualify it"
    )
    return tables.pop()


def _literals(text: str) -> list[str]:
    return re.findall(r"'((?:[^']|'')*)'", text)


def _kind_literals(name: str, sql: str) -> list[tuple[str, str]]:
    """(table, literal) for every kind literal the statement compares, lists or writes."""
    found: list[tuple[str, str]] = []
    comparison = re.compile(
        r"(?:\b(\w+)\.)?\bkind\s*(?:=|<>|!=)\s*('(?:[^']|'')*')"
        r"|(?:\b(\w+)\.)?\bkind\s+(?:NOT\s+)?IN\s*\(([^)]*)\)",
        re.IGNORECASE,
    )
    for m in comparison.finditer(sql):
        qualifier, text = (m[1], m[2]) if m[2] is not None else (m[3], m[4])
        table = _place(name, sql, qualifier)
        found += [(table, lit.strip("'")) for lit in _literals(text)]
    for m in re.finditer(
        r"VALUES\s*((?:\(\s*'[^']*'\s*\)\s*,?\s*)+)\)\s*AS\s+\w+\s*\(\s*kind\s*\)",
        sql,
        re.IGNORECASE,
    ):
        found += [("outbox", lit) for lit in _literals(m[1])]
    for m in re.finditer(
        r"INSERT\s+INTO\s+\{schema\}\.(\w+)\s*\(([^)]*)\)\s*(VALUES\s*\(|SELECT\b)",
        sql,
        re.IGNORECASE,
    ):
        table = m[1]
        columns = [c.strip() for c in m[2].split(",")]
        if table not in KINDED or "kind" not in columns:
            continue
        value = _top_level(sql[m.end() :])[columns.index("kind")].strip()
        if value.startswith("'"):
            found.append((table, value.strip("'")))
    return found


def _top_level(text: str) -> list[str]:
    """The comma-separated expressions at the start of ``text``, up to FROM or a closing ``)``."""
    items, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'":
            quoted = not quoted
        if quoted:
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        elif depth == 0 and re.match(r"\bFROM\b", text[i:], re.IGNORECASE) and text[i - 1] in " \n":
            break
    items.append(text[start:i])
    return items


STATEMENTS = _statements()


def test_every_kind_literal_in_the_sql_is_a_member_of_its_vocabulary() -> None:
    seen: dict[str, set[str]] = {table: set() for table in KINDED}
    for name, sql in STATEMENTS:
        for table, literal in _kind_literals(name, sql):
            seen[table].add(literal)
            vocabulary = KINDED[table]
            if vocabulary is not None:
                assert literal in {k.value for k in vocabulary}, (
                    f"{name}: {table}.kind {literal!r} is not a {vocabulary.__name__}"
                )
    # The scan finds what it must: both row kinds, and the job and cancel steps the
    # workflow statements compare (else a parsing change made the test vacuous).
    assert seen["outbox"] == {k.value for k in RowKind}
    assert {StepKind.JOB.value, StepKind.CANCEL.value} <= seen["workflow_steps"]


def test_the_outbox_check_constraint_names_exactly_the_row_kinds() -> None:
    checks = [
        set(_literals(m[1]))
        for _, sql in STATEMENTS
        for m in re.finditer(r"CHECK\s*\(\s*kind\s+IN\s*\(([^)]*)\)", sql, re.IGNORECASE)
        if _place("check", sql, None) == "outbox"
    ]
    assert checks == [{k.value for k in RowKind}]


def test_every_dollar_literal_in_the_sql_has_a_known_prefix() -> None:
    prefixes = (CRON_PREFIX, JOB_PREFIX, WORKFLOW_PREFIX)
    found = []
    for name, sql in STATEMENTS:
        for literal in _literals(sql):
            if literal.startswith("$") and not literal.startswith("$$"):
                found.append(literal)
                assert literal.startswith(prefixes), f"{name}: {literal!r} has no known prefix"
    assert found, "the scan found the schedule ticks' '$cron:%' patterns"


def test_the_job_key_views_strip_exactly_the_job_prefix() -> None:
    starts = [
        int(m[1])
        for _, sql in STATEMENTS
        for m in re.finditer(r"substr\(\s*(?:\w+\.)?timer_key\s*,\s*(\d+)\s*\)", sql)
    ]
    assert starts and set(starts) == {len(JOB_PREFIX) + 1}


def test_the_scan_places_and_refuses() -> None:
    sql = "SELECT 1 FROM {schema}.outbox o JOIN {schema}.workflow_steps s ON true WHERE "
    assert _kind_literals("t", sql + "o.kind = 'job' AND s.kind IN ('wait', 'sleep')") == [
        ("outbox", "job"),
        ("workflow_steps", "wait"),
        ("workflow_steps", "sleep"),
    ]
    with pytest.raises(AssertionError, match="qualify it"):
        _kind_literals("t", sql + "kind = 'job'")
    insert = "INSERT INTO {schema}.outbox (intent_id, kind) VALUES (%(id)s, 'jobs')"
    assert _kind_literals("t", insert) == [("outbox", "jobs")]
    values = "SELECT k.kind FROM (VALUES ('intent'), ('job')) AS k(kind)"
    assert _kind_literals("t", values) == [("outbox", "intent"), ("outbox", "job")]


# --- the decoder --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "timer_key", "target"),
    [
        ("add", None, ActorCommand("add")),
        ("add", "my-timer", ActorCommand("add")),
        ("tick", "$cron:UTC */5 * * * *", CronTick("$cron:UTC */5 * * * *")),
        ("$workflow.signal", None, WorkflowIntent("$workflow.signal")),
        # A workflow intent is the engine's whatever its timer key; one a newer code added too.
        ("$workflow.job", "$cron:@every 5ms", WorkflowIntent("$workflow.job")),
        ("$workflow.later", None, WorkflowIntent("$workflow.later")),
        ("$job:x", None, ActorCommand("$job:x")),
    ],
)
def test_decode_intent(command: str, timer_key: str | None, target: object) -> None:
    assert decode_intent(command, timer_key) == target


def test_the_sub_kinds_carry_their_prefixes() -> None:
    assert all(c.value.startswith(WORKFLOW_PREFIX) for c in WorkflowCommand)
    assert job_timer_key("k-1") == "$job:k-1"
    assert cron_timer_key("@every 5000ms") == "$cron:@every 5000ms"
    assert isinstance(decode_intent("t", cron_timer_key("UTC 0 * * * *")), CronTick)


def test_kinds_are_their_stored_strings() -> None:
    # Written to SQL parameters and JSON as they are: a StrEnum is its value.
    job: str = RowKind.JOB
    assert job == "job" and f"{RowKind.INTENT}" == "intent"
    assert {k.value for k in StepKind} >= {"command", "query", "job", "sleep", "wait", "cancel"}
