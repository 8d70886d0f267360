"""Fault-injection points (semantics §10.4): ``crash_next`` and ``pause_next``."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from akter.errors import InjectedCrash

POINTS = frozenset(
    {
        "before_handler",
        "before_commit",
        "after_commit",
        "after_claim",
        "before_execute",
        "after_execute",
        "before_renew",
        "before_dead_letter_commit",
        # Jobs: before the settle coalescer sends a batch of successes (issue 45).
        "before_settle_flush",
        # Turns: before a shared write sends several actors' one-flight turns (issue 45).
        "before_shared_write",
        "before_outbox_delete",
        "before_park",
        "before_discard_commit",
        "before_retry_commit",
        # Workflows: around a step's record, and before a run's end is written.
        "before_step_record",
        "after_step_record",
        "before_workflow_complete",
        # A turn run again after its workflow start met a live key.
        "before_keyed_start_retry",
        # Subscriptions: before each delivery, and after a round's deliveries, before its settle.
        "before_subscription_delivery",
        "before_subscription_settle",
    }
)

#: What an operation tells the hook at a point: plain values by name (the actor's ``ref``, an
#: ``intent_id``, a ``command`` ...), for matchers and pauses; never a stored row.
HookInfo = dict[str, Any]
Match = Callable[[HookInfo], bool]


@dataclass
class Pause:
    """A pause armed at a point: ``await pause.reached.wait()``, then ``pause.release()``."""

    point: str
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    info: HookInfo = field(default_factory=dict)

    def release(self) -> None:
        """Let the paused operation continue."""
        self.released.set()

    async def wait(self, within: float = 10.0) -> HookInfo:
        """Wait until the operation reaches the point; returns what it reported."""
        await asyncio.wait_for(self.reached.wait(), within)
        return self.info


@dataclass
class _Armed:
    action: Literal["crash", "pause"]
    match: Match | None
    pause: Pause | None = None


class Hooks:
    """Armed fault actions per point; each fires once, for the first matching operation."""

    def __init__(self) -> None:
        self._armed: dict[str, deque[_Armed]] = {}
        self.fired: list[tuple[str, str]] = []

    def _arm(self, point: str, armed: _Armed) -> None:
        if point not in POINTS:
            raise ValueError(f"Unknown fault point {point!r}; known points: {sorted(POINTS)}.")
        self._armed.setdefault(point, deque()).append(armed)

    def crash_next(self, point: str, match: Match | None = None) -> None:
        """Abandon the next operation reaching ``point`` like a process death."""
        self._arm(point, _Armed("crash", match))

    def pause_next(self, point: str, match: Match | None = None) -> Pause:
        """Hold the next operation reaching ``point`` until the returned pause is released."""
        pause = Pause(point)
        self._arm(point, _Armed("pause", match, pause))
        return pause

    def armed(self, point: str) -> bool:
        """Whether anything is armed at ``point`` (cheap check on hot paths)."""
        return bool(self._armed.get(point))

    async def at(self, point: str, info: HookInfo) -> None:
        """Called by the engine at a point: fires the first matching armed action."""
        queue = self._armed.get(point)
        if not queue:
            return
        for armed in list(queue):
            if armed.match is None or armed.match(info):
                queue.remove(armed)
                self.fired.append((point, armed.action))
                if armed.action == "crash":
                    raise InjectedCrash(point)
                assert armed.pause is not None
                armed.pause.info = info
                armed.pause.reached.set()
                await armed.pause.released.wait()
                return
