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
    {"ref": {...}, "job_id": ..., "attempt": n, "closed": true}   # after a terminal settle

``seq`` counts the attempt's accepted reports from 1 (a coalesced frame leaves a gap);
``lease_until`` is the attempt's lease end on the framework clock, in ms.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pydantic import BaseModel, ValidationError

from akter._ids import canonical_json, parse_framework_id
from akter._waits import wait_event
from akter.callers import ActorRef, current_caller

if TYPE_CHECKING:
    from akter.runtime import Runtime

log = logging.getLogger("akter.progress")

#: Largest frame, in bytes of canonical JSON.
MAX_FRAME_BYTES = 4096
#: Frames per second a runner publishes, with one second of burst.
RUNNER_RATE = 2000
#: Longest wait, after a terminal settle, for the last frame's flush before the close.
CLOSE_WAIT = 0.1
#: Messages a slow subscriber may lag behind before its oldest frames are dropped.
SUBSCRIBER_BACKLOG = 256
#: Longest wait, once a job is gone, for frames still travelling from another runner.
GONE_GRACE = 0.2

Message = dict[str, Any]


class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = time.monotonic()

    def take(self) -> float:
        """Take a token: 0.0 if one was taken, else the seconds until one is available."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


class ProgressSlot:
    """The progress of one attempt: validates, coalesces and paces its frames.

    ``report`` may be called from any thread (a synchronous executor runs in a worker thread);
    everything else runs on the event loop that opened the slot.
    """

    def __init__(
        self,
        hub: ProgressHub,
        *,
        ref: ActorRef,
        job_id: str,
        job: str,
        attempt: int,
        model: type[BaseModel] | None,
        every_ms: int,
        lease_until: Callable[[], int],
    ) -> None:
        self.hub = hub
        self.ref = ref
        self.job_id = job_id
        self.job = job
        self.attempt = attempt
        self.model = model
        self.every = every_ms / 1000
        self.lease_until = lease_until
        #: Accepted reports so far; the next accepted one gets ``seq + 1``.
        self.seq = 0
        self.ended = False
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._pending: tuple[int, Any] | None = None
        self._last = float("-inf")
        self._timer: asyncio.TimerHandle | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._released = False
        self._warned: set[str] = set()

    # --- the executor's side ------------------------------------------------------------------

    def report(self, frame: BaseModel) -> None:
        """Accept a frame, or drop it with a warning; never blocks or raises."""
        try:
            if self.ended:
                self._drop("ended", "Progress frame dropped: the attempt has ended")
                return
            if self.model is None:
                self._drop("no_model", "Progress frame dropped: the job declares no progress model")
                return
            try:
                source = frame.model_dump() if isinstance(frame, BaseModel) else frame
                data = self.model.model_validate(source).model_dump(mode="json")
            except ValidationError as exc:
                self._drop(
                    "invalid",
                    "Progress frame dropped: it fails the job's progress model",
                    error=_first_error(exc),
                )
                return
            size = len(canonical_json(data).encode("utf-8"))
            if size > MAX_FRAME_BYTES:
                self._drop(
                    "too_large",
                    "Progress frame dropped: larger than 4096 bytes",
                    bytes=size,
                )
                return
            if threading.get_ident() == self._thread:
                self._accept(data)
            else:
                self._loop.call_soon_threadsafe(self._accept, data)
        except Exception as exc:  # best-effort: a report never fails the executor
            self._drop("error", "Progress frame dropped", error=f"{type(exc).__name__}: {exc}")

    def _drop(self, why: str, message: str, **fields: Any) -> None:
        # The first drop of each kind per attempt warns; repeats (a reporting loop) stay quiet.
        level = logging.DEBUG if why in self._warned else logging.WARNING
        self._warned.add(why)
        log.log(level, message, extra={**self.log_fields(), **fields})

    def log_fields(self) -> dict[str, Any]:
        """The structured fields of the attempt's log lines (semantics §10.3)."""
        return {
            "actor": self.ref.type,
            "id": self.ref.id,
            "tenant": self.ref.tenant,
            "job": self.job,
            "job_id": self.job_id,
            "attempt": self.attempt,
        }

    # --- pacing (event loop) ------------------------------------------------------------------

    def _accept(self, data: Any) -> None:
        self.seq += 1
        self._pending = (self.seq, data)
        self._idle.clear()
        if self._timer is None:
            self._flush()

    def _flush(self) -> None:
        self._timer = None
        if self._pending is None:
            return
        wait = self._last + self.every - time.monotonic()
        if wait <= 0:
            wait = self.hub.bucket.take()
        if wait > 0:
            self._timer = self._loop.call_later(wait, self._flush)
            return
        seq, data = self._pending
        self._pending = None
        self._last = time.monotonic()
        self.hub.publish(
            {
                "ref": self.ref.to_json(),
                "job_id": self.job_id,
                "job": self.job,
                "attempt": self.attempt,
                "seq": seq,
                "lease_until": self.lease_until(),
                "frame": data,
            }
        )
        self._idle.set()
        if self._released:
            self.hub.forget(self)

    # --- the attempt's end --------------------------------------------------------------------

    def end(self) -> None:
        """The executor finished: later reports are dropped; a pending frame keeps its turn."""
        self.ended = True

    def release(self) -> None:
        """The attempt ended without a terminal settle: the job's progress stays open."""
        self.end()
        self._released = True
        if self._pending is None:
            self.hub.forget(self)

    async def close(self) -> None:
        """After a terminal settle: let the last frame flush (≤ 100 ms), then close the job."""
        self.end()
        if self._pending is not None:
            await wait_event(self._idle, CLOSE_WAIT)
        if self._timer is not None:
            # Still not due: publishing it now would break the interval; the close supersedes it.
            self._timer.cancel()
            self._timer = None
            self._pending = None
        self.hub.publish(
            {
                "ref": self.ref.to_json(),
                "job_id": self.job_id,
                "attempt": self.attempt,
                "closed": True,
            }
        )
        self.hub.forget(self)


