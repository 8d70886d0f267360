"""Actors' durable rows for operators: what ``akter inspect``, the console and the test kit show.

Nothing here writes, and nothing runs inside a turn. The console's reads go through the
runner's pool, each under a transaction-local ``statement_timeout`` (past it: ``ActorError``
``Timeout``); ``inspect`` and ``history`` read over a connection of their own to a URL, so they
work without a started runtime. Rows come back as dicts by column name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from akter._engine.services import Services
from akter._store.gateway import ops
from akter._store.gateway.ops import ActorHistory, ActorRows
from akter._store.gateway.subscriptions import SubscriptionsGateway
from akter.callers import ActorRef


class Actors:
    """One runner's operator reads of actor rows (module docstring)."""

    def __init__(self, services: Services) -> None:
        self._services = services

    def _key(self, ref: ActorRef) -> ops.Key:
        return ops.actor_key(self._services.registry.routing_key(ref), ref.tenant, ref.type, ref.id)

    def inspect(self, url: str, ref: ActorRef) -> ActorRows:
        """The actor's committed row (``None`` if it never committed), receipts and outbox rows.

        Synchronous, over a connection of its own to ``url`` (``akter inspect``).
        """
        return ops.inspect_actor(url, self._services.store.queries, self._key(ref))

    async def history(self, url: str, ref: ActorRef) -> ActorHistory:
        """Everything durable of the actor: row, receipts, outbox rows and retained events."""
        return await ops.actor_history(url, self._services.store.queries, self._key(ref))

    async def states(self, refs: Iterable[ActorRef]) -> list[Any]:
        """Each actor's committed state (``None`` for one that never committed), in order."""
        return await ops.committed_states(self._services.store, [self._key(r) for r in refs])

    async def subscriptions(self) -> list[dict[str, Any]]:
        """Per subscription: its subscriber type, feeds with work, parked feeds and lag (ms)."""
        gateway = SubscriptionsGateway(self._services.store, self._services.clock)
        return [
            {
                "subscription": row.subscription,
                "subscriber_type": row.subscription.split(".", 1)[0],
                "pending": row.pending,
                "parked": row.parked,
                "lag_ms": row.lag_ms,
            }
            for row in await gateway.overview()
        ]

    async def types(self, cap: int, timeout_ms: int) -> list[dict[str, Any]]:
        """Actors and tenants per type, counted in a sample of at most ``cap`` actor rows."""
        return await ops.console_types(self._services.store, cap, timeout_ms)

    async def totals(self, cap: int, timeout_ms: int) -> dict[str, Any]:
        """Pending intents, job rows and dead letters, each counted up to ``cap``."""
        return await ops.console_totals(self._services.store, cap, timeout_ms)

    async def page(
        self,
        actor_type: str,
        tenant: str | None,
        after: tuple[str, str],
        limit: int,
        timeout_ms: int,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` actor rows of a type after ``(tenant, id)``, in that order."""
        store = self._services.store
        return await ops.console_actors(store, actor_type, tenant, after, limit, timeout_ms)

    async def row(self, ref: ActorRef, timeout_ms: int) -> dict[str, Any] | None:
        """The actor's row with its receipt count; ``None`` if it never committed."""
        return await ops.console_actor(self._services.store, self._key(ref), timeout_ms)

    async def recent_events(
        self, ref: ActorRef, limit: int, timeout_ms: int
    ) -> list[dict[str, Any]]:
        """The actor's newest ``limit`` retained events, newest first."""
        store = self._services.store
        return await ops.console_recent_events(store, self._key(ref), limit, timeout_ms)

    async def outbox(self, ref: ActorRef, timeout_ms: int) -> list[dict[str, Any]]:
        """The actor's pending outbox rows."""
        return await ops.console_actor_outbox(self._services.store, self._key(ref), timeout_ms)


__all__ = ["ActorHistory", "ActorRows", "Actors"]
