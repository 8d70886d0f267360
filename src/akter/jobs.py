"""Job declarations: ``@akter.job`` executors, their routes and the route payload types.

A job is an external call an actor asks for in a turn (``self.enqueue``); it runs after commit
on an executor with attempts, a lease and honest ambiguity (semantics §5), and its outcome comes
back to the actor through an internal route command (``on_success``, ``on_dead_letter``,
``on_cancelled``) whose command id is the job id.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, Protocol

from pydantic import BaseModel, TypeAdapter, ValidationError
from typing_extensions import TypeVar

from akter._evolution import (
    Chain,
    Migration,
    MigrationDecorator,
    build_chain,
    check_aliases,
    check_version,
    declare,
    upgrade_payload,
)
from akter._ids import ms_from_duration
from akter._members import _MEMBER_ATTR, MemberOwner, MemberSpec
from akter._storable import storable_payload
from akter.callers import ActorRef
from akter.errors import DefinitionError, invalid_input_from
from akter.job_streams import JobStreamError
from akter.resources import MissingResource, OpenResources, Resource

PL = TypeVar("PL", bound=BaseModel)
R = TypeVar("R", default=Any)
A = TypeVar("A")
P = TypeVar("P", default=Any)
Duration = float | int | timedelta

_MAX_MS = 2**31 - 1


class JobCall(Protocol):
    """What an executor gets besides its payload: ids, attempt, progress, output, resources.

    A protocol, like :class:`akter.QueryView`: an executor is declared in its actor's class body
    without ``self``, and pyright accepts a first parameter whose type is not the class only when
    that type is a protocol. The runtime passes an :class:`AttemptCall`.

    Attributes:
        job_id: Stable across attempts: use it as the provider's idempotency key.
        attempt: The attempt number, from 1.
        principal: The principal of the turn that enqueued the job.
        ref: The actor that owns the job.
        tenant: The actor's tenant.
    """

    job_id: str
    attempt: int
    principal: str | None
    ref: ActorRef
    tenant: str
    _report: Callable[[BaseModel], None] | None
    _resources: OpenResources | None
    _stream: Callable[[object], None] | None

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        principal: str | None,
        ref: ActorRef,
        report: Callable[[BaseModel], None] | None = None,
        resources: OpenResources | None = None,
        stream: Callable[[object], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.principal = principal
        self.ref = ref
        self.tenant = ref.tenant
        self._report = report
        self._resources = resources
        self._stream = stream

    def stream(self, chunk: object) -> None:
        """Append a chunk to the job's output stream (docs/guides/job-streams.md); never blocks.

        A chunk is a ``str``, a pydantic model or a JSON value, at most
        ``akter.job_streams.MAX_CHUNK_BYTES`` of canonical JSON. Chunks are stored in order,
        batched, only while this attempt owns the job row.

        Raises:
            JobStreamError: ``chunk_too_large``, ``chunk_not_json``, ``stream_backlog`` or
                ``superseded`` (this attempt lost its job row: stop streaming).
        """
        if self._stream is None:
            raise JobStreamError(
                "superseded", f"Job {self.job_id!r}: this call has no output stream."
            )
        self._stream(chunk)

    def report(self, frame: BaseModel) -> None:
        """Publish a progress frame (best-effort; never blocks or raises)."""
        if self._report is not None:
            self._report(frame)

    def resource(self, key: Resource[A]) -> A:
        """The runtime's resource under ``key`` (``Runtime(resources=...)``; the jobs guide).

        Look resources up before the first external call: a missing one fails the attempt as
        not applied (retried, then dead-lettered), which is only true if nothing was called.

        Raises:
            MissingResource: If the runtime does not provide ``key`` (a rate key function's
                call has no resources).
        """
        where = f"Job {self.job_id!r} of {self.ref.type} {self.ref.id!r}"
        if self._resources is None:
            raise MissingResource(key, where)
        return self._resources.get(key, where)


class AttemptCall(JobCall):
    """The :class:`JobCall` of one attempt (or of a rate key's evaluation), built by the runtime."""


class DeadLetter(BaseModel, Generic[P]):
    """The payload of ``on_dead_letter``: a job that ran out of attempts."""

    job_id: str
    job: P
    attempts: int
    cause: str
    ambiguous: bool


class Succeeded(BaseModel, Generic[R]):
    """A cancelled job's result finished before the cancellation was seen."""

    kind: Literal["Succeeded"] = "Succeeded"
    value: R


class Failed(BaseModel):
    """A cancelled job that no attempt can have applied."""

    kind: Literal["Failed"] = "Failed"
    cause: str


class Unknown(BaseModel):
    """A cancelled job whose provider may have applied the call."""

    kind: Literal["Unknown"] = "Unknown"
    cause: str


class Cancelled(BaseModel, Generic[P, R]):
    """The payload of ``on_cancelled``: what is known of a cancelled job."""

    job_id: str
    job: P
    attempts: int
    outcome: Succeeded[R] | Failed | Unknown
    ambiguous: bool


class Rate:
    """A token-bucket rate limit of a job, kept in the database and shared by all runners.

    ``Rate(100, per=timedelta(seconds=1), key=lambda call: call.tenant, burst=20)``: each key
    (the key function's result, as text; one bucket without a key) gets ``limit`` tokens per
    ``per``, holding at most ``burst`` (default ``limit``). An attempt takes one token from
    each of its job's limits before it starts; a row that finds none is handed back uncounted,
    due when a token will be (docs/flow-control.md).

    Raises:
        DefinitionError: ``limit`` or ``burst`` is not a positive integer, ``per`` is not a
            positive duration, or ``key`` is not callable.
    """

    def __init__(
        self,
        limit: int,
        *,
        per: Duration = 1.0,
        key: Callable[[JobCall], Any] | None = None,
        burst: int | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000:
            raise DefinitionError(
                f"Rate limit must be an integer from 1 to 1000000, got {limit!r}."
            )
        if burst is not None and (
            isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000
        ):
            raise DefinitionError(
                f"Rate burst must be an integer from 1 to 1000000, got {burst!r}."
            )
        if key is not None and not callable(key):
            raise DefinitionError(f"Rate key must be a function of the JobCall, not {key!r}.")
        if key is not None and inspect.iscoroutinefunction(key):
            raise DefinitionError(
                f"Rate key must be a plain function (it runs inside the claim), not async {key!r}."
            )
        self.limit = limit
        self.per_ms = _ms(per, "Rate per")
        self.key = key
        self.burst = limit if burst is None else burst

    @property
    def tokens_per_ms(self) -> float:
        """The refill rate."""
        return self.limit / self.per_ms

    def key_of(self, call: JobCall) -> str:
        """The bucket key of one attempt (the key function may raise: the caller decides)."""
        if self.key is None:
            return ""
        key = self.key(call)
        if inspect.isawaitable(key):  # an async callable the definition check cannot see
            if inspect.iscoroutine(key):
                key.close()
            raise TypeError("the key function returned an awaitable; it must return the key")
        return str(key)

    def __repr__(self) -> str:
        return f"akter.Rate({self.limit}, per={self.per_ms} ms, burst={self.burst})"


def _rates(rate: Rate | list[Rate] | tuple[Rate, ...] | None) -> tuple[Rate, ...]:
    if rate is None:
        return ()
    found = (rate,) if isinstance(rate, Rate) else rate
    if not isinstance(found, tuple | list) or not all(isinstance(r, Rate) for r in found):
        raise DefinitionError(f"rate= takes an akter.Rate or a list of them, not {rate!r}.")
    if len(found) > 8:
        raise DefinitionError(f"rate= takes at most 8 limits, got {len(found)}.")
    return tuple(found)


@dataclass(frozen=True)
class JobOptions:
    """A job's options in whole milliseconds."""

    attempts: int
    backoff_base_ms: int
    backoff_max_ms: int
    timeout_ms: int
    per_actor: int | None
    progress: type[BaseModel] | None
    progress_every_ms: int
    #: The payload version rows are staged at (evolution E3).
    version: int = 0
    #: Earlier names of the job that stored rows and dead letters may carry (evolution E2).
    aliases: tuple[str, ...] = ()
    #: The default priority of its rows, 0-9, higher first (docs/flow-control.md).
    priority: int = 0
    #: After this long due, a row ranks like a top-priority row (``None``: strict priority).
    max_wait_ms: int | None = None
    #: At most this many live attempts of the job across all runners (``None``: no cap).
    concurrency: int | None = None
    #: Token-bucket limits an attempt takes a token from each of before it starts.
    rates: tuple[Rate, ...] = ()


class Job(Generic[PL, R]):
    """A declared job: created by ``@akter.job(...)`` on an executor inside an actor class."""

    def __init__(self, fn: Callable[[JobCall, PL], Awaitable[R]], options: JobOptions) -> None:
        if not callable(fn):
            raise DefinitionError(f"@job needs a function, not {fn!r}.")
        self.fn = fn
        self.options = options
        self.name: str = getattr(fn, "__name__", "job")
        self.owner: MemberOwner | None = None
        self.routes: dict[str, Callable[..., Any]] = {}
        self.payload_model: type[BaseModel] | None = None
        self.result: TypeAdapter[Any] = TypeAdapter(Any)
        self.is_async = inspect.iscoroutinefunction(fn)
        #: The payload migrations (evolution E3), complete once the job is resolved.
        self.payload_chain = Chain()
        self._migrations: list[Migration] = []

    @property
    def version(self) -> int:
        """The payload version this code stages and executes."""
        return self.options.version

    @property
    def aliases(self) -> tuple[str, ...]:
        """Earlier names of the job."""
        return self.options.aliases

    def migrate_payload(self, *, from_version: int) -> MigrationDecorator:
        """Declare the migration of this job's stored payloads from ``from_version``."""
        return typing.cast(MigrationDecorator, declare(from_version, self._migrations.append))

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        owner = self.owner.name if self.owner else "?"
        return f"<akter.Job {owner}.{self.name}>"

    def _route(self, kind: str, fn: Callable[..., Any]) -> None:
        if kind in self.routes:
            raise DefinitionError(f"Job {self.name!r} already has an on_{kind} route.")
        if not inspect.iscoroutinefunction(fn):
            raise DefinitionError(f"Route {getattr(fn, '__name__', fn)!r} must be 'async def'.")
        self.routes[kind] = fn
        setattr(fn, _MEMBER_ATTR, MemberSpec("command", internal=True, route=(kind, self)))

    def on_success(
        self, fn: Callable[[A, R], Awaitable[None]]
    ) -> Callable[[A, R], Awaitable[None]]:
        """Declare the internal command that receives the executor's result."""
        self._route("success", fn)
        return fn

    def on_dead_letter(
        self, fn: Callable[[A, DeadLetter[Any]], Awaitable[None]]
    ) -> Callable[[A, DeadLetter[Any]], Awaitable[None]]:
        """Declare the internal command that receives the job's dead letter."""
        self._route("dead_letter", fn)
        return fn

    def on_cancelled(
        self, fn: Callable[[A, Cancelled[Any, Any]], Awaitable[None]]
    ) -> Callable[[A, Cancelled[Any, Any]], Awaitable[None]]:
        """Declare the internal command that receives a cancelled job's report."""
        self._route("cancelled", fn)
        return fn

    def bind_owner(self, definition: MemberOwner) -> None:
        """Attach the job to its actor type and check its routes belong to it."""
        self.owner = definition
        for kind, fn in self.routes.items():
            member = definition.members.get(fn.__name__)
            if member is None or member.fn is not fn:
                raise DefinitionError(
                    f"{definition.name}.{self.name}: the on_{kind} route {fn.__qualname__!r} must "
                    f"be a method of {definition.name}."
                )

    def resolve(self) -> None:
        """Resolve the executor's payload and result annotations."""
        where = f"{self.owner.name if self.owner else '?'}.{self.name}"
        try:
            hints = typing.get_type_hints(self.fn)
        except NameError as exc:
            raise DefinitionError(f"{where}: cannot resolve an annotation ({exc}).") from None
        params = list(inspect.signature(self.fn).parameters.values())
        if len(params) != 2:
            raise DefinitionError(f"{where}: a job executor takes (call: JobCall, payload: Model).")
        payload_type = hints.get(params[1].name)
        if not (isinstance(payload_type, type) and issubclass(payload_type, BaseModel)):
            raise DefinitionError(f"{where}: the payload must be annotated with a pydantic model.")
        self.payload_model = payload_type
        self.result = TypeAdapter(hints.get("return", Any))
        self.payload_chain = build_chain(where, self._migrations)
        check_version(where, self.options.version, self.payload_chain)

    def decode_payload(self, stored: Any, version: int) -> dict[str, Any]:
        """A stored row's (or dead letter's) payload at ``version``, migrated and validated.

        Raises:
            PayloadTooNew: The row is at a version above the job's.
            ActorError: ``InvalidInput`` naming the field when it fails after migrations.
        """
        what = f"job {self.owner.name if self.owner else '?'}.{self.name}"
        return self.validate_payload(upgrade_payload(self.payload_chain, stored, version, what))

    def validate_payload(self, payload: Any) -> dict[str, Any]:
        """Validate an enqueued payload; its JSON form is stored in the outbox."""
        assert self.payload_model is not None
        try:
            model = self.payload_model.model_validate(
                payload.model_dump() if isinstance(payload, BaseModel) else payload
            )
        except ValidationError as exc:
            raise invalid_input_from(exc, f"payload for job {self.name}") from None
        return storable_payload(model, f"payload for job {self.name}")


def _ms(value: Duration, what: str, low: int = 1) -> int:
    try:
        ms = ms_from_duration(value, what)
    except (ValueError, TypeError) as exc:
        raise DefinitionError(str(exc)) from None
    if ms < low or ms > _MAX_MS:
        raise DefinitionError(f"{what} must be between {low} ms and {_MAX_MS} ms, got {ms} ms.")
    return ms


def _version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise DefinitionError(f"version= must be a non-negative integer, not {version!r}.")
    return version


def check_priority(priority: Any, what: str = "priority") -> int:
    """A priority from 0 to 9 (higher first), or a ``DefinitionError`` naming the value."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise DefinitionError(f"{what} must be an integer from 0 to 9, got {priority!r}.")
    return priority


def _concurrency(concurrency: Any) -> int | None:
    if concurrency is None:
        return None
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= 10_000
    ):
        raise DefinitionError(
            f"concurrency must be an integer from 1 to 10000, got {concurrency!r}."
        )
    return concurrency


class JobDecorator(typing.Protocol):
    """What ``@akter.job(...)`` returns: it takes an ``async def`` or a plain ``def`` executor.

    A plain ``def`` runs in a thread; an attempt that ends while its thread still runs keeps its
    slot until the thread returns (README, "Jobs").
    """

    @typing.overload
    def __call__(self, fn: Callable[[JobCall, PL], Awaitable[R]], /) -> Job[PL, R]: ...

    @typing.overload
    def __call__(self, fn: Callable[[JobCall, PL], R], /) -> Job[PL, R]: ...


def job(
    *,
    attempts: int = 4,
    backoff: tuple[Duration, Duration] = (1.0, 256.0),
    timeout: Duration = 30.0,
    per_actor: int | None = None,
    progress: type[BaseModel] | None = None,
    progress_every: Duration = 0.25,
    version: int = 0,
    aliases: tuple[str, ...] | list[str] = (),
    priority: int = 0,
    max_wait: Duration | None = None,
    concurrency: int | None = None,
    rate: Rate | list[Rate] | tuple[Rate, ...] | None = None,
) -> JobDecorator:
    """Declare a job executor inside an actor class (semantics §5.1).

    Args:
        attempts: 1…101 attempts in all.
        backoff: ``(base, max)``: the wait after failed attempt n is ``min(base × 2^(n−1), max)``.
        timeout: Per-attempt time limit on the runner.
        per_actor: 1…64 live attempts per actor across all runners, or unlimited.
        progress: The pydantic model of progress frames, if the job reports progress.
        progress_every: At most one published frame per interval (50 ms … 60 s).
        version: The version of its payload (evolution E3): pending rows and dead letters
            stored at an older version are upgraded by the ``@job.migrate_payload`` chain.
        aliases: Earlier names of the job, claimed for stored rows (evolution E2).
        priority: The default priority of its rows, 0-9, higher first; ``self.enqueue(...,
            priority=)`` overrides it per row (docs/flow-control.md).
        max_wait: Once a row has been ready this long it ranks like a priority-9 row, so
            higher priorities never starve it (``None``: strict priority).
        concurrency: At most this many attempts of the job run at once across all runners,
            counted in the database (1…10000, or unlimited).
        rate: An :class:`Rate` or a list of them (stacked: an attempt needs a token of each).
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 101:
        raise DefinitionError(f"attempts must be an integer from 1 to 101, got {attempts!r}.")
    if per_actor is not None and (
        isinstance(per_actor, bool) or not isinstance(per_actor, int) or not 1 <= per_actor <= 64
    ):
        raise DefinitionError(f"per_actor must be an integer from 1 to 64, got {per_actor!r}.")
    if not (isinstance(backoff, tuple | list) and len(backoff) == 2):
        raise DefinitionError("backoff must be a (base, max) pair.")
    base, cap = _ms(backoff[0], "backoff base"), _ms(backoff[1], "backoff max")
    if cap < base:
        raise DefinitionError(f"backoff max ({cap} ms) must be at least its base ({base} ms).")
    every = _ms(progress_every, "progress_every", 50)
    if every > 60_000:
        raise DefinitionError("progress_every must be at most 60 s.")
    if progress is not None and not (
        isinstance(progress, type) and issubclass(progress, BaseModel)
    ):
        raise DefinitionError("progress= must be a pydantic model class.")
    options = JobOptions(
        attempts=attempts,
        backoff_base_ms=base,
        backoff_max_ms=cap,
        timeout_ms=_ms(timeout, "timeout"),
        per_actor=per_actor,
        progress=progress,
        progress_every_ms=every,
        version=_version(version),
        aliases=check_aliases("@job", aliases),
        priority=check_priority(priority),
        max_wait_ms=None if max_wait is None else _ms(max_wait, "max_wait"),
        concurrency=_concurrency(concurrency),
        rates=_rates(rate),
    )

    def declare(fn: Callable[[JobCall, Any], Any]) -> Job[Any, Any]:
        return Job(fn, options)

    return typing.cast(JobDecorator, declare)


__all__ = [
    "Cancelled",
    "DeadLetter",
    "Duration",
    "Failed",
    "Job",
    "JobCall",
    "JobDecorator",
    "JobOptions",
    "Rate",
    "Succeeded",
    "Unknown",
    "job",
]
