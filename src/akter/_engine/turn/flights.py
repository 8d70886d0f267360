"""The connection side of a turn: its one libpq pipeline, and what a failure leaves behind.

Both flights are one pipeline (:class:`Flights`, on ``akter._store.pipeline.TurnPipeline``): the
admission flight ends with a Sync, so while the handlers run the server sees a transaction idle
after a ReadyForQuery and its idle-in-transaction timer is armed (see ``engine``). After a
failure, :func:`consistent` and :func:`rollback_quietly` decide whether the connection goes back
to the pool or is discarded; :func:`describe_db_error` and :func:`commit_unanswered` word the
caller's ``ActorUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol

import psycopg

from akter._engine.turn.types import BatchDefect, Retryable
from akter._store.gateway import actors
from akter._store.pipeline import Statements, TurnPipeline
from akter._store.pool import Connection
from akter.errors import InjectedCrash


def consistent(exc: BaseException) -> bool:
    """Whether the connection's client-side state is known after ``exc`` (see ``engine``).

    Only failures raised between the flights qualify. After a server error inside a flight the
    connection is discarded all the same: reconnecting costs milliseconds, such errors (lock
    waits, a refused write) are rare, and a session that saw one has nothing worth keeping.
    """
    return isinstance(exc, BatchDefect | Retryable | InjectedCrash)


async def discard(conn: Connection) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error, OSError):
            await asyncio.shield(conn.close())


#: How long a rollback after a failed turn may take before the connection is discarded instead.
ROLLBACK_WAIT_S = 2.0


class CommitFlight(Protocol):
    """What ``writes.send`` and ``turn.warm`` use of a turn's flights.

    :class:`Flights` on a connection of the turn's own, or ``shared.SharedFlights`` in a write
    shared with other turns.
    """

    lead: Callable[[Statements], Awaitable[object]] | None

    @property
    def pipe(self) -> Statements: ...

    @property
    def recording(self) -> bool: ...

    @property
    def rows_apart(self) -> bool: ...

    def commit(
        self, meanwhile: Callable[[], None] | None = None
    ) -> AbstractAsyncContextManager[None]: ...

    async def rolled_back(self) -> bool:
        """After a failed guard (``turn.warm``): ``False`` when the connection is unusable."""
        ...

    def unsent(self) -> bool:
        """Whether the commit flight certainly never reached the server."""
        ...


class Flights:
    """Both flights of a turn on the connection's :class:`TurnPipeline` (module docstring).

    ``admission()`` enters pipeline mode and ends with ``sync()``: its answers are read after a
    Sync alone, so the server's idle timer is armed while the handlers run. ``commit()`` ends
    with the commit flight's Sync and leaves pipeline mode. ``leave()`` leaves it after a
    failure in between; a failure inside a flight leaves answers owed, and the connection is
    discarded.
    """

    __slots__ = ("lead", "pipe", "recording", "rows_apart")

    def __init__(
        self, conn: Connection, *, recording: bool = False, rows_apart: bool = False
    ) -> None:
        self.pipe = actors.turn_pipeline(conn)
        #: Whether the batch span records: the flights' child spans are built only then.
        self.recording = recording
        #: Citus: a turn's rows (receipts, events, outbox rows, runs, routed feeds) are routed
        #: inserts of one row each (``akter._store.gateway.citus_writes``), so the commit stays
        #: on one worker connection, in one phase.
        self.rows_apart = rows_apart
        #: What the next :meth:`commit` flight sends first, when it is a warm turn's only one.
        self.lead: Callable[[Statements], Awaitable[object]] | None = None

    # Two small context-manager classes, not @asynccontextmanager: a generator-based one costs
    # an async generator and its hooks per use, twice per turn.

    def admission(self, meanwhile: Callable[[], None] | None = None) -> _Admission:
        """The admission flight; ``meanwhile`` runs once it is sent (``TurnPipeline.sync``)."""
        return _Admission(self.pipe, meanwhile)

    def commit(self, meanwhile: Callable[[], None] | None = None) -> _Commit:
        """The commit flight; ``meanwhile`` runs once it is sent (``TurnPipeline.sync``).

        With a :attr:`lead` the flight is the turn's only one (a warm turn, ``turn.warm``): it
        enters pipeline mode and queues the lead (``BEGIN`` and the guard) first.
        """
        lead, self.lead = self.lead, None
        return _Commit(self.pipe, meanwhile, lead)

    async def leave(self) -> bool:
        """Leave a pipeline still open after a failure; ``False`` if the connection is unusable."""
        return self.pipe.leave()

    async def rolled_back(self) -> bool:
        """Roll back the flight a failed guard aborted and leave the pipeline, still watched.

        ``False`` when that failed: the engine then discards the connection.
        """
        pipe = self.pipe
        try:
            await pipe.execute("ROLLBACK")
            await pipe.sync()
        except psycopg.Error:
            return False
        return pipe.leave(watched=True)

    def unsent(self) -> bool:
        """Never known here: a flight on the turn's own connection is sent as it is queued."""
        return False


class _Admission:
    """Enters pipeline mode; at the end, a Sync and every answer of the flight."""

    __slots__ = ("_meanwhile", "_pipe")

    def __init__(self, pipe: TurnPipeline, meanwhile: Callable[[], None] | None) -> None:
        self._pipe = pipe
        self._meanwhile = meanwhile

    async def __aenter__(self) -> None:
        self._pipe.enter()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            await self._pipe.sync(self._meanwhile)


class _Commit:
    """Ends the commit flight with its Sync and leaves pipeline mode."""

    __slots__ = ("_lead", "_meanwhile", "_pipe")

    def __init__(
        self,
        pipe: TurnPipeline,
        meanwhile: Callable[[], None] | None,
        lead: Callable[[Statements], Awaitable[object]] | None,
    ) -> None:
        self._pipe = pipe
        self._meanwhile = meanwhile
        self._lead = lead

    async def __aenter__(self) -> None:
        if self._lead is not None:
            self._pipe.enter()
            await self._lead(self._pipe)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            await self._pipe.sync(self._meanwhile)
            # Still watched: the engine may keep the connection for the next batch; it stops
            # the watch itself before the connection goes back to the pool.
            if not self._pipe.leave(watched=True):
                raise psycopg.InterfaceError("the connection could not leave pipeline mode")


async def rollback_quietly(conn: Connection) -> bool:
    """Roll back whatever is open; ``False`` when the connection is unusable."""
    if conn.closed or conn.broken:
        return False
    status = conn.info.transaction_status
    if status in (psycopg.pq.TransactionStatus.ACTIVE, psycopg.pq.TransactionStatus.UNKNOWN):
        return False  # results of an aborted pipeline still pending: a ROLLBACK could hang
    try:
        if status != psycopg.pq.TransactionStatus.IDLE:
            async with asyncio.timeout(ROLLBACK_WAIT_S):
                await asyncio.shield(conn.execute("ROLLBACK"))
    except (psycopg.Error, asyncio.CancelledError, TimeoutError):
        return False
    return conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def describe_db_error(exc: BaseException) -> str:
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return "the actor row lock was not granted within lock_wait"
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return "statement timeout"
    if isinstance(exc, psycopg.Error):
        state = getattr(exc, "sqlstate", None)
        return f"database error {state or type(exc).__name__}"
    return str(exc)


#: SQLSTATE classes that do not prove the server rolled the transaction back: connection
#: exceptions, resources, operator intervention (shutdown, cancel), system and internal errors.
_UNPROVEN_CLASSES = frozenset({"08", "53", "57", "58", "XX"})


def commit_unanswered(exc: BaseException) -> bool:
    """Whether a failure of a sent commit flight leaves its outcome unknown.

    A server error (an SQLSTATE) in the flight aborted the transaction before or at ``COMMIT``,
    so nothing committed; so did a ``COMMIT`` answered with anything but ``COMMIT``
    (``Retryable``). A lost connection, or an error of the classes above, proves nothing (the
    release-check clock read after ``COMMIT`` can only fail that way: cancelled or cut off).
    """
    if isinstance(exc, Retryable):
        return False
    state = getattr(exc, "sqlstate", None)
    return not state or state[:2] in _UNPROVEN_CLASSES
