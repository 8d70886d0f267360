"""``akter.QueryView``: the type of a query's ``self`` (re-exported by :mod:`akter.context`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel
from typing_extensions import TypeVar

from akter.callers import ActorRef, Caller
from akter.events import EventStream

if TYPE_CHECKING:
    from akter._row_handles import RowsRead

__all__ = ["QueryView"]

S_co = TypeVar("S_co", bound=BaseModel, covariant=True, default=BaseModel)


class QueryView(Protocol[S_co]):
    """The type of a query's ``self``: ``async def status(self: akter.QueryView[State]) -> ...``.

    What a query may use: the actor's address, its caller, the pinned clock, the read-only
    state, the event cursor, ``events()`` and reads of its owned rows (``rows(table)``); none
    of the staging calls, so ``self.send(...)`` or ``self.rows(t).insert(...)`` in a query
    annotated this way is a type error. (Whatever the annotation, a query's ``self``
    refuses staging at run time with :class:`~akter.errors.ReadOnlyError`.)
    """

    @property
    def id(self) -> str:
        """The actor's id (``""`` for a singleton)."""
        ...

    @property
    def tenant(self) -> str:
        """The actor's tenant."""
        ...

    @property
    def ref(self) -> ActorRef:
        """The actor's address."""
        ...

    @property
    def caller(self) -> Caller:
        """Who sent the query."""
        ...

    @property
    def principal(self) -> str | None:
        """The principal the query is attributed to."""
        ...

    @property
    def now(self) -> datetime:
        """Database time read with the state (an aware UTC datetime)."""
        ...

    @property
    def now_ms(self) -> int:
        """Database time read with the state, in epoch milliseconds."""
        ...

    @property
    def cursor(self) -> str:
        """The event cursor read with the state (``events(after=cursor)``)."""
        ...

    @property
    def state(self) -> S_co:
        """The committed state, read-only (writes raise ``ReadOnlyError``)."""
        ...

    def events(self, after: str | None = None, limit: int = 1000) -> EventStream:
        """One page of committed events after a cursor (``await self.events(...)``)."""
        ...

    def rows(self, table: Any) -> RowsRead:
        """This actor's committed rows of an owned table, read-only (``await .all()``, ...)."""
        ...
