"""Turn and query contexts: what ``self`` can do inside a command or a query.

A command's ``self`` is a writable turn context: staging calls (``emit``, ``send``, ``later``,
``enqueue`` ...) validate at the call and record work that is written only if the turn commits.
A query's ``self`` is a read-only view: its state raises on writes and staging calls raise
:class:`~akter.errors.ReadOnlyError`. Capabilities work only in the handler's own task while it
runs; any other use raises :class:`~akter.errors.CapabilityEscaped` and stages nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self

from pydantic import BaseModel
from typing_extensions import TypeVar

from akter._ids import canonical_json, child_id, mint_framework_id, validate_actor_id, validate_key
from akter._json import Unstorable, check_finite, storable_json, unserializable_path
from akter.callers import ActorRef, Caller, System, caller_to_json, principal_of
from akter.errors import CapabilityEscaped, ReadOnlyError, invalid_input

if TYPE_CHECKING:
    from akter.actor import ActorDefinition, Event
    from akter.events import EventStream
    from akter.jobs import Job

S = TypeVar("S", bound=BaseModel, default=BaseModel)
P = ParamSpec("P")
A = TypeVar("A", bound="TurnApi[Any]")
PL = TypeVar("PL", bound=BaseModel)

#: Set while a handler runs: a handle call from inside a turn is a defect.
IN_TURN: contextvars.ContextVar[TurnContext | None] = contextvars.ContextVar(
    "akter_in_turn", default=None
)


@dataclass(frozen=True)
class LoopLease:
    """The singleton lease a ``run()`` loop runs under: its fence.

    Attributes:
        actor_type: The singleton type (the ``singletons`` row's ``actor_type``).
        owner: This runner's id (the row's ``owner``).
        epoch: ``acquired_at_ms`` of the acquisition that started this loop; a takeover by
            another runner writes a new one.
    """

    actor_type: str
    owner: str
    epoch: int


@dataclass
class StagedRow:
    """One outbox row staged by a turn (intent, timer or job)."""

    intent_id: str
    kind: str  # "intent" | "job"
    target_type: str
    target_id: str
    command: str
    payload: str
    caller: str
    delay_ms: int | None
    at_ms: int | None
    timer_key: str | None


@dataclass
class Staged:
    """Everything one command staged, in order; discarded unless it succeeds."""

    events: list[tuple[str, str]] = field(default_factory=list)
    ops: list[tuple[str, Any]] = field(default_factory=list)  # ("row", StagedRow) | ("cancel_*", k)


class TurnContext:
    """The private state behind ``self`` for one command (or one query)."""

    def __init__(
        self,
        *,
        definition: ActorDefinition,
        ref: ActorRef,
        caller: Caller,
        command_id: str | None,
        now_ms: int,
        state: BaseModel,
        window_ms: int,
        readonly: bool,
        cursor: int = 0,
        events_reader: Callable[[str | None, int], Awaitable[Any]] | None = None,
    ) -> None:
        self.definition = definition
        self.ref = ref
        self.caller = caller
        self.command_id = command_id
        self.now_ms = now_ms
        self.state = state
        self.window_ms = window_ms
        self.readonly = readonly
        self.cursor = cursor
        self.events_reader = events_reader
        self.staged = Staged()
        self.task: asyncio.Task[Any] | None = None
        self.active = False
        self.mint_ordinal = 0
        self.poisoned: str | None = None
        self.loop_runtime: Any = None
        self.runner_id: str | None = None
        self.lease: LoopLease | None = None

    def check(self) -> None:
        """Refuse capabilities outside the handler's own task or after it ended."""
        if not self.active or asyncio.current_task() is not self.task:
            raise CapabilityEscaped(
                f"A turn capability of {self.ref.type}/{self.ref.id!r} was used after its "
                "handler returned or from another task; stage work only inside the handler."
            )

    def writable(self, what: str) -> None:
        """Refuse staging from a query."""
        self.check()
        if self.readonly:
            raise ReadOnlyError(f"{what}() is not available in a query: queries are read-only.")

    @property
    def principal(self) -> str | None:
        """The principal of the turn's caller."""
        return principal_of(self.caller)

    def system_caller(self, source: str, mint: tuple[str, int] | None = None) -> str:
        """The JSON caller of work this turn causes."""
        return caller_to_json(
            System(source=source, ref=self.ref, on_behalf_of=self.principal, mint=mint)  # type: ignore[arg-type]
        )