class Subscription:
    """One reader of a job's progress messages on this runner (latest frames, then the close)."""

    def __init__(self, hub: ProgressHub, job_id: str, ref: ActorRef | None) -> None:
        self.hub = hub
        self.job_id = job_id
        self.ref = ref
        self._messages: deque[Message] = deque(maxlen=SUBSCRIBER_BACKLOG)
        self._ready = asyncio.Event()
        #: The hub stopped: no message will come.
        self.stopped = False

    def offer(self, message: Message) -> None:
        """A message for this job (from this runner or, with ``notify``, another one)."""
        if self.ref is not None and message.get("ref") != self.ref.to_json():
            return
        self._messages.append(message)  # a lagging reader loses its oldest frames, not the close
        self._ready.set()

    def stop(self) -> None:
        """End the subscription without a message (the runner is stopping)."""
        self.stopped = True
        self._ready.set()

    async def get(self, within: float | None = None) -> Message | None:
        """The next message; ``None`` after ``within`` seconds or once stopped."""
        while not self._messages:
            if self.stopped:
                return None
            self._ready.clear()
            if not await wait_event(self._ready, within):
                return None
        return self._messages.popleft()

    def close(self) -> None:
        """Stop receiving messages."""
        self.hub.unsubscribe(self)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        if message.get("closed"):
            self.stopped = True
        return message


class ProgressHub:
    """This runner's progress messages: slots publish, subscriptions read (in memory only).

    With ``notify=True`` it also sends every message on ``NOTIFY <schema>_progress`` and, while
    anyone subscribes, listens there for other runners' messages.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
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

    def live(self, job_id: str) -> bool:
        """Whether an attempt of the job runs (or just ran and may still publish) here."""
        return job_id in self._slots

    def publish(self, message: Message) -> None:
        """Deliver a message to this runner's subscribers and, with ``notify``, to others."""
        self._deliver(message)
        if self.runtime.notify and not self._stopping:
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
        if self.runtime.notify and not self._listening:
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

    def _channel(self) -> str:
        return f"{self.runtime.schema}_progress"

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
            batch = [
                (self._channel(), self._outgoing.popleft()) for _ in range(len(self._outgoing))
            ]
            try:
                async with self.runtime.store.framework.connection() as conn:
                    cur = conn.cursor()
                    await cur.executemany(sql.SQL("SELECT pg_notify(%s, %s)"), batch)
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Progress notification failed; frames dropped",
                    extra={"frames": len(batch), "error": f"{type(exc).__name__}: {exc}"},
                )

    async def _listen(self) -> None:
        """Hear other runners' messages while this hub runs; reconnect after a failure."""
        while not self._stopping:
            try:
                conn = await self.runtime.store.connect_direct()
                try:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel())))
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
                await asyncio.sleep(self.runtime.poll_ms / 1000)

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


