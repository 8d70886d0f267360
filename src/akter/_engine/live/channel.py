"""Live messages to and from other runners on ``NOTIFY <schema>_live`` (``notify=True``).

Two messages, JSON, each with this runner's ``origin`` so its own listener skips them::

    {"o": origin, "v": [[tenant, type, id, version], ...]}     watched actors that committed
    {"o": origin, "b": [tenant, type, id, topic], "m": ...}    one broadcast

The sender batches what accumulated since its last send into as few payloads as fit under
PostgreSQL's 8000 bytes; the listener connects while anything on this runner follows (a watch
or a topic), and after each (re)connection wakes every watch once for what it may have missed.
A notification lost on the way is not retried: watches re-read on their poll, broadcasts are
best-effort.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from akter._retry import Backoff
from akter._store.gateway.live import MAX_PAYLOAD_BYTES, LiveNotifier
from akter._waits import wait_event

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.live")

#: An actor's address in a live message.
Key = tuple[str, str, str]
#: Messages queued for other runners at most; beyond, the oldest are dropped (best-effort).
_QUEUE_KEPT = 10_000
#: How long a new topic follower waits for this runner's listener to be listening; past it
#: (the database unreachable), it follows all the same and hears other runners once it is.
LISTEN_WAIT_S = 5.0


class LiveChannel:
    """This runner's side of the live channel (module docstring).

    Args:
        services: The runner's services.
        changed: Called for another runner's commit of a watched actor, with its version.
        broadcast: Called for another runner's broadcast: the actor, the topic, the JSON text.
        reconnected: Called after the listener (re)connects: anything may have been missed.
    """

    def __init__(
        self,
        services: Services,
        *,
        changed: Callable[[Key, int | None], None],
        broadcast: Callable[[Key, str, str], None],
        reconnected: Callable[[], None],
    ) -> None:
        self._services = services
        self._notifier = LiveNotifier(services.store)
        self._changed = changed
        self._broadcast = broadcast
        self._reconnected = reconnected
        self._origin = uuid.uuid4().hex[:12]
        self._versions: dict[Key, int | None] = {}
        self._broadcasts: deque[str] = deque(maxlen=_QUEUE_KEPT)
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        #: Set while the listener's ``LISTEN`` is in effect.
        self._listening = asyncio.Event()
        self._stopping = False

    @property
    def enabled(self) -> bool:
        """Whether messages travel between runners: ``notify=True``, while the runner runs."""
        services = self._services
        supervisor = services.supervisor
        return services.config.notify and supervisor.started and not supervisor.stopping

    def send_change(self, key: Key, version: int | None) -> None:
        """Tell other runners a watched actor committed (coalesced per actor until sent)."""
        if self.enabled:
            self._versions[key] = version
            self._kick()

    def send_broadcast(self, key: Key, topic: str, message: str) -> None:
        """Send a broadcast to other runners (dropped if it cannot fit one payload)."""
        if not self.enabled:
            return
        payload = (
            f'{{"o":{json.dumps(self._origin)},"b":{json.dumps([*key, topic])},"m":{message}}}'
        )
        if len(payload.encode()) > MAX_PAYLOAD_BYTES:
            log.warning(
                "Broadcast on %s/%r topic %r is too large for NOTIFY; sent on this runner only",
                key[1],
                key[2],
                topic,
                extra={"actor_type": key[1], "actor_id": key[2], "topic": topic},
            )
            return
        self._broadcasts.append(payload)
        self._kick()

    def listen(self) -> None:
        """Start hearing other runners (idempotent; only with ``notify=True``)."""
        if self.enabled and self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name="akter.live.listen")

    async def listening(self) -> None:
        """Start hearing other runners and wait until the ``LISTEN`` is in effect.

        What other runners send after this returns is heard (until a lost connection). Waits
        at most :data:`LISTEN_WAIT_S`; returns at once without ``notify=True``.
        """
        self.listen()
        if self._listener is not None:
            await wait_event(self._listening, LISTEN_WAIT_S)

    async def stop(self) -> None:
        """Stop sending and listening (messages not yet sent are dropped)."""
        self._stopping = True
        tasks = [t for t in (self._sender, self._listener) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sender = self._listener = None
        self._versions.clear()
        self._broadcasts.clear()
        self._stopping = False  # a runtime started again uses the channel again

    def _kick(self) -> None:
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="akter.live.notify")

    def _payloads(self) -> list[str]:
        payloads = list(self._broadcasts)
        self._broadcasts.clear()
        head = f'{{"o":{json.dumps(self._origin)},"v":['
        batch: list[str] = []
        size = len(head) + 2
        for key, version in self._versions.items():
            item = json.dumps([*key, version], separators=(",", ":"))
            if batch and size + len(item.encode()) + 1 > MAX_PAYLOAD_BYTES:
                payloads.append(head + ",".join(batch) + "]}")
                batch, size = [], len(head) + 2
            batch.append(item)
            size += len(item.encode()) + 1
        if batch:
            payloads.append(head + ",".join(batch) + "]}")
        self._versions.clear()
        return payloads

    async def _send(self) -> None:
        """Send what accumulated, on a pooled autocommit connection, until idle for 5 s."""
        while not self._stopping:
            self._wake.clear()
            payloads = self._payloads()
            if payloads:
                try:
                    await self._notifier.notify(payloads)
                except (psycopg.Error, OSError) as exc:
                    log.warning(
                        "Live notification failed; %d message(s) dropped (watches re-read on "
                        "their poll, broadcasts are best-effort): %s",
                        len(payloads),
                        exc,
                        extra={"messages": len(payloads), "error": str(exc)},
                    )
                continue
            if not await wait_event(self._wake, 5.0):
                return

    async def _listen(self) -> None:
        backoff = Backoff(0.1, 5.0)
        while not self._stopping:
            try:
                conn = await self._notifier.listen()
                try:
                    backoff.reset()
                    self._listening.set()
                    self._reconnected()
                    async for notice in conn.notifies():
                        self._heard(notice.payload)
                finally:
                    self._listening.clear()
                    await conn.close()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Live listener lost its connection; reconnecting (watches poll meanwhile): %s",
                    exc,
                    extra={"error": str(exc)},
                )
                await asyncio.sleep(backoff.next())

    def _heard(self, payload: str) -> None:
        try:
            message: Any = json.loads(payload)
        except ValueError:
            return
        if not isinstance(message, dict) or message.get("o") == self._origin:
            return
        for item in message.get("v", ()):
            if isinstance(item, list) and len(item) == 4:
                tenant, actor_type, actor_id, version = item
                self._changed((tenant, actor_type, actor_id), version)
        target = message.get("b")
        if isinstance(target, list) and len(target) == 4:
            text = json.dumps(message.get("m"), separators=(",", ":"))
            self._broadcast((target[0], target[1], target[2]), target[3], text)
