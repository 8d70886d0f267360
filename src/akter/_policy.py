"""Per-type policies (semantics §10.5) with their defaults and bounds."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta

from akter._ids import ms_from_duration
from akter.errors import DefinitionError

Duration = float | int | timedelta

_MAX_MS = 2**31 - 1


@dataclass(frozen=True)
class Policy:
    """Per actor type policies; every duration is seconds or a ``timedelta``.

    Attributes:
        execution_timeout: Bound on one turn's transaction (default 30 s).
        lock_wait: Longest wait for the actor row lock (default 2 s).
        delivery_timeout: How long a handle keeps retrying one call (default 30 s).
        max_state_bytes: Largest canonical state, in UTF-8 bytes (default 65,536).
        keep_receipts: Receipt retention (default 7 days).
        keep_events: Event retention (default 30 days).
        hold_events_for_subscribers: How much longer than ``keep_events`` events are kept while
            a subscription has not applied them (default 7 days; the subscriptions spec S5).
        keep_workflows: Retention of finished workflow runs, with their journal and signals,
            counted from their end (default 30 days); running, suspended and diverged runs are
            never pruned.
        keep_streams: Retention of a job's output stream, counted from its newest item
            (default 1 day; docs/guides/job-streams.md).
        max_schedule_lag: Ticks older than this are skipped (default 1 day).
        hibernate_after: Idle activations are dropped from memory after this (default 60 s).
    """

    execution_timeout: Duration = 30.0
    lock_wait: Duration = 2.0
    delivery_timeout: Duration = 30.0
    max_state_bytes: int = 65_536
    keep_receipts: Duration = timedelta(days=7)
    keep_events: Duration = timedelta(days=30)
    hold_events_for_subscribers: Duration = timedelta(days=7)
    keep_workflows: Duration = timedelta(days=30)
    keep_streams: Duration = timedelta(days=1)
    max_schedule_lag: Duration = timedelta(days=1)
    hibernate_after: Duration = 60.0

    def resolve(self, owner: str) -> ResolvedPolicy:
        """Validate and convert to whole milliseconds."""
        values: dict[str, int] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_state_bytes":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise DefinitionError(f"{owner}: max_state_bytes must be an integer ≥ 1.")
                values[f.name] = value
                continue
            try:
                ms = ms_from_duration(value, f.name)
            except (ValueError, TypeError) as exc:
                raise DefinitionError(f"{owner}: {exc}") from None
            if ms < 1 or (f.name in _BOUNDED and ms > _MAX_MS):
                raise DefinitionError(
                    f"{owner}: {f.name} must be between 1 ms and {_MAX_MS} ms, got {ms} ms."
                )
            values[f.name] = ms
        return ResolvedPolicy(**values)


_BOUNDED = {"execution_timeout", "lock_wait", "delivery_timeout"}


@dataclass(frozen=True)
class ResolvedPolicy:
    """A policy in whole milliseconds."""

    execution_timeout: int
    lock_wait: int
    delivery_timeout: int
    max_state_bytes: int
    keep_receipts: int
    keep_events: int
    hold_events_for_subscribers: int
    keep_workflows: int
    keep_streams: int
    max_schedule_lag: int
    hibernate_after: int


POLICY_FIELDS = frozenset(f.name for f in fields(Policy))
