"""The runner's configuration: every ``Runtime(...)`` option, validated once, then frozen.

``RuntimeConfig`` is the one place the keyword arguments of ``akter.Runtime`` are checked and
turned into whole milliseconds; every component reads the frozen result (through
``Services.config``) and never the raw arguments. The README's option table lists the same
options with the same bounds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

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


class RuntimeOptions(TypedDict, total=False):
    """The keyword options of ``akter.Runtime`` (defaults and bounds: ``RuntimeConfig``)."""

    database_url: str | None
    schema: str
    retry_window: Duration
    max_resident_actors: int
    max_pending_commands: int
    pool_size: int
    framework_pool_size: int
    pool_wait: Duration
    query_pool_wait: Duration
    drain_deadline: Duration
    data_dir: str | Path | None
    notify: bool
    poll: Duration
    pass_limit: int
    delivery_concurrency: int
    max_outbox_backlog: int | None
    max_backoff: Duration
    claim_lease: Duration | None
    executor_concurrency: int
    lease: Duration
    cancel_check: Duration | None
    settle_batch: int
    settle_wait: Duration
    jobs: Sequence[Any] | None
    relay: bool
    maintenance: bool
    host_actors: bool
    singleton_lease: Duration
    workflow_lease: Duration
    clock_offset: Duration
    watch_min_interval: Duration
    watch_recheck: Duration
    max_watchers: int
    max_watchers_per_actor: int


@dataclass(frozen=True)
class RuntimeConfig:
    """The validated options of one runner; ``ConfigurationError`` names the first bad one.

    Durations are seconds (``int``/``float``) or a ``timedelta`` and are kept as whole
    milliseconds in the ``*_ms`` fields, which are what components read.

    Attributes:
        database_url: A PostgreSQL URL; default ``$AKTER_DATABASE_URL``, else (``None``) an
            embedded server under ``./.akter`` (or ``$AKTER_DATA_DIR``, or ``data_dir``),
            started and stopped with the runtime.
        schema: The schema holding akter's tables (default ``akter``).
        retry_window: How long a command id stays valid (default 24 h, 1 ms to 30 days); must
            match the deployment's recorded window.
        max_resident_actors: Activations kept in memory before refusing new ones (≥ 1).
        max_pending_commands: Commands queued on this runner before refusing new ones (≥ 1).
        pool_size: Largest number of pooled connections for turns and queries (default 20).
        framework_pool_size: Connections of the framework's own pool (default 3, 1 to 100):
            heartbeats, singleton leases, relay backoffs, job claims and settles, retention.
            User turns never take them.
        pool_wait: The longest a turn waits for a pooled connection (default 2 s, 1 ms to 1 h);
            then its commands fail with a retryable ``ActorError`` ``ActorUnavailable`` (code
            ``pool_exhausted``), not retried by handles.
        query_pool_wait: The same bound for a query (default 2 s, 1 ms to 1 h).
        drain_deadline: Longest graceful shutdown (default 30 s).
        data_dir: The embedded server's data directory.
        notify: Wake other runners with ``NOTIFY`` after commits (default off: they poll).
        poll: The relay's and executors' idle poll interval (default 1 s).
        pass_limit: Rows a relay pass claims at most (default 256).
        delivery_concurrency: Deliveries in flight per runner (default 16).
        max_outbox_backlog: Due, undelivered intents at which this runner's relay stops
            admitting external commands (``RunnerAtCapacity``, retryable, with
            ``retry_after``) until the relays catch up (default 1,000; ``None``: never).
            Sampled only while the relay is saturated (``akter._engine.loop.backlog``).
        max_backoff: The longest wait between delivery retries (default 256 s).
        claim_lease: How long a relay claim holds a row (default: the longest
            ``execution_timeout + lock_wait`` of the hosted types, + 5 s).
        executor_concurrency: Job attempts executing per runner (default 64); a success waiting
            for its batched settle holds no slot.
        lease: The job attempt lease (default 60 s, at least 3 s).
        cancel_check: How often a running attempt checks for cancellation (default lease ÷ 3,
            at least 1 s, at most lease ÷ 3).
        settle_batch: The most job successes one settle statement ends (default 64, 1 to
            10,000; 1: each alone), semantics §5.9 "Batched successes".
        settle_wait: The longest a job success waits behind a settle statement in flight before
            its own is sent beside it (default 2 ms, 1 ms to 1 s).
        jobs: The declared jobs this runner executes (default: all of its types' jobs; ``[]``:
            none).
        relay: Run the relay on this runner (default on).
        maintenance: Contend for the ``$maintenance`` singleton (retention; default on).
        host_actors: Host the actor types' singleton loops and ticks (default on).
        singleton_lease: The lease on a singleton's ``run()`` loop (and ``$maintenance``), 1 s
            to 1 day (default 35 s, semantics §8.2). The owner refreshes it every lease × 10/35
            and stops its loop min(5 s, lease ÷ 7) before it could end; a dead owner's loop is
            taken over once its lease ends. Every runner of a deployment should use the same.
        workflow_lease: The lease on a running workflow run (default 30 s, 1 s to 1 h): renewed
            every third of it while the run's code executes; a dead runner's run is resumed by
            another runner once it has passed.
        clock_offset: Moves this runner's framework clock ahead of the database clock (default
            0; at most 366 days). The test offset of semantics §1.7, for demos and drills that
            need a time of day: every runner of the schema must use the same offset. Never set
            it in production.
        watch_min_interval: The least time between two values of one query watch (default
            0.1 s, 1 ms to 1 h): faster changes are coalesced into the latest value.
        watch_recheck: How often an idle watch re-reads its query, re-checking access (default
            10 s, 10 ms to 1 h): a revoked caller's watch ends within it.
        max_watchers: Query watches open on this runner at most (default 10,000).
        max_watchers_per_actor: Query watches of one actor on this runner at most (default
            1,000).
    """

    definitions: InitVar[Sequence[ActorDefinition]] = ()
    database_url: str | None = None
    schema: str = "akter"
    retry_window: Duration = timedelta(hours=24)
    max_resident_actors: int = 10_000
    max_pending_commands: int = 10_000
    pool_size: int = 20
    framework_pool_size: int = 3
    pool_wait: Duration = 2.0
    query_pool_wait: Duration = 2.0
    drain_deadline: Duration = 30.0
    data_dir: str | Path | None = None
    notify: bool = False
    poll: Duration = 1.0
    pass_limit: int = 256
    delivery_concurrency: int = 16
    max_outbox_backlog: int | None = 1_000
    max_backoff: Duration = 256.0
    claim_lease: Duration | None = None
    executor_concurrency: int = 64
    lease: Duration = 60.0
    cancel_check: Duration | None = None
    settle_batch: int = 64
    settle_wait: Duration = 0.002
    jobs: Sequence[Any] | None = None
    relay: bool = True
    maintenance: bool = True
    host_actors: bool = True
    singleton_lease: Duration = 35.0
    workflow_lease: Duration = 30.0
    clock_offset: Duration = 0.0
    watch_min_interval: Duration = 0.1
    watch_recheck: Duration = 10.0
    max_watchers: int = 10_000
    max_watchers_per_actor: int = 1_000
    # --- derived, in whole milliseconds -------------------------------------------------------
    window_ms: int = field(init=False)
    pool_wait_ms: int = field(init=False)
    query_pool_wait_ms: int = field(init=False)
    drain_deadline_ms: int = field(init=False)
    poll_ms: int = field(init=False)
    max_backoff_ms: int = field(init=False)
    claim_lease_ms: int = field(init=False)
    job_lease_ms: int = field(init=False)
    cancel_check_ms: int = field(init=False)
    settle_wait_ms: int = field(init=False)
    singleton_lease_ms: int = field(init=False)
    workflow_lease_ms: int = field(init=False)
    clock_offset_ms: int = field(init=False)
    watch_min_interval_ms: int = field(init=False)
    watch_recheck_ms: int = field(init=False)
    #: The job types this runner executes, as (actor type, job name).
    executes: frozenset[tuple[str, str]] = field(init=False)

    def __post_init__(self, definitions: Sequence[ActorDefinition]) -> None:
        self._set("database_url", self.database_url or os.environ.get("AKTER_DATABASE_URL"))
        self._set("data_dir", Path(self.data_dir) if self.data_dir else None)
        window_ms = ms_from_duration(self.retry_window, "retry_window")
        if not _WINDOW_MIN_MS <= window_ms <= _WINDOW_MAX_MS:
            raise ConfigurationError("retry_window must be between 1 ms and 30 days.")
        self._set("window_ms", window_ms)
        for name in ("max_resident_actors", "max_pending_commands", "pool_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an integer ≥ 1, got {value!r}.")
        self._check_singletons()
        _check_count("framework_pool_size", self.framework_pool_size, 1, 100, show=True)
        self._set("pool_wait_ms", _bounded(self.pool_wait, "pool_wait"))
        self._set("query_pool_wait_ms", _bounded(self.query_pool_wait, "query_pool_wait"))
        self._set("drain_deadline_ms", ms_from_duration(self.drain_deadline, "drain_deadline"))
        for name in ("pass_limit", "delivery_concurrency", "executor_concurrency"):
            _check_count(name, getattr(self, name), 1, 1_000_000)
        if self.max_outbox_backlog is not None:
            _check_count("max_outbox_backlog", self.max_outbox_backlog, 1, 100_000_000, show=True)
        self._set("notify", bool(self.notify))
        self._set("poll_ms", _at_least(self.poll, "poll", 1))
        self._set("max_backoff_ms", _at_least(self.max_backoff, "max_backoff", 1))
        claim = self.claim_lease
        self._set(
            "claim_lease_ms",
            _default_claim_lease(definitions)
            if claim is None
            else _at_least(claim, "claim_lease", 1),
        )
        self._check_jobs()
        workflow_lease_ms = _duration(self.workflow_lease, "workflow_lease")
        if not 1_000 <= workflow_lease_ms <= 3_600_000:
            raise ConfigurationError(
                f"workflow_lease must be between 1 s and 1 hour, got {workflow_lease_ms} ms."
            )
        self._set("workflow_lease_ms", workflow_lease_ms)
        self._set("executes", _executes(definitions, self.jobs))
        for name in ("relay", "maintenance", "host_actors"):
            self._set(name, bool(getattr(self, name)))
        self._check_watches()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_singletons(self) -> None:
        lease_ms = _duration(self.singleton_lease, "singleton_lease")
        offset_ms = _duration(self.clock_offset, "clock_offset")
        if not _SINGLETON_LEASE_MIN_MS <= lease_ms <= _SINGLETON_LEASE_MAX_MS:
            raise ConfigurationError(
                f"singleton_lease must be between 1 s and 1 day, got {lease_ms} ms."
            )
        if offset_ms > _CLOCK_OFFSET_MAX_MS:
            raise ConfigurationError(f"clock_offset must be at most 366 days, got {offset_ms} ms.")
        self._set("singleton_lease_ms", lease_ms)
        self._set("clock_offset_ms", offset_ms)

    def _check_watches(self) -> None:
        self._set("watch_min_interval_ms", _bounded(self.watch_min_interval, "watch_min_interval"))
        recheck_ms = _bounded(self.watch_recheck, "watch_recheck")
        if recheck_ms < 10:
            raise ConfigurationError(f"watch_recheck must be at least 10 ms, got {recheck_ms} ms.")
        self._set("watch_recheck_ms", recheck_ms)
        _check_count("max_watchers", self.max_watchers, 1, 10_000_000, show=True)
        _check_count(
            "max_watchers_per_actor", self.max_watchers_per_actor, 1, 10_000_000, show=True
        )

    def _check_jobs(self) -> None:
        lease_ms = _at_least(self.lease, "lease", 3_000)
        cancel_ms = lease_ms // 3
        if self.cancel_check is not None:
            cancel_ms = _at_least(self.cancel_check, "cancel_check", 1_000)
        if cancel_ms > lease_ms // 3:
            raise ConfigurationError("cancel_check must be at most a third of the lease.")
        self._set("job_lease_ms", lease_ms)
        self._set("cancel_check_ms", cancel_ms)
        _check_count("settle_batch", self.settle_batch, 1, 10_000, show=True)
        wait_ms = _duration(self.settle_wait, "settle_wait")
        if not 1 <= wait_ms <= 1_000:
            raise ConfigurationError(f"settle_wait must be between 1 ms and 1 s, got {wait_ms} ms.")
        self._set("settle_wait_ms", wait_ms)


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
