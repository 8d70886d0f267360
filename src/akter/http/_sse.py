"""Server-sent events: the framing of the event and progress feeds (the API's and the console's).

One frame is ``id:``/``event:``/``data:`` lines and a blank line. An actor's event feed names
each frame after the event's tag and carries its cursor as the frame ``id`` (what a client sends
back as ``Last-Event-ID``); a retention gap ends the feed with one ``retention_gap`` frame. A
job's progress feed sends ``progress`` frames, then one ``closed`` frame.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.responses import StreamingResponse

from akter.callers import ActorRef, Caller, as_caller
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter.runtime import Runtime

MEDIA_TYPE = "text/event-stream"


async def event_stream(
    runtime: Runtime, ref: ActorRef, after: str | None, caller: Caller
) -> AsyncIterator[str]:
    """An actor's events after ``after`` as server-sent events, live (also the console's feed)."""
    with as_caller(caller):
        try:
            async for record in runtime.follow_events(ref, after):
                data = json.dumps(
                    {
                        "cursor": record.cursor,
                        "tag": record.tag,
                        "event": _jsonable(record.event),
                        "command_id": record.command_id,
                        "emitted_at": record.emitted_at.isoformat(),
                    },
                    separators=(",", ":"),
                )
                yield f"id: {record.cursor}\nevent: {record.tag}\ndata: {data}\n\n"
        except ActorError as exc:
            if exc.reason == "RetentionGap":
                yield gap(exc)


async def progress_stream(messages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    """A job's progress messages as server-sent events (also the console's feed)."""
    async for message in messages:
        data = json.dumps(message, separators=(",", ":"))
        event = "closed" if message.get("closed") else "progress"
        yield f"event: {event}\ndata: {data}\n\n"


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


__all__ = ["MEDIA_TYPE", "event_stream", "gap", "once", "progress_stream"]
