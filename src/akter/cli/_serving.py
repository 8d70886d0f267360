"""Running a runtime in the foreground until SIGTERM or SIGINT, then draining it.

``akter serve``, ``akter worker`` and ``akter dev`` share this: the runtime starts (and, with an
HTTP address, uvicorn serves :func:`akter.http.app` on it), a ready line goes to stderr, and a
signal stops uvicorn first, then the runtime, which drains its turns, relay and executors.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Any

from akter.cli._common import stderr
from akter.http.timeouts import HEADERS_TIMEOUT, headers_timeout_protocol
from akter.runtime import Runtime


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_until_signalled(
    runtime: Runtime,
    http: str | None,
    *,
    stop: asyncio.Event | None = None,
    banner: str = "",
    app_options: dict[str, Any] | None = None,
    sock: socket.socket | None = None,
    headers_timeout: float = HEADERS_TIMEOUT,
) -> None:
    """Run the runtime (and uvicorn with ``http``) until ``stop`` is set; then drain.

    ``app_options`` go to :func:`akter.http.app` (``akter dev`` passes its local console; the
    body bound is its ``body_timeout``). uvicorn bounds each request's head to
    ``headers_timeout`` seconds (:func:`akter.http.timeouts.headers_timeout_protocol`).
    ``sock`` is a listening socket to serve on instead of binding ``http`` (a worker of
    ``akter serve --workers``, ``akter.cli._workers``).
    """
    stop = stop or stop_on_signals()
    server = None
    if http:
        import uvicorn

        from akter.http import app as http_app

        host, _, port = http.rpartition(":")
        runtime.advertise_http(http)
        config = uvicorn.Config(
            http_app(runtime, **(app_options or {})),
            host=host or "127.0.0.1",
            port=int(port),
            log_level="warning",
            lifespan="off",
            http=headers_timeout_protocol(headers_timeout),
            ws="websockets-sansio",  # the app's /ws (docs/guides/live.md)
        )
        server = uvicorn.Server(config)
    async with runtime:
        sockets = [sock] if sock is not None else None
        serving = asyncio.create_task(server.serve(sockets=sockets)) if server else None
        stderr.print(
            f"akter runner {runtime.runner_id} ready"
            + (f", HTTP on {http}" if http else "")
            + banner,
            markup=False,
        )
        await stop.wait()
        stderr.print("draining…")
        if server is not None and serving is not None:
            server.should_exit = True
            await serving
    stderr.print("drained")
