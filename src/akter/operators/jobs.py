"""Jobs for operators: list them, cancel one by id, follow one's progress.

The view, not the executor: nothing here claims or runs an attempt. A cancel runs in its own
short transaction; a job running on this runner is told at once, and a cancel that settles a
job wakes the relay for its route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from akter._engine.jobs.progress import ProgressStream, ProgressStreams
from akter._engine.services import Services
from akter._store.gateway import ops
from akter._store.gateway.jobs import JobsGateway
from akter.callers import ActorRef

#: What a cancel by id did: deleted a job that never ran, cancelled one, or found none.
CancelOutcome = Literal["deleted", "cancelled", "unknown"]


class Jobs:
    """Job rows across actors, for the CLI (``akter jobs``) and the console.

    Args:
        services: The runner's services (store, clock, config).
        streams: The runner's progress subscriptions.
        signal_running: Tells this runner's running attempts of these job ids to stop.
        announce: Wakes the relay here and on other runners.
    """

    def __init__(
        self,
        services: Services,
        streams: ProgressStreams,
        signal_running: Callable[[list[str]], None],
        announce: Callable[[], Awaitable[None]],
    ) -> None:
        self._services = services
        self._streams = streams
        self._signal_running = signal_running
        self._announce = announce

    def overview(self, url: str, limit: int = 100) -> list[dict[str, Any]]:
        """Job rows by column name, oldest due first, over a connection of its own to ``url``.

        Works without starting the runtime (``akter jobs list``).
        """
        return ops.jobs_overview(url, self._services.store.queries, limit)

    async def recent(self, limit: int, timeout_ms: int) -> list[dict[str, Any]]:
        """Job rows with their status, oldest first, read within ``timeout_ms`` (the console).

        Raises:
            ActorError: ``Timeout`` (``console_query_timeout``) past ``timeout_ms``.
        """
        return await ops.console_jobs(self._services.store, limit, timeout_ms)

    async def cancel(self, job_id: str) -> CancelOutcome:
        """Cancel a job by id in its own transaction (``akter jobs cancel``).

        Returns:
            ``"deleted"`` (it never ran), ``"cancelled"`` (its attempt or report settles it) or
            ``"unknown"`` (no such live job).
        """
        services = self._services
        services.supervisor.require_started()
        cancelled = await JobsGateway(services.store, services.clock).cancel_by_id(job_id)
        if cancelled.running:
            self._signal_running([job_id])
        if cancelled.outcome == "cancelled":
            await self._announce()
        outcome: CancelOutcome = cancelled.outcome
        return outcome

    async def progress(self, ref: ActorRef, job_id: str) -> ProgressStream:
        """Subscribe to a job's progress frames, then its closing message (access ``progress``).

        Checks access as the current caller before subscribing; close the stream when done.
        """
        return await self._streams.open(ref, job_id)

    async def hearing(self) -> None:
        """Return once this runner listens for other runners' progress frames (``notify``)."""
        await self._streams.hub.hearing.wait()


__all__ = ["CancelOutcome", "Jobs", "ProgressStream"]
