"""Job output streams: the items a reader gets and a chunk's rules (docs/guides/job-streams.md).

An executor appends chunks with ``call.stream(chunk)``; a reader (``handle.job_stream(job_id)``,
``GET /actors/{Type}/{id}/jobs/{job_id}/stream``, the typed client) gets the job's items in
order, each with its per-job sequence number ``seq``, which is also its resume cursor:

- :class:`AttemptStarted` opens an attempt's segment (before its first chunk; a retried attempt
  after an earlier one's chunks opens its segment when it starts, chunks or not);
- :class:`Chunk` is one chunk of that attempt;
- :class:`Closed` ends the stream with the job's outcome.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from akter._ids import canonical_json
from akter.errors import AkterError

__all__ = [
    "MAX_BUFFERED_BYTES",
    "MAX_CHUNK_BYTES",
    "AttemptStarted",
    "Chunk",
    "Closed",
    "JobStreamError",
    "StreamItem",
    "StreamOutcome",
    "StreamReader",
    "encode_chunk",
    "item_from_json",
    "item_to_json",
]

#: Largest chunk, in UTF-8 bytes of its canonical JSON (a ``str`` chunk counts its quotes).
MAX_CHUNK_BYTES = 16_384
#: Chunks an attempt may hold unwritten (bytes of canonical JSON) while the database is slow;
#: ``call.stream`` refuses beyond (``stream_backlog``) rather than block or lose one.
MAX_BUFFERED_BYTES = 1_048_576

#: How a job ended, as its stream's close tells (the progress close's vocabulary).
StreamOutcome = Literal["succeeded", "dead_lettered", "cancelled", "unknown"]
_OUTCOMES: frozenset[str] = frozenset({"succeeded", "dead_lettered", "cancelled", "unknown"})

StreamErrorCode = Literal["chunk_too_large", "chunk_not_json", "stream_backlog", "superseded"]


class JobStreamError(AkterError):
    """``call.stream`` refused a chunk; ``code`` names why.

    Codes: ``chunk_too_large`` (over :data:`MAX_CHUNK_BYTES`), ``chunk_not_json`` (not a ``str``,
    a pydantic model or a JSON value), ``stream_backlog`` (over :data:`MAX_BUFFERED_BYTES`
    waiting to be written), ``superseded`` (this attempt lost its job row to a newer attempt or
    a settle: nothing it streams lands any more).
    """

    def __init__(self, code: StreamErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: StreamErrorCode = code


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """The start of attempt ``attempt``'s segment: drop what earlier attempts streamed."""

    seq: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of attempt ``attempt``, as the executor streamed it (JSON value or text)."""

    seq: int
    attempt: int
    data: Any


@dataclass(frozen=True, slots=True)
class Closed:
    """The end of the stream: how the job ended (``unknown`` when nothing tells any more).

    ``attempt`` is the attempt whose settle ended the job (``None`` when the reader built the
    close from the job's trace). It is not always the last segment's: after a lease takeover,
    the first success of any attempt wins, so a stale attempt's success can end the job while
    a newer attempt was streaming.
    """

    seq: int
    outcome: StreamOutcome
    attempt: int | None = None


StreamItem = AttemptStarted | Chunk | Closed


class StreamReader(Protocol):
    """What ``handle.job_stream`` returns: ``async for`` its items; ``aclose()`` to stop early."""

    def __aiter__(self) -> StreamReader:
        """The reader itself."""
        ...

    def __anext__(self) -> Awaitable[StreamItem]:
        """The next item (the stream ends after :class:`Closed`)."""
        ...

    def aclose(self) -> Awaitable[None]:
        """Stop reading."""
        ...


def encode_chunk(chunk: object) -> tuple[str, int]:
    """A chunk's canonical JSON and its size in bytes.

    Raises:
        JobStreamError: ``chunk_not_json`` or ``chunk_too_large``.
    """
    value = chunk.model_dump(mode="json") if isinstance(chunk, BaseModel) else chunk
    if isinstance(value, float) and not math.isfinite(value):
        raise JobStreamError("chunk_not_json", f"A stream chunk must be finite, not {value!r}.")
    try:
        text = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise JobStreamError(
            "chunk_not_json",
            f"A stream chunk must be a str, a pydantic model or a JSON value ({exc}); "
            "convert it before call.stream().",
        ) from None
    size = len(text.encode("utf-8"))
    if size > MAX_CHUNK_BYTES:
        raise JobStreamError(
            "chunk_too_large",
            f"A stream chunk of {size} bytes is over the {MAX_CHUNK_BYTES}-byte bound; "
            "split it into several chunks.",
        )
    return text, size


def item_to_json(item: StreamItem) -> dict[str, Any]:
    """The wire form of an item (the SSE frame's data)."""
    match item:
        case AttemptStarted(seq, attempt):
            return {"seq": seq, "type": "attempt", "attempt": attempt}
        case Chunk(seq, attempt, data):
            return {"seq": seq, "type": "chunk", "attempt": attempt, "data": data}
        case Closed(seq, outcome, attempt):
            return {"seq": seq, "type": "closed", "outcome": outcome, "attempt": attempt}


def item_from_json(data: dict[str, Any]) -> StreamItem:
    """An item from its wire form.

    Raises:
        ValueError: If ``data`` is not an item's wire form.
    """
    kind = data.get("type")
    seq = int(data["seq"])
    if kind == "attempt":
        return AttemptStarted(seq, int(data["attempt"]))
    if kind == "chunk":
        return Chunk(seq, int(data["attempt"]), data.get("data"))
    outcome = data.get("outcome")
    if kind == "closed" and isinstance(outcome, str) and outcome in _OUTCOMES:
        attempt = data.get("attempt")
        return Closed(seq, outcome, None if attempt is None else int(attempt))  # type: ignore[arg-type]
    raise ValueError(f"Not a job stream item: {data!r}")
