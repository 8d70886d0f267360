"""Several actors' warm turns in one write (issue 45, ``docs/internals/shared-flights.md``).

A warm one-flight turn (``turn.warm``) whose mailbox holds no connection records its flight in a
:class:`~akter._store.pipeline.Segment` (:class:`SharedFlights`) and hands it to the runner's
:class:`SharedWriter` instead of checking a connection out. The writer runs at most
``connections`` writes at once, each on a pooled connection it keeps while turns wait: it takes
its fair share of the waiting turns (their count divided by ``connections``, rounded up, at most
``most``), queues each turn's flight followed by that turn's own Sync, sends them in one write
and reads them segment by segment, answering each turn with its own answers or its own error.

What does not change (the design page's rules): a turn is one transaction (``BEGIN``, its guard,
its writes, ``COMMIT``, a Sync); an error aborts its own segment only. A segment that errored
inside its transaction leaves the session in a failed transaction, so the segments after it in
the same write fail at their ``BEGIN`` (``25P02``) with nothing of them run: the writer rolls the
session back and sends them again in its next write, first. A lone turn never waits for company
(a writer starts at once while fewer than ``connections`` run). If the connection fails, a turn
whose Sync was read has its outcome; the others' commits were sent and are unanswered (the
engine answers "may have committed"), and the connection is discarded. A turn cancelled before
its write took it was never sent (:meth:`SharedFlights.unsent`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

import psycopg
from psycopg_pool import PoolTimeout

from akter import telemetry
from akter._engine.hooks import Hooks
from akter._engine.turn.flights import discard
from akter._engine.turn.types import Retryable
from akter._store.gateway import actors
from akter._store.pipeline import Segment, Statements, TurnPipeline
from akter._store.pool import Connection, Store
from akter.callers import ActorRef
from akter.errors import InjectedCrash

log = logging.getLogger("akter.turn")

#: The most turns one write carries (the design page's ``most``: bounds the last one's wait,
#: since the commits of one connection flush one after another).
MOST = 16


#: Offered the connection of a turn's lone write once it was answered (``conn``, and when it was
#: checked out): ``True`` if the turn's mailbox keeps it for its next batch (then it stays
#: watched, out of the pool), ``False`` to give it back.
Keep = Callable[[Connection, float], bool]


class _Waiting:
    """One turn's segment on its way: its answer future and when its turn gives up."""

    __slots__ = ("deadline", "done", "keep", "ref", "segment", "sent")

    def __init__(
        self, ref: ActorRef, segment: Segment, deadline: float, keep: Keep | None = None
    ) -> None:
        self.ref = ref
        self.segment = segment
        self.deadline = deadline
        self.keep = keep
        self.done: asyncio.Future[psycopg.Error | None] = asyncio.get_running_loop().create_future()
        #: Queued on a connection (from then on its COMMIT may reach the server).
        self.sent = False


