"""Owned rows in a turn: the batch's staged row writes, reads in its transaction, undo.

A command's ``self.rows(t)`` writes are staged on its :class:`CommandRows` and, when it ends
well, are compiled (a write that cannot be built is the command's defect, raised before any
flight carries it) and join the batch's pending writes, which the commit flight sends first,
before the state's update (:meth:`OwnedTurn.send`): a command that only writes rows adds no
round trip. A read sends the
batch's pending writes first, then the reading command's own (after a savepoint, taken once per
command), then the read, in one flight on the turn's pipeline: it sees the committed rows plus
this turn's writes, under the actor's row lock. A command that fails after it sent writes owes
a ``ROLLBACK TO SAVEPOINT`` that leads the next flight; its unsent writes are dropped.

A server error of an owned-row statement (a value its column refuses) is answered as a defect
of the batch: its commands re-run one per transaction, and the one that staged it fails with
``Defect`` naming the table, column or constraint (:func:`refused`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import psycopg
from pydantic import BaseModel

from akter._contexts import CommandContext
from akter._engine.turn.flights import Flights
from akter._engine.turn.types import Activation, BatchDefect
from akter._store.gateway.tables import owned_savepoint, owned_statement, owned_undo
from akter._store.pipeline import Answer, TurnPipeline
from akter._store.queries import Queries
from akter._tables import RowScopeError, refusal

#: SQLSTATE classes of a statement the server refused for what it says (data, integrity,
#: syntax or access): a defect of the command that staged it. Any other failure of a read
#: (a lost connection, a timeout) leaves the turn as any failed flight does.
REFUSED_CLASSES = frozenset({"22", "23", "42", "44"})


class RowsReadFailed(BaseException):
    """A read's flight failed for a reason that is not the command's: the turn fails with it.

    A ``BaseException``, so a handler's ``except Exception`` cannot swallow it.
    """

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


Statement = tuple[str, dict[str, Any]]
Scope = tuple[int, str, str]
#: A write and the statements it compiled to.
Compiled = tuple["Write", list[Statement]]


class Write(Protocol):
    """A staged row write (``akter._row_handles.RowsWrite``)."""

    @property
    def table(self) -> str: ...

    def compile(self) -> list[Statement]: ...

    def suspects(self) -> list[str]: ...


class OwnedTurn:
    """The owned-row writes of one batch on its turn's pipeline."""

    def __init__(self, pipe: TurnPipeline, q: Queries, scope: Scope, fresh: bool = False) -> None:
        self.pipe = pipe
        #: The actor had no created row when the batch began: its state indexes are written.
        self.fresh = fresh
        self.q = q
        self.scope = scope
        #: Writes of the batch's commands that ended well, compiled, not sent yet.
        self.pending: list[Compiled] = []
        #: A failed command sent writes: the next flight starts by rolling them back.
        self.undo = False
        #: The sent statements' answers and writes (``None``: a read): a refused value is
        #: named from them.
        self.sent: list[tuple[Answer, Write | None]] = []

    def command(self, ctx: CommandContext) -> CommandRows:
        """The rows side of the batch's next command (``ctx.owned``)."""
        rows = CommandRows(self, ctx)
        ctx.owned = rows
        return rows

    async def _queue(self, writes: Sequence[Compiled]) -> None:
        if self.undo:
            await owned_undo(self.pipe, self.q)
            self.undo = False
        for write, statements in writes:
            for statement in statements:
                answer = await owned_statement(self.pipe, statement)
                self.sent.append((answer, write))

    async def send(self) -> None:
        """Queue the pending writes in the commit flight (before ``COMMIT``)."""
        pending, self.pending = self.pending, []
        await self._queue(pending)

    def refused(self, exc: psycopg.Error) -> str | None:
        """The defect message when ``exc`` answered one of the sent row statements."""
        for answer, write in self.sent:
            if answer.failed:
                if write is None:
                    return refusal("an owned table (a read)", exc)
                return refusal(repr(write.table), exc, write.suspects())
        return None


