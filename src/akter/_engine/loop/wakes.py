"""After a local commit: who must hear of it (the pass loop, running attempts, event feeds).

A turn's commit callback: a due intent wakes this runner's pass loop at once; cancelled running
attempts get their signal; new rows and events poke the other runners (NOTIFY, when enabled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import IntentKey
from akter._store.pool import Clock
from akter.callers import ActorRef


class _Waker(Protocol):
    def wake(self) -> None: ...
    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None: ...
    def wake_intents(self, keys: Sequence[IntentKey]) -> None: ...
    def poke_others(self) -> None: ...


class _Jobs(Protocol):
    def cancel_signal(self, job_ids: list[str]) -> None: ...


class _Events(Protocol):
    def publish(self, ref: ActorRef) -> None: ...


class CommitWakes:
    """The commit callback of a runner's turn engine (module docstring)."""

    def __init__(self, clock: Clock, waker: _Waker, jobs: _Jobs, events: _Events) -> None:
        self._clock = clock
        self._waker = waker
        self._jobs = jobs
        self._events = events

    def __call__(self, act: Any, writes: Any, cancelled: list[tuple[str, bool]]) -> None:
        runs = getattr(writes, "runs", None)
        fed = getattr(writes, "fed", False)  # it wrote subscription feeds or follows
        if not (writes.rows or writes.events or cancelled or runs or fed):
            return  # a turn that staged nothing wakes nobody (most turns)
        now = self._clock.estimate()
        due = [
            r
            for r in writes.rows
            if (r.at_ms is not None and r.at_ms <= now) or (r.at_ms is None and not r.delay_ms)
        ]
        running = [job_id for job_id, is_running in cancelled if is_running]
        if running:
            self._jobs.cancel_signal(running)
        intents = [
            IntentKey(act.routing_key, r.intent_id, r.target_type) for r in due if r.kind != "job"
        ]
        if runs or fed:
            self._waker.wake()  # a started run is claimed in the next pass
        elif intents:
            self._waker.wake_intents(intents)  # a full pass that may claim these by key
        elif len(running) < len(cancelled):
            self._waker.wake_jobs()  # unstarted jobs cancelled: a job claim settles them
        elif due:
            self._waker.wake_jobs(
                [JobKey(act.routing_key, r.intent_id, act.ref.type, r.command) for r in due]
            )
        if writes.rows or cancelled or runs or fed:
            self._waker.poke_others()
        if writes.events:
            self._events.publish(act.ref)
            self._waker.poke_others()
