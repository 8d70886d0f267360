"""A runner's controls for a harness (``akter.testing``): fault points, clock, drain, death.

What a test kit does to a runner beyond serving calls: arm fault points (:class:`Hooks`), move
the framework clock and the leases that ride on it, run its lanes' passes now and wait for them,
and make it die like a process. Production code has no use for any of it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from akter._engine.dispatcher import Dispatcher
from akter._engine.hooks import POINTS, Hooks, Match, Pause
from akter._engine.jobs.executor import JobExecutor
from akter._engine.relay.intents import Relay
from akter._engine.runners import Runners
from akter._engine.services import Services
from akter._engine.workflows.engine import WorkflowEngine


class RunnerControl:
    """One runner's controls (module docstring).

    Args:
        services: The runner's services (store, clock, hooks, supervisor).
        dispatcher: Its mailboxes.
        relay: Its intent lane and pass loop.
        jobs: Its job executor.
        workflows: Its workflow engine.
        runners: Its runner registry (heartbeat, singleton leases).
        owner: The object the runner's own tasks belong to (the runtime).
        components: The objects whose methods run as the runner's background tasks.
        own_tasks: The runner's supervised tasks.
    """

    def __init__(
        self,
        services: Services,
        *,
        dispatcher: Dispatcher,
        relay: Relay,
        jobs: JobExecutor,
        workflows: WorkflowEngine,
        runners: Runners,
        owner: object,
        components: Sequence[object],
        own_tasks: Callable[[], Iterable[asyncio.Task[Any]]],
    ) -> None:
        self._services = services
        self._dispatcher = dispatcher
        self._relay = relay
        self._jobs = jobs
        self._workflows = workflows
        self._runners = runners
        self._owner = owner
        self._components = components
        self._own_tasks = own_tasks

    @property
    def hooks(self) -> Hooks:
        """The runner's fault points."""
        return self._services.hooks

    @property
    def on_citus(self) -> bool:
        """Whether the runner's database is a Citus coordinator (known once started)."""
        return self._services.store.strategy == "citus"

    # --- the clock ---------------------------------------------------------------------------

    @property
    def offset_ms(self) -> int:
        """How far the runner's framework clock is moved ahead of the database's, in ms."""
        return self._services.clock.offset_ms

    @offset_ms.setter
    def offset_ms(self, value: int) -> None:
        self._services.clock.offset_ms = value

    async def now_ms(self) -> int:
        """The framework clock, read from the database."""
        return await self._services.clock.read()

    def jumping(self, on: bool) -> None:
        """Mark a clock jump under way (the skew check does not take it for a skewed clock)."""
        self._services.clock.jumping = on

    async def shift_leases(self, ms: int) -> None:
        """Push the leases of the runner's running job attempts by ``ms`` (before a jump)."""
        await self._jobs.shift(ms)

    @property
    def serving(self) -> bool:
        """Whether the runner serves: ready (or waiting for storage) and not draining."""
        readiness = self._services.supervisor.readiness
        return readiness in ("ready", "storage") and not self._runners.draining

    async def heartbeat(self) -> None:
        """Write the runner's heartbeat now."""
        await self._runners.register()

    async def refresh_leases(self, *, owned: bool) -> None:
        """Renew the singleton leases it holds (``owned``), or contend for the others."""
        await self._runners.refresh_leases(owned=owned)

    # --- draining ----------------------------------------------------------------------------

    async def wait_jobs_idle(self) -> None:
        """Await every job attempt started so far."""
        await self._jobs.wait_idle()

    async def wait_workflows_idle(self) -> None:
        """Await every workflow attempt started so far."""
        await self._workflows.wait_idle()

    async def wait_idle(self) -> None:
        """Await the relay's deliveries, job attempts and workflow attempts started so far."""
        await self._relay.wait_idle()
        await self._jobs.wait_idle()
        await self._workflows.wait_idle()

    async def run_pass(self) -> int:
        """Run one pass of every lane now; returns how many rows it claimed."""
        return await self._relay.run_pass(drain=True)

    @property
    def progress(self) -> tuple[int, ...]:
        """Counters that move whenever the runner finishes a piece of work."""
        return (
            self._relay.delivered,
            self._relay.retried,
            self._jobs.finished,
            self._workflows.attempted,
        )

    @property
    def busy(self) -> bool:
        """Whether a delivery, a job attempt or a workflow attempt is under way.

        A job success waiting for its batched settle is under way: its outcome's route is not
        written yet.
        """
        return bool(self._relay.in_flight or self._jobs.unfinished or self._workflows.running)

    # --- death -------------------------------------------------------------------------------

    def die(self, conninfo: str) -> None:
        """The instant of a process death: refuse calls, and point new connections nowhere.

        Its dying tasks are not reported as failures. Follow with :meth:`close_pools` and by
        cancelling :meth:`background_tasks`.
        """
        supervisor = self._services.supervisor
        supervisor.stopping = True
        supervisor.started = False
        supervisor.readiness = "failed"
        self._dispatcher.accepting = False
        self._services.store.bind(conninfo)

    async def close_pools(self) -> None:
        """Close the runner's pools (callers waiting for a connection fail at once)."""
        await self._services.store.pool.close(timeout=1.0)
        await self._services.store.framework.close(timeout=1.0)

    def drop_caches(self) -> None:
        """Forget every resident actor (a dead process keeps no memory)."""
        self._dispatcher.drop_caches()

    def background_tasks(self) -> set[asyncio.Task[Any]]:
        """The unfinished tasks doing the runner's own work.

        A task belongs to the runner when its coroutine is a method of one of its components
        (the dispatcher's mailboxes, the relay's loop, passes, deliveries and settles, the
        executor's attempts, the registry's heartbeats, lease contention and singleton loops,
        the progress hub's tasks) or of an object holding the owner, plus the owner's own
        tasks. Callers' tasks are not among them: they get the error their call ends with.
        """
        ids = {id(c) for c in self._components}
        owner = self._owner
        found = {task for task in self._own_tasks() if not task.done()}
        current = asyncio.current_task()
        for task in asyncio.all_tasks():
            if task.done() or task is current:
                continue
            frame = getattr(task.get_coro(), "cr_frame", None)
            holder = frame.f_locals.get("self") if frame is not None else None
            if holder is None or holder is owner:
                continue
            # Static lookups: a handle answers any attribute name with a command.
            if id(holder) in ids or any(
                inspect.getattr_static(holder, name, None) is owner
                for name in ("rt", "_rt", "runtime")
            ):
                found.add(task)
        return found


__all__ = ["POINTS", "Hooks", "Match", "Pause", "RunnerControl"]
