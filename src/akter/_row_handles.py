"""What ``self.rows(table)`` returns: staged writes and scoped reads of one actor's rows.

Built on :mod:`akter._row_sql` (SQLAlchemy). Writes are staged on the context's ``owned``
(the turn's :class:`~akter._engine.turn.owned.CommandRows`), compiled when the turn sends them;
reads are sent at once (``await``). A write that names another owner's keys poisons the command
(it fails with ``Defect`` even if the handler catches the error) and stages nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import sqlalchemy as sa

from akter._contexts import CommandContext, _Context
from akter._row_sql import (
    Scope,
    Statement,
    compile_statement,
    count_of,
    delete_rows,
    insert_rows,
    scoped_select,
    suspects,
    update_rows,
)
from akter._tables import OwnedTable, RowScopeError
from akter.errors import ReadOnlyError

__all__ = ["Rows", "RowsRead", "RowsWrite", "mirror_write"]

Row = dict[str, Any]


class Owned(Protocol):
    """The engine's side behind ``self.rows``: the owner's keys, staging and reading."""

    @property
    def scope(self) -> Scope: ...

    def stage(self, write: RowsWrite) -> None: ...

    async def read(self, statement: Statement) -> list[tuple[Any, ...]]: ...


class RowsWrite:
    """One staged write; ``where()`` narrows an update or a delete until the turn sends it."""

    __slots__ = ("_build", "_criteria", "_sent", "_values", "owned")

    def __init__(
        self,
        owned: OwnedTable,
        build: Callable[[Sequence[Any]], Any | list[Statement]],
        values: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.owned = owned
        self._build = build
        self._values = values
        self._criteria: list[Any] = []
        self._sent = False

    @property
    def table(self) -> str:
        """The table's name, for messages."""
        return self.owned.name

    def where(self, *criteria: Any) -> RowsWrite:
        """Narrow the update or delete (ANDed with the owner's keys)."""
        if self._sent:
            raise RowScopeError(
                f"where() on a write to {self.table!r} that was already sent: call it in the "
                "same expression as update()/delete()."
            )
        self._criteria.extend(criteria)
        return self

    def suspects(self) -> list[str]:
        """The columns whose values do not fit their types (to name a value the server refused)."""
        return suspects(self.owned, self._values)

    def compile(self) -> list[Statement]:
        """The statements as they are sent (no ``where()`` after this)."""
        self._sent = True
        built = self._build(self._criteria)
        return built if isinstance(built, list) else [compile_statement(built)]


class RowsRead:
    """A scoped read: ``where``, ``order_by``, ``limit``, then ``await all()/one()/count()``."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows
        self._where: list[Any] = []
        self._order: list[Any] = []
        self._limit: int | None = None

    def _copy(self) -> RowsRead:
        made = RowsRead(self._rows)
        made._where, made._order, made._limit = [*self._where], [*self._order], self._limit
        return made

    def where(self, *criteria: Any) -> RowsRead:
        """A read narrowed by ``criteria`` (ANDed with the owner's keys); this one is unchanged."""
        made = self._copy()
        made._where.extend(criteria)
        return made

    def order_by(self, *clauses: Any) -> RowsRead:
        """A read in this order."""
        made = self._copy()
        made._order.extend(clauses)
        return made

    def limit(self, count: int) -> RowsRead:
        """A read of at most ``count`` rows."""
        made = self._copy()
        made._limit = count
        return made

    def select(self) -> sa.Select[Any]:
        """The scoped ``SELECT`` this read sends."""
        rows = self._rows
        return scoped_select(rows.declared, rows.owned.scope, self._where, self._order, self._limit)

    async def all(self) -> list[Row]:
        """Every matching row, as a ``dict`` by column name."""
        self._rows.ctx.check()
        stmt = self.select()
        names = [str(c.key) for c in stmt.selected_columns]
        found = await self._rows.owned.read(compile_statement(stmt))
        return [dict(zip(names, row, strict=True)) for row in found]

    async def one_or_none(self) -> Row | None:
        """The one matching row, or ``None``; more than one raises ``LookupError``."""
        found = await self.limit(2).all()
        if len(found) > 1:
            raise LookupError(f"more than one row of {self._rows.declared.name!r} matched")
        return found[0] if found else None

    async def one(self) -> Row:
        """The one matching row; none or several raise ``LookupError``."""
        found = await self.one_or_none()
        if found is None:
            raise LookupError(f"no row of {self._rows.declared.name!r} matched")
        return found

    async def count(self) -> int:
        """How many rows match."""
        self._rows.ctx.check()
        found = await self._rows.owned.read(compile_statement(count_of(self.select())))
        return int(found[0][0])


class Rows(RowsRead):
    """``self.rows(table)``: reads (as :class:`RowsRead`) and, in a command, staged writes."""

    def __init__(self, ctx: _Context, owned: Owned, declared: OwnedTable) -> None:
        self.ctx = ctx
        self.owned = owned
        self.declared = declared
        super().__init__(self)

    def insert(self, values: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Stage an ``INSERT`` of one row (a mapping) or several (a list of mappings)."""
        many = _many(values)
        self._stage(lambda scope: lambda _: insert_rows(self.declared, scope, many), many)

    def upsert(self, values: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Stage an insert that updates the given columns of a row whose primary key exists."""
        many = _many(values)
        self._stage(lambda scope: lambda _: insert_rows(self.declared, scope, many, True), many)

    def update(self, values: Mapping[str, Any]) -> RowsWrite:
        """Stage an ``UPDATE`` of this actor's rows; narrow it with ``.where(...)``."""
        return self._stage(
            lambda scope: lambda where: update_rows(self.declared, scope, values, where), [values]
        )

    def delete(self) -> RowsWrite:
        """Stage a ``DELETE`` of this actor's rows; narrow it with ``.where(...)``."""
        return self._stage(lambda scope: lambda where: delete_rows(self.declared, scope, where))

    def _stage(
        self,
        make: Callable[[Scope], Callable[[Sequence[Any]], Any]],
        values: Sequence[Mapping[str, Any]] = (),
    ) -> RowsWrite:
        ctx = self.ctx
        if not isinstance(ctx, CommandContext):
            raise ReadOnlyError("Owned rows are read-only in a query: write them in a command.")
        ctx.check()
        build = make(self.owned.scope)
        write = RowsWrite(self.declared, build, values)
        try:
            build([])  # the values' scope and columns are checked now, at the call
        except RowScopeError as exc:
            ctx.poisoned = str(exc)
            raise
        except (sa.exc.ArgumentError, sa.exc.CompileError, TypeError) as exc:
            ctx.poisoned = f"A write to {self.declared.name!r} is invalid: {exc}"
            raise RowScopeError(ctx.poisoned) from None
        self.owned.stage(write)
        return write


def _many(values: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if isinstance(values, Mapping):
        return [values]
    rows = list(values)
    if not rows:
        raise RowScopeError("insert()/upsert() takes at least one row")
    return rows


def mirror_write(declared: OwnedTable, scope: Scope, values: Mapping[str, Any]) -> RowsWrite:
    """The upsert of a state index's row (``akter.state_index``), staged by the turn."""
    return RowsWrite(declared, lambda _: insert_rows(declared, scope, [values], True), [values])
