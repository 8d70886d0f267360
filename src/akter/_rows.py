"""``self.rows(table)``: an actor's owned rows inside its commands and queries.

The method lives on :class:`akter.Actor` through :class:`RowsApi`; what it returns
(:mod:`akter._row_handles`) needs SQLAlchemy and is imported only when it is called. Behind
``self`` the context's ``owned`` is the engine's side: the turn's staged writes and reads in
its transaction for a command (``akter._engine.turn.owned``), a read-only reader for a query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akter._contexts import _Context
from akter.errors import CapabilityEscaped, ReadOnlyError

if TYPE_CHECKING:
    from akter._row_handles import Rows

__all__ = ["RowsApi"]


class RowsApi:
    """The ``rows()`` method of actors (mixed into :class:`akter.Actor`)."""

    def rows(self, table: Any) -> Rows:
        """This actor's rows of an owned ``table`` (one it names in ``tables=``).

        In a command: ``insert``, ``upsert``, ``update().where()``, ``delete().where()`` are
        staged and written with the turn; reads (``await .where(...).all()``, ``.one()``,
        ``.count()``) see the committed rows and this turn's writes. In a query: reads only.
        """
        from akter._row_handles import Rows
        from akter._tables import RowScopeError, owned_of

        ctx = self.__dict__.get("_akter_ctx") if hasattr(self, "__dict__") else None
        if not isinstance(ctx, _Context):
            raise CapabilityEscaped(
                "Turn capabilities exist only inside a command or query handler run by akter."
            )
        ctx.check()
        declared = owned_of(table)
        if declared not in ctx.definition.tables:
            raise RowScopeError(
                f"{ctx.definition.name} does not own the table {declared.name!r}: name it in "
                "tables=[...] of the class (cross-actor reads: runtime.rows(...))."
            )
        owned = getattr(ctx, "owned", None)
        if owned is None:
            raise ReadOnlyError("Owned rows are available in commands and queries only.")
        return Rows(ctx, owned, declared)
