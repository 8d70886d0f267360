"""Readers of job output streams (docs/guides/job-streams.md): resumable, closed by the outcome.

A reader reads the job's stored items after its cursor (``stream_read``), in pages, and then
waits: a commit of this runner's writers wakes it at once (:class:`StreamHub`), another runner's
is seen at the next look, at most :data:`LOOK_EVERY` later. While it waits it also asks the
job's trace (``job_trace``, the same read as progress readers): once the job row is gone and no
close was stored (the job streamed nothing, was cancelled before it ran, or its runner died
between the settle and the close), the reader ends with a close it builds from the trace
(:func:`akter._engine.jobs.progress.job_outcome`), numbered one past its cursor.

Access is the ``progress`` kind, checked when the reader opens. A job that no row names (never
enqueued, another actor's or another tenant's) is refused ``unknown_job``; a cursor past a stream
that retention deleted is refused ``RetentionGap``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from akter._engine.jobs.progress import ProgressStreams, job_outcome
from akter._engine.jobs.stream_writer import StreamHub, StreamWriter
from akter._kinds import RowKind
from akter._store.gateway.streams import StoredItem, StreamKey, StreamsGateway
from akter._waits import wait_event
from akter.callers import ActorRef
from akter.errors import ActorError
from akter.job_streams import AttemptStarted, Chunk, Closed, StreamItem, StreamOutcome

__all__ = ["JobStream", "StreamHub", "StreamLane", "StreamWriter"]

#: Longest a waiting reader goes without looking at the database (other runners' commits).
LOOK_EVERY = 0.25
#: Items read per statement.
PAGE = 500
#: Once the job row is gone, how long a reader waits for the close its settle is writing.
GONE_GRACE = 0.2


class StreamLane:
    """This runner's job streams: the writers' statements and wakes, and readers' opening.

    Args:
        gateway: The stream statements.
    """

    def __init__(self, gateway: StreamsGateway) -> None:
        self.gateway = gateway
        self.hub = StreamHub()

    def writer(self, key: StreamKey, attempt: int, *, begun: bool) -> StreamWriter:
        """The writer of one attempt (call on the event loop)."""
        return StreamWriter(self.gateway, self.hub, key, attempt, begun=begun)

    def reader(
        self, streams: ProgressStreams, ref: ActorRef, job_id: str, after: int = 0
    ) -> JobStream:
        """A reader of ``ref``'s job ``job_id`` after seq ``after`` (opened when first read)."""
        return JobStream(self, streams, ref, job_id, after)


class JobStream:
    """The items of one job's stream after a cursor, ending with :class:`~akter.job_streams.Closed`.

    ``await stream.open()`` checks access and the job before the first item (the HTTP route
    does, so a refusal is an answer, not a broken stream); iterating opens it too.
    """

    def __init__(
        self,
        lane: StreamLane,
        streams: ProgressStreams,
        ref: ActorRef,
        job_id: str,
        after: int,
    ) -> None:
        self._lane = lane
        self._streams = streams
        self.ref = ref
        self.job_id = job_id
        #: The cursor: the seq of the last item read.
        self.after = after
        self._opened = False
        self._items: AsyncGenerator[StreamItem, None] | None = None

    @property
    def key(self) -> StreamKey:
        """Where the job's stream lives."""
        ref = self.ref
        rk = self._streams.routing_key(ref)
        return StreamKey(rk, ref.tenant, ref.type, ref.id, self.job_id)

    async def open(self) -> None:
        """Check access (kind ``progress``), the job and the cursor.

        Raises:
            ActorError: ``Unauthorized`` by the access policy, ``InvalidCommandId`` for a
                malformed job id, ``InvalidInput`` (``unknown_job``) for a job no row names
                (another actor's or tenant's included), ``UnknownCursor`` for a negative cursor or
                a cursor past the stream's end (code ``beyond_end``), ``RetentionGap`` for a
                cursor into a stream that retention deleted.
        """
        if self._opened:
            return
        await self._streams.check(self.ref, self.job_id)
        after = self.after
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            raise ActorError(
                "UnknownCursor",
                f"A job stream cursor is a seq ≥ 0, not {self.after!r}.",
                code="malformed",
            )
        last = await self._lane.gateway.last(self.key)
        if last is not None:
            # A cursor is an item's seq, or one past an unclosed stream (a close built from the
            # trace); anything further would skip items not written yet.
            if after > last.seq + (last.kind != "closed"):
                raise ActorError(
                    "UnknownCursor",
                    f"Job {self.job_id!r}'s stream ends at seq {last.seq}, before the cursor "
                    f"{after}; use a seq the stream gave you.",
                    code="beyond_end",
                )
            if last.kind == "closed" and after == last.seq:
                self.after = last.seq - 1  # resumed after the end: the close again, nothing else
        else:
            trace = await self._streams.trace(self.ref, self.job_id)
            if (
                trace is not None
                and trace.row_kind is None
                and job_outcome(trace, self._streams.routes(self.ref), False) is None
            ):
                raise ActorError(
                    "InvalidInput",
                    f"There is no job {self.job_id!r} of {self.ref.type}/{self.ref.id!r}, and "
                    "none left a trace; check the id with 'akter jobs list'.",
                    code="unknown_job",
                    field="job_id",
                )
            if after > 0:
                raise ActorError(
                    "RetentionGap",
                    f"Job {self.job_id!r} has no stream items any more (retention deleted "
                    f"them, or it never reached seq {self.after}); read it again from 0.",
                )
        self._opened = True

    def __aiter__(self) -> JobStream:
        return self

    async def __anext__(self) -> StreamItem:
        if self._items is None:
            self._items = self._follow()
        return await anext(self._items)

    async def aclose(self) -> None:
        """Stop reading."""
        if self._items is not None:
            await self._items.aclose()

    async def _follow(self) -> AsyncGenerator[StreamItem, None]:
        await self.open()
        gateway, key = self._lane.gateway, self.key
        cancelled = False  # seen on the job row: a cancelled job may leave no other trace
        with self._lane.hub.waiting(self.job_id) as woken:
            while True:
                woken.clear()
                stored = await gateway.read(key, self.after, PAGE)
                for row in stored:
                    self.after = row.seq
                    item = _item(row)
                    yield item
                    if isinstance(item, Closed):
                        return
                if stored:
                    continue
                trace = await self._streams.trace(self.ref, self.job_id)
                if trace is None or trace.row_kind == RowKind.JOB:
                    cancelled = cancelled or (trace is not None and trace.row_cancelled)
                    await wait_event(woken, LOOK_EVERY)
                    continue
                # Ended: its close (and last chunks) may still be on their way from the settle.
                await wait_event(woken, GONE_GRACE)
                if await gateway.read(key, self.after, 1):
                    continue
                outcome: StreamOutcome = (
                    job_outcome(trace, self._streams.routes(self.ref), cancelled) or "unknown"
                )
                self.after += 1
                yield Closed(self.after, outcome)
                return


def _item(row: StoredItem) -> StreamItem:
    if row.kind == "attempt":
        return AttemptStarted(row.seq, row.attempt)
    if row.kind == "chunk":
        return Chunk(row.seq, row.attempt, None if row.data is None else json.loads(row.data))
    outcome = row.data if row.data in ("succeeded", "dead_lettered", "cancelled") else "unknown"
    return Closed(row.seq, outcome, row.attempt)  # type: ignore[arg-type]
