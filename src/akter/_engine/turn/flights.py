"""The connection side of a turn: its one psycopg pipeline, and what a failure leaves behind.

Both flights are one pipeline (:class:`Flights`): the admission flight ends with a Sync whose
results are read without a Flush, so while the handlers run the server sees a transaction idle
after a ReadyForQuery and its idle-in-transaction timer is armed (see ``engine``). After a
failure, :func:`consistent` and :func:`rollback_quietly` decide whether the connection goes back
to the pool or is discarded; :func:`describe_db_error` and :func:`commit_unanswered` word the
caller's ``ActorUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

import psycopg

from akter._engine.turn.types import BatchDefect, Retryable
from akter._store.pool import Connection
from akter.errors import InjectedCrash


def consistent(exc: BaseException) -> bool:
    """Whether the connection's client-side state is known after ``exc`` (see ``engine``).

    Only failures raised between the flights qualify. A server error inside a pipeline aborts
    the statements queued behind it, and psycopg may already count one of them as prepared: the
    connection then fails every later use of that statement ("prepared statement _pg3_N does
    not exist") and the turns of whichever actors draw it back off until their delivery timeout.
    Reconnecting costs milliseconds; such errors (lock waits, a refused write) are rare.
    """
    return isinstance(exc, BatchDefect | Retryable | InjectedCrash)


async def discard(conn: Connection) -> None:
    if not conn.closed:
        with contextlib.suppress(psycopg.Error, OSError):
            await asyncio.shield(conn.close())


#: How long a rollback after a failed turn may take before the connection is discarded instead.
ROLLBACK_WAIT_S = 2.0


class Flights:
    """One psycopg pipeline for both flights of a turn (module docstring).

    ``admission()`` enters the pipeline and ends with ``sync()``: its results are read without
    the Flush that leaving a pipeline sends, which would disarm the server's idle timer.
    ``commit()`` leaves the pipeline, whose Sync ends the commit flight. ``leave()`` leaves it
    after a failure in between.
    """

    def __init__(self, conn: Connection) -> None:
        self._cm = conn.pipeline()
        self._pipeline: psycopg.AsyncPipeline | None = None

    # Two small context-manager classes, not @asynccontextmanager: a generator-based one costs
    # an async generator and its hooks per use, twice per turn.

    def admission(self) -> _Admission:
        return _Admission(self)

    def commit(self) -> _Commit:
        return _Commit(self)

    async def leave(self) -> bool:
        """Leave a pipeline still open after a failure; ``False`` if the connection is unusable."""
        if self._pipeline is None:
            return True
        self._pipeline = None
        try:
            await asyncio.shield(self._cm.__aexit__(None, None, None))
        except (psycopg.Error, asyncio.CancelledError):
            return False
        return True


class _Admission:
    """Enters the pipeline; at the end, a Sync (read without the Flush that leaving sends)."""

    __slots__ = ("_flights",)

    def __init__(self, flights: Flights) -> None:
        self._flights = flights

    async def __aenter__(self) -> None:
        flights = self._flights
        flights._pipeline = await flights._cm.__aenter__()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        pipeline = self._flights._pipeline
        if kind is None and pipeline is not None:
            await pipeline.sync()


class _Commit:
    """Leaves the pipeline: its Sync ends the commit flight (also after a failure inside)."""

    __slots__ = ("_flights",)

    def __init__(self, flights: Flights) -> None:
        self._flights = flights

    async def __aenter__(self) -> None:
        assert self._flights._pipeline is not None

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        flights = self._flights
        flights._pipeline = None
        await flights._cm.__aexit__(kind, exc, tb)


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
