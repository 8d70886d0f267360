"""Server-sent events: the framing of the event and progress feeds (the API's and the console's).

One frame is ``id:``/``event:``/``data:`` lines and a blank line. An actor's event feed names
each frame after the event's tag and carries its cursor as the frame ``id`` (what a client sends
back as ``Last-Event-ID``); a retention gap ends the feed with one ``retention_gap`` frame. A
job's progress feed sends ``progress`` frames, then one ``closed`` frame. A job's output stream
sends ``attempt``, ``chunk`` and ``closed`` frames, each with its seq as the frame ``id``
(docs/guides/job-streams.md). While a feed is idle it
sends a comment line (``: keep-alive``) every :data:`KEEPALIVE_SECONDS`, so proxies that cut
silent connections keep it open; clients ignore comments.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from akter.callers import ActorRef, Caller, as_caller
from akter.errors import ActorError
from akter.events import EventRecord
from akter.job_streams import StreamItem, item_to_json

if TYPE_CHECKING:
    from akter.runtime import Runtime

MEDIA_TYPE = "text/event-stream"
#: Seconds of silence after which a feed sends a keep-alive comment (read at each wait).
KEEPALIVE_SECONDS = 15.0
KEEPALIVE = ": keep-alive\n\n"


async def keep_alive(frames: AsyncIterator[str]) -> AsyncIterator[str]:
    """``frames``, with :data:`KEEPALIVE` whenever :data:`KEEPALIVE_SECONDS` pass without one.

    One task drains ``frames`` (so its context variables stay in one task) into a queue of one;
    closing this generator cancels that task.
    """
    queue: asyncio.Queue[tuple[str | None, BaseException | None]] = asyncio.Queue(maxsize=1)

    async def pump() -> None:
        try:
            async for frame in frames:
                await queue.put((frame, None))
        except Exception as exc:
            await queue.put((None, exc))
            return
        await queue.put((None, None))

    task = asyncio.create_task(pump(), name="akter.sse")
    try:
        while True:
            try:
                frame, error = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if error is not None:
                raise error
            if frame is None:
                return
            yield frame
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def event_stream(
    runtime: Runtime, ref: ActorRef, after: str | None, caller: Caller
) -> AsyncIterator[str]:
    """An actor's events after ``after`` as server-sent events, live (also the console's feed)."""
    return keep_alive(_event_frames(runtime, ref, after, caller))


def progress_stream(messages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """A job's progress messages as server-sent events (also the console's feed)."""
    return keep_alive(_progress_frames(messages))


async def _event_frames(
    runtime: Runtime, ref: ActorRef, after: str | None, caller: Caller
) -> AsyncIterator[str]:
    with as_caller(caller):
        try:
            async for record in runtime.follow_events(ref, after):
                data = json.dumps(event_json(record), separators=(",", ":"))
                yield f"id: {record.cursor}\nevent: {record.tag}\ndata: {data}\n\n"
        except ActorError as exc:
            if exc.reason == "RetentionGap":
                yield gap(exc)


def event_json(record: EventRecord) -> dict[str, Any]:
    """An event record as a feed sends it (SSE ``data``, a WebSocket ``event`` message)."""
    return {
        "cursor": record.cursor,
        "tag": record.tag,
        "event": _jsonable(record.event),
        "version": record.version,
        "command_id": record.command_id,
        "emitted_at": record.emitted_at.isoformat(),
    }


async def _progress_frames(messages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for message in messages:
            data = json.dumps(message, separators=(",", ":"))
            event = "closed" if message.get("closed") else "progress"
            yield f"event: {event}\ndata: {data}\n\n"
    finally:
        close = getattr(messages, "aclose", None)
        if close is not None:
            await close()


def job_stream_frames(items: AsyncIterator[StreamItem]) -> AsyncIterator[str]:
    """A job's output stream as server-sent events, ending after the close."""
    return keep_alive(_job_stream_frames(items))


async def _job_stream_frames(items: AsyncIterator[StreamItem]) -> AsyncIterator[str]:
    try:
        async for item in items:
            data = item_to_json(item)
            text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            yield f"id: {item.seq}\nevent: {data['type']}\ndata: {text}\n\n"
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()


def stream_cursor(request: Request) -> int:
    """A job stream's cursor: ``Last-Event-ID``, else ``?after=``, else 0 (each must be a seq)."""
    header = request.headers.get("last-event-id")
    query = request.query_params.get("after")
    for given in (header, query):
        if given is not None and (
            re.fullmatch(r"0|[1-9][0-9]{0,18}", given) is None or int(given) >= 2**63
        ):
            raise ActorError(
                "UnknownCursor",
                f"A job stream cursor is a seq ≥ 0, not {given!r}.",
                code="malformed",
            )
    chosen = header if header is not None else query
    return 0 if chosen is None else int(chosen)


def gap(exc: ActorError) -> str:
    """The ``retention_gap`` frame that ends a feed whose cursor was pruned."""
    data = json.dumps({"reason": exc.reason, "detail": exc.message})
    return f"event: retention_gap\ndata: {data}\n\n"


def once(frames: list[str], headers: Mapping[str, str] | None = None) -> StreamingResponse:
    """A response that sends ``frames`` and ends (a feed refused after its checks passed)."""

    async def send() -> AsyncIterator[str]:
        for frame in frames:
            yield frame

    return StreamingResponse(send(), media_type=MEDIA_TYPE, headers=headers)


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


__all__ = [
    "KEEPALIVE",
    "KEEPALIVE_SECONDS",
    "MEDIA_TYPE",
    "event_json",
    "event_stream",
    "gap",
    "job_stream_frames",
    "keep_alive",
    "once",
    "progress_stream",
    "stream_cursor",
]