class _ReadOnly:
    """A read-only proxy of committed state handed to queries."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        return _read_only(getattr(self._target, name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise ReadOnlyError(f"Cannot set {name!r}: query views are read-only.")

    def __delattr__(self, name: str) -> None:
        raise ReadOnlyError(f"Cannot delete {name!r}: query views are read-only.")

    def __eq__(self, other: object) -> bool:
        return bool(self._target == (other._target if isinstance(other, _ReadOnly) else other))

    def __hash__(self) -> int:
        return id(self._target)

    def __repr__(self) -> str:
        return f"ReadOnly({self._target!r})"


def _read_only(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _ReadOnly(value)
    if isinstance(value, list | tuple):
        return tuple(_read_only(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: _read_only(v) for k, v in value.items()})
    if isinstance(value, set):
        return frozenset(value)
    return value


def unwrap_read_only(value: Any) -> Any:
    """Turn a query's read-only views back into plain values (for result validation)."""
    if isinstance(value, _ReadOnly):
        return object.__getattribute__(value, "_target").model_copy(deep=True)
    if isinstance(value, tuple):
        return tuple(unwrap_read_only(v) for v in value)
    if isinstance(value, MappingProxyType):
        return {k: unwrap_read_only(v) for k, v in value.items()}
    return value


def _ctx(obj: Any) -> TurnContext:
    ctx = obj.__dict__.get("_akter_ctx") if hasattr(obj, "__dict__") else None
    if not isinstance(ctx, TurnContext):
        raise CapabilityEscaped(
            "Turn capabilities exist only inside a command or query handler run by akter."
        )
    ctx.check()
    return ctx


def _due(
    after: float | timedelta | None, at: datetime | None, what: str
) -> tuple[int | None, int | None]:
    from akter._ids import ms_from_duration

    if after is not None and at is not None:
        raise ValueError(f"{what}: give after= or at=, not both.")
    if at is not None:
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise ValueError(f"{what}: at= must be an aware datetime.")
        return None, int(at.timestamp() * 1000)
    if after is not None:
        return ms_from_duration(after, "after"), None
    return None, None


