"""Progress frames of running jobs (semantics §5.11): validated, coalesced, rate-limited, in memory.

An executor reports frames with ``call.report(frame)``; each attempt has a :class:`ProgressSlot`
that validates the frame against the job's ``progress`` model, keeps only the latest one and
publishes it at most once per ``progress_every``, under a runner-wide token bucket. Published
messages go to this runner's :class:`ProgressHub`, whose subscribers (the SSE route, handles)
read them; with ``notify=True`` they also travel on ``NOTIFY <schema>_progress``, sent outside
any transaction, to other runners' hubs. Frames are never stored: not in state, events,
receipts nor the outbox. Reporting never blocks and never raises: a frame that cannot be
published is dropped with a warning.

Messages (JSON-ready dicts)::

    {"ref": {...}, "job_id": ..., "job": ..., "attempt": n, "seq": s, "lease_until": ms,
     "frame": {...}}
    {"ref": {...}, "job_id": ..., "attempt": n, "closed": true, "outcome": ...}  # the end

``seq`` counts the attempt's accepted reports from 1 (a coalesced frame leaves a gap);
``lease_until`` is the attempt's lease end on the framework clock, in ms.

A reader learns how the job ended from the durable trace its end left (:func:`job_outcome`), read
in one statement: the route intent that replaced the job row, then that route's receipt
(command id = job id), and the dead letter. ``outcome`` is ``succeeded``, ``dead_lettered``,
``cancelled`` (also when the reader saw the row cancelled), or ``unknown`` when nothing tells
(no route declared for that end, or the route's receipt already pruned). Opening a reader for a
job that no row names, that is not running here and has no message waiting, is refused
(``unknown_job``, HTTP 404): a job that never existed cannot be told from one that ended
without leaving a row, so the second is refused too. Nothing is written per turn for this.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Mapping,
)
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from pydantic import BaseModel

from akter._engine.jobs.progress_slot import (
    MAX_FRAME_BYTES,
    Message,
    ProgressSlot,
    Subscription,
    TokenBucket,
)
from akter._ids import parse_framework_id
from akter._kinds import RowKind
from akter._store.gateway.notify import Notifier
from akter._store.gateway.progress import JobTrace, JobTraces
from akter._waits import wait_event
from akter.callers import ActorRef, Caller, current_caller
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter.actor import AccessKind, ActorDefinition

__all__ = [
    "MAX_FRAME_BYTES",
    "Message",
    "ProgressHub",
    "ProgressSlot",
    "ProgressStream",
    "ProgressStreams",
    "Subscription",
    "TokenBucket",
    "job_outcome",
    "job_progress",
]

log = logging.getLogger("akter.progress")

#: Frames per second a runner publishes, with one second of burst.
RUNNER_RATE = 2000
#: Longest wait, once a job is gone, for frames still travelling from another runner.
GONE_GRACE = 0.2

#: How a job ended, as its closing message tells.
Outcome = Literal["succeeded", "dead_lettered", "cancelled", "unknown"]
_ROUTE_OUTCOMES: dict[str, Outcome] = {
    "success": "succeeded",
    "dead_letter": "dead_lettered",
    "cancelled": "cancelled",
}

#: Checks a caller's access of one kind to an actor (``Runtime``'s access policy check).
CheckAccess = Callable[["ActorDefinition", ActorRef, Caller, "AccessKind"], Awaitable[None]]


class ProgressHub:
    """This runner's progress messages: slots publish, subscriptions read (in memory only).

    With ``notify=True`` it also sends every message on ``NOTIFY <schema>_progress`` and, while
    anyone subscribes, listens there for other runners' messages.
    """

    def __init__(self, services: Services) -> None:
        self._services = services
        self._notifier = Notifier(services.store)
        self.bucket = TokenBucket(RUNNER_RATE, RUNNER_RATE)
        self._subscribers: dict[str, set[Subscription]] = {}
        self._slots: dict[str, list[ProgressSlot]] = {}
        self._latest: dict[str, Message] = {}
        self._origin = uuid.uuid4().hex
        self._outgoing: deque[str] = deque(maxlen=4 * RUNNER_RATE)
        self._send = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._sending = False
        self._listening = False
        self._stopping = False
        #: Set while this hub listens for other runners' messages (``notify=True``).
        self.hearing = asyncio.Event()

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Accept subscriptions again (after a stop)."""
        self._stopping = False

    async def stop(self) -> None:
        """End every subscription and stop the notification tasks."""
        self._stopping = True
        for subscriptions in list(self._subscribers.values()):
            for subscription in list(subscriptions):
                subscription.stop()
        self._subscribers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._sending = self._listening = False
        self._outgoing.clear()

    # --- publishing ---------------------------------------------------------------------------

    def open(
        self,
        *,
        ref: ActorRef,
        job_id: str,
        job: str,
        attempt: int,
        model: type[BaseModel] | None,
        every_ms: int,
        lease_until: Callable[[], int],
    ) -> ProgressSlot:
        """The slot of one attempt (call on the event loop)."""
        slot = ProgressSlot(
            self,
            ref=ref,
            job_id=job_id,
            job=job,
            attempt=attempt,
            model=model,
            every_ms=every_ms,
            lease_until=lease_until,
        )
        self._slots.setdefault(job_id, []).append(slot)
        return slot

    def forget(self, slot: ProgressSlot) -> None:
        """The slot published its last message."""
        slots = self._slots.get(slot.job_id)
        if slots is not None and slot in slots:
            slots.remove(slot)
            if not slots:
                del self._slots[slot.job_id]
                self._latest.pop(slot.job_id, None)

    def live(self, job_id: str, ref: ActorRef | None = None) -> bool:
        """Whether an attempt of the job runs (or just ran and may still publish) here.

        With ``ref``, only an attempt of that actor's job (type, id and tenant) counts: a reader
        must not learn that another actor's or another tenant's job with that id runs.
        """
        slots = self._slots.get(job_id, ())
        return any(ref is None or slot.ref == ref for slot in slots)

    def publish(self, message: Message) -> None:
        """Deliver a message to this runner's subscribers and, with ``notify``, to others."""
        self._deliver(message)
        if self._services.config.notify and not self._stopping:
            # Unescaped, a message stays within NOTIFY's 8000-byte payload: a frame is at most
            # 4096 bytes of canonical JSON, which escapes the same characters.
            payload = json.dumps(
                {**message, "origin": self._origin}, ensure_ascii=False, separators=(",", ":")
            )
            self._outgoing.append(payload)
            self._send.set()
            if not self._sending:
                self._sending = True
                self._spawn(self._sender(), "akter.progress.notify")

    def _deliver(self, message: Message) -> None:
        job_id = str(message.get("job_id"))
        if message.get("closed"):
            self._latest.pop(job_id, None)
        elif job_id in self._slots:
            self._latest[job_id] = message
        for subscription in list(self._subscribers.get(job_id, ())):
            subscription.offer(message)

    # --- subscribing --------------------------------------------------------------------------

    def subscribe(self, job_id: str, ref: ActorRef | None = None) -> Subscription:
        """Receive the job's messages (of ``ref``'s job only, when given) from now on.

        The latest frame of an attempt running here is delivered first.
        """
        subscription = Subscription(self, job_id, ref)
        if self._stopping:
            subscription.stop()
            return subscription
        self._subscribers.setdefault(job_id, set()).add(subscription)
        latest = self._latest.get(job_id)
        if latest is not None:
            subscription.offer(latest)
        if self._services.config.notify and not self._listening:
            self._listening = True
            self._spawn(self._listen(), "akter.progress.listen")
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``."""
        subscriptions = self._subscribers.get(subscription.job_id)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._subscribers[subscription.job_id]

    def subscribers(self, job_id: str) -> int:
        """How many subscriptions read the job's progress on this runner."""
        return len(self._subscribers.get(job_id, ()))

    # --- other runners (notify=True) ----------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.append(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def _sender(self) -> None:
        """Send queued messages on a pooled autocommit connection: never inside a transaction."""
        try:
            await self._send_queued()
        finally:
            self._sending = False

    async def _send_queued(self) -> None:
        while not self._stopping:
            if not self._outgoing:
                self._send.clear()
                if not await wait_event(self._send, 5.0):
                    if not self._outgoing:
                        # Idle: no await between this check and the flag going down (in
                        # _sender), so the next publish starts a new sender.
                        return
                continue
            batch = [self._outgoing.popleft() for _ in range(len(self._outgoing))]
            try:
                await self._notifier.notify_progress(batch)
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Progress notification failed; frames dropped",
                    extra={"frames": len(batch), "error": f"{type(exc).__name__}: {exc}"},
                )

    async def _listen(self) -> None:
        """Hear other runners' messages while this hub runs; reconnect after a failure."""
        while not self._stopping:
            try:
                conn = await self._notifier.listen_progress()
                try:
                    self.hearing.set()
                    async for notice in conn.notifies():
                        self._heard(notice.payload)
                finally:
                    self.hearing.clear()
                    await conn.close()
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Progress listener failed; reconnecting",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
                await asyncio.sleep(self._services.config.poll_ms / 1000)

    def _heard(self, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if not isinstance(message, dict) or message.pop("origin", None) == self._origin:
            return
        if "job_id" in message:
            self._deliver(message)


# --- readers ----------------------------------------------------------------------------------


async def job_progress(
    streams: ProgressStreams, ref: ActorRef, job_id: str
) -> AsyncIterator[Message]:
    """The job's progress messages, ending after its closing message (access kind ``progress``)."""
    stream = await streams.open(ref, job_id)
    try:
        async for message in stream:
            yield message
    finally:
        await stream.aclose()


def job_outcome(trace: JobTrace, routes: Mapping[str, str], cancelled: bool) -> Outcome | None:
    """How a job whose row is gone ended, from its trace; ``None`` when no row names it.

    Args:
        trace: The job's trace (its row no longer a job row).
        routes: The actor type's route commands by name: ``success``, ``dead_letter`` or
            ``cancelled``.
        cancelled: Whether the reader saw the job row cancelled.
    """
    if trace.lettered:
        return "dead_lettered"  # also a cancelled job that became an ambiguous letter
    route = trace.route_command
    kind = routes.get(route) if route is not None else None
    if kind == "cancelled" or cancelled:
        return "cancelled"
    if kind is not None:
        return _ROUTE_OUTCOMES[kind]
    return "unknown" if route is not None else None


class ProgressStreams:
    """Opens readers of this runner's progress hub.

    Args:
        services: The runner's services.
        hub: The runner's progress hub (the job executor's).
        check_access: The runtime's access check for a kind (here ``progress``).
    """

    def __init__(self, services: Services, hub: ProgressHub, check_access: CheckAccess) -> None:
        self._services = services
        #: The hub the readers subscribe to.
        self.hub = hub
        self._check_access = check_access
        self._traces = JobTraces(services.store)

    async def open(self, ref: ActorRef, job_id: str) -> ProgressStream:
        """Check access (kind ``progress``) and subscribe at once; iterate for the job's messages.

        The stream yields the latest frames of the job's attempts and ends after the closing
        message, which carries the ``outcome``. A job that already ended closes at once (with
        ``attempt`` ``None``); without ``notify`` only attempts running on this runner report
        frames.

        Raises:
            ActorError: ``Unauthorized`` by the actor's access policy, ``InvalidCommandId`` for
                a malformed job id, ``InvalidInput`` for an unknown actor type or, with code
                ``unknown_job``, a job that no row names (never enqueued, or ended without
                leaving a route or a dead letter). A job of another actor or another tenant is
                refused the same way, even while it runs here: the rows and the live attempts
                are looked up by ``ref`` (tenant, type, id) and the job id together.
        """
        self._services.supervisor.require_started()
        definition = self._services.registry.definition(ref.type)
        parse_framework_id(job_id)
        await self._check_access(definition, ref, current_caller(), "progress")
        subscription = self.hub.subscribe(job_id, ref)
        trace = await self.trace(ref, job_id)
        if (
            trace is not None
            and trace.row_kind is None
            and job_outcome(trace, self.routes(ref), False) is None
            and not (self.hub.live(job_id, ref) or subscription.queued or subscription.stopped)
        ):
            subscription.close()
            raise ActorError(
                "InvalidInput",
                f"There is no job {job_id!r} of {ref.type}/{ref.id!r}, and none left a trace; "
                "check the id with 'akter jobs list'.",
                code="unknown_job",
                field="job_id",
            )
        return ProgressStream(self, subscription, ref, job_id, trace)

    async def check(self, ref: ActorRef, job_id: str) -> None:
        """Check the current caller's access (kind ``progress``) and the job id's form."""
        self._services.supervisor.require_started()
        definition = self._services.registry.definition(ref.type)
        parse_framework_id(job_id)
        await self._check_access(definition, ref, current_caller(), "progress")

    @property
    def poll_s(self) -> float:
        """How often a reader looks for a job that ended elsewhere."""
        return self._services.config.poll_ms / 1000

    def routes(self, ref: ActorRef) -> dict[str, str]:
        """The actor type's route commands by name (the trace a finished job leaves)."""
        definition = self._services.registry.definition(ref.type)
        return {
            fn.__name__: kind for job in definition.jobs.values() for kind, fn in job.routes.items()
        }

    def routing_key(self, ref: ActorRef) -> int:
        """The routing key of an address."""
        return self._services.registry.routing_key(ref)

    async def trace(self, ref: ActorRef, job_id: str) -> JobTrace | None:
        """What the rows say of the job; ``None`` when they cannot be read now."""
        key = {
            "rk": self.routing_key(ref),
            "tenant": ref.tenant,
            "type": ref.type,
            "id": ref.id,
        }
        try:
            return await self._traces.read(key, job_id)
        except (psycopg.Error, OSError):
            return None  # unknown: keep following, look again at the next poll

    async def outcome(self, ref: ActorRef, job_id: str, cancelled: bool) -> Outcome:
        """How the job ended, read after its close (``unknown`` when nothing tells)."""
        trace = await self.trace(ref, job_id)
        if trace is None or trace.row_kind == RowKind.JOB:
            return "cancelled" if cancelled else "unknown"
        return job_outcome(trace, self.routes(ref), cancelled) or "unknown"


class ProgressStream:
    """The messages of one subscription, ending after the close (see :func:`job_progress`).

    The subscription is taken when the stream is opened, so nothing published after that is
    missed; it is dropped when the stream ends, is closed, or is garbage-collected unread.
    """

    def __init__(
        self,
        streams: ProgressStreams,
        subscription: Subscription,
        ref: ActorRef,
        job_id: str,
        first: JobTrace | None = None,
    ) -> None:
        self._subscription = subscription
        self._messages = _follow(streams, subscription, ref, job_id, first)

    def __aiter__(self) -> ProgressStream:
        return self

    async def __anext__(self) -> Message:
        return await anext(self._messages)

    async def aclose(self) -> None:
        """Stop following the job."""
        self._subscription.close()
        await self._messages.aclose()

    def __del__(self) -> None:
        self._subscription.close()


async def _follow(
    streams: ProgressStreams,
    subscription: Subscription,
    ref: ActorRef,
    job_id: str,
    first: JobTrace | None,
) -> AsyncGenerator[Message, None]:
    hub = streams.hub
    poll = streams.poll_s
    cancelled = False  # seen on the job row: a cancelled job may leave no other trace
    try:
        timeout = 0.0  # look for a finished job at once (the trace open() read), then every poll
        while True:
            message = await subscription.get(timeout)
            if message is not None:
                if message.get("closed"):
                    yield await _closing(streams, ref, message, cancelled)
                    return
                yield message
                continue
            if subscription.stopped:
                return
            timeout = poll
            trace, first = first or await streams.trace(ref, job_id), None
            if trace is None or trace.row_kind == RowKind.JOB or hub.live(job_id, ref):
                cancelled = cancelled or (trace is not None and trace.row_cancelled)
                continue
            # Gone: another runner's last frames and close may still be on their way.
            while (late := await subscription.get(GONE_GRACE)) is not None:
                if late.get("closed"):
                    yield await _closing(streams, ref, late, cancelled)
                    return
                yield late
            if not subscription.stopped:
                outcome = job_outcome(trace, streams.routes(ref), cancelled) or "unknown"
                yield {**_closed(ref, job_id, None), "outcome": outcome}
            return
    finally:
        subscription.close()


def _closed(ref: ActorRef, job_id: str, attempt: int | None) -> Message:
    return {"ref": ref.to_json(), "job_id": job_id, "attempt": attempt, "closed": True}


async def _closing(
    streams: ProgressStreams, ref: ActorRef, message: Message, cancelled: bool
) -> Message:
    """The closing message with the job's ``outcome`` (read from its trace when not given)."""
    if message.get("outcome") is not None:
        return message
    return {**message, "outcome": await streams.outcome(ref, str(message["job_id"]), cancelled)}
