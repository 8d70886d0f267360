"""One round of one claimed feed: read, route, deliver in order, settle (the subscriptions spec).

A round reads up to ``batch`` events of the source after the feed's ``done`` and finds their
subscribers: ``route(event, source)`` for a routed subscription, the feed's follows for a
dynamic one. Each subscriber gets its events in cursor order, in a task of its own: first its
applied cursor is read (S1: what it applied is acknowledged without a delivery), then each
later event is delivered as the subscription's command, one turn each. A failing subscriber
stops at its failed event; the others go on (S6). The feed's ``done`` then moves to the last
event read, or to just before the earliest failed one, with a backoff: the next round starts
there and the subscribers that went on acknowledge what they applied.

Events pruned before the subscription applied them are a gap: each subscriber that had not
applied past it gets one :class:`akter.RetentionGap` delivery first (S5).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from akter._engine.lanes import Deliver
from akter._event_decl import decode_stored
from akter._store.gateway.events import EventsGateway, StoredEvent
from akter._store.gateway.subscriptions import ClaimedFeed, SubscriptionsGateway
from akter.actor import ActorDefinition
from akter.callers import ActorRef, System
from akter.subscriptions import SubscriptionSpec, delivery_payload

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.subscriptions")

#: Subscribers one round serves at once (a fan-out to thousands stays within the mailboxes'
#: admission limits; each subscriber's events stay in order within its own task).
SUBSCRIBERS_AT_ONCE = 64


class RouteFailed(Exception):
    """A routed subscription's ``route(event, source)`` raised or returned no id: back off."""


@dataclass
class Target:
    """One subscriber's share of a round: its events in order, and where it starts."""

    subscriber_id: str
    #: The cursor the subscriber starts after when it has applied nothing (a follow's start).
    start_after: int = 0
    events: list[StoredEvent] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """What a round did: the feed's new ``done``, and the first failure if any."""

    done: int
    error: str | None = None
    delivered: int = 0


class Round:
    """The deliveries of one claimed feed (module docstring)."""

    def __init__(
        self,
        services: Services,
        gateway: SubscriptionsGateway,
        deliver: Deliver,
        mint: Callable[[], str],
        *,
        definition: ActorDefinition,
        member: str,
        spec: SubscriptionSpec,
        feed: ClaimedFeed,
    ) -> None:
        self._services = services
        self._gateway = gateway
        self._deliver = deliver
        self._mint = mint
        self._definition = definition
        self._member = member
        self._spec = spec
        self._feed = feed
        key = feed.key
        self.source = ActorRef(key.tenant, key.source_type, key.source_id)
        self.delivered = 0

    async def run(self, batch: int) -> Outcome:
        """Read, route and deliver up to ``batch`` events; the feed's new ``done``."""
        feed = self._feed
        key = feed.key
        source_key = {"rk": key.routing_key, "tenant": key.tenant, "type": key.source_type}
        page = await EventsGateway(self._services.store).read(
            {**source_key, "id": key.source_id},
            after=feed.done,
            limit=batch,
            wait_s=self._services.config.query_pool_wait_ms / 1000,
            what=f"the events of {key.source_type}/{key.source_id!r}",
        )
        if page is None:
            return Outcome(feed.head)  # no source row: nothing was ever committed
        first = page.first_seq if page.first_seq is not None else page.event_seq + 1
        # Events after ``done`` pruned before they were delivered: a gap up to ``first - 1``.
        gap = first - 1 if first - 1 > feed.done else None
        last = page.events[-1].seq if page.events else max(feed.done, gap or 0)
        targets = await self._targets(page.events, gap)
        if not targets:
            return Outcome(last)
        bound = asyncio.Semaphore(SUBSCRIBERS_AT_ONCE)

        async def serve(target: Target) -> tuple[int | None, str | None]:
            async with bound:
                return await self._serve(target, gap)

        failures = await asyncio.gather(*(serve(t) for t in targets))
        failed = [(seq, err) for seq, err in failures if seq is not None]
        if not failed:
            return Outcome(last, None, self.delivered)
        seq, error = min(failed, key=lambda f: f[0])
        return Outcome(seq - 1, error, self.delivered)

    async def _targets(self, events: Sequence[StoredEvent], gap: int | None) -> list[Target]:
        spec = self._spec
        mine = [e for e in events if e.tag in spec.classes]
        if spec.route is None:
            follows = await self._gateway.followers(self._feed.key)
            targets = [Target(sid, start) for sid, start in follows]
            for t in targets:
                t.events = [e for e in mine if e.seq > t.start_after]
            return [t for t in targets if t.events or (gap is not None and gap > t.start_after)]
        by_id: dict[str, Target] = {}
        if gap is not None:
            for sid, applied in await self._gateway.holders(self._definition.name, self._feed.key):
                if applied < gap:
                    by_id.setdefault(sid, Target(sid))
        for e in mine:
            event, _ = decode_stored(spec.classes.get(e.tag), e.tag, e.payload, e.payload_version)
            try:
                sid = spec.route(event, self.source)
            except Exception as exc:
                raise RouteFailed(
                    f"the route raised {type(exc).__name__}: {exc} (event {e.seq})"
                ) from exc
            if not isinstance(sid, str):
                raise RouteFailed(
                    f"the route returned {sid!r}, not a subscriber id (event {e.seq})"
                )
            by_id.setdefault(sid, Target(sid)).events.append(e)
        return list(by_id.values())

    async def _serve(self, target: Target, gap: int | None) -> tuple[int | None, str | None]:
        """Deliver a subscriber's events in order: ``(first failed cursor, why)`` or ``None``s."""
        # S4: the subscriber is addressed in the feed's (the source's) tenant, at each delivery.
        ref = ActorRef(self.source.tenant, self._definition.name, target.subscriber_id)
        subscriber = {
            "rk": self._services.registry.routing_key(ref),
            "tenant": ref.tenant,
            "type": ref.type,
            "id": ref.id,
        }
        stored = await self._gateway.applied(subscriber, self._feed.key)
        applied = target.start_after if stored is None else stored
        key = self._feed.key
        if gap is not None and applied < gap:
            payload = delivery_payload(
                key.subscription, key.source_type, key.source_id, gap, gap_after=applied
            )
            error = await self._one(ref, payload, gap)
            if error is not None:
                return gap, error
            applied = gap
        for e in target.events:
            if e.seq <= applied:
                continue  # applied already (S1, S3): acknowledged without the handler
            payload = delivery_payload(
                key.subscription,
                key.source_type,
                key.source_id,
                e.seq,
                tag=e.tag,
                payload=e.payload,
                version=e.payload_version,
                emitted_at_ms=e.emitted_at_ms,
            )
            error = await self._one(ref, payload, e.seq)
            if error is not None:
                return e.seq, error
        return None, None

    async def _one(self, ref: ActorRef, payload: dict[str, Any], cursor: int) -> str | None:
        """One delivery turn; ``None`` when it committed, else why it failed."""
        hooks = self._services.hooks
        if hooks.armed("before_subscription_delivery"):
            info = {"ref": ref, "source": self.source, "cursor": cursor}
            await hooks.at("before_subscription_delivery", info)
        caller = System(source="subscription", ref=self.source)
        result = await self._deliver(ref, self._member, payload, self._mint(), caller)
        if result.kind in ("ok", "declared"):
            self.delivered += 1
            return None
        return f"{type(result.error).__name__}: {result.error}"
