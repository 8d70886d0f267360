"""Subscriptions: an actor reacts to another actor's events (the subscriptions spec).

``@akter.subscription(Source, events=[...], route=...)`` declares a subscriber's handler, an
internal command that only the subscription lane delivers; :class:`Delivery` is what it gets,
or a :class:`RetentionGap` when the history it needed was pruned. A dynamic subscription (no
``route=``) is started and stopped by ``self.subscribe(...)`` / ``self.unsubscribe(...)`` in a
command (:class:`Subscribing`, a base of ``akter.Actor``), staged until the turn commits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

from akter._contexts import CommandContext
from akter._event_decl import Event, decode_stored
from akter._ids import placement_key, routing_key
from akter._members import command, definition_of
from akter._staging import StagedFollow
from akter.callers import ActorRef
from akter.errors import CapabilityEscaped, DefinitionError, ReadOnlyError, invalid_input

E = TypeVar("E")
H = TypeVar("H", bound=Callable[..., Coroutine[Any, Any, None]])

#: The attribute a subscription's handler carries its :class:`SubscriptionSpec` on.
SPEC_ATTR = "__akter_subscription__"

Start = Literal["now", "start"]


@dataclass(frozen=True)
class Delivery(Generic[E]):
    """One source event delivered to a subscriber (the subscriptions spec S1, S2).

    Attributes:
        source: The actor that emitted the event (in the subscriber's tenant).
        cursor: The event's sequence number in its source's log.
        event: The event, decoded through its class's aliases and payload migrations (raw, the
            stored JSON, when this code cannot decode it).
        emitted_at: When the source's turn emitted it.
    """

    source: ActorRef
    cursor: int
    event: E
    emitted_at: datetime


@dataclass(frozen=True)
class RetentionGap(Delivery[Any]):
    """Events the subscriber had not applied were pruned (S5): one delivery per gap.

    ``event`` is ``None``; events ``after + 1`` to ``resume_after`` are gone, and the next
    delivery is the event after ``resume_after``. Reconcile from the source's state.

    Attributes:
        after: The last cursor the subscription had applied from this source.
        resume_after: The cursor deliveries resume after.
    """

    after: int = 0
    resume_after: int = 0


@dataclass(frozen=True)
class SubscriptionSpec:
    """What ``@akter.subscription`` recorded on a handler."""

    source: type[Any]
    events: tuple[type[Event], ...]
    route: Callable[[Any, ActorRef], str] | None
    start: Start

    @property
    def source_type(self) -> str:
        """The source actor type's name."""
        return definition_of(self.source).name

    @functools.cached_property
    def classes(self) -> dict[str, type[Event]]:
        """The event classes by tag and alias (what a delivery decodes with)."""
        found: dict[str, type[Event]] = {}
        for klass in self.events:
            for tag in (klass.event_tag, *klass.event_aliases):
                found.setdefault(tag, klass)
        return found


def subscription(
    source: type[Any],
    *,
    events: Sequence[type[Event]],
    route: Callable[[Any, ActorRef], str] | None = None,
    start: Start = "now",
) -> Callable[[H], H]:
    """Declare a subscriber's handler: ``async def on_x(self, delivery: akter.Delivery[E])``.

    Args:
        source: The actor class whose events it follows.
        events: The event classes it receives (others of the source are not delivered).
        route: ``route(event, source) -> subscriber id``: a routed subscription. Without it the
            subscription is dynamic: ``self.subscribe(Handler, source_id=...)`` starts it.
        start: Where a routed subscription added to a deployed system starts: ``"now"`` (each
            source's next commit) or ``"start"`` (its retained history).
    """
    if not (isinstance(source, type) and hasattr(source, "__akter_definition__")):
        raise DefinitionError(f"@subscription takes an akter.Actor class, not {source!r}.")
    classes = tuple(events)
    if not classes or not all(isinstance(k, type) and issubclass(k, Event) for k in classes):
        raise DefinitionError("@subscription(events=[...]) takes one or more akter.Event classes.")
    if route is not None and not callable(route):
        raise DefinitionError("@subscription(route=...) must be callable: (event, source) -> id.")
    if start not in ("now", "start"):
        raise DefinitionError(f"@subscription(start=...) is 'now' or 'start', not {start!r}.")
    spec = SubscriptionSpec(source, classes, route, start)

    def mark(fn: H) -> H:
        async def handler(self: Any, delivery: dict[str, Any]) -> None:
            await fn(self, delivery_of(spec, self.tenant, delivery))

        handler.__name__ = fn.__name__
        handler.__qualname__ = fn.__qualname__
        handler.__doc__ = fn.__doc__
        handler.__module__ = fn.__module__
        setattr(handler, SPEC_ATTR, spec)
        return command(internal=True)(handler)  # type: ignore[return-value]

    return mark


