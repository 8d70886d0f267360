"""Event reads with cursors and live feeds (semantics §6).

A cursor is an actor's event sequence number as a decimal string. Reads are exclusive and
ordered; a malformed cursor or one beyond ``event_seq`` is ``UnknownCursor``, one below the first
retained event is ``RetentionGap``: events are never skipped silently. Live feeds replay after a
cursor, then wait for local commits (at once), other runners' commits (``NOTIFY`` or one poll),
and read again by sequence, so they never miss or repeat an event.

Each stored event is decoded by the class that claims its tag or one of its ``aliases=``,
through that class's migrations from the row's ``payload_version`` (evolution E2, E3). A row
this code cannot decode — no class claims the tag, its version is newer than the class's, or
its payload fails the migration or the class — is given raw (the stored JSON object, with its
stored version on the record), so one such row never wedges a page, a feed or a query.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from akter._event_decl import Event, decode_stored
from akter._store.gateway.events import EventsGateway, StoredEvent
from akter._waits import wait_event
from akter.callers import ActorRef
from akter.errors import ActorError
from akter.events import EventRecord, parse_cursor

if TYPE_CHECKING:
    from akter._engine.services import Services

MAX_PAGE = 10_000


def _decode(services: Services, tag: str, payload: Any, version: int) -> tuple[Any, int]:
    """A stored event under this code, or raw (:func:`akter._event_decl.decode_stored`).

    The class is the hosted types' for the tag or alias first, then any declared class.
    """
    klass = services.registry.event_types.get(tag) or Event.registry().get(tag)
    return decode_stored(klass, tag, payload, version)


class EventBus:
    """In-process subscribers per actor, woken after local commits (and on NOTIFY)."""

    def __init__(self) -> None:
        self._subscribers: dict[tuple[str, str, str], set[asyncio.Event]] = {}

    def subscribe(self, ref: ActorRef) -> asyncio.Event:
        """A flag set whenever the actor may have new events."""
        flag = asyncio.Event()
        self._subscribers.setdefault((ref.tenant, ref.type, ref.id), set()).add(flag)
        return flag

    def unsubscribe(self, ref: ActorRef, flag: asyncio.Event) -> None:
        """Stop waking ``flag``."""
        key = (ref.tenant, ref.type, ref.id)
        flags = self._subscribers.get(key)
        if flags is not None:
            flags.discard(flag)
            if not flags:
                del self._subscribers[key]

    def publish(self, ref: ActorRef) -> None:
        """The actor committed events on this runner."""
        for flag in self._subscribers.get((ref.tenant, ref.type, ref.id), ()):
            flag.set()

    def wake_all(self) -> None:
        """Another runner may have committed events: every follower reads again."""
        for flags in self._subscribers.values():
            for flag in flags:
                flag.set()


async def read_events(
    services: Services, ref: ActorRef, after: str | int | None, limit: int = 1000
) -> list[EventRecord]:
    """Committed events of one actor after a cursor, oldest first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ActorError("InvalidInput", f"limit must be from 1 to {MAX_PAGE}.", field="limit")
    start = parse_cursor(after)
    key = {
        "rk": services.registry.routing_key(ref),
        "tenant": ref.tenant,
        "type": ref.type,
        "id": ref.id,
    }
    row = await EventsGateway(services.store).read(
        key,
        after=start,
        limit=limit,
        wait_s=services.config.query_pool_wait_ms / 1000,  # a read like a query: its pool bound
        what=f"the events of {ref.type}/{ref.id!r}",
    )
    event_seq = row.event_seq if row else 0
    if start > event_seq:
        raise ActorError(
            "UnknownCursor",
            f"Cursor {start} is beyond the last event ({event_seq}) of {ref.type}/{ref.id!r}.",
        )
    first = row.first_seq if row and row.first_seq is not None else event_seq + 1
    # No cursor (or "0") starts at the oldest retained event (§6.2); any other cursor below the
    # retained prefix is a gap the reader must hear about.
    if start != 0 and start < first - 1:
        raise ActorError(
            "RetentionGap",
            f"Events {start + 1}–{first - 1} of {ref.type}/{ref.id!r} were pruned; resume from "
            f"cursor {first - 1} and reconcile from state.",
        )
    records = row.events if row else []
    return [_record(services, e) for e in records]


def _record(services: Services, e: StoredEvent) -> EventRecord:
    event, version = _decode(services, e.tag, e.payload, e.payload_version)
    return EventRecord(
        cursor=str(e.seq),
        event=event,
        command_id=e.command_id,
        emitted_at=datetime.fromtimestamp(e.emitted_at_ms / 1000, tz=UTC),
        tag=e.tag,
        version=version,
    )


async def follow(
    services: Services, bus: EventBus, ref: ActorRef, after: str | int | None
) -> AsyncIterator[EventRecord]:
    """Replay after ``after``, then follow new commits live, without gap or repeat.

    ``bus`` is the runner's event bus: it wakes the feed after local commits and on ``NOTIFY``.
    """
    cursor = parse_cursor(after)
    flag = bus.subscribe(ref)
    try:
        while True:
            flag.clear()
            batch = await read_events(services, ref, cursor, MAX_PAGE)
            for record in batch:
                cursor = int(record.cursor)
                yield record
            if len(batch) == MAX_PAGE:
                continue
            await wait_event(flag, services.config.poll_ms / 1000)
    finally:
        bus.unsubscribe(ref, flag)
