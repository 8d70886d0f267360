"""Sampled gauges (semantics §10.1), computed only by the ``$maintenance`` lease owner.

Every ``sample_every`` (15 s) the owner reads the outbox once: rows, relay lag (the age of the
oldest due unclaimed row, 0 if none), stuck rows (``attempts ≥ 8``) and parked rows by ``kind``,
and, extending §10.1, the job attempts running under a live lease (``akter.jobs.running`` by
``actor_type`` and ``job``), the rows held back by flow control (``akter.jobs.waiting_slot``,
``akter.jobs.waiting_rate``; docs/flow-control.md) and the due jobs no live runner executes
(``akter.jobs.unserved``), and the workflow runs running under a live lease and suspended
(``akter.workflows.running``, ``akter.workflows.suspended`` by ``actor_type``; the workflows spec
W4), and the subscriptions' lag (``akter.subscription.lag`` by subscriber type). The job gauges
are read only when that first read found a job row. A runner that loses (or releases) the lease
stops reporting them, so a scrape of many runners sees each value once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import psycopg

from akter._engine.jobs import watch as job_watch
from akter._engine.parking import OncePer
from akter._kinds import RowKind
from akter._store.gateway.job_flow import FlowGateway
from akter._store.gateway.maintenance import MaintenanceGateway
from akter._store.gateway.parked import ParkedGateway
from akter._store.gateway.subscriptions import SubscriptionsGateway
from akter._store.gateway.workflows import WorkflowsGateway
from akter.telemetry import SAMPLED_GAUGES

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter._store.gateway.runners import LiveRunner

log = logging.getLogger("akter.sampling")

SAMPLE_EVERY_MS = 15_000
STUCK_ATTEMPTS = 8


class Sampler:
    """The sampled gauges of one runner; :meth:`run` is the owner's loop.

    ``live`` reads the live runners' registrations (``Runners.live``): the job types they
    execute decide which due job rows are unserved (:mod:`akter._engine.jobs.watch`);
    ``declares_job`` tells whether a live runner's code declares a job this code lacks.
    """

    def __init__(
        self,
        services: Services,
        live: Callable[[], Awaitable[list[LiveRunner]]] | None = None,
        declares_job: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> None:
        self._metrics = services.metrics
        self._registry = services.registry
        self._live = live
        self._declares_job = declares_job
        self._gateway = MaintenanceGateway(services.store, services.clock)
        self._parked = ParkedGateway(services.store, services.clock)
        self._flow = FlowGateway(services.store, services.clock)
        self._workflows = WorkflowsGateway(services.store, services.clock)
        self._subscriptions = SubscriptionsGateway(services.store, services.clock)
        self._unserved_log = OncePer(job_watch.LOG_EVERY_S)
        #: The interval between samples (``sample_every``); read before each wait.
        self.every_ms = SAMPLE_EVERY_MS
        #: How many samples this runner has taken.
        self.taken = 0
        self._sampled = asyncio.Event()

    async def sample(self) -> None:
        """Read the outbox once and replace the sampled gauges of this runner's metrics.

        The job gauges are read only when the outbox holds a job row: with none, each of them
        is zero (as its statement would have found a moment later), and an idle deployment's
        owner sends three statements less per sample.
        """
        kinds = await self._gateway.sample(stuck=STUCK_ATTEMPTS)
        metrics = self._metrics
        for name, column in (
            ("akter.outbox.rows", "outbox_rows"),
            ("akter.relay.lag_ms", "lag_ms"),
            ("akter.relay.stuck_rows", "stuck_rows"),
            ("akter.outbox.parked", "parked"),
        ):
            metrics.replace(name, (({"kind": r.kind}, float(getattr(r, column))) for r in kinds))
        jobs = any(r.kind == RowKind.JOB and r.outbox_rows for r in kinds)
        await self._sample_unserved(jobs)
        flow = await self._flow.sample_flow() if jobs else []
        for name in ("waiting_slot", "waiting_rate"):
            metrics.replace(
                f"akter.jobs.{name}",
                (
                    ({"actor_type": r.actor_type, "job": r.job}, float(getattr(r, name)))
                    for r in flow
                ),
            )
        running = await self._gateway.running_jobs() if jobs else []
        metrics.replace(
            "akter.jobs.running",
            (({"actor_type": r.actor_type, "job": r.job}, float(r.running)) for r in running),
        )
        runs = await self._workflows.sample()
        for name in ("running", "suspended"):
            metrics.replace(
                f"akter.workflows.{name}",
                (({"actor_type": r.actor_type}, float(getattr(r, name))) for r in runs),
            )
        await self._sample_subscriptions()
        self.taken += 1
        self._sampled.set()
        self._sampled = asyncio.Event()

    async def _sample_subscriptions(self) -> None:
        """``akter.subscription.lag``: per subscriber type, its oldest feed with work's age."""
        lag: dict[str, float] = {}
        for row in await self._subscriptions.overview():
            subscriber = row.subscription.split(".", 1)[0]
            lag[subscriber] = max(lag.get(subscriber, 0.0), float(row.lag_ms))
        self._metrics.replace(
            "akter.subscription.lag", (({"actor_type": t}, ms) for t, ms in lag.items())
        )

    async def _sample_unserved(self, jobs: bool) -> None:
        """``akter.jobs.unserved``: due job rows no live runner executes (the undeclared parked).

        ``jobs``: the outbox holds a job row. The live runners are read only when one is due:
        with none, nothing can be unserved.
        """
        if self._live is None:
            return
        due = await self._parked.due_jobs() if jobs else []
        served = job_watch.served_names(await self._live()) if due else set()
        unserved = await job_watch.watch(
            self._parked,
            self._registry,
            due,
            served,
            self._unserved_log,
            declared_elsewhere=self._declares_job,
        )
        self._metrics.replace(
            "akter.jobs.unserved",
            (({"actor_type": u.actor_type, "job": u.job}, float(u.due)) for u in unserved),
        )

    async def wait_for(self, taken: int) -> None:
        """Wait until this runner has taken ``taken`` samples (tests)."""
        while self.taken < taken:
            await self._sampled.wait()

    def clear(self) -> None:
        """Stop reporting the sampled gauges (the lease is gone)."""
        self._metrics.clear(SAMPLED_GAUGES)

    async def run(self) -> None:
        """Sample now and every ``every_ms`` while this runner owns ``$maintenance``."""
        try:
            while True:
                try:
                    await self.sample()
                except (psycopg.Error, OSError) as exc:
                    log.warning("Gauge sampling failed", extra={"error": str(exc)})
                except Exception:
                    # A bug, not an outage: say so loudly; gauges are not worth stopping for.
                    log.exception("Gauge sampling raised unexpectedly")
                await asyncio.sleep(self.every_ms / 1000)
        finally:
            self.clear()
