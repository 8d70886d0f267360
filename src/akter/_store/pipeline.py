"""A turn's two flights on libpq's pipeline (``psycopg.pq``), without psycopg's cursor layer.

psycopg's cursors in a pipeline pay, for every statement, the connection's lock, a writability poll
and a flush, a result generator and a cursor's bookkeeping: the plain-psycopg floor's five-statement
turn costs about 290 µs of client CPU on this project's bench machine, and the same five prepared
statements queued on ``psycopg.pq`` and read after one Sync about 110 µs (docs/benchmarks.md,
"Turns, fifth round"). A turn's statements are few, known and repeated, so the turn sends them
through :class:`TurnPipeline`: the same driver (libpq through psycopg's own wrapper), the
connection's adapters (psycopg's ``Transformer`` dumps parameters and loads rows exactly as a cursor
on that connection would) and psycopg's exception classes (``error_from_result``).

A statement is queued by :meth:`TurnPipeline.execute`, which returns its :class:`Answer`;
nothing is read until :meth:`TurnPipeline.sync` sends the Sync and reads every answer of the
flight, raising the first server error after all of them are in. The first use of a statement
(its text and parameter types) on a connection prepares it in the same flight; it counts as
prepared only once the server answered the Parse. Any failure that leaves answers unread makes
the pipeline *unusable* (:meth:`TurnPipeline.leave` says so) and the caller discards the
connection.

Several turns can share one write (``akter._engine.turn.shared``, docs/internals/shared-flights.md):
each turn's statements are recorded in a :class:`Segment` with no connection, then queued on one
pipeline by :meth:`TurnPipeline.queue`, each segment followed by its own Sync; one
:meth:`TurnPipeline.flush` sends them all, and :meth:`TurnPipeline.next_segment` reads them one
segment at a time, a server error belonging to its own segment only.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, cast

import psycopg
from psycopg import adapt, pq
from psycopg._encodings import conn_encoding
from psycopg.abc import Transformer

#: Placeholders of the catalogue's statements: ``%(name)s``, ``%s`` and the escaped ``%%``.
_PLACEHOLDER = re.compile(rb"%\((\w+)\)s|%s|%%")
#: Prepared statements one connection keeps for turns; past this a statement runs unnamed.
MAX_PREPARED = 128

_TEXT = pq.Format.TEXT
_AUTO = adapt.PyFormat.AUTO
_OK = pq.ExecStatus.COMMAND_OK
_TUPLES = pq.ExecStatus.TUPLES_OK
_FATAL = pq.ExecStatus.FATAL_ERROR
_SYNC = pq.ExecStatus.PIPELINE_SYNC

Row = tuple[Any, ...]


class Answer:
    """One statement's result once its flight was synced: a cursor's reading methods.

    ``tx`` is the pipeline's (its loaders read the rows); a :class:`Segment`'s answers get it
    when the segment is queued on a connection.
    """

    __slots__ = ("_loaded", "_result", "_tx")

    def __init__(self, tx: Transformer | None) -> None:
        self._tx = tx
        self._result: pq.abc.PGresult | None = None
        self._loaded: list[Row] | None = None

    @property
    def statusmessage(self) -> str | None:
        """The command tag (``"COMMIT"``, ``"UPDATE 1"``), as ``psycopg.Cursor.statusmessage``."""
        status = self._answered().command_status
        return status.decode() if status else None

    @property
    def failed(self) -> bool:
        """Whether the server answered the statement with an error (after its flight synced)."""
        return self._result is not None and self._result.status == _FATAL

    async def fetchone(self) -> Row | None:
        rows = self._rows()
        return rows[0] if rows else None

    async def fetchall(self) -> list[Row]:
        return list(self._rows())

    def _answered(self) -> pq.abc.PGresult:
        if self._result is None:
            raise psycopg.InterfaceError("the statement's flight was not synced")
        return self._result

    def _rows(self) -> list[Row]:
        if self._loaded is None:
            result = self._answered()
            if result.status != _TUPLES or not result.ntuples:
                self._loaded = []
            else:
                tx = self._tx
                assert tx is not None  # set when the statement was queued on a connection
                tx.set_pgresult(result)
                self._loaded = tx.load_rows(0, result.ntuples, tuple)
        return self._loaded


#: A statement sent and not yet read: its answer (``None`` for a Parse), and the key a Parse
#: prepares (``None`` for a statement).
_Queued = tuple[Answer | None, tuple[bytes, tuple[int, ...]] | None]


class Statements(Protocol):
    """What a turn's gateways queue statements on: a :class:`TurnPipeline` or a :class:`Segment`."""

    async def execute(
        self, query: str | bytes, params: Mapping[str, Any] | None = None, *, prepare: bool = True
    ) -> Answer: ...


