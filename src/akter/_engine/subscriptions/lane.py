"""The subscriptions lane as the pass loop drives it: claim feeds, run rounds, settle.

Each pass, :meth:`SubscriptionLane.claim` scans for feeds with work of the subscriber types
this runner hosts (a scan without locks), claims up to its free slots one by one (a keyed
statement each: the same on plain PostgreSQL and Citus) and runs a :class:`Round` per claimed
feed in a task of its own. The round's outcome settles the feed under its claim token: its new
``done``, and a backoff (doubling from ``BACKOFF_FIRST_MS``, capped, with jitter) when a
subscriber failed (S6). A feed whose subscription this code does not declare is parked.

The lane scans on every pass but jobs-only ones, idle polls included: the loop's idle probe
knows the outbox and the runs, not the feeds. That is one probe of the feeds' claim index per
poll, and only on a runner that hosts a subscriber type. A source's commit that wrote a feed
wakes the loop here and pokes the other runners (``BatchWrites.fed``).

Before its first claim the lane records the subscriptions this code declares (the
``subscriptions`` table); a routed one declared ``start="start"`` and recorded for the first
time gets a feed for every source with events (S8).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import psycopg

from akter._engine.lanes import Claimed, Deliver, Pass, Waker
from akter._engine.subscriptions.rounds import Outcome, Round, RouteFailed
from akter._engine.turn.subscribed import Followed
from akter._store.gateway.subscriptions import ClaimedFeed, FeedKey, SubscriptionsGateway
from akter.errors import InjectedCrash

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.subscriptions")

#: Feeds one runner delivers at once, and events one round reads.
SLOTS, BATCH = 16, 256
#: A failing feed's first wait, and the longest.
BACKOFF_FIRST_MS, BACKOFF_MAX_MS = 200, 60_000


def backoff_ms(attempts: int) -> int:
    """The wait after a round's ``attempts``-th consecutive failure (from 0), with jitter."""
    wait = min(BACKOFF_FIRST_MS * 2 ** min(attempts, 20), BACKOFF_MAX_MS)
    return int(wait * random.uniform(0.75, 1.0))


class _Calls(Protocol):
    """The call paths the lane delivers through (``akter._engine.calls.Calls``)."""

    @property
    def deliver_decoded(self) -> Deliver: ...

    def mint_command_id(self) -> str: ...


