"""Turn and query contexts: what ``self`` can do inside a command or a query.

A command's ``self`` is a writable turn context: staging calls (``emit``, ``send``, ``later``,
``enqueue`` ...) validate at the call and record work that is written only if the turn commits.
A query's ``self`` is a read-only view: its state raises on writes and staging calls raise
:class:`~akter.errors.ReadOnlyError`. Capabilities work only in the handler's own task while it
runs; any other use raises :class:`~akter.errors.CapabilityEscaped` and stages nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, Generic, ParamSpec, Self

from pydantic import BaseModel
from typing_extensions import TypeVar

from akter._contexts import (
    IN_TURN,
    CommandContext,
    LoopContext,
    LoopLease,
    QueryContext,
    _Context,
    bind,
)
from akter._enqueue import job_row, many_payload, own_job, row_priority
from akter._event_decl import Event
from akter._ids import canonical_json, child_id, payload_hash, validate_actor_id, validate_key
from akter._json import Unstorable, check_finite, storable_json, unserializable_path
from akter._kinds import RowKind, WorkflowCommand, job_timer_key
from akter._members import definition_of, member_of
from akter._query_view import QueryView
from akter._readonly import read_only as _read_only
from akter._readonly import unwrap_read_only
from akter._staging import (
    CancelJob,
    CancelTimer,
    StagedEvent,
    StagedRow,
    StagedRun,
    framework_id,
    parse_due,
)
from akter.callers import ActorRef, Caller
from akter.errors import CapabilityEscaped, ReadOnlyError, invalid_input
from akter.events import EventStream
from akter.jobs import Job

__all__ = [
    "IN_TURN",
    "CommandContext",
    "Later",
    "LoopContext",
    "LoopLease",
    "QueryContext",
    "QueryView",
    "TurnApi",
    "bind",
    "unwrap_read_only",
]

S = TypeVar("S", bound=BaseModel, default=BaseModel)
P = ParamSpec("P")
A = TypeVar("A", bound="TurnApi[Any]")
PL = TypeVar("PL", bound=BaseModel)


def _ctx(obj: Any) -> _Context:
    ctx = obj.__dict__.get("_akter_ctx") if hasattr(obj, "__dict__") else None
    if not isinstance(ctx, _Context):
        raise CapabilityEscaped(
            "Turn capabilities exist only inside a command or query handler run by akter."
        )
    ctx.check()
    return ctx


def _writable(obj: Any, what: str) -> CommandContext:
    """The command context behind ``obj``; staging from a query or a loop is refused."""
    ctx = _ctx(obj)
    if not isinstance(ctx, CommandContext):
        raise ReadOnlyError(f"{what}() is not available in a query: queries are read-only.")
    return ctx


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
        ctx = _writable(self._owner, "later")
        _stage_intent(ctx, command, actor_id, args, kwargs, self._delay_ms, self._at_ms, self._key)


def _stage_workflow(ctx: CommandContext, command: WorkflowCommand, body: dict[str, Any]) -> str:
    """Stage a ``$workflow.*`` intent to this actor (the relay hands it to the engine)."""
    timeout = ctx.definition.policy.execution_timeout
    intent_id = framework_id(ctx.now_ms, 0, None, timeout, ctx.window_ms)
    ctx.staged.ops.append(
        StagedRow(
            intent_id=intent_id,
            kind=RowKind.INTENT,
            target_type=ctx.definition.name,
            target_id=ctx.ref.id,
            command=command,
            payload=canonical_json(body),
            caller=ctx.system_caller("actor"),
            delay_ms=0,
            at_ms=None,
            timer_key=None,
        )
    )
    return intent_id


def _stage_intent(
    ctx: CommandContext,
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
    member = member_of(command)
    if member.kind != "command":
        raise invalid_input(f"{member.owner.name}.{member.name} is a query; send a command.")
    target_id = "" if member.owner.singleton else validate_actor_id(actor_id)
    payload = member.bind(args, kwargs)
    timed = delay_ms is not None or at_ms is not None or key is not None
    source = "timer" if timed else "actor"
    timeout = ctx.definition.policy.execution_timeout
    row = StagedRow(
        intent_id=framework_id(ctx.now_ms, delay_ms, at_ms, timeout, ctx.window_ms),
        kind=RowKind.INTENT,
        target_type=member.owner.name,
        target_id=target_id,
        command=member.name,
        payload=canonical_json(payload),
        caller=ctx.system_caller(source, mint),
        delay_ms=delay_ms if delay_ms is not None else (None if at_ms is not None else 0),
        at_ms=at_ms,
        timer_key=key,
        payload_version=member.version,
    )
    if key is not None:
        ctx.staged.ops.append(CancelTimer(key))
    ctx.staged.ops.append(row)


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
        ctx = _ctx(self)
        if not isinstance(ctx, CommandContext):
            raise ReadOnlyError("Queries have no command id.")
        return ctx.command_id

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
        ctx = _ctx(self)
        if not isinstance(ctx, LoopContext):
            raise ReadOnlyError("self.runtime exists only in a singleton's run() loop.")
        return ctx.runtime

    @property
    def lease(self) -> LoopLease:
        """In a singleton's ``run()`` loop: the lease it runs under (owner and epoch)."""
        ctx = _ctx(self)
        if not isinstance(ctx, LoopContext) or ctx.lease is None:
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
        if isinstance(ctx, CommandContext):
            return ctx.state  # type: ignore[return-value]
        if isinstance(ctx, QueryContext):
            return _read_only(ctx.state)  # type: ignore[no-any-return]
        raise ReadOnlyError("A singleton loop has no state; call a command to change it.")

    @state.setter
    def state(self, value: S) -> None:
        ctx = _writable(self, "state =")
        if not isinstance(value, type(ctx.state)):
            raise TypeError(
                f"State of {ctx.definition.name!r} must be a {type(ctx.state).__name__}, "
                f"not {type(value).__name__}."
            )
        ctx.state = value

    def emit(self, event: Event) -> None:
        """Stage an event; it is appended with the next sequence number if the turn commits."""
        ctx = _writable(self, "emit")
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
        ctx.staged.events.append(
            StagedEvent(tag, storable_json(dumped, where), type(event).event_version)
        )

    def send(
        self,
        command: Callable[Concatenate[A, P], Awaitable[Any]],
        actor_id: str,
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> None:
        """Stage an intent: ``command`` delivered to ``actor_id`` (same tenant) after commit."""
        ctx = _writable(self, "send")
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
        _writable(self, "later")
        if key is not None:
            validate_key(key, "timer key")
        delay_ms, at_ms = parse_due(after, at, "later()")
        if delay_ms is None and at_ms is None:
            delay_ms = 0
        return Later(self, delay_ms, at_ms, key)

    def start_workflow(
        self, workflow: Any, /, *args: Any, key: str | None = None, **kwargs: Any
    ) -> str:
        """Start a workflow run on this actor if the turn commits; returns the run id.

        ``self.start_workflow(Order.fulfil, sku, cents, key="fulfil")``: the arguments are
        validated now; the run is written by the turn's own commit, so it exists exactly when
        the turn commits (``runtime.workflow_run(id)`` finds it at once). With ``key=``, at
        most one run per (actor, workflow, key) is live: a start of a key that a live run holds,
        or that this turn or an earlier command of its batch started, starts nothing and
        returns that run's id (its arguments are still validated, and otherwise ignored). A
        turn that finds the key taken only as it commits (the run started by a turn it did not
        see) is run again, once, knowing the live runs. (The workflows spec's ``self.start``:
        ``start`` is a common command name, which this method would clash with.)
        """
        from akter.workflows import WorkflowMember

        ctx = _writable(self, "start_workflow")
        if not isinstance(workflow, WorkflowMember) or workflow.owner is not ctx.definition:
            raise invalid_input(
                f"start() takes a workflow of {ctx.definition.name!r} (e.g. "
                f"{ctx.definition.name}.<workflow>), not {workflow!r}."
            )
        if key is not None:
            validate_key(key, "workflow key")
        input = workflow.bind(args, kwargs)
        if key is not None:
            for op in ctx.staged.ops:
                if isinstance(op, StagedRun) and (op.workflow, op.key) == (workflow.name, key):
                    return op.run_id  # started earlier in this turn: that run
            known = ctx.keyed_runs
            if known is not None and (found := known.get((workflow.name, key))) is not None:
                return found  # live, or started by an earlier command of the batch
        timeout = ctx.definition.policy.execution_timeout
        run_id = framework_id(ctx.now_ms, 0, None, timeout, ctx.window_ms)
        ctx.staged.ops.append(
            StagedRun(
                run_id=run_id,
                workflow=workflow.name,
                key=key,
                input=canonical_json(input),
                input_hash=payload_hash(input),
                caller=ctx.system_caller("actor"),
                timeout_ms=workflow.timeout_ms,
            )
        )
        return run_id

    def signal_workflow(self, run_id: str, signal: BaseModel) -> None:
        """Send ``signal`` to a workflow run if the turn commits (kept until a wait takes it).

        (The workflows spec's ``self.signal``; ``signal`` is a common command name.)
        """
        from akter._storable import storable_payload
        from akter.workflows import signal_name

        ctx = _writable(self, "signal_workflow")
        if not isinstance(run_id, str) or not run_id:
            raise invalid_input(f"signal_workflow() takes a run id, not {run_id!r}.")
        if not isinstance(signal, BaseModel):
            raise invalid_input(
                f"signal_workflow() takes a pydantic model instance, not {signal!r}."
            )
        payload = canonical_json(storable_payload(signal, f"signal {signal_name(signal)}"))
        body = {"run_id": run_id, "name": signal_name(signal), "payload": payload}
        _stage_workflow(ctx, WorkflowCommand.SIGNAL, body)

    def cancel_workflow(self, run_id: str) -> None:
        """Ask a workflow run to cancel if the turn commits."""
        ctx = _writable(self, "cancel_workflow")
        if not isinstance(run_id, str) or not run_id:
            raise invalid_input(f"cancel_workflow() takes a run id, not {run_id!r}.")
        _stage_workflow(ctx, WorkflowCommand.CANCEL, {"run_id": run_id})

    def cancel_timer(self, key: str) -> None:
        """Delete this actor's pending timer with ``key`` if the turn commits."""
        ctx = _writable(self, "cancel_timer")
        validate_key(key, "timer key")
        ctx.staged.ops.append(CancelTimer(key))

    def enqueue(
        self,
        job: Job[PL, Any],
        payload: PL,
        *,
        key: str | None = None,
        after: float | timedelta | None = None,
        at: datetime | None = None,
        priority: int | None = None,
    ) -> str:
        """Stage a job of this actor type; returns its id (the provider idempotency key).

        ``priority`` (0-9, higher first) overrides the job's declared default for this row.
        """
        ctx = _writable(self, "enqueue")
        own_job(ctx, job, "enqueue")
        if key is not None:
            validate_key(key, "job key")
        due = parse_due(after, at, "enqueue()")
        rank = job.options.priority if priority is None else row_priority(priority)
        row = job_row(ctx, job, job.validate_payload(payload), due, rank, key)
        if key is not None:
            ctx.staged.ops.append(CancelJob(job_timer_key(key)))
        ctx.staged.ops.append(row)
        return row.intent_id

    def enqueue_many(
        self,
        job: Job[PL, Any],
        payloads: Sequence[PL],
        *,
        after: float | timedelta | None = None,
        at: datetime | None = None,
        priority: int | None = None,
    ) -> list[str]:
        """Stage one job of this actor type per payload; returns their ids, in order.

        Every payload is validated first: one that is invalid refuses the whole call with
        ``InvalidInput`` naming its index, and stages none. The rows are written with the
        turn's other outbox rows, in one statement, only if the turn commits.
        """
        ctx = _writable(self, "enqueue_many")
        own_job(ctx, job, "enqueue_many")
        if isinstance(payloads, str | bytes) or not isinstance(payloads, Sequence):
            raise invalid_input(
                f"enqueue_many() takes a list of payloads for job {job.name!r}, not {payloads!r}."
            )
        due = parse_due(after, at, "enqueue_many()")
        rank = job.options.priority if priority is None else row_priority(priority)
        bodies = [many_payload(job, i, payload) for i, payload in enumerate(payloads)]
        rows = [job_row(ctx, job, body, due, rank, None) for body in bodies]
        ctx.staged.ops.extend(rows)
        return [row.intent_id for row in rows]

    def cancel_job(self, key: str) -> None:
        """Cancel this actor's job with ``key`` if the turn commits (semantics §5.8)."""
        ctx = _writable(self, "cancel_job")
        validate_key(key, "job key")
        ctx.staged.ops.append(CancelJob(job_timer_key(key)))

    def mint(self, child: type[Any]) -> ActorRef:
        """Mint the id of a new child actor, derived from this command's id (semantics §1.5)."""
        ctx = _writable(self, "mint")
        definition = definition_of(child)
        ordinal = ctx.mint_ordinal
        ctx.mint_ordinal += 1
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
        ctx = _writable(self, "create")
        member = member_of(command)
        ordinal = ctx.mint_ordinal
        ref = self.mint(member.owner.cls)
        _stage_intent(
            ctx, command, ref.id, args, kwargs, None, None, None, mint=(ctx.command_id, ordinal)
        )
        return ref

    def events(self, after: str | None = None, limit: int = 1000) -> EventStream:
        """Committed events after a cursor (exclusive), as :class:`akter.EventRecord`.

        In a query, ``await self.events(after=self.cursor)`` reads one page; on a handle,
        ``async for record in handle.events(after=cursor)`` replays and then follows live.
        """
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
