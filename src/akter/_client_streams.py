"""The typed client's job output stream reader (docs/guides/job-streams.md), async and sync.

The reader follows ``GET /actors/{Type}/{id}/jobs/{job_id}/stream`` and, when the connection
drops before the close, reconnects with ``Last-Event-ID`` set to the last item's seq: the server
resumes after it, so no item is missed or repeated.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Iterator

import httpx

from akter.errors import AkterError
from akter.job_streams import Closed, StreamItem, StreamReader, item_from_json

#: Wait before reconnecting a dropped stream (seconds).
RECONNECT_AFTER = 0.25


class RemoteStream:
    """A job's output stream over HTTP (``StreamReader``): see :func:`follow_job_stream`."""

    def __init__(self, items: AsyncGenerator[StreamItem, None]) -> None:
        self._items = items

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> StreamItem:
        return await anext(self._items)

    async def aclose(self) -> None:
        """Stop reading (closes the connection)."""
        await self._items.aclose()


def job_stream(
    http: httpx.AsyncClient,
    path: str,
    after: int,
    error_of: Callable[[httpx.Response], AkterError],
) -> RemoteStream:
    """The items after seq ``after`` at ``path``, across reconnects, ending after the close."""
    return RemoteStream(follow_job_stream(http, path, after, error_of))


async def follow_job_stream(
    http: httpx.AsyncClient,
    path: str,
    after: int,
    error_of: Callable[[httpx.Response], AkterError],
) -> AsyncGenerator[StreamItem, None]:
    """The items after seq ``after`` at ``path``, across reconnects, ending after the close."""
    cursor = after
    while True:
        headers = {"Last-Event-ID": str(cursor), "Accept": "text/event-stream"}
        try:
            async with http.stream("GET", path, headers=headers, timeout=None) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_of(response)
                async for item in _items(response):
                    cursor = item.seq
                    yield item
                    if isinstance(item, Closed):
                        return
        except (httpx.TransportError, httpx.TimeoutException):
            pass  # dropped: resume after the last seq
        await asyncio.sleep(RECONNECT_AFTER)


async def _items(response: httpx.Response) -> AsyncGenerator[StreamItem, None]:
    data: str | None = None
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
        elif not line and data is not None:
            yield item_from_json(json.loads(data))
            data = None


def sync_items(loop: asyncio.AbstractEventLoop, items: StreamReader) -> Iterator[StreamItem]:
    """``items`` read on ``loop``, blocking (the sync client's private loop)."""
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(items))
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(items.aclose())
