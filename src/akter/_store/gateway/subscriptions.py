"""The subscriptions' statements (``queries_subscriptions.sql``, the subscriptions spec).

In a turn's commit flight (on its pipeline): a source's feed bumps (:func:`bump_feeds`), a
subscriber's follows (:func:`follow`) and a delivery's applied cursors (:func:`advance`). On
the framework pool (:class:`SubscriptionsGateway`): the lane's scans, claims, settles and
parkings, its dedup probes, and the records of declared subscriptions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._store.pipeline import Answer, Statements
from akter._store.queries import Queries

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

#: The parameters that address one actor row (``rk``, ``tenant``, ``type``, ``id``).
Key = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class FeedBump:
    """One (source, subscription) a batch's events match: its newest cursor and new floor."""

    subscription: str
    head: int
    floor: int
    routed: bool


@dataclass(frozen=True, slots=True)
class Advance:
    """One delivery of a batch: the applied cursor its turn records (S1)."""

    subscription: str
    source_type: str
    source_id: str
    cursor: int


async def bump_feeds(
    pipe: Statements,
    q: Queries,
    key: Key,
    now_ms: int,
    bumps: Sequence[FeedBump],
    *,
    rows_apart: bool = False,
) -> None:
    """Queue the source's feed writes: routed ones upserted, dynamic ones moved if they exist.

    ``rows_apart`` (Citus): one ``citus_sub_feed_bump_routed`` per routed feed, routed to the
    source's shard (the upsert from ``unnest`` is pulled to the coordinator there, and makes
    the turn's commit two-phase: ``akter._store.gateway.citus_writes``).
    """
    routed = [b for b in bumps if b.routed]
    dynamic = [b for b in bumps if not b.routed]
    if routed and rows_apart:
        for b in routed:
            await pipe.execute(
                q["citus_sub_feed_bump_routed"],
                {**key, "now": now_ms, "name": b.subscription, "head": b.head, "floor": b.floor},
            )
    elif routed:
        await pipe.execute(
            q["sub_feeds_bump_routed"],
            {
                **key,
                "now": now_ms,
                "names": [b.subscription for b in routed],
                "heads": [b.head for b in routed],
                "floors": [b.floor for b in routed],
            },
        )
    if dynamic:
        await pipe.execute(
            q["sub_feeds_bump_dynamic"],
            {
                **key,
                "now": now_ms,
                "names": [b.subscription for b in dynamic],
                "heads": [b.head for b in dynamic],
            },
        )


async def follow(
    pipe: Statements,
    q: Queries,
    source: Key,
    subscriber: Key,
    *,
    subscription: str,
    after: int | None,
    active: bool,
    now_ms: int,
) -> None:
    """Queue a subscriber's follow (``active``) or unfollow of one source."""
    reset = {
        **subscriber,
        "subscription": subscription,
        "source_type": source["type"],
        "source_id": source["id"],
    }
    await pipe.execute(q["sub_cursor_reset"], reset)
    params = {**source, "subscription": subscription, "subscriber": subscriber["id"]}
    if not active:
        await pipe.execute(q["sub_unfollow"], params)
        return
    await pipe.execute(q["sub_follow"], {**params, "after": after})
    await pipe.execute(
        q["sub_feed_open"],
        {**source, "subscription": subscription, "after": after, "now": now_ms},
    )


def advance(
    pipe: Statements, q: Queries, key: Key, now_ms: int, advances: Sequence[Advance]
) -> Awaitable[Answer]:
    """Queue the batch's applied cursors (a stale one fails the flight: nothing commits)."""
    return pipe.execute(
        q["sub_cursor_advance"],
        {
            **key,
            "now": now_ms,
            "subscriptions": [a.subscription for a in advances],
            "source_types": [a.source_type for a in advances],
            "source_ids": [a.source_id for a in advances],
            "cursors": [a.cursor for a in advances],
        },
    )


@dataclass(frozen=True, slots=True)
class FeedKey:
    """One feed row's address: its source and subscription."""

    routing_key: int
    tenant: str
    source_type: str
    source_id: str
    subscription: str

    def params(self) -> dict[str, Any]:
        """The statement parameters that address the row."""
        return {
            "rk": self.routing_key,
            "tenant": self.tenant,
            "type": self.source_type,
            "id": self.source_id,
            "subscription": self.subscription,
        }


@dataclass(frozen=True, slots=True)
class ClaimedFeed:
    """A feed claimed for one delivery round."""

    key: FeedKey
    head: int
    done: int
    attempts: int
    token: str


@dataclass(frozen=True, slots=True)
class Overview:
    """One subscription's feeds: with work, parked, and the age of the newest pending head."""

    subscription: str
    pending: int
    parked: int
    lag_ms: int


