"""Per-actor mailboxes: one worker per activation drains its commands in batches.

Commands queued behind a running turn of the same actor run together in the next transaction
(at most 32, never two with one command id). Limits refuse work instead of queueing without
bound: ``max_pending_commands`` (``ActorUnavailable``) and ``max_resident_actors``
(``RunnerAtCapacity``). Activations idle for ``hibernate_after`` are dropped from memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from akter._engine.turn import BATCH_LIMIT, Activation, Request, Result, TurnEngine
from akter._ids import placement_key, routing_key
from akter.actor import ActorDefinition
from akter.callers import ActorRef
from akter.errors import ActorError

log = logging.getLogger("akter.dispatcher")


@dataclass
class _Mailbox:
    activation: Activation
    queue: deque[Request] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    #: The worker's queue is empty and it is looking once more (``Dispatcher._more``): idle.
    lingering: bool = False


class Admission(Protocol):
    """Refuses an external command the runner cannot take now (``akter._engine.loop.backlog``)."""

    def admit(self, command_id: str) -> None: ...


def routing_key_of(definition: ActorDefinition, ref: ActorRef) -> int:
    """The routing key of an actor under its type's placement."""
    return routing_key(placement_key(definition.placement, ref.tenant, ref.type, ref.id))


class Dispatcher:
    """Owns activations and their mailboxes on one runner."""

    def __init__(
        self,
        engine: TurnEngine,
        *,
        max_resident_actors: int,
        max_pending_commands: int,
        admission: Admission | None = None,
    ) -> None:
        self.engine = engine
        self.max_resident_actors = max_resident_actors
        self.max_pending_commands = max_pending_commands
        self._boxes: dict[tuple[str, str, str], _Mailbox] = {}
        self._resident_by_type: dict[str, int] = {}
        self._pending = 0
        self.accepting = True
        #: The outbox backlog's admission check of external commands (the pass loop's gate).
        self.admission = admission

    @property
    def resident(self) -> int:
        """How many activations are in memory."""
        return len(self._boxes)

    @property
    def pending(self) -> int:
        """How many commands wait or run."""
        return self._pending

    def activation(self, definition: ActorDefinition, ref: ActorRef) -> Activation | None:
        """The activation of ``ref`` if resident."""
        box = self._boxes.get((ref.tenant, ref.type, ref.id))
        return box.activation if box else None

    def submit(self, definition: ActorDefinition, request: Request) -> asyncio.Future[Result]:
        """Queue a command on its actor's mailbox; the future resolves with its result."""
        if request.external and not self.accepting:
            raise ActorError(
                "ActorUnavailable",
                "The runner is draining and accepts no new commands; retry on another runner.",
                command_id=request.command_id.raw,
            )
        if self._pending >= self.max_pending_commands:
            raise ActorError(
                "ActorUnavailable",
                f"The runner has {self._pending} pending commands (max_pending_commands); "
                "retry shortly.",
                command_id=request.command_id.raw,
            )
        if request.external and self.admission is not None:
            self.admission.admit(request.command_id.raw)
        ref = request.ref
        key = (ref.tenant, ref.type, ref.id)
        box = self._boxes.get(key)
        if box is None:
            if len(self._boxes) >= self.max_resident_actors:
                self.hibernate(force=True)
            if len(self._boxes) >= self.max_resident_actors:
                raise ActorError(
                    "RunnerAtCapacity",
                    f"The runner holds {len(self._boxes)} actors (max_resident_actors); "
                    "retry shortly or on another runner.",
                    command_id=request.command_id.raw,
                )
            box = _Mailbox(Activation(definition, ref, routing_key_of(definition, ref)))
            self._boxes[key] = box
            self._resident(ref.type, +1)
            self.engine.metrics.count("akter.activations.started", actor_type=ref.type)
        box.queue.append(request)
        self._pending += 1
        if box.worker is None:
            box.worker = asyncio.create_task(
                self._drain(box), name=f"akter.mailbox {ref.type}/{ref.id}"
            )
        return request.future

    async def _drain(self, box: _Mailbox) -> None:
        act = box.activation
        try:
            while await self._more(box):
                if act.backoff.current:
                    await self.engine.release(act)  # no connection kept through a backoff
                    await asyncio.sleep(act.backoff.current)
                batch = _take_batch(box.queue)
                self._observe_ages(act, batch)
                try:
                    results = await self.engine.run(act, batch)
                except BaseException as exc:
                    for request in batch:
                        if not request.future.done():
                            request.future.set_exception(
                                exc if isinstance(exc, ActorError) else _interrupted(request, exc)
                            )
                    self._pending -= len(batch)
                    if not isinstance(exc, Exception):
                        raise
                    # An engine bug must not kill the mailbox: its other commands still run.
                    act.drop_cache()
                    log.exception(
                        "Turn failed unexpectedly: %s/%r (tenant %r)",
                        act.ref.type,
                        act.ref.id,
                        act.ref.tenant,
                        extra={"actor": act.ref.type, "id": act.ref.id, "tenant": act.ref.tenant},
                    )
                    continue
                self._pending -= len(batch)
                retry = any(
                    r.kind == "error"
                    and isinstance(r.error, ActorError)
                    and r.error.reason == "ActorUnavailable"
                    for r in results
                )
                if retry:
                    act.backoff.next()
                else:
                    act.backoff.reset()
                for request, result in zip(batch, results, strict=True):
                    if not request.future.done():
                        request.future.set_result(result)
                act.last_used = time.monotonic()
        except asyncio.CancelledError:
            for request in box.queue:
                if not request.future.done():
                    request.future.set_exception(
                        ActorError(
                            "ActorUnavailable",
                            "The runner stopped before the command ran; retry.",
                            command_id=request.command_id.raw,
                        )
                    )
            self._pending -= len(box.queue)
            box.queue.clear()
            raise
        finally:
            box.worker = None
            await self.engine.release(act)  # the connection its batches kept, if any

    @staticmethod
    async def _more(box: _Mailbox) -> bool:
        """Whether the mailbox has work; when empty, look once more after one loop iteration.

        A caller woken by the batch's results runs in that iteration: a command it sends at
        once (a sequential caller's next) joins this worker, instead of starting a task of its
        own one iteration later.
        """
        if box.queue:
            return True
        box.lingering = True
        try:
            await asyncio.sleep(0)
        finally:
            box.lingering = False
        return bool(box.queue)

    def hibernate(self, *, force: bool = False) -> int:
        """Drop idle activations (all idle ones when ``force``); returns how many."""
        now = time.monotonic()
        dropped = 0
        for key, box in list(self._boxes.items()):
            idle = (box.worker is None or box.lingering) and not box.queue
            limit = box.activation.definition.policy.hibernate_after / 1000
            if idle and (force or now - box.activation.last_used >= limit):
                del self._boxes[key]
                self._resident(box.activation.ref.type, -1)
                dropped += 1
        return dropped

    def _resident(self, actor_type: str, change: int) -> None:
        count = self._resident_by_type.get(actor_type, 0) + change
        self._resident_by_type[actor_type] = count
        self.engine.metrics.set("akter.activations", count, actor_type=actor_type)

    def _observe_ages(self, act: Activation, batch: list[Request]) -> None:
        """``akter.mailbox.age_ms``: how long each command waited before its batch began."""
        now = time.monotonic()
        metrics = self.engine.metrics
        for request in batch:
            metrics.observe(
                "akter.mailbox.age_ms", (now - request.enqueued_at) * 1000, actor_type=act.ref.type
            )

    def drop_caches(self) -> None:
        """Forget every cached state (tests, crashes)."""
        for box in self._boxes.values():
            box.activation.drop_cache()

    async def quiesce(self, deadline: float) -> int:
        """Wait for running mailboxes until ``deadline`` (monotonic); cancel the rest."""
        while True:
            workers = [b.worker for b in self._boxes.values() if b.worker is not None]
            if not workers:
                return 0
            left = deadline - time.monotonic()
            if left <= 0:
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                return len(workers)
            await asyncio.wait(workers, timeout=left)


def _take_batch(queue: deque[Request]) -> list[Request]:
    batch: list[Request] = []
    ids: set[str] = set()
    while queue and len(batch) < BATCH_LIMIT:
        nxt = queue[0]
        # A duplicate id stops the batch: it runs next, and replays the first one's receipt.
        if nxt.command_id.raw in ids:
            break
        ids.add(nxt.command_id.raw)
        batch.append(queue.popleft())
    return batch


def _interrupted(request: Request, exc: BaseException) -> ActorError:
    """The error of a command whose turn was interrupted: unknown only past its commit send."""
    what = f"The turn was interrupted ({type(exc).__name__})"
    if request.commit_sent:
        return ActorError(
            "ActorUnavailable",
            f"{what} after its commit was sent; it may or may not have committed: retry with "
            "the same command id.",
            code="outcome_unknown",
            command_id=request.command_id.raw,
        )
    return ActorError(
        "ActorUnavailable",
        f"{what} before its commit; it was not committed: retry with the same command id.",
        command_id=request.command_id.raw,
    )
