"""The kill drill's subscribers (the subscriptions spec S1–S3): a tally per source, not a list.

A subscriber of the drill keeps, per source actor, the last cursor it applied, how many events
it applied and a running checksum over ``(cursor, n)`` in the order it applied them, plus a
count of the deliveries that came at or below the last cursor (a duplicate or an event out of
order). Its state stays a few hundred bytes however many events flow, so the drill runs at the
issue's size under the state-size limit, and the checker still compares exactly: it computes
the same checksum from the source's event log (:func:`chain`) and asks for the same count, last
cursor and checksum, and zero violations.

The sources are :mod:`tests.integration.subscription_actors`'s ``Order`` (routed to a
warehouse) and ``User`` (followed by inboxes); :data:`ACTORS` is what the drill's runners host.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel

import akter
from tests.integration.subscription_actors import Count, Order, OrderPaid, Posted, User

#: The violations a subscriber keeps word of (the count goes on).
KEEP_VIOLATIONS = 10


def chain(previous: str, cursor: int, n: int) -> str:
    """The running checksum after applying the event at ``cursor`` whose payload says ``n``."""
    return hashlib.sha256(f"{previous}|{cursor}:{n}".encode()).hexdigest()[:16]


class Track(BaseModel):
    """What a subscriber applied of one source."""

    last: int = 0
    count: int = 0
    chain: str = ""


class Tally(BaseModel):
    """A drill subscriber's state: a :class:`Track` per source id, and what went wrong."""

    sources: dict[str, Track] = {}
    violations: int = 0
    seen_violations: list[str] = []
    gaps: int = 0


def apply(state: Tally, delivery: akter.Delivery[OrderPaid] | akter.Delivery[Posted]) -> None:
    """Apply one delivery to the tally (the drill's handlers)."""
    if isinstance(delivery, akter.RetentionGap):
        state.gaps += 1  # the drill prunes nothing: the checker wants none
        return
    track = state.sources.setdefault(delivery.source.id, Track())
    if delivery.cursor <= track.last:
        state.violations += 1
        if len(state.seen_violations) < KEEP_VIOLATIONS:
            state.seen_violations.append(f"{delivery.source.id}#{delivery.cursor}<={track.last}")
    track.last = delivery.cursor
    track.count += 1
    track.chain = chain(track.chain, delivery.cursor, delivery.event.n)


class TallyWarehouse(akter.Actor[Tally], access=akter.public):
    """Routed: each OrderPaid goes to the warehouse it names."""

    @akter.subscription(Order, events=[OrderPaid], route=lambda event, source: event.warehouse)
    async def on_order(self, delivery: akter.Delivery[OrderPaid]) -> None:
        apply(self.state, delivery)


class TallyInbox(akter.Actor[Tally], access=akter.public):
    """Dynamic: follows the users it is told to."""

    @akter.subscription(User, events=[Posted])
    async def on_post(self, delivery: akter.Delivery[Posted]) -> None:
        apply(self.state, delivery)

    @akter.command
    async def follow(self, user_id: str) -> None:
        self.subscribe(TallyInbox.on_post, source_id=user_id, start="start")


ACTORS: list[type[akter.Actor[Count]] | type[akter.Actor[Tally]]] = [
    Order,
    User,
    TallyWarehouse,
    TallyInbox,
]
