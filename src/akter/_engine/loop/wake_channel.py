"""One runner's pass-loop wakes: the in-process event, ``NOTIFY`` to others, the ``LISTEN`` loop.

Wakes only cut latency (semantics §3.5.2): a local commit that made a row due sets the event at
once; with ``notify=True`` a commit with new rows or events sends one ``NOTIFY`` on
``<schema>_wake`` (at most every 50 ms, strictly after the commit), and a dedicated connection
listens for other runners' and wakes this relay and its live event feeds (and tells the relay's
idle wait when a wake came from another runner, to follow it: ``akter._engine.loop.idle``).
A listener that loses its connection reconnects with backoff and wakes once for whatever it
missed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import psycopg

from akter._retry import Backoff
from akter._store.gateway.jobs import JobKey
from akter._store.gateway.notify import Notifier
from akter._store.gateway.outbox import IntentKey

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter._store.pool import Connection

log = logging.getLogger("akter.relay")

_NOTIFY_EVERY = 0.05
#: The most job rows a jobs-only pass claims by key (more: the full claims).
_JOB_KEYS_KEPT = 64
#: The most intents a pass claims by key (more: the intent lane's scan).
_INTENT_KEYS_KEPT = 256
#: Waits between reconnects of the wake listener (doubling).
_RECONNECT_FIRST_S, _RECONNECT_MAX_S = 0.1, 5.0


class WakeChannel:
    """The pass loop's wakes (module docstring).

    Args:
        services: The runner's services.
        heard: Called for every wake heard, after the relay's own (the event bus wakes its
            live feeds).
        other: Called for a wake another runner sent (this runner hears its own too).
    """

    def __init__(
        self, services: Services, *, heard: Callable[[], None], other: Callable[[], None]
    ) -> None:
        self._services = services
        self._heard = heard
        self._other = other
        self._notifier = Notifier(services.store)
        #: Set by a wake; the pass loop waits on it between passes.
        self.event = asyncio.Event()
        # Every wake since the event was last cleared asked for job claims only: the job rows
        # they made due (empty: not known), else None.
        self._job_keys: list[JobKey] | None = None
        # Every wake since the event was set that asked for intent claims named its intents:
        # those intents (empty: none asked), else None (the intent lane scans).
        self._intent_keys: list[IntentKey] | None = None
        #: The intent keys of the pass the last :meth:`take` started (``Pass.intent_keys``).
        self.taken_intents: list[IntentKey] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._listener: Connection | None = None
        self._notify_pending = False
        self._last_notify = 0.0
        self._stopping = False

    def wake(self) -> None:
        """Ask for a pass soon (capacity one: repeated wakes coalesce)."""
        self._job_keys = None
        self._intent_keys = None
        self.event.set()

    def wake_intents(self, keys: Sequence[IntentKey]) -> None:
        """Ask for a full pass soon whose intent claim may name ``keys`` (made due here)."""
        if not self.event.is_set():
            self._intent_keys = list(keys)
        elif self._intent_keys is not None:
            self._intent_keys += keys
            if len(self._intent_keys) > _INTENT_KEYS_KEPT:
                self._intent_keys = None  # not all kept: the intent lane scans
        self._job_keys = None
        self.event.set()

    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None:
        """Ask for a pass soon that need only claim jobs (a commit made only job rows due)."""
        if not self.event.is_set():
            self._job_keys = list(keys)
            self._intent_keys = []
            self.event.set()
        elif self._job_keys:
            self._job_keys += keys
            if not keys or len(self._job_keys) > _JOB_KEYS_KEPT:
                self._job_keys = []  # not all known: the executor's full claims

    def take(self) -> list[JobKey] | None:
        """Clear the event; what the pass it starts must claim.

        If every wake since the event was set asked for job claims only: the job rows they made
        due (empty: not all known). Else None: a full pass. The intents the wakes named are
        left in :attr:`taken_intents`.
        """
        keys, self._job_keys = self._job_keys, None
        self.taken_intents, self._intent_keys = self._intent_keys, None
        self.event.clear()
        return keys

    async def listen(self) -> None:
        """With ``notify=True``: LISTEN for other runners' wakes."""
        if self._services.config.notify and self._listener is None:
            self._listener = await self._notifier.listen_wake()
            task = asyncio.create_task(self._listen(), name="akter.relay.listen")
            self._tasks.append(self._services.supervisor.supervise(task))

    async def stop(self) -> None:
        """Stop listening and sending (a notification in flight is cancelled)."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._listener is not None:
            await self._listener.close()
            self._listener = None

    async def announce(self) -> None:
        """Wake this relay and, with ``notify=True``, every runner now (sent and awaited).

        For writes made outside a turn (an operator's retry, released claims at a stop): the
        process may stop at once, and idle relays sleep until their next due row
        (``akter._engine.loop.idle``), so the wake is not throttled nor left to a task.
        """
        self.wake()
        if not self._services.config.notify:
            return
        try:
            await self._notifier.notify_wake()
        except (psycopg.Error, OSError) as exc:
            log.warning("Wake notification failed", extra={"error": str(exc)})

    def poke_others(self) -> None:
        """After a local commit with ``notify=True``: NOTIFY other runners, at most every 50 ms."""
        if not self._services.config.notify or self._notify_pending or self._stopping:
            return
        self._notify_pending = True
        self._tasks.append(asyncio.create_task(self._notify(), name="akter.relay.notify"))

    async def _notify(self) -> None:
        try:
            wait = self._last_notify + _NOTIFY_EVERY - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._notify_pending = False
            self._last_notify = time.monotonic()
            # Sent on a pooled autocommit connection, strictly after the commit: never inside
            # a turn transaction (design principle 5).
            await self._notifier.notify_wake()
        except (psycopg.Error, OSError) as exc:
            self._notify_pending = False
            log.warning("Wake notification failed", extra={"error": str(exc)})
        finally:
            task = asyncio.current_task()
            if task in self._tasks:
                self._tasks.remove(task)

    async def _listen(self) -> None:
        """Follow wakes; if the server drops the connection, reconnect with backoff.

        Polling stays the correctness path meanwhile; after reconnecting, one wake covers the
        notifications missed while the connection was down.
        """
        backoff = Backoff(_RECONNECT_FIRST_S, _RECONNECT_MAX_S)
        while True:
            try:
                if self._listener is None or self._listener.closed:
                    self._listener = await self._notifier.listen_wake()
                    self.wake()
                    self._heard()
                backoff.reset()
                async for notification in self._listener.notifies():
                    if not self._notifier.sent_here(notification.pid):
                        self._other()
                    self.wake()
                    self._heard()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Wake listener lost its connection; reconnecting", extra={"error": str(exc)}
                )
                if self._listener is not None:
                    await self._listener.close()
                    self._listener = None
                await asyncio.sleep(backoff.next())
