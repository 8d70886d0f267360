"""Runners: registry and heartbeats, singleton leases and background loops, maintenance.

Semantics §8. A runner registers and heartbeats every 10 s; it is live while its heartbeat is
younger than 35 s. Singleton background loops (an actor's ``async def run(self)``) and the
reserved ``$maintenance`` duties (retention sweeps, runner pruning) are owned through a lease row
refreshed every 10 s; the owner stops its loop once 30 s of local monotonic time have passed
since its last successful refresh was *sent*, before any successor can acquire the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from akter._engine import declared
from akter._engine.orphans import Orphans
from akter._engine.sampling import Sampler
from akter._store.citus import singleton_routing_key
from akter._store.gateway.runners import LiveRunner, RunnersGateway, SingletonLease
from akter._version import __version__

if TYPE_CHECKING:
    from akter._engine.services import Services

#: Runs a singleton's ``run()`` loop: (actor type, runner id, lease epoch).
SingletonLoop = Callable[[str, str, int | None], Coroutine[Any, Any, None]]

log = logging.getLogger("akter.runners")

T = TypeVar("T")

HEARTBEAT_MS = 10_000
LIVE_MS = 35_000
PRUNE_MS = 3_600_000
LEASE_MS = 35_000
REFRESH_MS = 10_000
STOP_MARGIN_MS = 5_000
MAINTENANCE = "$maintenance"
SWEEP_EVERY_MS = 60_000


@dataclass
class _Lease:
    """One singleton lease this runner tries to hold, and the loop it runs while it does."""

    actor_type: str
    #: The routing key of the singleton's actor: the lease row's (``Runners.lease_key``).
    routing_key: int
    body: Callable[[], Coroutine[Any, Any, None]]
    owned: bool = False
    confirmed_at: float = 0.0  # monotonic send time of the last successful acquire/refresh
    epoch: int | None = None  # acquired_at_ms of the acquisition the running loop is fenced on
    task: asyncio.Task[None] | None = None
    runs: int = 0
    events: list[tuple[str, float]] = field(default_factory=list)
    # One refresh at a time: the background round and ActorTest.advance may both refresh, and two
    # interleaved rounds could each start a loop.
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)


class Runners:
    """This runner's registration, its singleton leases and its maintenance duties.

    Args:
        services: The runner's services.
        run_singleton_loop: Runs a singleton's loop while this runner holds its lease.
    """

    def __init__(self, services: Services, *, run_singleton_loop: SingletonLoop) -> None:
        self._services = services
        self._run_singleton_loop = run_singleton_loop
        self._gateway = RunnersGateway(services.store, services.clock)
        self.runner_id = str(uuid.uuid4())
        self.http_address: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._leases: dict[str, _Lease] = {}
        self.draining = False
        self.heartbeat_ms = HEARTBEAT_MS
        # Runtime(singleton_lease=...): 35 s by default; refreshes every lease × 10/35 (10 s),
        # and the loop guard stops min(5 s, lease ÷ 7) before the lease could end.
        self.lease_ms: int = services.config.singleton_lease_ms
        self.refresh_ms = max(1, self.lease_ms * REFRESH_MS // LEASE_MS)
        #: Sampled gauges, taken while this runner owns $maintenance (``sampler.every_ms``).
        self.sampler = Sampler(services, live=self.live, declares_job=self.declares_job)
        #: Stored names no definition claims: checked at start and every maintenance cycle.
        self.orphans = Orphans(services)

    def lease_key(self, actor_type: str) -> int:
        """The routing key of a singleton's lease row: its actor's (tenant "default", id "")."""
        definition = self._services.registry.definitions.get(actor_type)
        return singleton_routing_key(
            actor_type, "tenant" if definition is None else definition.placement
        )

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Register, check for orphans, then heartbeat and contend for leases in the background."""
        await self.register()
        await self.check_orphans(owner=False)
        supervisor = self._services.supervisor
        for definition in self._services.registry.definitions.values():
            run = getattr(definition.cls, "run", None)
            if definition.singleton and callable(run) and not _is_base_run(run):
                self._leases[definition.name] = _Lease(
                    definition.name,
                    self.lease_key(definition.name),
                    self._singleton_body(definition.name),
                )
        if self._services.config.maintenance:
            self._leases[MAINTENANCE] = _Lease(
                MAINTENANCE, self.lease_key(MAINTENANCE), self._maintenance_body
            )
        self._tasks.append(
            supervisor.supervise(
                asyncio.create_task(self._heartbeats(), name="akter.runners.heartbeat")
            )
        )
        if self._leases:
            self._tasks.append(
                supervisor.supervise(
                    asyncio.create_task(self._contend(), name="akter.runners.leases")
                )
            )

    async def stop(self) -> None:
        """Stop loops, release held leases, mark draining, then unregister."""
        self.draining = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for lease in self._leases.values():
            await self._stop_loop(lease)
            if lease.owned:
                await _quietly(
                    "release_singleton",
                    self._gateway.release_singleton(
                        lease.actor_type, lease.routing_key, self.runner_id
                    ),
                    None,
                )
                lease.owned = False
        await _quietly("heartbeat_runner", self._gateway.mark_draining(self.runner_id), None)
        await _quietly("unregister_runner", self._gateway.unregister(self.runner_id), None)

    async def register(self) -> None:
        """Write this runner's row."""
        config = self._services.config
        definitions = self._services.registry.definitions
        await _quietly(
            "register_runner",
            self._gateway.register(
                self.runner_id,
                http_address=self.http_address,
                actor_types=sorted(definitions) if config.host_actors else [],
                job_types=sorted(f"{t}.{j}" for t, j in config.executes),
                version=__version__,
                models=(declared.models(definitions.values()) if config.host_actors else {}),
            ),
            None,
        )

    async def state_paths(self, actor_type: str, version: int) -> list[list[str]]:
        """The key paths that live runners' newer models of ``actor_type`` declare at ``version``.

        Newer: the model was first recorded after this runner's (``declared``). Asked by a
        turn whose loss guard found keys to drop (evolution E4, migration 0014); a failure is
        raised (the turn answers it as retryable), never read as "none".
        """
        definition = self._services.registry.definitions.get(actor_type)
        if definition is None:
            return []
        skew_ms = self._services.clock.skew_ms(0)
        return await self._gateway.state_paths(
            actor_type,
            version,
            declared.fingerprint(definition),
            live_ms=LIVE_MS,
            skew_ms=skew_ms,
        )

    async def declares_command(self, actor_type: str, command: str) -> bool:
        """Whether a live runner's code declares ``actor_type``'s ``command`` (migration 0014).

        Asked by a relay about to park an intent to a command its own code does not declare.
        """
        skew_ms = self._services.clock.skew_ms(0)
        return await self._gateway.declares_command(
            actor_type, command, live_ms=LIVE_MS, skew_ms=skew_ms
        )

    async def declares_job(self, actor_type: str, job: str) -> bool:
        """Whether a live runner's code declares ``actor_type``'s ``job`` (migration 0014).

        Asked by the maintenance owner about to park due rows of a job its own code does not
        declare: a deploy that added the job leaves them due for the newer code.
        """
        skew_ms = self._services.clock.skew_ms(0)
        return await self._gateway.declares_job(actor_type, job, live_ms=LIVE_MS, skew_ms=skew_ms)

    async def live(self) -> list[LiveRunner]:
        """Live runners (heartbeat younger than 35 s)."""
        skew_ms = self._services.clock.skew_ms(0)
        return await _quietly(
            "live_runners", self._gateway.live(live_ms=LIVE_MS, skew_ms=skew_ms), []
        )

    async def check_orphans(self, *, owner: bool) -> None:
        """Warn about stored names no definition claims (evolution E2); never raises.

        ``owner``: this runner owns ``$maintenance`` and sets the ``akter.orphans`` gauge.
        """
        try:
            skew_ms = self._services.clock.skew_ms(0)
            live = await self._gateway.live(live_ms=LIVE_MS, skew_ms=skew_ms)
            hosted = {t for row in live for t in row.actor_types}
            await self.orphans.check(hosted, owner=owner)
        except (psycopg.Error, OSError) as exc:
            log.warning("Orphan check failed", extra={"error": str(exc)})
        except Exception:
            # A bug, not an outage: say so loudly; a warning is not worth stopping for.
            log.exception("Orphan check raised unexpectedly")

    async def prune(self) -> None:
        """Forget silent runners, and runners whose heartbeat is ahead of the clock (skew)."""
        pruned = await _quietly(
            "prune_runners", self._gateway.prune(prune_ms=PRUNE_MS, live_ms=LIVE_MS), []
        )
        for row in pruned:
            if row.ahead_ms > LIVE_MS:
                log.warning(
                    "Pruned a runner whose heartbeat is ahead of the database clock "
                    "(the clock moved back): runner %s, %s ms ahead",
                    row.runner_id,
                    row.ahead_ms,
                    extra={"pruned_runner_id": row.runner_id, "skew_ms": row.ahead_ms},
                )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_ms / 1000)
            supervisor = self._services.supervisor
            try:
                alive = await self._gateway.heartbeat(self.runner_id, draining=self.draining)
                if not alive:
                    await self.register()
                if supervisor.readiness == "storage":
                    supervisor.readiness = "ready"
            except (psycopg.Error, OSError) as exc:
                log.warning("Runner heartbeat failed", extra={"error": str(exc)})
                if supervisor.readiness == "ready":
                    supervisor.readiness = "storage"

    # --- leases -----------------------------------------------------------------------------

    async def _contend(self) -> None:
        while True:
            renewed = await self._renew_owned()
            for lease in self._leases.values():
                if lease.actor_type not in renewed:
                    await self._refresh(lease)
            await asyncio.sleep(self.refresh_ms / 1000)

    async def _renew_owned(self) -> set[str]:
        """Renew the leases this runner holds in one statement; the types renewed.

        A lease being refreshed right now (``ActorTest.advance``) is left to its round, and one
        no longer this runner's gets a full round. A failed statement counts as this round's
        attempt for every lease held (as a failed full round would): each stays as it was and
        its loop's guard stops it if the lease is not renewed in time.
        """
        held = [lease for lease in self._leases.values() if lease.owned]
        held = [lease for lease in held if not lease.refreshing.locked()]
        if not held:
            return set()
        for lease in held:
            await lease.refreshing.acquire()  # unlocked: returns without yielding
        try:
            sent = time.monotonic()
            try:
                rows = await self._gateway.renew_singletons(
                    [lease.actor_type for lease in held], self.runner_id, lease_ms=self.lease_ms
                )
            except (psycopg.Error, OSError) as exc:
                log.warning("Singleton lease renewal failed", extra={"error": str(exc)})
                return {lease.actor_type for lease in held}
            by_type = {row.actor_type: row for row in rows}
            for lease in held:
                if lease.actor_type in by_type:
                    await self._apply(lease, [by_type[lease.actor_type]], sent)
            return set(by_type)
        finally:
            for lease in held:
                lease.refreshing.release()

    async def refresh_leases(self, *, owned: bool) -> None:
        """One refresh round now: of the leases held (``owned``), else contend for the others.

        ``ActorTest.advance`` runs it after a clock jump, holders first on every runner, as the
        background refreshes would have during that time.
        """
        for lease in list(self._leases.values()):
            if lease.owned == owned:
                await self._refresh(lease)

    async def _refresh(self, lease: _Lease) -> None:
        async with lease.refreshing:
            await self._refresh_once(lease)

    async def _refresh_once(self, lease: _Lease) -> None:
        sent = time.monotonic()
        rows: list[SingletonLease] = []
        failed = False
        try:
            rows = await self._gateway.acquire_singleton(
                lease.actor_type,
                lease.routing_key,
                self.runner_id,
                lease_ms=self.lease_ms,
                skew_ms=self._services.clock.skew_ms(self.lease_ms),
                # A takeover waits for the old owner's fenced turns; never longer than half a
                # refresh, so one stuck lease row cannot hold up this runner's other leases.
                lock_wait_ms=max(50, self.refresh_ms // 2),
            )
        except (psycopg.Error, OSError) as exc:
            failed = True
            log.warning("Singleton lease refresh failed", extra={"error": str(exc)})
        await self._apply(lease, rows, sent, failed=failed)

    async def _apply(
        self, lease: _Lease, rows: list[SingletonLease], sent: float, *, failed: bool = False
    ) -> None:
        """Act on a lease round's answer: one row (sent at ``sent``) iff this runner owns it."""
        if rows and rows[0].skew_ms is not None:
            log.warning(
                "Took over a singleton lease ahead of the database clock (the clock moved back): "
                "singleton %s",
                lease.actor_type,
                extra={
                    "actor_type": lease.actor_type,
                    "runner_id": self.runner_id,
                    "skew_ms": rows[0].skew_ms,
                },
            )
        if rows:
            epoch = rows[0].acquired_at_ms
            lease.owned = True
            lease.confirmed_at = sent
            if lease.task is not None and not lease.task.done() and lease.epoch != epoch:
                # Lost and taken again since this loop started: its fence is stale, restart it.
                await self._stop_loop(lease)
            if lease.task is None or lease.task.done():
                lease.epoch = epoch
                lease.runs += 1
                lease.events.append(("started", time.monotonic()))
                lease.task = asyncio.create_task(
                    self._guarded(lease), name=f"akter.singleton {lease.actor_type}"
                )
        elif not failed:
            # Another runner holds the lease: never run the loop here.
            lease.owned = False
            await self._stop_loop(lease)

    async def _guarded(self, lease: _Lease) -> None:
        """Run the loop body, stopping it once the lease is no longer known to be fresh."""
        body = asyncio.create_task(lease.body(), name=f"akter.singleton.body {lease.actor_type}")
        try:
            while not body.done():
                # 5 s at the default 35 s lease; proportionally less for short (test) leases.
                margin = min(STOP_MARGIN_MS, self.lease_ms // 7)
                left = lease.confirmed_at + (self.lease_ms - margin) / 1000 - time.monotonic()
                if left <= 0:
                    log.warning(
                        "Singleton lease not refreshed in time; stopping its loop: singleton %s",
                        lease.actor_type,
                        extra={"actor_type": lease.actor_type},
                    )
                    lease.owned = False
                    break
                await asyncio.wait({body}, timeout=left)
        finally:
            if not body.done():
                body.cancel()
            await asyncio.gather(body, return_exceptions=True)
            lease.events.append(("stopped", time.monotonic()))
            if body.done() and not body.cancelled() and body.exception() is not None:
                log.error(
                    "Singleton loop failed: singleton %s",
                    lease.actor_type,
                    exc_info=body.exception(),
                    extra={"actor_type": lease.actor_type},
                )

    async def _stop_loop(self, lease: _Lease) -> None:
        task = lease.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if lease.task is task:  # a loop started meanwhile is not this call's to forget
            lease.task = None

    def owns(self, actor_type: str) -> bool:
        """Whether this runner currently holds the lease of ``actor_type``."""
        lease = self._leases.get(actor_type)
        return bool(lease and lease.owned and lease.task is not None and not lease.task.done())

    def _singleton_body(self, actor_type: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def body() -> None:
            # Fenced on the acquisition that started this loop (set just before it started).
            epoch = self._leases[actor_type].epoch
            await self._run_singleton_loop(actor_type, self.runner_id, epoch)

        return body

    async def _maintenance_body(self) -> None:
        from akter._engine.retention import sweep

        # Sampled gauges (semantics §10.1) on their own cadence, only while this body runs.
        sampling = asyncio.create_task(self._sampling(), name="akter.maintenance.sampling")
        try:
            while True:
                try:
                    await sweep(self._services)
                    await self.prune()
                    await self.check_orphans(owner=True)
                except (psycopg.Error, OSError) as exc:
                    log.warning("Maintenance sweep failed", extra={"error": str(exc)})
                await asyncio.sleep(SWEEP_EVERY_MS / 1000)
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)

    async def _sampling(self) -> None:
        # A method of the registry (not the sampler's own), so the task counts as the runner's.
        await self.sampler.run()


async def _quietly(statement: str, write: Awaitable[T], failed: T) -> T:
    """Await runner bookkeeping; an outage is logged and answered with ``failed``."""
    try:
        return await write
    except (psycopg.Error, OSError) as exc:
        log.warning("Runner bookkeeping failed", extra={"statement": statement, "error": str(exc)})
        return failed


def _is_base_run(run: Any) -> bool:
    from akter.actor import Actor

    return getattr(run, "__qualname__", "") == getattr(Actor.run, "__qualname__", None)