class SharedWriter:
    """Sends waiting warm turns' flights, several per write (module docstring)."""

    def __init__(
        self,
        store: Store,
        hooks: Hooks,
        *,
        connections: int,
        most: int = MOST,
        pool_wait: float = 2.0,
        metrics: telemetry.Metrics | None = None,
    ) -> None:
        self._store = store
        self.hooks = hooks
        #: At most this many writes at once (each on a connection of its own).
        self.connections = max(1, connections)
        self.most = max(1, most)
        self.pool_wait = pool_wait
        self._metrics = metrics
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._writers = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def send(self, waiting: _Waiting, meanwhile: Callable[[], None] | None = None) -> None:
        """Send ``waiting``'s segment in a shared write; raise its server error, or the write's.

        ``meanwhile`` runs once the segment is handed over, before its answers are awaited. A
        turn that finds the line empty and a write free sends itself, in its own task (no
        writer task, no wake): only turns that arrive while every write is busy share one.
        """
        if not self._waiting and self._writers < self.connections:
            self._writers += 1
            try:
                if meanwhile is not None:
                    meanwhile()
                await self._write_alone(waiting)
            finally:
                self._writers -= 1
                if self._waiting and not self._closed and self._writers < self.connections:
                    self._start()  # turns that queued meanwhile: a writer of their own
        else:
            self._waiting.append(waiting)
            if self._writers < self.connections:
                self._start()
            if meanwhile is not None:
                meanwhile()
        # A cancelled wait cancels the future: a writer skips it if it was not sent yet.
        error = await waiting.done
        if error is not None:
            raise error

    def _start(self) -> None:
        self._writers += 1
        task = asyncio.create_task(self._drain(), name="akter-shared-writer")
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A writer ended: one more starts if turns still wait (a writer that failed)."""
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("A shared turn writer failed", exc_info=exc)
        if self._waiting and not self._closed and self._writers < self.connections:
            self._start()

    async def aclose(self) -> None:
        """Stop the writers (the runtime's shutdown); their waiting turns fail as unsent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._waiting:
            _fail(self._waiting.popleft(), Retryable("the runner is stopping"))
        self._closed = False  # a runtime started again writes again

    def _share(self) -> list[_Waiting]:
        """This writer's fair share of the waiting turns (never one already cancelled)."""
        share: list[_Waiting] = []
        size = min(self.most, -(-len(self._waiting) // self.connections))
        while self._waiting and len(share) < size:
            waiting = self._waiting.popleft()
            if not waiting.done.done():
                share.append(waiting)
        return share

    async def _drain(self) -> None:
        """One writer: writes while turns wait, on a connection it keeps meanwhile."""
        pool = self._store.pool
        conn: Connection | None = None
        try:
            while self._waiting:
                share = self._share()
                if not share:
                    continue
                if conn is None:
                    try:
                        conn = await pool.getconn(timeout=self.pool_wait)
                    except PoolTimeout as exc:
                        for waiting in share:
                            _fail(waiting, exc)
                        continue
                if not await self._write(conn, share):
                    await discard(conn)
                    await pool.putconn(conn)
                    conn = None
                elif pool.getting:  # someone waits for a connection: give this one back
                    actors.turn_pipeline(conn).unwatch()
                    await pool.putconn(conn)
                    conn = None
        finally:
            self._writers -= 1
            if conn is not None:
                pipe = actors.turn_pipeline(conn)
                pipe.unwatch()
                if not pipe.usable:  # cancelled mid-write: answers are owed on it
                    await discard(conn)
                await pool.putconn(conn)

    async def _write_alone(self, waiting: _Waiting) -> None:
        """One turn's write, on a connection checked out for it.

        Given back after, unless the turn's mailbox keeps it (``waiting.keep``: a sequential
        caller's next turns then run on it, as after a turn on a connection of its own).
        """
        pool = self._store.pool
        try:
            conn = await pool.getconn(timeout=self.pool_wait)
        except PoolTimeout as exc:
            _fail(waiting, exc)
            return
        taken = time.monotonic()
        usable = False
        try:
            usable = await self._write(conn, [waiting])
        finally:
            if not usable:
                await discard(conn)
                await pool.putconn(conn)
            elif not (
                waiting.keep is not None and _committed(waiting) and waiting.keep(conn, taken)
            ):
                actors.turn_pipeline(conn).unwatch()
                await pool.putconn(conn)

    async def _write(self, conn: Connection, share: list[_Waiting]) -> bool:
        """One shared write; ``False`` when the connection must be discarded."""
        if self.hooks.armed("before_shared_write"):
            try:
                await self.hooks.at("before_shared_write", {"refs": [w.ref for w in share]})
            except InjectedCrash as crash:  # nothing was sent: each turn fails unsent
                for waiting in share:
                    _fail(waiting, crash)
                return True
            share = [w for w in share if not w.done.done()]  # cancelled while held
            if not share:
                return True
        pipe = actors.turn_pipeline(conn)
        sent: list[_Waiting] = []
        for waiting in share:
            queued = pipe.segments
            waiting.sent = True
            try:
                pipe.queue(waiting.segment)
            except Exception as exc:  # a parameter that could not be dumped: this turn's own
                # Nothing of it can commit (a ROLLBACK ends what of it was queued, before its
                # Sync): it fails as not committed.
                waiting.sent = False
                _fail(waiting, exc)
                if pipe.segments == queued:
                    continue
                # Its segment is read in its place, so each turn after it reads its own answers.
            sent.append(waiting)
        try:
            if self._metrics is not None and sent:
                self._metrics.observe("akter.turn.shared_write", len(sent))
            async with asyncio.timeout_at(max(w.deadline for w in share)):
                return await self._read(pipe, sent)
        except BaseException as exc:
            # Cut, timed out or cancelled: the segments not read have no answer.
            lost = exc if isinstance(exc, psycopg.Error) else _unanswered(exc)
            for waiting in sent:
                _fail(waiting, lost)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if not isinstance(exc, psycopg.Error | OSError | TimeoutError):
                log.exception("A shared turn write failed unexpectedly")
            return False

    async def _read(self, pipe: TurnPipeline, sent: list[_Waiting]) -> bool:
        await pipe.flush()
        again: list[_Waiting] = []
        failed = False
        for waiting in sent:
            error = await pipe.next_segment()
            failed = failed or error is not None
            if waiting.done.done():
                continue  # answered already: its parameter could not be dumped, or it left
            if isinstance(error, psycopg.errors.InFailedSqlTransaction):
                again.append(waiting)  # an earlier segment's failed transaction: it never ran
            else:
                waiting.done.set_result(error)
        if failed:  # end the failed transaction an error left (a warning if there is none)
            await pipe.execute("ROLLBACK")
            await pipe.sync()
        for waiting in reversed(again):
            waiting.sent = False
            self._waiting.appendleft(waiting)
        return pipe.leave(watched=True)


def _committed(waiting: _Waiting) -> bool:
    """Whether ``waiting``'s turn was answered without an error (its segment committed)."""
    done = waiting.done
    return done.done() and not done.cancelled() and done.exception() is None and not done.result()


def _fail(waiting: _Waiting, exc: BaseException) -> None:
    if not waiting.done.done():
        waiting.done.set_exception(exc)


def _unanswered(exc: BaseException) -> psycopg.Error:
    """A write's failure that is no server error, as one: its commits are unanswered."""
    lost = psycopg.OperationalError(f"the shared write was not answered ({type(exc).__name__})")
    lost.__cause__ = exc
    return lost


class SharedFlights:
    """A warm turn's one flight (``turn.warm``) recorded for a :class:`SharedWriter`.

    What ``writes.send`` uses of ``flights.Flights``, with the flight sent in a shared write.
    """

    __slots__ = ("_deadline", "_keep", "_ref", "_waiting", "_writer", "lead", "pipe", "recording")

    #: Never on Citus (warm turns are not).
    rows_apart = False

    def __init__(
        self,
        writer: SharedWriter,
        ref: ActorRef,
        deadline: float,
        *,
        recording: bool = False,
        keep: Keep | None = None,
    ) -> None:
        self._writer = writer
        self._ref = ref
        self._deadline = deadline
        self._keep = keep
        self.pipe = Segment()
        self.recording = recording
        self.lead: Callable[[Statements], Awaitable[object]] | None = None
        self._waiting: _Waiting | None = None

    def commit(self, meanwhile: Callable[[], None] | None = None) -> _SharedCommit:
        """The flight: its lead and statements recorded, sent at the end (``SharedWriter``)."""
        lead, self.lead = self.lead, None
        return _SharedCommit(self, meanwhile, lead)

    async def rolled_back(self) -> bool:
        """After a failed guard: the writer already rolled its connection back."""
        return True

    def unsent(self) -> bool:
        """Whether the flight certainly never reached the server (a wait cancelled in line)."""
        return self._waiting is None or not self._waiting.sent

    async def _send(self, meanwhile: Callable[[], None] | None) -> None:
        self._waiting = _Waiting(self._ref, self.pipe, self._deadline, self._keep)
        await self._writer.send(self._waiting, meanwhile)


class _SharedCommit:
    """Records the lead first; at the end, sends the segment and awaits its answers."""

    __slots__ = ("_flights", "_lead", "_meanwhile")

    def __init__(
        self,
        flights: SharedFlights,
        meanwhile: Callable[[], None] | None,
        lead: Callable[[Statements], Awaitable[object]] | None,
    ) -> None:
        self._flights = flights
        self._meanwhile = meanwhile
        self._lead = lead

    async def __aenter__(self) -> None:
        if self._lead is not None:
            await self._lead(self._flights.pipe)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            await self._flights._send(self._meanwhile)
