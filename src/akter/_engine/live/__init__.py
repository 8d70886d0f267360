"""Live reads of one runner: query watches and broadcasts (docs/guides/live.md).

:class:`Live` holds this runner's open watches (bounded per runner and per actor) and the
followers of broadcast topics. After every local commit (:meth:`Live.after`, wrapped around the
turn engine's commit callback) it wakes the actor's watches with the committed row version and
delivers the turn's broadcasts; with ``notify=True`` it sends both to the other runners on the
live channel (:mod:`akter._engine.live.channel`) and hears theirs. Nothing here is written to
the database.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from akter._broadcasts import check_topic
from akter._engine.calls import Calls, check_access
from akter._engine.live.channel import Key, LiveChannel
from akter._engine.live.watch import Evaluate, Watch, WatchValue
from akter.actor import Member
from akter.callers import ActorRef, Caller, current_caller
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter._engine.services import Services

__all__ = ["Live", "TopicFollower", "Watch", "WatchValue"]

log = logging.getLogger("akter.live")

#: Broadcasts queued for one follower at most; beyond, new ones are dropped for it.
FOLLOWER_QUEUE = 256


def _key(ref: ActorRef) -> Key:
    return (ref.tenant, ref.type, ref.id)


class TopicFollower:
    """Broadcasts on one actor's topic, as this runner receives them (best-effort)."""

    def __init__(self, key: Key, topic: str, release: Callable[[TopicFollower], None]) -> None:
        self.key = key
        self.topic = topic
        self._release = release
        self._queue: asyncio.Queue[str | None] = asyncio.Queue(FOLLOWER_QUEUE)
        #: Broadcasts dropped because this follower's queue was full.
        self.dropped = 0

    def deliver(self, message: str | None) -> None:
        """Queue one broadcast's JSON text (``None``: the end)."""
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped += 1

    def close(self) -> None:
        """Stop following (idempotent)."""
        self._release(self)
        self.deliver(None)

    async def messages(self) -> AsyncIterator[Any]:
        """Each broadcast's message, decoded; ends when closed."""
        try:
            while (text := await self._queue.get()) is not None:
                yield json.loads(text)
        finally:
            self._release(self)


