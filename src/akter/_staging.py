"""What a command stages, and when staged work falls due.

A command's staging calls (``send``, ``later``, ``enqueue``, their cancellations) record typed
operations in :class:`Staged`; the turn merges those of its successful commands, in order, into
its commit flight. :func:`due_and_slack` is the one rule for when an intent, timer, tick or job
row is due and how much slack its framework id gets (semantics §1.4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from akter._ids import mint_framework_id, ms_from_duration
from akter._kinds import RowKind


@dataclass(slots=True)
class StagedRow:
    """One outbox row staged by a turn (intent, timer or job)."""

    intent_id: str
    kind: RowKind
    target_type: str
    target_id: str
    command: str
    payload: str
    caller: str
    delay_ms: int | None
    at_ms: int | None
    timer_key: str | None
    #: The target command's (or job's) payload version (evolution E3).
    payload_version: int = 0
    #: A job's priority, 0-9 (higher first), and its max_wait in ms (migration 0006).
    priority: int = 0
    max_wait_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Delete this actor's pending timer ``key`` (and drop earlier stagings of it)."""

    key: str


@dataclass(frozen=True, slots=True)
class CancelJob:
    """Cancel this actor's job ``key`` (its ``$job:`` timer key; earlier stagings dropped)."""

    key: str


@dataclass(slots=True)
class StagedRun:
    """A workflow run a turn starts on its own actor: written in the turn's commit flight.

    A keyed start stages one only when no run of its (workflow, key) is known live or started
    earlier in the batch (``CommandContext.keyed_runs``): it returns that run's id instead.
    """

    run_id: str
    workflow: str
    key: str | None
    input: str
    input_hash: str
    caller: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class StagedFollow:
    """A dynamic subscription started (``active``) or stopped by the turn (subscriptions spec).

    ``start_after``: the cursor it applies events after; ``None``: the source's newest at the
    commit ("now").
    """

    subscription: str
    source_type: str
    source_id: str
    #: The source's routing key (its follow and feed rows live in its shard).
    source_rk: int
    start_after: int | None
    active: bool


#: One staged operation: a row to write, a run to start, a follow, or a cancellation.
StagedOp = StagedRow | StagedRun | StagedFollow | CancelTimer | CancelJob


@dataclass(frozen=True, slots=True)
class StagedEvent:
    """An emitted event: its tag, stored JSON and payload version (the class's ``version=``)."""

    tag: str
    payload: str
    version: int = 0


@dataclass(frozen=True, slots=True)
class StagedBroadcast:
    """A ``self.broadcast(topic, message)``: sent after the commit, best-effort (live.md)."""

    topic: str
    message: str  # its JSON text


@dataclass(slots=True)
class Staged:
    """Everything one command staged, in order; discarded unless it succeeds."""

    events: list[StagedEvent] = field(default_factory=list)
    ops: list[StagedOp] = field(default_factory=list)
    broadcasts: list[StagedBroadcast] = field(default_factory=list)


def parse_due(
    after: float | timedelta | None, at: datetime | None, what: str
) -> tuple[int | None, int | None]:
    """``after=`` / ``at=`` of a staging call as ``(delay_ms, at_ms)``; at most one is set.

    Raises:
        ValueError: Both are given, ``at`` is not an aware datetime, or ``after`` is not a
            duration (named ``what`` in the message).
    """
    if after is not None and at is not None:
        raise ValueError(f"{what}: give after= or at=, not both.")
    if at is not None:
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValueError(f"{what}: at= must be an aware datetime.")
        return None, int(at.timestamp() * 1000)
    if after is not None:
        return ms_from_duration(after, "after"), None
    return None, None


def due_and_slack(
    now_ms: int, delay_ms: int | None, at_ms: int | None, execution_timeout_ms: int
) -> tuple[int, int]:
    """When a staged row is due, and the slack of its framework id (semantics §1.4).

    An absolute time (``at_ms``) is due then, without slack; a relative delay counts from the
    turn's pinned clock and gets the sender's execution timeout as slack (the commit may land
    that much later); neither is due now, without slack.
    """
    if at_ms is not None:
        return at_ms, 0
    if delay_ms is not None:
        return now_ms + delay_ms, execution_timeout_ms
    return now_ms, 0


def framework_id(
    now_ms: int, delay_ms: int | None, at_ms: int | None, execution_timeout_ms: int, window_ms: int
) -> str:
    """The id of a staged row due per :func:`due_and_slack`."""
    due, slack = due_and_slack(now_ms, delay_ms, at_ms, execution_timeout_ms)
    return mint_framework_id(now_ms, due, slack, window_ms)