def spec_of(fn: Any) -> SubscriptionSpec | None:
    """The subscription a handler declares, if it is one."""
    spec = getattr(fn, SPEC_ATTR, None)
    return spec if isinstance(spec, SubscriptionSpec) else None


def delivery_payload(
    subscription: str,
    source_type: str,
    source_id: str,
    cursor: int,
    *,
    tag: str = "",
    payload: Any = None,
    version: int = 0,
    emitted_at_ms: int = 0,
    gap_after: int | None = None,
) -> dict[str, Any]:
    """The payload of a delivery command (what the lane sends, the handler's wrapper reads)."""
    body: dict[str, Any] = {
        "subscription": subscription,
        "source_type": source_type,
        "source_id": source_id,
        "cursor": cursor,
        "tag": tag,
        "payload": payload,
        "version": version,
        "emitted_at_ms": emitted_at_ms,
    }
    if gap_after is not None:
        body["gap_after"] = gap_after
    return {"delivery": body}


def delivery_of(spec: SubscriptionSpec, tenant: str, body: dict[str, Any]) -> Delivery[Any]:
    """A delivery payload as the handler gets it: the event decoded, or a gap."""
    source = ActorRef(tenant, body["source_type"], body["source_id"])
    cursor = int(body["cursor"])
    emitted_at = datetime.fromtimestamp(int(body["emitted_at_ms"]) / 1000, tz=UTC)
    if "gap_after" in body:
        return RetentionGap(source, cursor, None, emitted_at, int(body["gap_after"]), cursor)
    tag = body["tag"]
    event, _ = decode_stored(spec.classes.get(tag), tag, body["payload"], int(body["version"]))
    return Delivery(source, cursor, event, emitted_at)


def _source(spec: SubscriptionSpec, ctx: CommandContext, source_id: str) -> tuple[str, str, int]:
    """The source's type, id and routing key (in the subscriber's tenant, S4)."""
    source = definition_of(spec.source)
    key = placement_key(source.placement, ctx.ref.tenant, source.name, source_id)
    return source.name, source_id, routing_key(key)


class Subscribing:
    """``self.subscribe`` / ``self.unsubscribe``: a base of ``akter.Actor``."""

    def subscribe(
        self,
        handler: Callable[..., Coroutine[Any, Any, None]],
        *,
        source_id: str,
        start: Start | int = "now",
    ) -> None:
        """Follow ``source_id``'s events with ``handler`` if the turn commits (dynamic, S8).

        ``start``: ``"now"`` (events after the source's newest at the commit), ``"start"``
        (its retained history) or a cursor to apply events after. Subscribing again restarts.
        """
        name, spec, ctx = self._follow(handler, source_id, "subscribe")
        if start == "now":
            after: int | None = None
        elif start == "start":
            after = 0
        elif isinstance(start, int) and not isinstance(start, bool) and start >= 0:
            after = start
        else:
            raise invalid_input(
                f"subscribe(start=...) is 'now', 'start' or a cursor ≥ 0, not {start!r}."
            )
        ctx.staged.ops.append(StagedFollow(name, *_source(spec, ctx, source_id), after, True))

    def unsubscribe(
        self, handler: Callable[..., Coroutine[Any, Any, None]], *, source_id: str
    ) -> None:
        """Stop following ``source_id`` with ``handler`` if the turn commits."""
        name, spec, ctx = self._follow(handler, source_id, "unsubscribe")
        ctx.staged.ops.append(StagedFollow(name, *_source(spec, ctx, source_id), None, False))

    def _follow(
        self, handler: Any, source_id: Any, what: str
    ) -> tuple[str, SubscriptionSpec, CommandContext]:
        ctx = self.__dict__.get("_akter_ctx")
        if ctx is None:
            raise CapabilityEscaped(
                "Turn capabilities exist only inside a command or query handler run by akter."
            )
        if not isinstance(ctx, CommandContext):
            raise ReadOnlyError(f"{what}() is not available in a query: queries are read-only.")
        ctx.check()
        spec = spec_of(handler)
        owner = getattr(handler, "__akter_owner__", None)
        if spec is None or owner is None:
            raise invalid_input(f"{what}() takes a subscription handler, not {handler!r}.")
        if spec.route is not None:
            raise invalid_input(
                f"{owner.name}.{handler.__name__} is routed: it cannot be subscribed by hand."
            )
        if owner.name != ctx.ref.type:
            raise invalid_input(
                f"{what}() takes a subscription of {ctx.ref.type}, not of {owner.name}."
            )
        if not isinstance(source_id, str):
            raise invalid_input(f"{what}(source_id=...) must be a string, not {source_id!r}.")
        return f"{owner.name}.{handler.__name__}", spec, ctx