#: A recorded statement: its answer, text, parameters and whether it may be prepared.
Recorded = tuple[Answer, "str | bytes", "Mapping[str, Any] | None", bool]


class Segment:
    """One turn's flight recorded without a connection, for a write shared with other turns.

    :meth:`execute` records; :meth:`TurnPipeline.queue` sends the records on a connection,
    followed by the segment's own Sync. A segment can be queued again (its answers are reset):
    a write whose earlier segment left the session in a failed transaction sends it again.
    """

    __slots__ = ("recorded",)

    def __init__(self) -> None:
        self.recorded: list[Recorded] = []

    async def execute(
        self, query: str | bytes, params: Mapping[str, Any] | None = None, *, prepare: bool = True
    ) -> Answer:
        """Record ``query`` with ``params``; its answer is read after the segment's write."""
        answer = Answer(None)
        self.recorded.append((answer, query, params, prepare))
        return answer


class _Context:
    """The adapters a pipeline dumps and loads with: the connection's, plus ``extra``."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], extra: Mapping[type, type]) -> None:
        self.connection = conn
        self.adapters = adapt.AdaptersMap(conn.adapters)
        for cls, dumper in extra.items():
            self.adapters.register_dumper(cls, dumper)


class TurnPipeline:
    """The turn statements of one connection: queued, prepared once, read after one Sync.

    Kept with its connection (its prepared statements are the session's). ``dumpers`` are
    registered on top of the connection's adapters (the turn's binary array parameters).
    """

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], dumpers: Mapping[type, type] | None = None
    ) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self._tx = adapt.Transformer.from_context(_Context(conn, dumpers or {}))
        self._encoding = conn_encoding(conn)
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        #: The number of the next prepared statement's name (names are never reused: a Parse a
        #: failed segment skipped is forgotten while a later one's name stands).
        self._named = 0
        #: Statements sent since the last Sync: ``(answer, key it prepares or None)``; a
        #: Parse's answer is ``None``.
        self._queued: list[_Queued] = []
        #: Segments queued with their Syncs and not yet read (:meth:`queue`), oldest first.
        self._segments: collections.deque[list[_Queued]] = collections.deque()
        self._open = False
        #: Answers are owed by the server, or a send may have been cut: not reusable.
        self._unusable = False
        #: The loop watching the socket for reads during this turn (``None``: not watched).
        self._watching: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        #: The future a wait for the server's answers sleeps on.
        self._waiter: asyncio.Future[None] | None = None

    @property
    def usable(self) -> bool:
        """Whether the connection can leave the pipeline cleanly."""
        return not (self._unusable or self._queued or self._segments)

    @property
    def segments(self) -> int:
        """Segments queued with their Syncs (:meth:`queue`) and not yet read."""
        return len(self._segments)

    def enter(self) -> None:
        """Enter libpq's pipeline mode (a turn's first flight)."""
        if not self.usable:
            raise psycopg.InterfaceError("the turn pipeline of this connection is unusable")
        self._pg.enter_pipeline_mode()
        self._open = True

    def leave(self, *, watched: bool = False) -> bool:
        """Leave pipeline mode; ``False`` if answers are owed (discard the connection).

        The socket stops being watched first, whatever the answer: a connection goes back to
        the pool, or is closed, only after its turn left the pipeline. With ``watched`` the
        watch stays, for a next turn on the same connection (``TurnEngine`` keeps one for its
        mailbox's next batch): whoever gives the connection back then calls :meth:`unwatch`.
        """
        if not watched:
            self.unwatch()
        if not self._open:
            return not self._unusable
        if not self.usable:
            return False
        try:
            self._pg.exit_pipeline_mode()
        except psycopg.Error:
            self._unusable = True
            return False
        self._open = False
        return True

    async def execute(
        self, query: str | bytes, params: Mapping[str, Any] | None = None, *, prepare: bool = True
    ) -> Answer:
        """Queue ``query`` (psycopg's ``%(name)s`` placeholders) with ``params``.

        Its :class:`Answer` can be read after the next :meth:`sync`. ``prepare=False``: never
        prepared (statements of a user's owned tables, not to fill :data:`MAX_PREPARED`).
        """
        answer = Answer(self._tx)
        self._send(answer, query, params, prepare)
        return answer

    def _send(
        self,
        answer: Answer,
        query: str | bytes,
        params: Mapping[str, Any] | None,
        prepare: bool,
    ) -> None:
        sql, names = _converted(query, params is not None)
        if params is None:
            values: list[Any] = []
        else:
            values = [params[name] for name in names]
        tx = self._tx
        # Dump before anything is sent: a parameter that cannot be dumped leaves nothing queued.
        dumped = tx.dump_sequence(values, [_AUTO] * len(values)) if values else []
        types = tuple(tx.types or ()) if values else ()
        formats = list(tx.formats or ()) if values else None
        key = (sql, types)
        name = self._prepared.get(key)
        pg = self._pg
        self._unusable = True  # until the sends below are done
        if name is None and prepare and len(self._prepared) < MAX_PREPARED:
            name = b"akter_turn_%d" % self._named
            self._named += 1
            pg.send_prepare(name, sql, param_types=types or None)
            self._queued.append((None, key))
            self._prepared[key] = name
        if name is not None:
            pg.send_query_prepared(name, dumped, param_formats=formats, result_format=_TEXT)
        else:
            pg.send_query_params(
                sql, dumped, param_types=types, param_formats=formats, result_format=_TEXT
            )
        self._queued.append((answer, None))
        self._unusable = False

    def queue(self, segment: Segment) -> None:
        """Queue ``segment``'s statements and its own Sync; nothing is flushed or read yet.

        Enters pipeline mode if needed. If a statement cannot be dumped, a ``ROLLBACK`` ends
        what of the segment was queued (so nothing of it can commit) and the error is raised.
        """
        if not self._open:
            self.enter()
        tx = self._tx
        try:
            for answer, query, params, prepare in segment.recorded:
                answer._tx, answer._result, answer._loaded = tx, None, None
                self._send(answer, query, params, prepare)
        except Exception:
            if self._queued:
                self._send(Answer(tx), "ROLLBACK", None, False)
            raise
        finally:
            if self._queued:
                self._unusable = True
                _queue_sync(self._pg)
                self._segments.append(self._queued)
                self._queued = []
                self._unusable = False

    async def flush(self) -> None:
        """Send every queued segment (one write, unless the socket's buffer is full)."""
        await self._flush(None)

    async def next_segment(self) -> psycopg.Error | None:
        """Read the oldest queued segment's answers; its first server error, not raised.

        A lost connection raises (the segments not read have no answer).
        """
        queued = self._segments[0]
        self._unusable = True
        results = await self._read(len(queued))
        self._segments.popleft()
        self._unusable = False
        return self._settle(queued, results)

    async def sync(self, meanwhile: Callable[[], None] | None = None) -> None:
        """End the flight: send a Sync, read every answer, raise the first server error.

        The statements' answers are set in order; a Parse that was not answered ``OK`` is
        forgotten (the statement is prepared again next time). ``meanwhile`` runs once the
        whole flight is sent, before its answers are awaited: client work that needs none of
        them overlaps the server's. It must not raise.
        """
        queued, self._queued = self._queued, []
        self._unusable = True
        self._pg.pipeline_sync()
        await self._flush(meanwhile)
        results = await self._read(len(queued))
        self._unusable = False
        error = self._settle(queued, results)
        if error is not None:
            raise error

    def _settle(
        self, queued: list[_Queued], results: list[pq.abc.PGresult]
    ) -> psycopg.Error | None:
        """Give each answer its result, forget a failed Parse; the flight's first error."""
        error: psycopg.Error | None = None
        for (answer, key), result in zip(queued, results, strict=True):
            status = result.status
            if answer is None:
                if status != _OK and key is not None:
                    self._prepared.pop(key, None)
            else:
                answer._result = result
            if status == _FATAL and error is None:
                error = psycopg.errors.error_from_result(result, encoding=self._encoding)
        return error

    async def _flush(self, meanwhile: Callable[[], None] | None) -> None:
        """Send what is queued, then run ``meanwhile``."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        fd = pg.socket
        # While the output is not all sent, read too: a server whose own output is full stops
        # reading, and a large flight would otherwise wait for it forever.
        while pg.flush():
            self.unwatch()  # _sendable registers (and then removes) its own reader
            await _sendable(loop, fd)
            pg.consume_input()
        if meanwhile is not None:
            meanwhile()

    async def _read(self, expected: int) -> list[pq.abc.PGresult]:
        """Read ``expected`` results up to the next Sync's."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        results: list[pq.abc.PGresult] = []
        while True:
            last_none = False
            while not pg.is_busy():
                result = pg.get_result()
                if result is None:
                    if last_none:
                        break
                    last_none = True
                    continue
                last_none = False
                if result.status == _SYNC:
                    if len(results) != expected:
                        raise psycopg.InternalError(
                            f"the flight got {len(results)} answers for {expected} statements"
                        )
                    return results
                results.append(result)
            await self._readable(loop)
            if self._watching is None:  # the watcher's read failed: this one raises its error
                pg.consume_input()

    # The socket is watched from a turn's first wait until it leaves the pipeline: one
    # registration with the event loop per turn instead of one per wait (two epoll_ctl calls
    # and asyncio's bookkeeping less per wait; docs/benchmarks.md, "Turns, sixth round").

    async def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until an answer is complete in libpq's buffer (or the socket failed)."""
        if self._watching is not loop:
            self.unwatch()
            self._fd = self._pg.socket
            loop.add_reader(self._fd, self._on_readable)
            self._watching = loop
        waiter = self._waiter = loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_readable(self) -> None:
        # Read what arrived into libpq's buffer, so that a readable socket cannot make the loop
        # call this again and again (a message the server sent unasked, the end of a session);
        # wake the waiting flight only once an answer is complete. A readiness seen again after
        # the woken task already read the socket (it is reported once more before that task
        # runs) then wakes nobody: one loop iteration less per flight.
        pg = self._pg
        try:
            pg.consume_input()
            busy = pg.is_busy()
        except psycopg.Error:
            self.unwatch()  # the session ended: the waiting flight's own read reports it
            busy = False
        waiter = self._waiter
        if waiter is not None and not busy and not waiter.done():
            waiter.set_result(None)

    def unwatch(self) -> None:
        """Stop watching the socket (idempotent)."""
        loop, self._watching = self._watching, None
        if loop is not None:
            loop.remove_reader(self._fd)


def _libpq_send_sync() -> Callable[[int], int] | None:
    """The ``PQsendPipelineSync`` of libpq 17+, which psycopg does not wrap; else ``None``.

    ``PQpipelineSync`` flushes the output at once: a shared write of K segments (``queue``)
    would make K ``send`` calls, the first waking the server before the rest is queued.
    ``PQsendPipelineSync`` only queues the Sync, and :meth:`TurnPipeline.flush` sends them all.
    Looked up in the libpq psycopg itself loaded (the ``psycopg[binary]`` wheel bundles one; the
    C and pure-Python builds use the system's): the same library, so the same ``PGconn``.
    """
    try:
        if pq.__impl__ == "binary":
            import psycopg_binary  # the wheel psycopg loaded its libpq from

            libs = Path(psycopg_binary.__file__).parent.parent / "psycopg_binary.libs"
            found = sorted(str(p) for p in libs.glob("libpq*.so*"))
            path = found[0] if len(found) == 1 else None
        else:
            path = ctypes.util.find_library("pq")
        if path is None or pq.version() < 170000:
            return None
        function = ctypes.CDLL(path).PQsendPipelineSync
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p]
    function.restype = ctypes.c_int
    return cast("Callable[[int], int]", function)


_SEND_SYNC = _libpq_send_sync()


def _queue_sync(pg: pq.abc.PGconn) -> None:
    """End a segment with a Sync, flushed with the rest of the write when it can be."""
    if _SEND_SYNC is None:
        pg.pipeline_sync()
    elif _SEND_SYNC(cast(Any, pg).pgconn_ptr) != 1:  # the ``abc`` does not declare it
        raise psycopg.OperationalError(pg.get_error_message())


async def _sendable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until ``fd`` is writable or readable (a flight not yet all sent)."""
    ready = loop.create_future()
    loop.add_reader(fd, _wake, ready)
    loop.add_writer(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
        loop.remove_writer(fd)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_CONVERTED: dict[tuple[str | bytes, bool], tuple[bytes, tuple[str, ...]]] = {}


def _converted(query: str | bytes, with_params: bool) -> tuple[bytes, tuple[str, ...]]:
    """``query`` in PostgreSQL's ``$n`` form and its parameter names in order (cached).

    As psycopg: without parameters the text is sent as it is (``%`` included).
    """
    found = _CONVERTED.get((query, with_params))
    if found is not None:
        return found
    raw = query.encode() if isinstance(query, str) else bytes(query)
    names: list[str] = []
    if with_params:

        def number(match: re.Match[bytes]) -> bytes:
            token = match.group(0)
            if token == b"%%":
                return b"%"
            if token == b"%s":
                raise psycopg.ProgrammingError("turn statements take named parameters only")
            name = match.group(1).decode()
            if name not in names:
                names.append(name)
            return b"$%d" % (names.index(name) + 1)

        raw = _PLACEHOLDER.sub(number, raw)
    found = _CONVERTED[(query, with_params)] = (raw, tuple(names))
    return found