class SubscriptionsGateway:
    """The lane's statements on the framework pool."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def _rows(self, statement: Any, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(statement, params)
            return await cur.fetchall() if cur.description is not None else []

    async def _count(self, statement: Any, params: Mapping[str, Any]) -> int:
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(statement, params)
            return cur.rowcount

    async def scan(self, types: Sequence[str], limit: int) -> list[FeedKey]:
        """Feeds with due work of the subscriber ``types``, read without locks."""
        params = {"off": self._clock.offset_ms, "types": list(types), "limit": limit}
        rows = await self._rows(self._store.queries["sub_feeds_scan"], params)
        return [
            FeedKey(
                int(r["routing_key"]),
                str(r["tenant_id"]),
                str(r["actor_type"]),
                str(r["actor_id"]),
                str(r["subscription"]),
            )
            for r in rows
        ]

    async def claim(self, key: FeedKey, token: str, lease_ms: int) -> ClaimedFeed | None:
        """Claim one feed until its lease ends; ``None`` if another runner holds it."""
        params = {**key.params(), "token": token, "lease": lease_ms, "off": self._clock.offset_ms}
        rows = await self._rows(self._store.queries["sub_feed_claim"], params)
        if not rows:
            return None
        row = rows[0]
        return ClaimedFeed(key, int(row["head"]), int(row["done"]), int(row["attempts"]), token)

    async def settle(
        self, feed: ClaimedFeed, *, done: int, wait_ms: int = 0, error: str | None = None
    ) -> bool:
        """Record what the round delivered and release the claim (backing off ``wait_ms``)."""
        params = {
            **feed.key.params(),
            "done": done,
            "wait": wait_ms,
            "error": error,
            "token": feed.token,
            "off": self._clock.offset_ms,
        }
        return await self._count(self._store.queries["sub_feed_settle"], params) == 1

    async def park(self, feed: ClaimedFeed, reason: str) -> None:
        """Park the feed with ``reason`` (it is not claimed again until an operator acts)."""
        params = {**feed.key.params(), "reason": reason, "token": feed.token}
        await self._count(self._store.queries["sub_feed_park"], params)

    async def followers(self, key: FeedKey) -> list[tuple[str, int]]:
        """A dynamic feed's followers and the cursor each starts after."""
        rows = await self._rows(self._store.queries["sub_follows_read"], key.params())
        return [(str(r["subscriber_id"]), int(r["start_after"])) for r in rows]

    async def applied(self, subscriber: Key, key: FeedKey) -> int | None:
        """A subscriber's applied cursor of the feed's source (``None``: nothing applied)."""
        params = {
            **subscriber,
            "subscription": key.subscription,
            "source_type": key.source_type,
            "source_id": key.source_id,
        }
        rows = await self._rows(self._store.queries["sub_cursor_read"], params)
        return int(rows[0]["applied"]) if rows else None

    async def holders(self, subscriber_type: str, key: FeedKey) -> list[tuple[str, int]]:
        """The routed subscribers that applied events of the feed's source (a gap's receivers)."""
        params = {
            "tenant": key.tenant,
            "type": subscriber_type,
            "subscription": key.subscription,
            "source_type": key.source_type,
            "source_id": key.source_id,
        }
        rows = await self._rows(self._store.queries["sub_cursor_holders"], params)
        return [(str(r["actor_id"]), int(r["applied"])) for r in rows]

    async def record(self, name: str, source_type: str, shape: str, start: str) -> bool:
        """Record a declared subscription; ``True`` only the first time."""
        params = {
            "name": name,
            "source_type": source_type,
            "shape": shape,
            "start": start,
            "off": self._clock.offset_ms,
        }
        return bool(await self._rows(self._store.queries["sub_record"], params))

    async def backfill(self, name: str, source_type: str, now_ms: int) -> int:
        """A feed from the start for every source of ``source_type`` with events (S8)."""
        params = {"name": name, "source_type": source_type, "now": now_ms}
        return await self._count(self._store.queries["sub_backfill"], params)

    async def recorded(self) -> list[tuple[str, str, str, str]]:
        """Every recorded subscription: name, source type, shape, start."""
        rows = await self._rows(self._store.queries["sub_recorded"], {})
        return [
            (str(r["name"]), str(r["source_type"]), str(r["shape"]), str(r["start"])) for r in rows
        ]

    async def overview(self) -> list[Overview]:
        """Per subscription: feeds with work, parked feeds, the age of the newest pending head."""
        rows = await self._rows(self._store.queries["sub_overview"], {"off": self._clock.offset_ms})
        return [
            Overview(str(r["subscription"]), int(r["pending"]), int(r["parked"]), int(r["lag_ms"]))
            for r in rows
        ]
