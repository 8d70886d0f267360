"""The statements akter builds on owned tables, with SQLAlchemy Core, scoped to one owner.

Imported only when an owned table is used (the ``akter[sqlalchemy]`` extra). Every statement
built here names its owner's keys: inserts and upserts get the ownership columns filled, and
updates, deletes and reads get ``routing_key = … AND tenant_id = … AND actor_id = …`` added to
whatever the handler wrote. A value naming an ownership column with another owner's key is
refused (:class:`~akter._tables.RowScopeError`) before anything is staged.

Statements are compiled for psycopg (``%(name)s`` placeholders, SQLAlchemy's bind processors
applied) into :data:`Statement` pairs that the turn's pipeline or a pooled connection runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from akter._tables import OwnedTable, RowScopeError

__all__ = ["DIALECT", "Scope", "Statement", "compile_statement", "count_of", "scoped_select"]

#: A compiled statement: its SQL text (psycopg's ``%(name)s`` placeholders) and parameters.
Statement = tuple[str, dict[str, Any]]
#: One owner's keys: ``(routing_key, tenant, actor id)``.
Scope = tuple[int, str, str]

DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]


def compile_statement(stmt: sa.sql.ClauseElement) -> Statement:
    """``stmt`` as psycopg runs it: IN lists expanded, bind processors (JSON ...) applied."""
    compiled: Any = stmt.compile(dialect=DIALECT, compile_kwargs={"render_postcompile": True})
    params: dict[str, Any] = dict(compiled.construct_params() or {})
    # SQLAlchemy's own processors (JSON's, an Enum's): what its psycopg driver would send.
    for name, process in compiled._bind_processors.items():
        if name in params and params[name] is not None and callable(process):
            params[name] = process(params[name])
    return str(compiled.string), params


def _owner_filter(owned: OwnedTable, scope: Scope) -> sa.ColumnElement[bool]:
    c = owned.table.c
    return sa.and_(*(c[name] == value for name, value in zip(owned.keys, scope, strict=True)))


def _checked(
    owned: OwnedTable, scope: Scope, values: Mapping[str, Any], fill: bool
) -> dict[str, Any]:
    """``values`` with the ownership columns checked against ``scope`` (filled when ``fill``)."""
    if not isinstance(values, Mapping):
        raise TypeError(f"row values for {owned.name!r} must be a mapping of column names")
    row = dict(values)
    for name, mine in zip(owned.keys, scope, strict=True):
        if name in row and row[name] != mine:
            raise RowScopeError(
                f"A write to {owned.name!r} set its ownership column {name!r} to "
                f"{row[name]!r}, not this actor's {mine!r}: akter fills the ownership "
                "columns; leave them out."
            )
        if fill:
            row[name] = mine
        else:
            row.pop(name, None)
    unknown = [name for name in row if name not in owned.table.c]
    if unknown:
        raise RowScopeError(f"{owned.name!r} has no column(s) {', '.join(map(repr, unknown))}.")
    return row


def insert_rows(
    owned: OwnedTable, scope: Scope, rows: Sequence[Mapping[str, Any]], upsert: bool = False
) -> list[Statement]:
    """One ``INSERT`` per row, each with its ownership columns filled (queued in one flight).

    ``upsert``: ``INSERT … ON CONFLICT (primary key) DO UPDATE`` of the row's other columns.
    The statement of a column set is compiled once per table (:func:`_template`): compiling
    a 100-row ``VALUES`` list each turn cost more than the turn itself.
    """
    out: list[Statement] = []
    for row in rows:
        checked = _checked(owned, scope, row, True)
        columns = tuple(checked)
        text, processors = _template(owned, columns, upsert)
        params: dict[str, Any] = {}
        for i, (column, process) in enumerate(zip(columns, processors, strict=True)):
            value = checked[column]
            params[f"v{i}"] = process(value) if process is not None and value is not None else value
        out.append((text, params))
    return out


def _template(
    owned: OwnedTable, columns: tuple[str, ...], upsert: bool
) -> tuple[str, list[Callable[[Any], Any] | None]]:
    """The compiled insert (or upsert) of one column set, and its columns' bind processors."""
    key = (columns, upsert)
    found: tuple[str, list[Callable[[Any], Any] | None]] | None = owned.templates.get(key)
    if found is not None:
        return found
    table = owned.table
    binds = {c: sa.bindparam(f"v{i}", type_=table.c[c].type) for i, c in enumerate(columns)}
    stmt: Any
    if upsert:
        stmt = pg_insert(table).values(binds)
        pk = [c.name for c in table.primary_key.columns]
        changed = [c for c in columns if c not in pk]
        if changed:
            stmt = stmt.on_conflict_do_update(
                index_elements=pk, set_={c: stmt.excluded[c] for c in changed}
            )
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=pk)
    else:
        stmt = sa.insert(table).values(binds)
    compiled: Any = stmt.compile(dialect=DIALECT)
    processors = compiled._bind_processors
    found = (str(compiled.string), [processors.get(f"v{i}") for i in range(len(columns))])
    owned.templates[key] = found
    return found


def update_rows(
    owned: OwnedTable, scope: Scope, values: Mapping[str, Any], where: Sequence[Any]
) -> Any:
    """An ``UPDATE`` of this owner's rows matching ``where``; ownership columns never change."""
    changed = _checked(owned, scope, values, False)
    return sa.update(owned.table).values(changed).where(_owner_filter(owned, scope), *where)


def delete_rows(owned: OwnedTable, scope: Scope, where: Sequence[Any]) -> Any:
    """A ``DELETE`` of this owner's rows matching ``where``."""
    return sa.delete(owned.table).where(_owner_filter(owned, scope), *where)


def scoped_select(
    owned: OwnedTable,
    scope: Scope,
    where: Sequence[Any] = (),
    order_by: Sequence[Any] = (),
    limit: int | None = None,
) -> sa.Select[Any]:
    """This owner's rows matching ``where``."""
    stmt = sa.select(owned.table).where(_owner_filter(owned, scope), *where)
    if order_by:
        stmt = stmt.order_by(*order_by)
    if limit is not None:
        stmt = stmt.limit(limit)
    return stmt


def count_of(stmt: sa.Select[Any]) -> sa.Select[Any]:
    """``SELECT count(*)`` of what ``stmt`` selects."""
    return sa.select(sa.func.count()).select_from(stmt.order_by(None).subquery())


def suspects(owned: OwnedTable, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The columns whose values do not fit their declared types (to name a refused value)."""
    found: list[str] = []
    for row in rows:
        for name, value in row.items():
            column = owned.table.c.get(name)
            if column is None or value is None or name in found:
                continue
            if not _fits(column.type, value):
                found.append(name)
    return found


def _fits(kind: Any, value: Any) -> bool:
    length = getattr(kind, "length", None)
    if isinstance(value, str) and isinstance(length, int) and len(value) > length:
        return False
    try:
        expected = kind.python_type
    except NotImplementedError:
        return True
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, expected)
