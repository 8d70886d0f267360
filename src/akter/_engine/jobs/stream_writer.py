"""One attempt's output stream writer and the runner's stream wakes (docs/guides/job-streams.md).

``call.stream(chunk)`` validates the chunk at once (a refusal is a :class:`JobStreamError` in the
executor) and buffers it; a flusher task writes the buffer with one statement per flush
(``stream_append``), at most every :data:`FLUSH_EVERY` or as soon as :data:`FLUSH_BYTES` wait.
The append is fenced by the attempt: once the job row no longer runs at this attempt (its lease
was lost and another attempt took it, or a settle ended it) nothing more lands, and the next
``call.stream`` raises ``superseded``. Before the attempt settles, the runner flushes what is
left (:meth:`StreamWriter.finish`), so a job's chunks always come before its close; after a
terminal settle it writes the close with the outcome (:meth:`StreamWriter.close`).

An append that fails may still have committed: the retry carries the last seq the writer knows
(or, before its first append, relies on its attempt's marker), so it never writes a chunk twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from akter._store.gateway.streams import ItemKind, StreamKey, StreamsGateway
from akter.job_streams import MAX_BUFFERED_BYTES, JobStreamError, encode_chunk

log = logging.getLogger("akter.jobs.streams")

#: Longest a chunk waits in the buffer before its flush starts (seconds).
FLUSH_EVERY = 0.02
#: Buffered bytes that start a flush at once.
FLUSH_BYTES = 65_536
#: Wait before retrying an append that failed.
RETRY_EVERY = 0.2
#: Longest the attempt's end waits for its last chunks to be written (seconds).
FINISH_WITHIN = 5.0


class StreamHub:
    """This runner's stream wakes: a writer's commit wakes the readers waiting here at once."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}

    def tell(self, job_id: str) -> None:
        """Items of ``job_id`` were committed on this runner."""
        for event in self._waiters.get(job_id, ()):
            event.set()

    @contextlib.contextmanager
    def waiting(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set by the job's next commit here, while the block runs."""
        event = asyncio.Event()
        self._waiters.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[job_id]


class StreamWriter:
    """The output stream of one attempt (module docstring).

    ``stream`` may be called from any thread (a synchronous executor runs in a worker thread);
    everything else runs on the event loop that made the writer.

    Args:
        gateway: The stream statements.
        hub: The runner's wakes.
        key: The job.
        attempt: The attempt number.
        begun: Whether the job may already have items (an earlier attempt, a settle-only claim):
            the marker is written at once when it has, and the close is written after a
            terminal settle even if this attempt streamed nothing.
    """

    def __init__(
        self,
        gateway: StreamsGateway,
        hub: StreamHub,
        key: StreamKey,
        attempt: int,
        *,
        begun: bool,
    ) -> None:
        self._gateway = gateway
        self._hub = hub
        self.key = key
        self.attempt = attempt
        self.begun = begun
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._chunks: list[str] = []
        self._bytes = 0
        self._ended = False
        #: The fence refused an append: this attempt no longer owns the job row.
        self.superseded = False
        #: Something of this attempt was stored.
        self.wrote = False
        self._marked = False
        self._expect: int | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    def start(self) -> None:
        """The executor is about to run: after an earlier attempt's items, mark this one now."""
        if self.begun:
            self._wake()

    # --- the executor's side ------------------------------------------------------------------

    def stream(self, chunk: object) -> None:
        """Validate and buffer one chunk (never blocks).

        Raises:
            JobStreamError: ``chunk_not_json``, ``chunk_too_large``, ``stream_backlog`` or
                ``superseded``.
        """
        text, size = encode_chunk(chunk)
        with self._lock:
            if self.superseded or self._ended:
                raise JobStreamError(
                    "superseded",
                    f"Attempt {self.attempt} of job {self.key.job_id!r} no longer runs (its lease "
                    "was lost or it ended); its chunks are not stored.",
                )
            if self._bytes + size > MAX_BUFFERED_BYTES:
                raise JobStreamError(
                    "stream_backlog",
                    f"Job {self.key.job_id!r} holds {self._bytes} bytes of chunks not yet "
                    f"written (bound {MAX_BUFFERED_BYTES}); the database is slow or unreachable.",
                )
            self._chunks.append(text)
            self._bytes += size
        if threading.get_ident() == self._thread:
            self._wake()
        else:
            self._loop.call_soon_threadsafe(self._wake)

    # --- flushing (event loop) ----------------------------------------------------------------

    def _wake(self) -> None:
        self._ready.set()
        if self._task is None:
            self._task = asyncio.create_task(self._flusher(), name="akter.job stream")

    async def _flusher(self) -> None:
        while True:
            await self._ready.wait()
            if not self._ended and self._bytes < FLUSH_BYTES:
                await asyncio.sleep(FLUSH_EVERY)  # gather the chunks of the next few ms
            self._ready.clear()
            try:
                await _shielded(self._flush())
            except (psycopg.Error, OSError) as exc:
                self._warn("Job stream append failed; retrying", exc)
                await asyncio.sleep(RETRY_EVERY)
                self._ready.set()
                continue
            if self.superseded or (self._ended and not self._chunks):
                return

    async def _flush(self) -> None:
        with self._lock:
            chunks = list(self._chunks)
        if not chunks and (self._marked or not self.begun):
            return
        items: list[tuple[ItemKind, str | None]] = [] if self._marked else [("attempt", None)]
        items += [("chunk", text) for text in chunks]
        answer = await self._gateway.append(
            self.key, self.attempt, items, expect=self._expect, if_begun=not chunks
        )
        if not answer.held:
            self._supersede()
            return
        if answer.written:
            last = answer.last_seq + answer.written
        elif self._expect is None and answer.marked:
            last = answer.last_seq  # an earlier try of this first append committed
        elif self._expect is not None and answer.last_seq == self._expect + len(items):
            last = answer.last_seq  # an earlier try of this append committed
        elif not chunks:
            return  # the job has no items yet: the marker comes with the first chunk
        else:
            self._supersede()  # another writer appended: never expected while the fence holds
            return
        self._expect = last
        self._marked = self.wrote = True
        with self._lock:
            del self._chunks[: len(chunks)]
            self._bytes = sum(len(text.encode("utf-8")) for text in self._chunks)
        self._hub.tell(self.key.job_id)

    def _supersede(self) -> None:
        with self._lock:
            self.superseded = True
            dropped = len(self._chunks)
            self._chunks.clear()
            self._bytes = 0
        log.warning(
            "Job stream chunks refused: attempt %s of job %r no longer runs (lease lost or "
            "settled); %s chunk(s) dropped",
            self.attempt,
            self.key.job_id,
            dropped,
            extra=self._fields(),
        )

    # --- the attempt's end --------------------------------------------------------------------

    def end(self) -> None:
        """The executor finished: later chunks are refused."""
        with self._lock:
            self._ended = True

    async def finish(self) -> None:
        """Write what is buffered (≤ :data:`FINISH_WITHIN`), before the attempt settles."""
        self.end()
        task = self._task
        if task is None:
            return
        self._ready.set()
        done, _ = await asyncio.wait([task], timeout=FINISH_WITHIN)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            log.warning(
                "Job stream chunks of attempt %s of job %r not written within %s s; dropped",
                self.attempt,
                self.key.job_id,
                FINISH_WITHIN,
                extra=self._fields(),
            )

    async def close(self, outcome: str | None) -> None:
        """After a terminal settle: end the job's stream with ``outcome`` (if it has one)."""
        if outcome is None or not (self.wrote or self.begun):
            return  # nothing was streamed: readers learn the outcome from the job's trace
        try:
            await _shielded(self._gateway.close(self.key, self.attempt, outcome))
        except (psycopg.Error, OSError) as exc:
            self._warn("Job stream close failed; readers learn the outcome from its trace", exc)
            return
        self._hub.tell(self.key.job_id)

    def _warn(self, message: str, exc: BaseException) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        error = f"{type(exc).__name__}: {exc}"
        log.log(
            level,
            "%s: job %r attempt %s: %s",
            message,
            self.key.job_id,
            self.attempt,
            error,
            extra={**self._fields(), "error": error},
        )

    def _fields(self) -> dict[str, Any]:
        return {
            "actor": self.key.type,
            "id": self.key.id,
            "tenant": self.key.tenant,
            "job_id": self.key.job_id,
            "attempt": self.attempt,
        }


async def _shielded(operation: Any) -> Any:
    """Await a statement that must not be abandoned once sent: a cancel waits for its answer."""
    task = asyncio.ensure_future(operation)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise
