"""One attempt's progress slot and one reader's subscription (semantics §5.11).

A :class:`ProgressSlot` validates an attempt's frames against the job's ``progress`` model,
keeps only the latest one and publishes it at most once per ``progress_every``, under the
runner's token bucket; a :class:`Subscription` holds the messages of one job for one reader.
Both belong to a hub (:class:`akter._engine.jobs.progress.ProgressHub`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from akter._ids import canonical_json
from akter._waits import wait_event
from akter.callers import ActorRef

log = logging.getLogger("akter.progress")

#: Largest frame, in bytes of canonical JSON.
MAX_FRAME_BYTES = 4096
#: Longest wait, after a terminal settle, for the last frame's flush before the close.
CLOSE_WAIT = 0.1
#: Messages a slow subscriber may lag behind before its oldest frames are dropped.
SUBSCRIBER_BACKLOG = 256

Message = dict[str, Any]


class Hub(Protocol):
    """What slots and subscriptions need of their hub."""

    @property
    def bucket(self) -> TokenBucket: ...

    def publish(self, message: Message) -> None: ...

    def forget(self, slot: ProgressSlot) -> None: ...

    def unsubscribe(self, subscription: Subscription) -> None: ...


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
        hub: Hub,
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

    async def close(self, outcome: str | None = None) -> None:
        """After a terminal settle: let the last frame flush (≤ 100 ms), then close the job.

        ``outcome`` is how the settle ended the job; readers learn it from the close.
        """
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
                **({} if outcome is None else {"outcome": outcome}),
            }
        )
        self.hub.forget(self)


class Subscription:
    """One reader of a job's progress messages on this runner (latest frames, then the close)."""

    def __init__(self, hub: Hub, job_id: str, ref: ActorRef | None) -> None:
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

    @property
    def queued(self) -> bool:
        """Whether a message waits to be read (a close may already be here)."""
        return bool(self._messages)

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


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first['msg']}" if where else str(first["msg"])
