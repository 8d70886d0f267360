"""Seeding singleton ticks at start, in its own short transaction.

Seeding happens once per start: every runner inserts its singletons' default instance and their
schedule ticks (inserts that already exist are no-ops). Operator actions live in
:mod:`akter.operators`.
"""

from __future__ import annotations

from akter._engine.dispatcher import routing_key_of
from akter._engine.services import Services
from akter._engine.ticks import first_ticks
from akter._ids import canonical_json
from akter._store.gateway.actors import actor_key
from akter._store.gateway.outbox import OutboxRows
from akter.callers import ActorRef


async def seed_singleton_ticks(services: Services) -> None:
    """Insert each hosted singleton's default instance and ticks (idempotent)."""
    if not services.config.host_actors:
        return
    rows = OutboxRows(services.store, services.clock)
    for definition in services.registry.definitions.values():
        if not (definition.singleton and definition.schedules):
            continue
        ref = ActorRef("default", definition.name, "")
        rk = routing_key_of(definition, ref)
        now = await services.clock.read()
        await rows.seed_ticks(
            actor_key(rk, ref.tenant, ref.type, ref.id),
            state=canonical_json(definition.default_state().model_dump(mode="json")),
            ticks=first_ticks(definition, ref, rk, now, services.config.window_ms),
            state_version=definition.state_version,
        )
