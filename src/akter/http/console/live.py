"""The console's live reads: an actor's row as it commits, and a job's output stream.

Routes, behind the same guard as every console API route (:mod:`akter.http.console.guard`)::

    GET /console/api/actor/state?type=&id=&tenant=             SSE ``state`` frames, live
    GET /console/api/jobs/stream?type=&id=&tenant=&job_id=&after=   SSE job stream frames

``actor/state`` sends the actor's row as stored (state, version, event and receipt counts: what
``GET /console/api/actor`` shows), once at once and then after each commit that changes it
(``id``: the row version). It is a row follower of the runtime's live reads
(``runtime.live.follow_row``): woken at once by this runner's commits, by another runner's when
the type has a watchable query and ``notify`` is on, and otherwise read every ``poll``. Values
come at most one per ``watch_min_interval`` and never go back in version. It counts against the
runner's ``max_watchers`` and ``max_watchers_per_actor``; a read that fails ends the feed with an
``error`` frame (the page opens it again).

``jobs/stream`` is the job output stream of ``GET /actors/{T}/{id}/jobs/{job_id}/stream``, with
its frames (``attempt``, ``chunk``, ``closed``; ``id``: the seq) and refusals (404
``unknown_job`` for a job of another actor or tenant than the one named, 410 ``RetentionGap``),
read as the console's ``System`` caller: the console's operators read every tenant's job
output, as they read every tenant's state and events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from akter.callers import ActorRef, System, as_caller
from akter.errors import ActorError
from akter.http._sse import MEDIA_TYPE, job_stream_frames, keep_alive, stream_cursor
from akter.http.problems import from_actor_error

if TYPE_CHECKING:
    from akter.runtime import Runtime

#: A console statement's transaction-local ``statement_timeout`` (as :mod:`.api`'s).
STATEMENT_TIMEOUT_MS = 2_000
_SSE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Accel-Buffering": "no",
}


class LiveApi:
    """The console's live routes on ``runtime``.

    Args:
        runtime: The runtime whose actors and jobs are followed.
        guard: Admits a request as an operator (or raises the refusal).
        ref_of: The actor a request's ``type``, ``id`` and ``tenant`` parameters name.
    """

    def __init__(
        self,
        runtime: Runtime,
        guard: Callable[[Request], Awaitable[System]],
        ref_of: Callable[[Request], ActorRef],
    ) -> None:
        self.runtime = runtime
        self.guard = guard
        self.ref_of = ref_of

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the console's."""
        return [
            Route("/console/api/actor/state", self.state, methods=["GET"]),
            Route("/console/api/jobs/stream", self.job_stream, methods=["GET"]),
        ]

    async def state(self, request: Request) -> Response:
        """``GET /console/api/actor/state``: the actor's row, then after each commit (SSE)."""
        try:
            await self.guard(request)
            ref = self.ref_of(request)
            actors = self.runtime.operators.actors

            async def read() -> tuple[dict[str, Any], int]:
                body = row_json(await actors.row(ref, STATEMENT_TIMEOUT_MS))
                return body, body["version"]

            watch = self.runtime.live.follow_row(ref, read)
        except ActorError as exc:
            return from_actor_error(exc)
        return StreamingResponse(
            keep_alive(_state_frames(watch)), media_type=MEDIA_TYPE, headers=_SSE_HEADERS
        )

    async def job_stream(self, request: Request) -> Response:
        """``GET /console/api/jobs/stream``: a job's output stream, then its close (SSE)."""
        try:
            caller = await self.guard(request)
            ref = self.ref_of(request)
            job_id = request.query_params.get("job_id")
            if not job_id:
                raise ActorError(
                    "InvalidInput", "The 'job_id' query parameter is required.", field="job_id"
                )
            stream = self.runtime.job_stream(ref, job_id, stream_cursor(request))
            with as_caller(caller):
                await stream.open()  # the job and the cursor: refusals stay 4xx
        except ActorError as exc:
            return from_actor_error(exc)
        return StreamingResponse(
            job_stream_frames(stream), media_type=MEDIA_TYPE, headers=_SSE_HEADERS
        )


def row_json(row: dict[str, Any] | None) -> dict[str, Any]:
    """An actor row as the console shows it (a row never committed: version 0, no state)."""
    return {
        "exists": row is not None,
        "version": row["version"] if row else 0,
        "created": row["created"] if row else False,
        "event_seq": row["event_seq"] if row else 0,
        "state": row["state"] if row else None,
        # The row's version as stored, beside the code's: a row is migrated only when a turn
        # writes it, so an older one here is expected, a newer one refused.
        "state_version": row["state_version"] if row else None,
        "updated_at": _iso(row["updated_at_ms"]) if row else None,
        "receipts": row["receipts"] if row else 0,
    }


async def _state_frames(watch: Any) -> AsyncIterator[str]:
    """A row follower's values as ``state`` frames; a failed read ends it with ``error``."""
    try:
        async for item in watch.values():
            data = json.dumps(item.value, separators=(",", ":"), default=str)
            yield f"id: {item.version}\nevent: state\ndata: {data}\n\n"
    except ActorError as exc:
        problem = json.loads(bytes(from_actor_error(exc).body))
        yield f"event: error\ndata: {json.dumps(problem)}\n\n"
    finally:
        watch.close()


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()
