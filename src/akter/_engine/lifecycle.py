"""Starting and draining a runner's components, in order.

Start: the embedded server when no URL is configured, migrations over a direct connection, the
pools, a first clock sample, the singletons' ticks, the job executor, the pass loop (or only its
listener), the runner registry, and hibernation of idle activations. Stop (a drain): refuse new
commands, stop the pass loop, release the relay's claims, stop the workflow and job lanes, let
in-flight turns finish until the drain deadline, unregister, close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Literal, Protocol

from akter._drain import DrainReport
from akter._engine import declared
from akter._engine.dispatcher import Dispatcher
from akter._engine.operations import seed_singleton_ticks
from akter._engine.orphans import declared_names
from akter._engine.services import Services
from akter._engine.tables import check_owned_tables
from akter._store.migrate import Deployment, migrate_store

log = logging.getLogger("akter.runtime")

#: How often idle activations are dropped from memory.
HIBERNATE_EVERY_S = 5.0


class _Component(Protocol):
    async def start(self) -> None: ...


class _Loop(_Component, Protocol):
    async def listen(self) -> None: ...
    async def stop(self) -> None: ...


class _Relay(Protocol):
    async def stop(self, deadline: float) -> int: ...


class _Jobs(_Component, Protocol):
    @property
    def running(self) -> int: ...
    async def stop(self) -> None: ...


class _Runners(_Component, Protocol):
    async def stop(self) -> None: ...


class _Workflows(Protocol):
    async def stop(self) -> None: ...


class Lifecycle:
    """Starts and drains one runner (module docstring)."""

    def __init__(
        self,
        services: Services,
        dispatcher: Dispatcher,
        loop: _Loop,
        jobs: _Jobs,
        relay: _Relay,
        runners: _Runners,
        workflows: _Workflows | None = None,
    ) -> None:
        self._services = services
        self._dispatcher = dispatcher
        self._loop = loop
        self._jobs = jobs
        self._relay = relay
        self._runners = runners
        self._workflows = workflows
        #: Further lanes (subscriptions): stopped after the loop, with the workflow lane.
        self.lanes: list[_Workflows] = []
        #: The runner's own background tasks (hibernation).
        self.tasks: list[asyncio.Task[None]] = []
        #: The deployment row read at start.
        self.deployment: Deployment | None = None
        self._embedded: Any = None

    async def start(self, url: str | None) -> None:
        """Start everything on the server at ``url`` (``None``: the embedded one)."""
        services = self._services
        if url is None:
            from akter._store.embedded import EmbeddedPostgres, default_data_dir

            self._embedded = EmbeddedPostgres(Path(services.config.data_dir or default_data_dir()))
            url = await asyncio.to_thread(self._embedded.start)
        assert url is not None
        services.store.bind(url)
        try:
            await self._migrate()
            await services.store.open()
            await check_owned_tables(services.store, services.definitions.values())
            await services.clock.read()
            await seed_singleton_ticks(services)
            await self._jobs.start()
            if services.config.relay:
                await self._loop.start()
            else:
                await self._loop.listen()  # live event feeds still hear other runners
            await self._runners.start()
            hibernation = asyncio.create_task(self._hibernation(), name="akter.hibernation")
            self.tasks.append(services.supervisor.supervise(hibernation))
        except BaseException:
            await self.close()
            raise

    async def _migrate(self) -> None:
        self.deployment = await migrate_store(
            self._services.store,
            retry_window_ms=self._services.config.window_ms,
            placements={d.name: d.placement for d in self._services.definitions.values()},
            names=declared_names(self._services.definitions.values())
            + declared.names(self._services.definitions.values()),
        )

    async def drain(self) -> DrainReport:
        """Refuse new commands, let in-flight work finish until the drain deadline, close."""
        self._dispatcher.accepting = False
        deadline = time.monotonic() + self._services.config.drain_deadline_ms / 1000
        await self._loop.stop()  # no new pass: the lanes' claims end below
        released = await self._relay.stop(deadline)
        if self._workflows is not None:
            await self._workflows.stop()  # running attempts hand their runs back
        for lane in self.lanes:
            await lane.stop()
        attempts = self._jobs.running
        await self._jobs.stop()
        interrupted = await self._dispatcher.quiesce(deadline)
        await self._runners.stop()
        if interrupted:
            log.warning("Drain deadline expired", extra={"interrupted_turns": interrupted})
        await self.close()
        status: Literal["clean", "deadline_expired"] = (
            "deadline_expired" if interrupted else "clean"
        )
        return DrainReport(status, interrupted, attempts, released)

    async def close(self) -> None:
        """Cancel the runner's own tasks, close the pools, stop the embedded server."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        await self._dispatcher.engine.shared.aclose()  # its writes, before their pool closes
        if self._services.store.url:
            await self._services.store.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None

    async def _hibernation(self) -> None:
        while True:
            await asyncio.sleep(HIBERNATE_EVERY_S)
            self._dispatcher.hibernate()
