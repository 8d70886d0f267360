"""The runner's configuration: every ``Runtime(...)`` option, validated once, then frozen.

``RuntimeConfig.build`` is the one place the keyword arguments of ``akter.Runtime`` are checked
and turned into whole milliseconds; every component reads the frozen result (through
``Services.config``) and never the raw arguments. The README's option table lists the same
options with the same bounds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akter._ids import ms_from_duration
from akter.errors import ConfigurationError

if TYPE_CHECKING:
    from akter.actor import ActorDefinition

_WINDOW_MIN_MS = 1
_WINDOW_MAX_MS = 30 * 24 * 3600 * 1000
_SINGLETON_LEASE_MIN_MS = 1_000
_SINGLETON_LEASE_MAX_MS = 24 * 3600 * 1000
_CLOCK_OFFSET_MAX_MS = 366 * 24 * 3600 * 1000
_POOL_WAIT_MAX_MS = 3600 * 1000
#: Added to the longest ``execution_timeout + lock_wait`` for the default relay claim lease.
_CLAIM_LEASE_MARGIN_MS = 5_000
_CLAIM_LEASE_FLOOR_MS = 32_000

Duration = float | timedelta


@dataclass(frozen=True)
class RuntimeConfig:
    """The validated options of one runner (``akter.Runtime``'s keyword arguments).

    Durations are whole milliseconds. ``database_url`` is ``None`` for the embedded server.
    """

    database_url: str | None
    data_dir: Path | None
    schema: str
    #: How long a command id stays valid (``retry_window``).
    window_ms: int
    max_resident_actors: int
    max_pending_commands: int
    pool_size: int
    framework_pool_size: int
    #: The longest a turn, and a query, waits for a pooled connection.
    pool_wait_ms: int
    query_pool_wait_ms: int
    drain_deadline_ms: int
    notify: bool
    poll_ms: int
    pass_limit: int
    delivery_concurrency: int
    max_backoff_ms: int
    claim_lease_ms: int
    executor_concurrency: int
    #: The executor's job attempt lease (``lease``).
    job_lease_ms: int
    cancel_check_ms: int
    #: The job types this runner executes, as (actor type, job name).
    executes: frozenset[tuple[str, str]]
    relay: bool
    maintenance: bool
    host_actors: bool
    singleton_lease_ms: int
    clock_offset_ms: int

    @classmethod
    def build(
        cls,
        definitions: Iterable[ActorDefinition],
        *,
        database_url: str | None,
        schema: str,
        retry_window: Duration,
        max_resident_actors: int,
        max_pending_commands: int,
        pool_size: int,
        framework_pool_size: int,
        pool_wait: Duration,
        query_pool_wait: Duration,
        drain_deadline: Duration,
        data_dir: str | Path | None,
        notify: bool,
        poll: Duration,
        pass_limit: int,
        delivery_concurrency: int,
        max_backoff: Duration,
        claim_lease: Duration | None,
        executor_concurrency: int,
        lease: Duration,
        cancel_check: Duration | None,
        jobs: Sequence[Any] | None,
        relay: bool,
        maintenance: bool,
        host_actors: bool,
        singleton_lease: Duration,
        clock_offset: Duration,
    ) -> RuntimeConfig:
        """Check every option; raise ``ConfigurationError`` naming the first one out of range."""
        definitions = tuple(definitions)
        window_ms = ms_from_duration(retry_window, "retry_window")
        if not _WINDOW_MIN_MS <= window_ms <= _WINDOW_MAX_MS:
            raise ConfigurationError("retry_window must be between 1 ms and 30 days.")
        for name, value in (
            ("max_resident_actors", max_resident_actors),
            ("max_pending_commands", max_pending_commands),
            ("pool_size", pool_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an integer ≥ 1, got {value!r}.")
        singleton_lease_ms = _duration(singleton_lease, "singleton_lease")
        offset_ms = _duration(clock_offset, "clock_offset")
        if not _SINGLETON_LEASE_MIN_MS <= singleton_lease_ms <= _SINGLETON_LEASE_MAX_MS:
            raise ConfigurationError(
                f"singleton_lease must be between 1 s and 1 day, got {singleton_lease_ms} ms."
            )
        if offset_ms > _CLOCK_OFFSET_MAX_MS:
            raise ConfigurationError(f"clock_offset must be at most 366 days, got {offset_ms} ms.")
        _check_count("framework_pool_size", framework_pool_size, 1, 100, show=True)
        pool_wait_ms = _bounded(pool_wait, "pool_wait")
        query_pool_wait_ms = _bounded(query_pool_wait, "query_pool_wait")
        drain_deadline_ms = ms_from_duration(drain_deadline, "drain_deadline")
        for name, value in (
            ("pass_limit", pass_limit),
            ("delivery_concurrency", delivery_concurrency),
            ("executor_concurrency", executor_concurrency),
        ):
            _check_count(name, value, 1, 1_000_000)
        poll_ms = _at_least(poll, "poll", 1)
        max_backoff_ms = _at_least(max_backoff, "max_backoff", 1)
        claim_lease_ms = (
            _default_claim_lease(definitions)
            if claim_lease is None
            else _at_least(claim_lease, "claim_lease", 1)
        )
        job_lease_ms = _at_least(lease, "lease", 3_000)
        cancel_check_ms = (
            job_lease_ms // 3
            if cancel_check is None
            else _at_least(cancel_check, "cancel_check", 1_000)
        )
        if cancel_check_ms > job_lease_ms // 3:
            raise ConfigurationError("cancel_check must be at most a third of the lease.")
        return cls(
            database_url=database_url or os.environ.get("AKTER_DATABASE_URL") or None,
            data_dir=Path(data_dir) if data_dir else None,
            schema=schema,
            window_ms=window_ms,
            max_resident_actors=max_resident_actors,
            max_pending_commands=max_pending_commands,
            pool_size=pool_size,
            framework_pool_size=framework_pool_size,
            pool_wait_ms=pool_wait_ms,
            query_pool_wait_ms=query_pool_wait_ms,
            drain_deadline_ms=drain_deadline_ms,
            notify=bool(notify),
            poll_ms=poll_ms,
            pass_limit=pass_limit,
            delivery_concurrency=delivery_concurrency,
            max_backoff_ms=max_backoff_ms,
            claim_lease_ms=claim_lease_ms,
            executor_concurrency=executor_concurrency,
            job_lease_ms=job_lease_ms,
            cancel_check_ms=cancel_check_ms,
            executes=_executes(definitions, jobs),
            relay=bool(relay),
            maintenance=bool(maintenance),
            host_actors=bool(host_actors),
            singleton_lease_ms=singleton_lease_ms,
            clock_offset_ms=offset_ms,
        )


def _duration(value: Duration, what: str) -> int:
    try:
        return ms_from_duration(value, what)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def _at_least(value: Duration, what: str, low: int) -> int:
    ms = _duration(value, what)
    if ms < low:
        raise ConfigurationError(f"{what} must be at least {low} ms, got {ms} ms.")
    return ms


def _bounded(value: Duration, what: str) -> int:
    ms = _duration(value, what)
    if not 1 <= ms <= _POOL_WAIT_MAX_MS:
        raise ConfigurationError(f"{what} must be between 1 ms and 1 hour, got {ms} ms.")
    return ms


def _check_count(name: str, value: object, low: int, high: int, *, show: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = f", got {value!r}" if show else ""
        raise ConfigurationError(f"{name} must be an integer from {low} to {high}{shown}.")


def _default_claim_lease(definitions: Sequence[ActorDefinition]) -> int:
    longest = max(
        (d.policy.execution_timeout + d.policy.lock_wait for d in definitions),
        default=_CLAIM_LEASE_FLOOR_MS,
    )
    return longest + _CLAIM_LEASE_MARGIN_MS


def _executes(
    definitions: Sequence[ActorDefinition], jobs: Sequence[Any] | None
) -> frozenset[tuple[str, str]]:
    if jobs is None:
        return frozenset((d.name, name) for d in definitions for name in d.jobs)
    from akter.jobs import Job

    chosen = set()
    for job in jobs:
        if not isinstance(job, Job) or job.owner is None:
            raise ConfigurationError(f"jobs= takes declared jobs (Order.charge), not {job!r}.")
        chosen.add((job.owner.name, job.name))
    return frozenset(chosen)
