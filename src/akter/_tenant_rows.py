"""``runtime.rows(table, tenant=...)``: one tenant's owned rows across actors, read-only.

A :class:`TenantRows` holds a SQLAlchemy ``Select`` already filtered on the tenant; the caller
refines it (``where``, ``order_by``, joins with the owners' ``actors`` rows through
:meth:`TenantRows.join_state`) and runs it with :meth:`all` or :meth:`page` (keyset pagination),
always in a ``READ ONLY`` transaction. Only a ``Select`` is run: a write is refused before it
is sent. SQLAlchemy (the ``akter[sqlalchemy]`` extra) is imported when one is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from akter._store.gateway.tables import read_only
from akter._tables import OwnedTable, RowScopeError, owned_of
from akter.errors import DefinitionError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from akter._store.pool import Store

__all__ = ["TenantRows"]


class TenantRows:
    """One tenant's rows of an owned table: ``select`` to refine, ``all``/``page`` to run."""

    def __init__(self, store: Store, table: Any, tenant: str, wait_s: float) -> None:
        import sqlalchemy as sa
        from sqlalchemy.dialects.postgresql import JSONB

        self.owned: OwnedTable = owned_of(table)
        if self.owned.owner is None:
            raise DefinitionError(
                f"runtime.rows: no actor class owns {self.owned.name!r}; name it in tables=[...] "
                "of the class whose rows it holds."
            )
        self.table = self.owned.table
        self.tenant = tenant
        self._store = store
        self._wait_s = wait_s
        #: The owners' rows of akter's ``v_actors`` view (``state``: jsonb), for ``join_state``.
        self.state = sa.table(
            "v_actors",
            sa.column("routing_key", sa.BigInteger),
            sa.column("tenant_id", sa.Text),
            sa.column("actor_type", sa.Text),
            sa.column("actor_id", sa.Text),
            sa.column("state", JSONB),
            schema=store.queries.schema,
        )
        #: The tenant's rows: refine it and pass it to :meth:`all` or :meth:`page`.
        self.select: sa.Select[Any] = sa.select(self.table).where(self._tenant_filter())

    def _tenant_filter(self) -> sa.ColumnElement[bool]:
        filtered: sa.ColumnElement[bool] = self.table.c[self.owned.tenant_id] == self.tenant
        return filtered

    def join_state(self, select: sa.Select[Any] | None = None) -> sa.Select[Any]:
        """``select`` joined with each row's owner (``self.state.c.state`` is its state)."""
        import sqlalchemy as sa

        c, s = self.table.c, self.state.c
        on = sa.and_(
            s.routing_key == c[self.owned.routing_key],
            s.tenant_id == c[self.owned.tenant_id],
            s.actor_type == self.owned.owner,
            s.actor_id == c[self.owned.actor_id],
        )
        return (self.select if select is None else select).join(self.state, on)

    async def all(self, select: sa.Select[Any] | None = None) -> list[dict[str, Any]]:
        """The rows of ``select`` (default: every row of the tenant), as dicts by column key."""
        import sqlalchemy as sa

        from akter._row_sql import compile_statement

        stmt = self.select if select is None else select
        if not isinstance(stmt, sa.Select):
            raise RowScopeError("runtime.rows(...) runs a SELECT only: owned rows are read-only.")
        stmt = stmt.where(self._tenant_filter())  # again: harmless, and a select not from .select
        names = [str(c.key) for c in stmt.selected_columns]
        found = await read_only(
            self._store,
            compile_statement(stmt),
            wait_s=self._wait_s,
            what=f"runtime.rows({self.owned.name!r})",
        )
        return [dict(zip(names, row, strict=True)) for row in found]

    async def page(
        self,
        select: sa.Select[Any] | None = None,
        *,
        key: Sequence[Any],
        after: Sequence[Any] | None = None,
        limit: int = 100,
    ) -> tuple[list[dict[str, Any]], tuple[Any, ...] | None]:
        """One page in ``key`` order (a unique ordering) after ``after``; the next ``after``.

        Keyset pagination: ``rows, after = await r.page(key=[t.c.actor_id, t.c.line_no])``,
        then ``page(key=..., after=after)`` until ``after`` is ``None``.
        """
        import sqlalchemy as sa

        stmt = self.select if select is None else select
        if after is not None:
            stmt = stmt.where(sa.tuple_(*key) > sa.tuple_(*after))
        rows = await self.all(stmt.order_by(*key).limit(limit))
        names = [str(k.key) for k in key]
        last = tuple(rows[-1][n] for n in names) if len(rows) == limit else None
        return rows, last
