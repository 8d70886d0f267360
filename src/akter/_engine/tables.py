"""The start check of owned tables: each declared table as the database has it.

A runner starts only when every owned table of its types exists with the ownership columns
(their types, ``NOT NULL``), a primary key led by them, and every column the ``sa.Table``
declares; otherwise ``start()`` raises ``akter.OwnedTableError`` naming the table and what is
missing (docs/guides/owned-tables.md, "The rules"); ``akter check`` reports the same as
``owned_table`` findings (:func:`check_findings`). Extra database columns are fine: that is
the expand step of an Alembic migration made before the code that uses them is deployed.
"""

from __future__ import annotations

from collections.abc import Iterable

from akter._members import ActorDefinition
from akter._store.gateway.check import CheckGateway
from akter._store.gateway.tables import (
    Column,
    citus_colocated,
    quoted_name,
    tables_columns,
)
from akter._store.pool import Store
from akter._tables import OWNER_COLUMNS, OwnedTable, OwnedTableError
from akter.check import Finding


async def check_owned_tables(store: Store, definitions: Iterable[ActorDefinition]) -> None:
    """Raise ``OwnedTableError`` naming each owned table that disagrees with its declaration."""
    problems = await owned_table_problems(store, definitions)
    if problems:
        raise OwnedTableError(
            "Owned tables disagree with the database: " + "; ".join(problems) + ". Apply the "
            "application's migrations (Alembic) before starting this code."
        )


async def check_findings(
    gateway: CheckGateway, definitions: Iterable[ActorDefinition]
) -> list[Finding]:
    """``akter check``'s findings: one ``owned_table`` error per table that disagrees."""
    findings: list[Finding] = []
    for owned in [t for d in definitions for t in d.tables]:
        columns = await gateway.owned_table(quoted_name(owned.table.schema, owned.table.name))
        problem = _disagreement(owned, columns)
        if problem:
            findings.append(
                Finding(
                    "error",
                    "owned_table",
                    owned.owner,
                    None,
                    0,
                    f"The owned table {owned.name!r} {problem}: a runner of this code would "
                    "refuse to start.",
                    fix="Apply the application's migrations (Alembic) before deploying the code.",
                )
            )
    return findings


async def owned_table_problems(store: Store, definitions: Iterable[ActorDefinition]) -> list[str]:
    """One sentence per owned table that disagrees with its declaration."""
    tables: list[OwnedTable] = [t for d in definitions for t in d.tables]
    if not tables:
        return []
    names = [quoted_name(t.table.schema, t.table.name) for t in tables]
    found = await tables_columns(store, names)
    problems: list[str] = []
    for owned, columns in zip(tables, found, strict=True):
        problem = _disagreement(owned, columns)
        if not problem and store.strategy == "citus":
            name = quoted_name(owned.table.schema, owned.table.name)
            if not await citus_colocated(store, name, owned.routing_key):
                problem = (
                    f"is not distributed by {owned.routing_key!r} co-located with akter's "
                    "actors (create_distributed_table(..., colocate_with => '<schema>.actors'))"
                )
        if problem:
            problems.append(f"{owned.name!r} (owned by {owned.owner}) {problem}")
    return problems


def _disagreement(owned: OwnedTable, columns: list[Column] | None) -> str:
    """What is wrong with the table as the database has it (``""``: nothing)."""
    if columns is None:
        return "does not exist"
    found = {c.name: c for c in columns}
    wrong: list[str] = []
    for name, (_, kind) in zip(owned.keys, OWNER_COLUMNS, strict=True):
        column = found.get(name)
        if column is None:
            wrong.append(f"lacks the ownership column {name!r}")
        elif not _same_kind(column.type, kind) or not column.not_null:
            wrong.append(f"has {name!r} as {column.type} (want {kind} NOT NULL)")
    leading = sorted((c.key_position, c.name) for c in columns if c.key_position is not None)[:3]
    if sorted(n for _, n in leading) != sorted(owned.keys):
        named = [n for _, n in leading]
        wrong.append(f"has a primary key led by {named!r}, not by {list(owned.keys)!r}")
    missing = [c.name for c in owned.table.columns if c.name not in found]
    if missing:
        wrong.append(f"lacks the declared column(s) {', '.join(map(repr, missing))}")
    return ", ".join(wrong)


def _same_kind(found: str, kind: str) -> bool:
    if kind == "text":
        return found == "text" or found.startswith("character varying")
    return found == kind