class Live:
    """This runner's watches and topic followers (module docstring)."""

    def __init__(self, services: Services, calls: Calls) -> None:
        self._services = services
        self._calls = calls
        self._watches: dict[Key, set[Watch]] = {}
        self._open = 0
        #: Watch reads refused with a retryable error (a full pool ...) and made again later.
        self.retried_reads = 0
        # Watch reads take at most half the pool at once: a burst of watches woken by one
        # commit never starves the turns (and queries) of connections.
        self._reads = asyncio.Semaphore(max(1, services.config.pool_size // 2))
        # The newest read of each group of alike watches (query, arguments, caller), shared.
        self._shared: dict[tuple[Any, ...], tuple[Any, int, bytes]] = {}
        self._members: dict[tuple[Any, ...], int] = {}
        # One read at a time per group: the others woken by the same commit take its result.
        self._group_locks: dict[tuple[Any, ...], asyncio.Lock] = {}
        self._followers: dict[tuple[Key, str], set[TopicFollower]] = {}
        self._watched_types = frozenset(
            name
            for name, d in services.registry.definitions.items()
            if any(m.spec.watch for m in d.members.values())
        )
        self._channel = LiveChannel(
            services,
            changed=self._changed,
            broadcast=self._deliver,
            reconnected=self._wake_all,
        )

    # --- commits --------------------------------------------------------------------------

    def after(self, inner: Callable[[Any, Any, Any], None]) -> Callable[[Any, Any, Any], None]:
        """The turn engine's commit callback ``inner``, followed by this runner's live news."""

        def on_commit(act: Any, writes: Any, cancelled: Any) -> None:
            inner(act, writes, cancelled)
            try:
                self.committed(act.ref, act.version, writes.broadcasts)
            except Exception:  # never fail a committed turn's caller for a best-effort wake
                log.exception("Live delivery after a commit of %s/%r failed", *_key(act.ref)[1:])

        return on_commit

    def committed(self, ref: ActorRef, version: int | None, broadcasts: Any = ()) -> None:
        """``ref`` committed at row ``version``, with the turn's staged broadcasts."""
        key = _key(ref)
        # Every type's: row followers (the console's) follow types without a watchable query.
        self._changed(key, version)
        if ref.type in self._watched_types:
            self._channel.send_change(key, version)
        for staged in broadcasts:
            self._deliver(key, staged.topic, staged.message)
            self._channel.send_broadcast(key, staged.topic, staged.message)

    def _changed(self, key: Key, version: int | None) -> None:
        for watch in self._watches.get(key, ()):
            watch.changed(version)

    def _wake_all(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.changed(None)

    def _deliver(self, key: Key, topic: str, message: str) -> None:
        for follower in self._followers.get((key, topic), ()):
            follower.deliver(message)

    # --- watches --------------------------------------------------------------------------

    @property
    def watching(self) -> int:
        """Watches open on this runner."""
        return self._open

    async def open_watch(
        self, member: Member, ref: ActorRef, payload: dict[str, Any], caller: Caller | None = None
    ) -> Watch:
        """Check and register a watch of ``member`` on ``ref`` (read it with ``values()``).

        Raises:
            ActorError: ``InvalidInput`` (``not_watchable``) for a query not declared
                ``watch=True``; ``Unauthorized`` when the access policy refuses the query;
                ``RunnerAtCapacity`` (``too_many_watchers``, ``too_many_actor_watchers``)
                beyond ``max_watchers`` or ``max_watchers_per_actor``.
        """
        services = self._services
        services.supervisor.require_started()
        caller = caller or current_caller()
        if member.kind != "query" or not member.spec.watch:
            raise ActorError(
                "InvalidInput",
                f"{ref.type}.{member.name} is not a watchable query; declare it with "
                "@akter.query(watch=True).",
                code="not_watchable",
            )
        await check_access(member.owner, ref, caller, "query", member.name)
        key = _key(ref)
        self._check_capacity(ref)

        group = (key, member.name, json.dumps(payload, sort_keys=True, default=str), repr(caller))

        async def evaluate(at_least: int | None) -> tuple[Any, int, bytes]:
            lock = self._group_locks.setdefault(group, asyncio.Lock())
            async with lock, self._reads:
                shared = self._shared.get(group)
                if at_least is not None and shared is not None and shared[1] >= at_least:
                    # Read by an alike watch since that commit (its access check included); a
                    # copy of its own for each reader, who may change the value it holds.
                    return member.result.validate_json(shared[2]), shared[1], shared[2]
                value, version = await self._calls.query_versioned(member, ref, payload, caller)
            read = (value, version, member.result.dump_json(value))
            if group in self._members and (shared is None or shared[1] <= version):
                self._shared[group] = read
            return read

        return self._register(group, ref, evaluate, heard=True)

    def follow_row(self, ref: ActorRef, read: Callable[[], Awaitable[tuple[Any, int]]]) -> Watch:
        """A watch of ``ref``'s row as ``read`` returns it: (a JSON value, the row version).

        For operator surfaces (the console): no access policy is asked (the surface checked its
        operator), and ``read`` is the surface's own statement. Woken at once by this runner's
        commits of ``ref``, whatever its type; another runner's commits are heard only for types
        with a watchable query (the live channel carries those only), so a row of any other type
        is read again every ``poll``. It counts against ``max_watchers`` and
        ``max_watchers_per_actor`` as a query watch does.

        Raises:
            ActorError: ``RunnerAtCapacity`` as :meth:`open_watch`.
        """
        self._services.supervisor.require_started()
        self._check_capacity(ref)
        group = (_key(ref), "$row", object())  # never shared: each follower reads for itself

        async def evaluate(at_least: int | None) -> tuple[Any, int, bytes]:
            async with self._reads:
                value, version = await read()
            return value, version, json.dumps(value, sort_keys=True, default=str).encode()

        return self._register(group, ref, evaluate, heard=ref.type in self._watched_types)

    def _check_capacity(self, ref: ActorRef) -> None:
        config = self._services.config
        if self._open >= config.max_watchers:
            raise ActorError(
                "RunnerAtCapacity",
                f"This runner has {self._open} open watches (max_watchers); watch again later "
                "or on another runner.",
                code="too_many_watchers",
            )
        if len(self._watches.get(_key(ref), ())) >= config.max_watchers_per_actor:
            raise ActorError(
                "RunnerAtCapacity",
                f"{ref.type}/{ref.id!r} has {config.max_watchers_per_actor} open watches on this "
                "runner (max_watchers_per_actor); watch again later or on another runner.",
                code="too_many_actor_watchers",
            )

    def _register(
        self, group: tuple[Any, ...], ref: ActorRef, evaluate: Evaluate, *, heard: bool
    ) -> Watch:
        """Open a watch of ``group`` on ``ref``; ``heard``: other runners announce its commits."""
        config = self._services.config
        recheck = config.watch_recheck_ms / 1000
        idle = recheck if config.notify and heard else min(config.poll_ms / 1000, recheck)
        watch = Watch(
            group,
            ref,
            evaluate,
            min_interval=config.watch_min_interval_ms / 1000,
            idle_poll=idle,
            release=self._release,
            retried=self._retried,
        )
        self._watches.setdefault(_key(ref), set()).add(watch)
        self._members[group] = self._members.get(group, 0) + 1
        self._open += 1
        self._channel.listen()
        return watch

    def _retried(self, exc: ActorError) -> None:
        self.retried_reads += 1
        log.debug("A watch read was refused (%s), reading again later", exc.code)

    def _release(self, watch: Watch) -> None:
        watches = self._watches.get(_key(watch.ref))
        if watches is not None and watch in watches:
            watches.discard(watch)
            self._open -= 1
            left = self._members.pop(watch.group) - 1
            if left:
                self._members[watch.group] = left
            else:
                self._shared.pop(watch.group, None)
                self._group_locks.pop(watch.group, None)
            if not watches:
                del self._watches[_key(watch.ref)]

    # --- broadcasts -----------------------------------------------------------------------

    async def follow_topic(
        self, ref: ActorRef, topic: str, caller: Caller | None = None
    ) -> TopicFollower:
        """Follow ``ref``'s broadcasts on ``topic`` (access kind ``events``): ``messages()``."""
        self._services.supervisor.require_started()
        check_topic(topic)
        definition = self._services.registry.definition(ref.type)
        await check_access(definition, ref, caller or current_caller(), "events")
        follower = TopicFollower(_key(ref), topic, self._unfollow)
        self._followers.setdefault((follower.key, topic), set()).add(follower)
        # Another runner's broadcast sent before this runner's LISTEN took effect would be
        # missed although it came after the follow: wait for it (watches need not: a
        # (re)connected listener wakes every watch once).
        try:
            await self._channel.listening()
        except BaseException:
            self._unfollow(follower)
            raise
        return follower

    def _unfollow(self, follower: TopicFollower) -> None:
        slot = (follower.key, follower.topic)
        followers = self._followers.get(slot)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self._followers[slot]

    async def stop(self) -> None:
        """End every watch and follower, and stop the live channel."""
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.close()
        for followers in list(self._followers.values()):
            for follower in list(followers):
                follower.close()
        await self._channel.stop()
