"""What a turn writes for subscriptions (the subscriptions spec), in its commit flight.

Three things, each only when the batch has it: a source's feed rows for the subscriptions its
events match (S7: one row per source and subscription per batch, nothing when none follows
it), the follows its commands staged (``self.subscribe`` / ``self.unsubscribe``), and the
applied cursors of the deliveries it ran (S1). :class:`Followed` is the index of declared
subscriptions by source type that the first needs, built once per runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from akter._staging import StagedEvent, StagedFollow
from akter._store.gateway import subscriptions as gateway
from akter._store.pipeline import Statements
from akter._store.queries import Queries
from akter.actor import ActorDefinition
from akter.subscriptions import SubscriptionSpec, spec_of


@dataclass(frozen=True)
class Watch:
    """One declared subscription as a source's commit sees it."""

    name: str
    tags: frozenset[str]
    routed: bool
    from_start: bool


@dataclass(frozen=True)
class Followed:
    """The declared subscriptions of a runtime: by source type, and by name."""

    by_source: Mapping[str, tuple[Watch, ...]] = field(default_factory=dict)
    specs: Mapping[str, tuple[ActorDefinition, SubscriptionSpec]] = field(default_factory=dict)

    @classmethod
    def of(cls, definitions: Iterable[ActorDefinition]) -> Followed:
        """Index the subscriptions the ``definitions`` declare."""
        by_source: dict[str, list[Watch]] = {}
        specs: dict[str, tuple[ActorDefinition, SubscriptionSpec]] = {}
        for definition in definitions:
            for member in definition.members.values():
                spec = spec_of(member.fn)
                if spec is None:
                    continue
                name = f"{definition.name}.{member.name}"
                specs[name] = (definition, spec)
                watch = Watch(
                    name, frozenset(spec.classes), spec.route is not None, spec.start == "start"
                )
                by_source.setdefault(spec.source_type, []).append(watch)
        return cls({k: tuple(v) for k, v in by_source.items()}, specs)


def bumps(
    watches: Sequence[Watch], events: Sequence[tuple[StagedEvent, str]], first_seq: int
) -> list[gateway.FeedBump]:
    """The feed rows a batch's events (numbered from ``first_seq``) move: one per subscription."""
    found: list[gateway.FeedBump] = []
    for watch in watches:
        head = 0
        for i, (event, _) in enumerate(events):
            if event.tag in watch.tags:
                head = first_seq + i
        if head:
            floor = 0 if watch.from_start else first_seq - 1
            found.append(gateway.FeedBump(watch.name, head, floor, watch.routed))
    return found


def advances(
    definition: ActorDefinition, deliveries: Iterable[tuple[str, Mapping[str, object]]]
) -> list[gateway.Advance]:
    """The applied cursors of a batch's successful deliveries (``(member, payload)`` pairs)."""
    found = []
    for member, payload in deliveries:
        body = payload.get("delivery")
        if not isinstance(body, Mapping) or spec_of(definition.members[member].fn) is None:
            continue
        found.append(
            gateway.Advance(
                f"{definition.name}.{member}",
                str(body["source_type"]),
                str(body["source_id"]),
                int(str(body["cursor"])),
            )
        )
    return found


async def queue(
    pipe: Statements,
    q: Queries,
    key: Mapping[str, object],
    *,
    definition: ActorDefinition,
    followed: Followed | None,
    events: Sequence[tuple[StagedEvent, str]],
    first_seq: int,
    follows: Sequence[StagedFollow],
    delivered: Iterable[tuple[str, Mapping[str, object]]],
    now_ms: int,
    rows_apart: bool = False,
) -> bool:
    """Queue the batch's subscription writes, each only when the batch has it (module doc).

    ``delivered``: the ``(command, payload)`` of the batch's commands that get a receipt.
    ``rows_apart`` (Citus): each routed feed upserted by a statement of its own.
    Returns whether it wrote feeds or follows (the subscription lane has work).
    """
    watches = followed.by_source.get(definition.name, ()) if followed is not None else ()
    bumped = bumps(watches, events, first_seq) if watches and events else []
    if bumped:
        await gateway.bump_feeds(pipe, q, key, now_ms, bumped, rows_apart=rows_apart)
    for op in follows:
        source = {"rk": op.source_rk, "tenant": key["tenant"], "type": op.source_type}
        await gateway.follow(
            pipe,
            q,
            {**source, "id": op.source_id},
            key,
            subscription=op.subscription,
            after=op.start_after,
            active=op.active,
            now_ms=now_ms,
        )
    applied = advances(definition, delivered)
    if applied:
        await gateway.advance(pipe, q, key, now_ms, applied)
    return bool(bumped or follows)