async def open_progress(runtime: Runtime, ref: ActorRef, job_id: str) -> ProgressStream:
    """Check access (kind ``progress``) and subscribe at once; iterate for the job's messages.

    The stream yields the latest frames of the job's attempts and ends after the closing
    message. A job whose row is gone (never enqueued, or already ended) gets a closing message
    with ``attempt`` ``None``; without ``notify`` only attempts running on this runner report
    frames.

    Raises:
        ActorError: ``Unauthorized`` by the actor's access policy, ``InvalidCommandId`` for a
            malformed job id, ``InvalidInput`` for an unknown actor type.
    """
    runtime._require_started()
    definition = runtime.definition(ref.type)
    parse_framework_id(job_id)
    await runtime._check_access_kind(definition, ref, current_caller(), "progress")
    hub: ProgressHub = runtime.jobs.progress
    return ProgressStream(runtime, hub.subscribe(job_id, ref), ref, job_id)


async def job_progress(runtime: Runtime, ref: ActorRef, job_id: str) -> AsyncIterator[Message]:
    """The job's progress messages, ending after its closing message (access kind ``progress``)."""
    stream = await open_progress(runtime, ref, job_id)
    try:
        async for message in stream:
            yield message
    finally:
        await stream.aclose()


class ProgressStream:
    """The messages of one subscription, ending after the close (see :func:`open_progress`).

    The subscription is taken when the stream is opened, so nothing published after that is
    missed; it is dropped when the stream ends, is closed, or is garbage-collected unread.
    """

    def __init__(
        self, runtime: Runtime, subscription: Subscription, ref: ActorRef, job_id: str
    ) -> None:
        self._subscription = subscription
        self._messages = _follow(runtime, subscription, ref, job_id)

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
    runtime: Runtime, subscription: Subscription, ref: ActorRef, job_id: str
) -> AsyncGenerator[Message, None]:
    hub = subscription.hub
    poll = runtime.poll_ms / 1000
    try:
        timeout = 0.0  # look for a finished job at once, then every poll
        while True:
            message = await subscription.get(timeout)
            if message is not None:
                yield message
                if message.get("closed"):
                    return
                continue
            if subscription.stopped:
                return
            timeout = poll
            if hub.live(job_id) or await _pending(runtime, ref, job_id):
                continue
            # Gone: another runner's last frames and close may still be on their way.
            while (late := await subscription.get(GONE_GRACE)) is not None:
                yield late
                if late.get("closed"):
                    return
            if not subscription.stopped:
                yield {"ref": ref.to_json(), "job_id": job_id, "attempt": None, "closed": True}
            return
    finally:
        subscription.close()


async def _pending(runtime: Runtime, ref: ActorRef, job_id: str) -> bool:
    """Whether the actor still holds the job's row (pending, running, backing off)."""
    key = {
        "rk": runtime.routing_key(ref),
        "tenant": ref.tenant,
        "type": ref.type,
        "id": ref.id,
    }
    try:
        async with runtime.store.pool.connection() as conn:
            cur = await conn.execute(runtime.store.queries["inspect_outbox"], key)
            rows = await cur.fetchall()
    except (psycopg.Error, OSError):
        return True  # unknown: keep following, look again at the next poll
    return any(row[0] == job_id and row[1] == "job" for row in rows)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first['msg']}" if where else str(first["msg"])
