"""Actors of the subscriptions tests (the subscriptions spec): orders, warehouses, inboxes."""

from __future__ import annotations

from pydantic import BaseModel

import akter


class OrderPaid(akter.Event, tag="sub.order_paid"):
    warehouse: str
    n: int


class OrderNoted(akter.Event, tag="sub.order_noted"):
    """An event no subscription follows."""

    n: int


class Posted(akter.Event, tag="sub.posted"):
    n: int


class Count(BaseModel):
    n: int = 0


class Seen(BaseModel):
    """What a subscriber applied: ``(source id, cursor, n)`` in order, and gaps."""

    applied: list[tuple[str, int, int]] = []
    gaps: list[tuple[str, int, int]] = []


class Order(akter.Actor[Count], access=akter.public, events=[OrderPaid, OrderNoted]):
    @akter.command
    async def pay(self, warehouse: str, k: int = 1) -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(OrderPaid(warehouse=warehouse, n=self.state.n))
        return self.state.n

    @akter.command
    async def note(self) -> int:
        self.state.n += 1
        self.emit(OrderNoted(n=self.state.n))
        return self.state.n

    @akter.command
    async def pay_then_break(self, warehouse: str) -> int:
        self.state.n += 1
        self.emit(OrderPaid(warehouse=warehouse, n=self.state.n))
        raise RuntimeError("broken after emitting")


#: Subscribers whose handler fails while their id is in here (a defect, S6).
FAILING: set[str] = set()


class Warehouse(akter.Actor[Seen], access=akter.public):
    """Routed: each OrderPaid goes to the warehouse it names."""

    @akter.subscription(Order, events=[OrderPaid], route=lambda event, source: event.warehouse)
    async def on_order(self, delivery: akter.Delivery[OrderPaid]) -> None:
        if self.id in FAILING:
            raise RuntimeError(f"warehouse {self.id} is failing")
        if isinstance(delivery, akter.RetentionGap):
            self.state.gaps.append((delivery.source.id, delivery.after, delivery.resume_after))
            return
        self.state.applied.append((delivery.source.id, delivery.cursor, delivery.event.n))

    @akter.query
    async def seen(self) -> Seen:
        return self.state


class User(akter.Actor[Count], access=akter.public, events=[Posted]):
    @akter.command
    async def post(self, k: int = 1) -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(Posted(n=self.state.n))
        return self.state.n


class Inbox(akter.Actor[Seen], access=akter.public):
    """Dynamic: follows the users it is told to."""

    @akter.subscription(User, events=[Posted])
    async def on_post(self, delivery: akter.Delivery[Posted]) -> None:
        if self.id in FAILING:
            raise RuntimeError(f"inbox {self.id} is failing")
        if isinstance(delivery, akter.RetentionGap):
            self.state.gaps.append((delivery.source.id, delivery.after, delivery.resume_after))
            return
        self.state.applied.append((delivery.source.id, delivery.cursor, delivery.event.n))

    @akter.command
    async def follow(self, user_id: str, start: str | int = "now") -> None:
        self.subscribe(Inbox.on_post, source_id=user_id, start=start)  # type: ignore[arg-type]

    @akter.command
    async def follow_then_break(self, user_id: str) -> None:
        self.subscribe(Inbox.on_post, source_id=user_id)
        raise RuntimeError("broken after subscribing")

    @akter.command
    async def unfollow(self, user_id: str) -> None:
        self.unsubscribe(Inbox.on_post, source_id=user_id)

    @akter.query
    async def seen(self) -> Seen:
        return self.state


class Reading(akter.Event, tag="sub.reading"):
    board: str
    n: int


class Sensor(
    akter.Actor[Count],
    access=akter.public,
    events=[Reading],
    keep_events=10,
    hold_events_for_subscribers=20,
):
    """A source with a short retention: 10 s, held 20 s more for subscriptions (S5)."""

    @akter.command
    async def read(self, board: str, k: int = 1) -> int:
        for _ in range(k):
            self.state.n += 1
            self.emit(Reading(board=board, n=self.state.n))
        return self.state.n


class Board(akter.Actor[Seen], access=akter.public):
    @akter.subscription(Sensor, events=[Reading], route=lambda event, source: event.board)
    async def on_reading(self, delivery: akter.Delivery[Reading]) -> None:
        if self.id in FAILING:
            raise RuntimeError(f"board {self.id} is failing")
        if isinstance(delivery, akter.RetentionGap):
            self.state.gaps.append((delivery.source.id, delivery.after, delivery.resume_after))
            return
        self.state.applied.append((delivery.source.id, delivery.cursor, delivery.event.n))

    @akter.query
    async def seen(self) -> Seen:
        return self.state


class Totals(akter.Actor[Seen], access=akter.public, singleton=True):
    """A projection of every order, from the start of the retained history (S8)."""

    @akter.subscription(Order, events=[OrderPaid], route=lambda event, source: "", start="start")
    async def on_order(self, delivery: akter.Delivery[OrderPaid]) -> None:
        self.state.applied.append((delivery.source.id, delivery.cursor, delivery.event.n))

    @akter.query
    async def seen(self) -> Seen:
        return self.state


ACTORS: list[type[akter.Actor[Count]] | type[akter.Actor[Seen]]] = [
    Order,
    Warehouse,
    User,
    Inbox,
    Sensor,
    Board,
]