class Later:
    """The result of ``self.later(...)``: ``.send(Other.command, other_id, ...)``."""

    def __init__(
        self, owner: Any, delay_ms: int | None, at_ms: int | None, key: str | None
    ) -> None:
        self._owner = owner
        self._delay_ms = delay_ms
        self._at_ms = at_ms
        self._key = key

    def send(
        self,
        command: Callable[Concatenate[A, P], Awaitable[Any]],
        actor_id: str,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """Stage a timer that delivers ``command`` to ``actor_id`` when due."""
        ctx = _ctx(self._owner)
        ctx.writable("later")
        _stage_intent(ctx, command, actor_id, args, kwargs, self._delay_ms, self._at_ms, self._key)


def _stage_intent(
    ctx: TurnContext,
    command: Any,
    actor_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    delay_ms: int | None,
    at_ms: int | None,
    key: str | None,
    *,
    mint: tuple[str, int] | None = None,
) -> None:
    from akter.actor import member_of

    member = member_of(command)
    if member.kind != "command":
        raise invalid_input(f"{member.owner.name}.{member.name} is a query; send a command.")
    target_id = "" if member.owner.singleton else validate_actor_id(actor_id)
    payload = member.bind(args, kwargs)
    timed = delay_ms is not None or at_ms is not None or key is not None
    source = "timer" if timed else "actor"
    if delay_ms is not None:
        # The slack is the sender's execution timeout (semantics §1.4).
        due, slack = ctx.now_ms + delay_ms, ctx.definition.policy.execution_timeout
    elif at_ms is not None:
        due, slack = at_ms, 0
    else:
        due, slack = ctx.now_ms, 0
    row = StagedRow(
        intent_id=mint_framework_id(ctx.now_ms, due, slack, ctx.window_ms),
        kind="intent",
        target_type=member.owner.name,
        target_id=target_id,
        command=member.name,
        payload=canonical_json(payload),
        caller=ctx.system_caller(source, mint),
        delay_ms=delay_ms if delay_ms is not None else (None if at_ms is not None else 0),
        at_ms=at_ms,
        timer_key=key,
    )
    if key is not None:
        ctx.staged.ops.append(("cancel_timer", key))
    ctx.staged.ops.append(("row", row))


class TurnApi(Generic[S]):
    """The capability surface shared by actors: ``self`` inside commands and queries."""

    @property
    def id(self) -> str:
        """The actor's id (``""`` for a singleton)."""
        return _ctx(self).ref.id

    @property
    def tenant(self) -> str:
        """The actor's tenant."""
        return _ctx(self).ref.tenant

    @property
    def ref(self) -> ActorRef:
        """The actor's address."""
        return _ctx(self).ref

    @property
    def caller(self) -> Caller:
        """Who sent the command being run."""
        return _ctx(self).caller

    @property
    def principal(self) -> str | None:
        """The principal the command is attributed to."""
        return _ctx(self).principal

    @property
    def command_id(self) -> str:
        """The command id of the running command."""
        cid = _ctx(self).command_id
        if cid is None:
            raise ReadOnlyError("Queries have no command id.")
        return cid

    @property
    def now(self) -> datetime:
        """Database time pinned for the turn (an aware UTC datetime)."""
        return datetime.fromtimestamp(_ctx(self).now_ms / 1000, tz=UTC)

    @property
    def now_ms(self) -> int:
        """Database time pinned for the turn, in epoch milliseconds."""
        return _ctx(self).now_ms

    @property
    def cursor(self) -> str:
        """In a query: the event cursor read with the state (``events(after=cursor)``)."""
        return str(_ctx(self).cursor)

    @property
    def runtime(self) -> Any:
        """In a singleton's ``run()`` loop: the runtime, whose handles are fenced on the lease.

        ``self.runtime.get(...)`` and ``self.runtime.create(...)`` return handles whose commands
        carry the loop's lease (:attr:`lease`); everything else is the runtime itself.
        """
        from akter.handles import FencedRuntime

        ctx = _ctx(self)
        if ctx.loop_runtime is None:
            raise ReadOnlyError("self.runtime exists only in a singleton's run() loop.")
        if ctx.lease is None:
            return ctx.loop_runtime
        return FencedRuntime(ctx.loop_runtime, ctx.lease)

    @property
    def lease(self) -> LoopLease:
        """In a singleton's ``run()`` loop: the lease it runs under (owner and epoch)."""
        ctx = _ctx(self)
        if ctx.lease is None:
            raise ReadOnlyError("self.lease exists only in a singleton's run() loop.")
        return ctx.lease

    async def run(self) -> None:
        """A singleton's background loop: override it; one runner at a time runs it.

        It runs for the "default"-tenant instance on the runner holding the type's lease and is
        cancelled when the lease cannot be refreshed in time. It has no state: change state by
        calling commands through ``self.runtime.get(...)``.

        Those commands are fenced in the database: the turn checks, before the handler runs,
        that the lease is still this loop's (same owner and epoch, not ended), and its commit
        flight checks it again holding the lease row ``FOR KEY SHARE`` through ``COMMIT``. The
        owner's refreshes pass that lock; a successor's takeover locks the row ``FOR UPDATE``
        first, so it waits for a commit in flight (never for a paused client).
        A command from a loop whose lease was lost (the process was paused past its lease, say)
        is refused with ``ActorError`` ``LeaseLost``, writes nothing and leaves its command id
        unused. Queries need no fence and carry none.

        The cancellation at lease − margin holds only while the process runs; after a pause
        the loop may take one more step before it is cancelled. Fence your own writes the same
        way, in their transaction, with :attr:`lease`::

            SELECT 1 FROM <schema>.singletons
            WHERE actor_type = %(actor_type)s AND owner = %(owner)s::uuid
              AND acquired_at_ms = %(epoch)s AND lease_until_ms > <schema>.now_ms(0)
            FOR KEY SHARE

        and write only if it returns a row. (``now_ms(0)`` is the database clock; a runtime
        with ``clock_offset=`` writes leases on its shifted clock, so pass that offset in ms.)
        """
        return

    @property
    def state(self) -> S:
        """The actor's state: writable in commands, read-only in queries."""
        ctx = _ctx(self)
        if ctx.loop_runtime is not None:
            raise ReadOnlyError("A singleton loop has no state; call a command to change it.")
        if ctx.readonly:
            return _read_only(ctx.state)  # type: ignore[no-any-return]
        return ctx.state  # type: ignore[return-value]

    @state.setter
    def state(self, value: S) -> None:
        ctx = _ctx(self)
        ctx.writable("state =")
        if not isinstance(value, type(ctx.state)):
            raise TypeError(
                f"State of {ctx.definition.name!r} must be a {type(ctx.state).__name__}, "
                f"not {type(value).__name__}."
            )
        ctx.state = value

    def emit(self, event: Event) -> None:
        """Stage an event; it is appended with the next sequence number if the turn commits."""
        from akter.actor import Event

        ctx = _ctx(self)
        ctx.writable("emit")
        if not isinstance(event, Event):
            raise TypeError(f"emit() takes an akter.Event, not {type(event).__name__}.")
        declared = ctx.definition.events
        if declared and type(event) not in declared:
            raise TypeError(
                f"{ctx.definition.name} does not declare {type(event).__name__} in events=[...]."
            )
        tag = type(event).event_tag
        # Refused here, inside the handler, with the field named: never in the commit flight.
        where = f"event {tag}"
        check_finite(event, where)
        try:
            dumped = event.model_dump(mode="json")
        except ValueError as exc:  # pydantic cannot serialize a value an Any field holds
            raise Unstorable(unserializable_path(event, where), str(exc)) from None
        ctx.staged.events.append((tag, storable_json(dumped, where)))

    def send(
        self,
        command: Callable[Concatenate[A, P], Awaitable[Any]],
        actor_id: str,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """Stage an intent: ``command`` delivered to ``actor_id`` (same tenant) after commit."""
        ctx = _ctx(self)
        ctx.writable("send")
        _stage_intent(ctx, command, actor_id, args, kwargs, None, None, None)

    def later(
        self,
        *,
        after: float | timedelta | None = None,
        at: datetime | None = None,
        key: str | None = None,
    ) -> Later:
        """A timer: ``self.later(after=60, key="remind").send(Other.cmd, other_id, ...)``.

        ``after`` counts from the commit on the database clock; ``at`` is an aware datetime
        (a past one is due at once). A ``key`` replaces this actor's pending timer with that key.
        """
        ctx = _ctx(self)
        ctx.writable("later")
        if key is not None:
            validate_key(key, "timer key")
        delay_ms, at_ms = _due(after, at, "later()")
        if delay_ms is None and at_ms is None:
            delay_ms = 0
        return Later(self, delay_ms, at_ms, key)

    def cancel_timer(self, key: str) -> None:
        """Delete this actor's pending timer with ``key`` if the turn commits."""
        ctx = _ctx(self)
        ctx.writable("cancel_timer")
        validate_key(key, "timer key")
        ctx.staged.ops.append(("cancel_timer", key))

    def enqueue(
        self,
        job: Job[PL, Any],
        payload: PL,
        *,
        key: str | None = None,
        after: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> str:
        """Stage a job of this actor type; returns its id (the provider idempotency key)."""
        ctx = _ctx(self)
        ctx.writable("enqueue")
        from akter.jobs import Job

        if not isinstance(job, Job) or job.owner is not ctx.definition:
            raise invalid_input(
                f"enqueue() takes a job of {ctx.definition.name!r} (e.g. "
                f"{ctx.definition.name}.<job>), not {job!r}."
            )
        if key is not None:
            validate_key(key, "job key")
        delay_ms, at_ms = _due(after, at, "enqueue()")
        body = job.validate_payload(payload)
        due = at_ms if at_ms is not None else ctx.now_ms + (delay_ms or 0)
        slack = ctx.definition.policy.execution_timeout if at_ms is None else 0
        job_id = mint_framework_id(ctx.now_ms, due, slack, ctx.window_ms)
        row = StagedRow(
            intent_id=job_id,
            kind="job",
            target_type=ctx.definition.name,
            target_id=ctx.ref.id,
            command=job.name,
            payload=canonical_json(body),
            caller=ctx.system_caller("job"),
            delay_ms=delay_ms if at_ms is None else None,
            at_ms=at_ms,
            timer_key=None if key is None else "$job:" + key,
        )
        if key is not None:
            ctx.staged.ops.append(("cancel_job", "$job:" + key))
        ctx.staged.ops.append(("row", row))
        return job_id

    def cancel_job(self, key: str) -> None:
        """Cancel this actor's job with ``key`` if the turn commits (semantics §5.8)."""
        ctx = _ctx(self)
        ctx.writable("cancel_job")
        validate_key(key, "job key")
        ctx.staged.ops.append(("cancel_job", "$job:" + key))

    def mint(self, child: type[Any]) -> ActorRef:
        """Mint the id of a new child actor, derived from this command's id (semantics §1.5)."""
        from akter.actor import definition_of

        ctx = _ctx(self)
        ctx.writable("mint")
        definition = definition_of(child)
        ordinal = ctx.mint_ordinal
        ctx.mint_ordinal += 1
        assert ctx.command_id is not None
        return ActorRef(
            ctx.ref.tenant,
            definition.name,
            child_id(
                tenant=ctx.ref.tenant,
                parent_type=ctx.definition.name,
                parent_id=ctx.ref.id,
                parent_command_id=ctx.command_id,
                ordinal=ordinal,
                child_type=definition.name,
            ),
        )

    def create(
        self,
        command: Callable[Concatenate[A, P], Awaitable[Any]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ActorRef:
        """Mint a child and stage its creating command as an intent carrying the mint proof."""
        from akter.actor import member_of

        ctx = _ctx(self)
        ctx.writable("create")
        member = member_of(command)
        ordinal = ctx.mint_ordinal
        ref = self.mint(member.owner.cls)
        assert ctx.command_id is not None
        _stage_intent(
            ctx, command, ref.id, args, kwargs, None, None, None, mint=(ctx.command_id, ordinal)
        )
        return ref

    def events(self, after: str | None = None, limit: int = 1000) -> EventStream:
        """Committed events after a cursor (exclusive), as :class:`akter.EventRecord`.

        In a query, ``await self.events(after=self.cursor)`` reads one page; on a handle,
        ``async for record in handle.events(after=cursor)`` replays and then follows live.
        """
        from akter.events import EventStream

        ctx = _ctx(self)
        reader = ctx.events_reader
        if reader is None:
            raise ReadOnlyError("events() is available in queries and on handles only.")
        return EventStream(lambda: reader(after, limit))

    def progress(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """On a handle: live progress frames of one of this actor's jobs."""
        raise TypeError("progress() is a handle method; call it on runtime.get(...).")

    def with_command_id(self, command_id: str) -> Self:
        """On a handle: pin the command id of the next call (idempotent retries)."""
        raise TypeError("with_command_id() is a handle method; call it on runtime.get(...).")


def staged_json(value: Any) -> str:
    """Canonical JSON of a staged value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