class SubscriptionLane:
    """One runner's subscriptions lane (module docstring).

    Args:
        services: The runner's services.
        deliver: Delivers one event as the subscription's command (``Calls.deliver_decoded``).
        mint: Mints a command id for each delivery (``Calls.mint_command_id``).
        waker: The pass loop: a round that read a full batch asks for the next pass.
        followed: The declared subscriptions (``Followed.of`` the hosted definitions).
    """

    def __init__(
        self,
        services: Services,
        *,
        deliver: Deliver,
        mint: Callable[[], str],
        waker: Waker,
        followed: Followed,
    ) -> None:
        self._services = services
        self._deliver = deliver
        self._mint = mint
        self._waker = waker
        self._followed = followed
        self._gateway = SubscriptionsGateway(services.store, services.clock)
        self._types = sorted({d.name for d, _ in followed.specs.values()})
        self._running: dict[FeedKey, asyncio.Task[None]] = {}
        self._recorded = False
        self._stopping = False

    @classmethod
    def of(
        cls, services: Services, calls: _Calls, waker: Waker, followed: Followed
    ) -> SubscriptionLane:
        """The lane delivering through ``calls`` (the runtime's call paths)."""
        return cls(
            services,
            deliver=calls.deliver_decoded,
            mint=calls.mint_command_id,
            waker=waker,
            followed=followed,
        )

    async def claim(self, p: Pass) -> Claimed:
        """Claim feeds with work into free slots and start their rounds; return at once.

        A test drain (``p.drain``) first awaits the rounds under way, and then its own: the
        drain's passes see this lane settled, as they see the other lanes' work through their
        runner's controls.
        """
        if not self._types or p.jobs_only or self._stopping:
            return Claimed()
        if not self._recorded:
            await self._record()
        waited = 0
        if p.drain and self._running:
            waited = len(self._running)
            await asyncio.gather(*self._running.values(), return_exceptions=True)
        free = SLOTS - len(self._running)
        if free <= 0:
            return Claimed(0, True)
        keys = await self._gateway.scan(self._types, free + len(self._running))
        started: list[asyncio.Task[None]] = []
        for key in keys:
            if len(started) >= free:
                break
            if key in self._running:
                continue
            # The relay's claim lease (claim_lease): a round that outlives it may be redone by
            # another runner; S1's applied cursor keeps that from applying an event twice.
            lease = self._services.config.claim_lease_ms
            feed = await self._gateway.claim(key, secrets.token_hex(8), lease)
            if feed is None:
                continue
            task = asyncio.create_task(self._round(feed), name=f"akter.subscription:{key}")
            self._running[key] = task
            started.append(task)
        if p.drain and started:
            await asyncio.gather(*started, return_exceptions=True)
        return Claimed(len(started) + waited, len(keys) > free)

    async def stop(self) -> None:
        """Stop the rounds under way (their feeds are claimed again when the lease ends)."""
        self._stopping = True
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()

    async def _record(self) -> None:
        """Record the declared subscriptions; backfill a new start="start" one first (S8).

        The backfill runs before the record, so a runner that dies between the two backfills
        again at its next start (the backfill leaves existing feeds as they are).
        """
        now = await self._services.clock.read()
        known = {name for name, *_ in await self._gateway.recorded()}
        for name, (_, spec) in sorted(self._followed.specs.items()):
            if name in known:
                continue
            if spec.route is not None and spec.start == "start":
                made = await self._gateway.backfill(name, spec.source_type, now)
                log.info(
                    "Subscription %s starts from the retained history of %d %s actors",
                    name,
                    made,
                    spec.source_type,
                    extra={"subscription": name, "feeds": made},
                )
            shape = "dynamic" if spec.route is None else "routed"
            await self._gateway.record(name, spec.source_type, shape, spec.start)
        self._recorded = True

    async def _round(self, feed: ClaimedFeed) -> None:
        key = feed.key
        try:
            found = self._followed.specs.get(key.subscription)
            if found is None or found[1].source_type != key.source_type:
                reason = f"{key.subscription} is not a subscription to {key.source_type} here"
                await self._gateway.park(feed, reason)
                log.warning(
                    "Parked the feed of %s/%r for %s: the code does not declare it",
                    key.source_type,
                    key.source_id,
                    key.subscription,
                    extra={"subscription": key.subscription, "source_id": key.source_id},
                )
                return
            definition, spec = found
            member = key.subscription.split(".", 1)[1]
            work = Round(
                self._services,
                self._gateway,
                self._deliver,
                self._mint,
                definition=definition,
                member=member,
                spec=spec,
                feed=feed,
            )
            try:
                outcome = await work.run(BATCH)
            except (psycopg.Error, OSError, RouteFailed) as exc:
                outcome = Outcome(feed.done, f"{type(exc).__name__}: {exc}")
            await self._settle(feed, outcome)
        except InjectedCrash:
            log.info("Injected crash in the round of %s", key.subscription)
        except Exception:
            log.exception("Subscription round of %s failed unexpectedly", key.subscription)
        finally:
            self._running.pop(key, None)

    async def _settle(self, feed: ClaimedFeed, outcome: Outcome) -> None:
        key = feed.key
        hooks = self._services.hooks
        if hooks.armed("before_subscription_settle"):
            info = {"subscription": key.subscription, "source_id": key.source_id}
            await hooks.at("before_subscription_settle", info)
        metrics = self._services.metrics
        subscriber_type = key.subscription.split(".", 1)[0]
        metrics.count("akter.subscription.delivered", outcome.delivered, actor_type=subscriber_type)
        if outcome.error is None:
            await self._gateway.settle(feed, done=outcome.done)
            if outcome.done < feed.head or outcome.delivered:
                self._waker.wake()  # more may be due: the next pass claims it
            return
        wait = backoff_ms(feed.attempts)
        metrics.count("akter.subscription.retried", 1, actor_type=subscriber_type)
        log.warning(
            "Subscription %s from %s/%r failed at cursor %d, retrying in %d ms: %s",
            key.subscription,
            key.source_type,
            key.source_id,
            outcome.done + 1,
            wait,
            outcome.error,
            extra={"subscription": key.subscription, "source_id": key.source_id},
        )
        await self._gateway.settle(feed, done=outcome.done, wait_ms=wait, error=outcome.error)