class CommandRows:
    """One command's side of :class:`OwnedTurn` (``ctx.owned`` behind ``self.rows``)."""

    def __init__(self, turn: OwnedTurn, ctx: CommandContext) -> None:
        self.turn = turn
        self.ctx = ctx
        self.staged: list[Write] = []
        self.saved = False

    @property
    def scope(self) -> Scope:
        """The owner's keys."""
        return self.turn.scope

    def stage(self, write: Write) -> None:
        """Stage a write (``self.rows(t).insert(...)`` ...)."""
        self.staged.append(write)

    async def read(self, statement: Statement) -> list[tuple[Any, ...]]:
        """Send the batch's writes so far, then ``statement``; its rows."""
        turn, pipe = self.turn, self.turn.pipe
        pending, turn.pending = turn.pending, []
        await turn._queue(pending)
        try:
            staged = compiled(self.staged)
        except BatchDefect as bad:
            self.ctx.poisoned = self.ctx.poisoned or bad.message
            raise RowScopeError(bad.message) from None
        self.staged = []
        if staged and not self.saved:
            await owned_savepoint(pipe, turn.q)
            self.saved = True
        await turn._queue(staged)
        answer = await owned_statement(pipe, statement)
        turn.sent.append((answer, None))
        try:
            await pipe.sync()
        except psycopg.Error as exc:
            if (exc.sqlstate or "")[:2] not in REFUSED_CLASSES:
                raise RowsReadFailed(exc) from None
            refused = turn.refused(exc) or refusal("an owned table", exc)
            self.ctx.poisoned = self.ctx.poisoned or refused  # a defect, even if caught
            raise RowScopeError(refused) from None
        return await answer.fetchall()

    def end(self, ok: bool, states: tuple[BaseModel, BaseModel] | None = None) -> None:
        """The command ended: its writes join the batch's, or are dropped (and undone).

        ``states``: the state before and after a command that ended well, for the type's
        state indexes (``akter.state_index``).
        """
        if ok:
            if states is not None:
                self._mirror(*states)
            self.turn.pending.extend(compiled(self.staged))
        elif self.saved:
            self.turn.undo = True
        self.staged = []

    def _mirror(self, before: BaseModel, after: BaseModel) -> None:
        """Stage the upsert of each state index whose projection changed (or a first turn)."""
        for declared in self.ctx.definition.tables:
            project = declared.mirror
            if project is None:
                continue
            try:
                values = dict(project(after))
                same = not self.turn.fresh and values == dict(project(before))
            except Exception as exc:
                raise BatchDefect(
                    0, f"The state index {declared.name!r} failed on the state: {exc!r}"
                ) from None
            if not same:
                from akter._row_handles import mirror_write  # SQLAlchemy: types with tables

                self.staged.append(mirror_write(declared, self.scope, values))


def compiled(writes: Sequence[Write]) -> list[Compiled]:
    """Each write with its statements; one that cannot be built is a ``BatchDefect``."""
    out: list[Compiled] = []
    for write in writes:
        try:
            out.append((write, write.compile()))
        except Exception as exc:  # SQLAlchemy's, a scope refusal of a state index's values
            raise BatchDefect(
                0, f"A write to {write.table!r} could not be built: {type(exc).__name__}: {exc}"
            ) from None
    return out


def owned_turn(flights: Flights, q: Queries, act: Activation) -> OwnedTurn | None:
    """The batch's owned rows, for a type that owns tables (``None`` for any other)."""
    if not act.definition.tables:
        return None
    scope = (act.routing_key, act.ref.tenant, act.ref.id)
    return OwnedTurn(flights.pipe, q, scope, fresh=not act.created)


def raise_refused(owned: OwnedTurn | None, exc: psycopg.Error) -> None:
    """Raise the batch's defect when ``exc`` answered one of its owned-row statements.

    The server rolled the flight back: the batch's commands re-run one per transaction, and the
    one whose row the column refuses fails with ``Defect`` (``engine._run``).
    """
    if owned is not None and (exc.sqlstate or "")[:2] in REFUSED_CLASSES:
        message = owned.refused(exc)
        if message is not None:
            raise BatchDefect(0, message) from None
