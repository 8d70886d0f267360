"""Owned tables: their declaration (``akter.owner_columns``, ``akter.owned``, ``tables=``).

An owned table is a user's SQLAlchemy Core ``Table`` whose rows belong to one actor each, named
by three ownership columns (``routing_key``, ``tenant_id``, ``actor_id`` unless adopted under
other names). One actor type owns a table. SQLAlchemy is imported only where a table is declared
(the ``akter[sqlalchemy]`` extra): core akter never imports it. See docs/guides/owned-tables.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from akter.errors import AkterError, ConfigurationError, DefinitionError

__all__ = [
    "OWNER_COLUMNS",
    "OwnedTable",
    "OwnedTableError",
    "RowScopeError",
    "owned",
    "owned_of",
    "owner_columns",
    "refusal",
    "state_index",
]

#: The ownership columns' default names, in primary key order, and their PostgreSQL types.
OWNER_COLUMNS = (("routing_key", "bigint"), ("tenant_id", "text"), ("actor_id", "text"))


class OwnedTableError(ConfigurationError):
    """An owned table in the database disagrees with its declaration (checked at start)."""


class RowScopeError(AkterError):
    """A row write named another actor's or tenant's ownership keys; nothing was written."""


def owner_columns() -> list[Any]:
    """The ownership columns to put first in an owned ``sa.Table``: its leading primary key.

    ``routing_key bigint``, ``tenant_id text`` and ``actor_id text``, all ``NOT NULL``; akter
    fills them on every write.
    """
    import sqlalchemy as sa

    kinds = {"bigint": sa.BigInteger, "text": sa.Text}
    return [
        sa.Column(name, kinds[kind], primary_key=True, nullable=False, autoincrement=False)
        for name, kind in OWNER_COLUMNS
    ]


@dataclass(eq=False)
class OwnedTable:
    """One owned table's declaration: the ``sa.Table`` and its ownership columns' names."""

    table: Any
    routing_key: str = "routing_key"
    tenant_id: str = "tenant_id"
    actor_id: str = "actor_id"
    #: The actor type that owns it (set when the class naming it in ``tables=`` is defined).
    owner: str | None = field(default=None)
    #: For a state index (:func:`state_index`): the state's projection onto the table's columns.
    mirror: Callable[[Any], Mapping[str, Any]] | None = None
    #: Compiled inserts by column set (``akter._row_sql._template``).
    templates: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """The table's name as SQL names it (``schema.name`` when it has a schema)."""
        return str(self.table.fullname)

    @property
    def keys(self) -> tuple[str, str, str]:
        """The ownership columns' names, in primary key order."""
        return (self.routing_key, self.tenant_id, self.actor_id)

    def claim(self, type_name: str) -> None:
        """Record ``type_name`` as the owner; a second owner type is a ``DefinitionError``."""
        if self.owner is not None and self.owner != type_name:
            raise DefinitionError(
                f"{type_name}: the table {self.name!r} is owned by {self.owner}; a table has "
                "one owner type (declare another table)."
            )
        self.owner = type_name


def owned(table: Any, *, routing_key: str, tenant_id: str, actor_id: str) -> OwnedTable:
    """Adopt an existing table: name its ownership columns (``tables=[akter.owned(t, ...)]``)."""
    declared = _declaration(table)
    if declared is not None:
        raise DefinitionError(f"The table {declared.name!r} is already declared as owned.")
    made = OwnedTable(table, routing_key, tenant_id, actor_id)
    _check_columns(made)
    table.info["akter_owned"] = made
    return made


def state_index(table: Any, project: Callable[[Any], Mapping[str, Any]]) -> OwnedTable:
    """Mirror state fields into an owned table's indexed columns, kept in the same turn.

    ``table`` has one row per actor (its primary key is the ownership columns alone);
    ``project(state)`` maps the state to that row's other columns. After each command whose
    projection changed (and on an actor's first turn) akter upserts the row in the command's
    turn, so ``runtime.rows(table, tenant=...)`` finds actors by state through the table's
    indexes. A state migration that renames a field changes only ``project``.
    """
    declared = owned_of(table)
    key = [c.name for c in declared.table.primary_key.columns]
    if sorted(key) != sorted(declared.keys):
        raise DefinitionError(
            f"The state index {declared.name!r} must have one row per actor: its primary key "
            f"is {key!r}, not the ownership columns {list(declared.keys)!r} alone."
        )
    if not callable(project):
        raise DefinitionError(f"state_index({declared.name!r}, project): project is callable.")
    declared.mirror = project
    return declared


def owned_of(table: Any) -> OwnedTable:
    """The declaration of ``table`` (an ``sa.Table`` or an :class:`OwnedTable`)."""
    if isinstance(table, OwnedTable):
        return table
    declared = _declaration(table)
    if declared is None:
        if not hasattr(table, "c") or not hasattr(table, "info"):
            raise DefinitionError(f"tables= takes sqlalchemy Table objects, not {table!r}.")
        declared = OwnedTable(table)
        _check_columns(declared)
        table.info["akter_owned"] = declared
    return declared


def _declaration(table: Any) -> OwnedTable | None:
    info = getattr(table, "info", None)
    found = info.get("akter_owned") if isinstance(info, dict) else None
    return found if isinstance(found, OwnedTable) else None


def _check_columns(declared: OwnedTable) -> None:
    """The declaration's own shape: the ownership columns exist and lead the primary key."""
    table = declared.table
    missing = [name for name in declared.keys if name not in table.c]
    if missing:
        raise DefinitionError(
            f"The owned table {declared.name!r} lacks the ownership column(s) "
            f"{', '.join(missing)}: add *akter.owner_columns() or adopt it with akter.owned()."
        )
    leading = [c.name for c in table.primary_key.columns][:3]
    if sorted(leading) != sorted(declared.keys):
        raise DefinitionError(
            f"The owned table {declared.name!r} has the primary key {leading!r}...; it must "
            f"start with the ownership columns {list(declared.keys)!r}."
        )


def refusal(table: str, exc: Any, suspects: Sequence[str] = ()) -> str:
    """A refused row statement's defect message: the table, column or constraint, the reason.

    ``exc`` is the server's error (a ``psycopg.Error``: its ``diag`` names what refused). A
    value the server could not take as its column's type is not named by the server: then
    ``suspects`` are the columns whose values do not fit their declared types.
    """
    diag = exc.diag
    # A Citus worker's error reaches the coordinator without these fields: read its words.
    said = str(diag.message_primary or "")
    named_column = diag.column_name or _quoted(said, r'in column "([^"]+)"')
    constraint = diag.constraint_name or _quoted(said, r'violates [\w ]*constraint "([^"]+)"')
    column = named_column or (", ".join(map(repr, suspects)) if suspects else None)
    what = ", ".join(
        f"{label} {name if label == 'column' and not named_column else repr(name)}"
        for label, name in (("column", column), ("constraint", constraint))
        if name
    )
    return (
        f"A row statement on {table} was refused ({exc.sqlstate}"
        f"{'; ' + what if what else ''}): {diag.message_primary or exc}"
    )


def _quoted(message: str, pattern: str) -> str | None:
    found = re.search(pattern, message)
    return found.group(1) if found else None
