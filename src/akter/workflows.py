"""Workflow declarations: ``@akter.workflow``, the ``wf`` context, runs and outcomes.

A workflow is sequential code that belongs to an actor and survives crashes (the workflows
spec, W1-W6). Each durable thing it does is a *step* recorded in a journal: a command turn, a
job, a sleep, a signal wait, a local function, a recorded value. After a crash or a suspension
the function runs again from the top and recorded steps are answered from the journal, so the
code between steps must be deterministic: the same inputs and step outcomes lead to the same
steps. The engine that runs them lives in :mod:`akter._engine.workflows.engine`; this module holds
what users declare, and re-exports what they hold of a run (:mod:`akter._workflow_runs`).
"""

from __future__ import annotations

import inspect
import typing
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any, Concatenate, Generic, Protocol, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from typing_extensions import ParamSpec, TypeVar

from akter._ids import ms_from_duration
from akter._members import _MEMBER_ATTR, MemberSpec
from akter._storable import storable_payload, unstorable_argument
from akter._workflow_runs import (
    FinalStatus,
    RunOps,
    RunStatus,
    StepRecordView,
    WorkflowFailure,
    WorkflowOutcome,
    WorkflowRun,
    WorkflowStatus,
    signal_name,
)
from akter.callers import ActorRef
from akter.errors import (
    DefinitionError,
    invalid_input,
    invalid_input_from,
)
from akter.jobs import Job

#: The former name of :class:`WorkflowFailure` (it read like an exception), kept as an alias.
WorkflowError = WorkflowFailure

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")
S = TypeVar("S", bound=BaseModel)
PL = TypeVar("PL", bound=BaseModel)

#: The default ``timeout=`` of a workflow: 30 days.
DEFAULT_TIMEOUT_MS = 30 * 24 * 3600 * 1000


class StepDriver(Protocol):
    """What the ``wf`` context delegates to: the engine's run attempt (module docstring)."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def ref(self) -> ActorRef:
        """The workflow's actor."""
        ...

    @property
    def workflow(self) -> str:
        """The workflow's name."""
        ...

    def handle(self, actor: type[Any], id: str, tenant: str | None) -> Any:
        """A handle whose commands and queries are command steps."""
        ...

    async def job(self, job: Job[Any, Any], payload: BaseModel) -> Any:
        """A job step."""
        ...

    async def sleep(self, delay_ms: int | None, until_ms: int | None) -> None:
        """A durable timer."""
        ...

    async def wait(self, signal: type[BaseModel], timeout_ms: int | None) -> Any:
        """A signal wait (``None`` at timeout)."""
        ...

    async def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        attempts: int,
        backoff: tuple[float, float],
    ) -> Any:
        """A local function step."""
        ...

    def value(self, kind: str, make: Callable[[], Any], adapter: TypeAdapter[Any]) -> Any:
        """A recorded value (``now``, ``uuid4``, ``random``)."""
        ...

    def patched(self, marker: str) -> bool:
        """A version marker."""
        ...


_DATETIME: TypeAdapter[datetime] = TypeAdapter(datetime)
_UUID: TypeAdapter[uuid.UUID] = TypeAdapter(uuid.UUID)
_FLOAT: TypeAdapter[float] = TypeAdapter(float)


class Workflow(Protocol):
    """The ``wf`` a workflow function receives: its steps (the workflows spec, W2).

    A protocol, like :class:`akter.QueryView`: a workflow is declared in its actor's class body
    with ``wf`` first and no ``self``, and pyright accepts a first parameter whose type is not
    the class only when that type is a protocol. The runtime passes a :class:`WorkflowContext`.

    Attributes:
        run_id: This run's id.
        ref: The actor the workflow belongs to.
        name: The workflow's name.
    """

    run_id: str
    ref: ActorRef
    name: str
    _driver: StepDriver

    def __init__(self, driver: StepDriver) -> None:
        self._driver = driver
        self.run_id = driver.run_id
        self.ref = driver.ref
        self.name = driver.workflow

    def get(self, actor: type[A], id: str = "", *, tenant: str | None = None) -> A:
        """A handle whose commands are steps: each runs exactly once (its receipt replays).

        ``tenant`` defaults to the workflow's actor's tenant.
        """
        return typing.cast(A, self._driver.handle(actor, id, tenant))

    async def job(self, job: Job[PL, R], payload: PL) -> R:
        """Stage ``job`` on the workflow's actor and wait for its outcome (a suspension).

        Raises:
            akter.JobDeadLettered: The job ran out of attempts (``letter.ambiguous`` says
                whether the provider may have applied it).
            akter.JobCancelled: The job was cancelled.
        """
        return typing.cast(R, await self._driver.job(job, payload))

    async def sleep(
        self, duration: float | timedelta | None = None, *, until: datetime | None = None
    ) -> None:
        """Sleep durably (seconds or a ``timedelta``, or ``until=`` an aware datetime).

        The wake time is recorded on the database clock; while asleep the run holds no runner,
        task or connection.
        """
        if (duration is None) == (until is None):
            raise invalid_input("wf.sleep() takes a duration or until=, exactly one of them.")
        if until is not None:
            if not isinstance(until, datetime) or until.tzinfo is None:
                raise invalid_input("wf.sleep(until=) must be an aware datetime.")
            await self._driver.sleep(None, int(until.timestamp() * 1000))
        else:
            assert duration is not None
            await self._driver.sleep(ms_from_duration(duration, "duration"), None)

    async def wait(
        self,
        signal: type[S],
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (durable, the spec's name)
    ) -> S | None:
        """Take the oldest unconsumed signal of class ``signal``, waiting for one if needed.

        Signals sent before the wait are kept; each is consumed once, in arrival order. Returns
        ``None`` when ``timeout`` passes first.
        """
        if not (isinstance(signal, type) and issubclass(signal, BaseModel)):
            raise invalid_input(f"wf.wait() takes a pydantic model class, not {signal!r}.")
        timeout_ms = None if timeout is None else ms_from_duration(timeout, "timeout")
        return typing.cast(S | None, await self._driver.wait(signal, timeout_ms))

    @overload
    async def step(
        self,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        attempts: int = 3,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> R: ...
    @overload
    async def step(
        self,
        fn: Callable[..., R],
        /,
        *args: Any,
        attempts: int = 3,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> R: ...
    async def step(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        attempts: int = 3,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> Any:
        """Run a local function (async, or sync in a thread) and record its JSON result.

        At least once: a crash between the call and its record runs it again. After
        ``attempts`` failures (waiting ``backoff[0]`` s, doubling up to ``backoff[1]`` s),
        ``akter.StepFailed`` is raised here.
        """
        if not callable(fn):
            raise invalid_input(f"wf.step() takes a function, not {fn!r}.")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
            raise invalid_input(f"wf.step(attempts=) must be from 1 to 100, got {attempts!r}.")
        low, high = backoff
        if not (0 <= low <= high):
            raise invalid_input(
                f"wf.step(backoff=) must be (first, most) seconds, got {backoff!r}."
            )
        return await self._driver.step(fn, args, attempts, (float(low), float(high)))

    def now(self) -> datetime:
        """The time, recorded: the same on every replay of this run."""
        from datetime import UTC

        return typing.cast(
            datetime, self._driver.value("now", lambda: datetime.now(UTC), _DATETIME)
        )

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded: the same on every replay of this run."""
        return typing.cast(uuid.UUID, self._driver.value("uuid4", uuid.uuid4, _UUID))

    def random(self) -> float:
        """A random float in [0, 1), recorded: the same on every replay of this run."""
        import random

        return typing.cast(float, self._driver.value("random", random.random, _FLOAT))

    def patched(self, marker: str) -> bool:
        """Whether this run takes the code path introduced under ``marker`` (W5).

        New runs (and runs that reach this point for the first time) answer ``True``, and the
        marker is recorded; runs whose journal passed this point before the marker existed
        answer ``False``, on every replay.
        """
        if not isinstance(marker, str) or not marker:
            raise invalid_input("wf.patched() takes a non-empty marker string.")
        return self._driver.patched(marker)


class WorkflowContext(Workflow):
    """The :class:`Workflow` of one run attempt, built by the engine over its step driver."""


class WorkflowStarter(Generic[P, R]):
    """``handle.<workflow>``: starts a run of the workflow on the handle's actor."""

    def __init__(self, start: Callable[..., Awaitable[WorkflowRun[R]]]) -> None:
        self._start = start

    async def start(self, *args: P.args, **kwargs: P.kwargs) -> WorkflowRun[R]:
        """Start a run; idempotent by the handle's command id (the run id derives from it)."""
        return await self._start(*args, **kwargs)


class WorkflowMember(Generic[P, R]):
    """A declared workflow of an actor type (``@akter.workflow``).

    On the class (``Order.fulfil``) it is the workflow, as ``self.start`` takes it; on a handle
    (``order.fulfil``) it is a :class:`WorkflowStarter`.
    """

    def __init__(
        self,
        fn: Callable[Concatenate[Workflow, P], Coroutine[Any, Any, R]],
        timeout_ms: int,
        internal: bool = False,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise DefinitionError(f"@akter.workflow: {fn.__qualname__} must be an async def.")
        self.fn = fn
        self.name = fn.__name__
        self.timeout_ms = timeout_ms
        #: Only System callers may start it (turns, in-process System code); absent from HTTP.
        self.internal = internal
        self.owner: Any = None  # the ActorDefinition, bound when the class is collected
        self.on_complete_name: str | None = None
        self.args_model: type[BaseModel] | None = None
        self.result: TypeAdapter[Any] = TypeAdapter(Any)
        self.params: list[inspect.Parameter] = []
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        owner = self.owner.name if self.owner is not None else "?"
        return f"<akter workflow {owner}.{self.name}>"

    @overload
    def __get__(self, obj: None, owner: Any, /) -> WorkflowMember[P, R]: ...
    @overload
    def __get__(self, obj: object, owner: Any, /) -> WorkflowStarter[P, R]: ...
    def __get__(self, obj: object | None, owner: Any, /) -> Any:
        if obj is None:
            return self
        raise AttributeError(
            f"{self.name} is a workflow: start it from a handle (handle.{self.name}.start(...)) "
            "or from a turn (self.start(...))."
        )

    def on_complete(self, fn: Callable[[Any, WorkflowOutcome[Any]], Awaitable[None]]) -> Any:
        """Declare the internal command that receives the run's :class:`WorkflowOutcome`, once."""
        setattr(fn, _MEMBER_ATTR, MemberSpec(kind="command", internal=True))
        self.on_complete_name = fn.__name__
        return fn

    def bind_owner(self, owner: Any) -> None:
        """Bind the workflow to its actor type's definition."""
        self.owner = owner

    def resolve(self) -> None:
        """Resolve the function's annotations into the input model and result adapter."""
        if self.args_model is not None:
            return
        where = f"{self.owner.name if self.owner else '?'}.{self.name}"
        try:
            hints = typing.get_type_hints(self.fn, include_extras=True)
        except NameError as exc:
            raise DefinitionError(f"{where}: cannot resolve an annotation ({exc}).") from None
        params = list(inspect.signature(self.fn).parameters.values())
        if not params or params[0].name == "self":
            raise DefinitionError(
                f"{where}: a workflow takes 'wf' first and no 'self' (it runs outside any turn)."
            )
        fields: dict[str, Any] = {}
        for p in params[1:]:
            if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise DefinitionError(f"{where}: *args and **kwargs are not supported.")
            if p.name not in hints:
                raise DefinitionError(f"{where}: parameter {p.name!r} needs a type annotation.")
            default = p.default if p.default is not inspect.Parameter.empty else ...
            fields[p.name] = (hints[p.name], default)
        if "return" not in hints:
            raise DefinitionError(f"{where}: the return type needs an annotation (use -> None).")
        try:
            self.args_model = create_model(
                f"{where.replace('.', '_')}_workflow_args",
                __config__=ConfigDict(extra="forbid"),
                **fields,
            )
            self.result = TypeAdapter(hints["return"])
        except Exception as exc:  # pydantic schema errors
            raise DefinitionError(f"{where}: unsupported annotation: {exc}") from None
        self.params = params[1:]

    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Validate start arguments into the stored input (JSON-ready).

        Raises:
            ActorError: ``InvalidInput`` naming the field.
        """
        self.resolve()
        assert self.args_model is not None
        names = [p.name for p in self.params]
        if len(args) > len(names):
            raise invalid_input(
                f"{self.name}() takes {len(names)} argument(s), {len(args)} were given."
            )
        values = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key in values:
                raise invalid_input(f"{self.name}() got argument {key!r} twice.", field=key)
            values[key] = value
        return self.validate_input(values)

    def validate_input(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate an input mapping (in-process or decoded JSON) into the stored input."""
        self.resolve()
        assert self.args_model is not None
        try:
            model = self.args_model.model_validate(dict(values))
        except Exception as exc:
            from pydantic import ValidationError

            if isinstance(exc, ValidationError):
                raise invalid_input_from(exc, f"{self.name}()") from None
            raise
        return storable_payload(model, f"{self.name}()")

    def validate_json_body(self, raw: bytes, body: dict[str, Any]) -> None:
        """Check an HTTP start body strictly, as a command's (JSON ``true`` is not an ``int``).

        Args:
            raw: The body as received.
            body: The same body parsed (checked first for unstorable values).

        Raises:
            ActorError: ``InvalidInput`` naming the field.
        """
        self.resolve()
        assert self.args_model is not None
        what = f"arguments for {self.owner.name if self.owner else '?'}.{self.name}"
        problem = unstorable_argument(body)
        if problem is not None:
            where, why = problem
            raise invalid_input(f"Invalid {what}: field {where!r} {why}.", field=where)
        try:
            self.args_model.model_validate_json(raw or b"{}", strict=True)
        except ValidationError as exc:
            raise invalid_input_from(exc, what) from None

    def arguments(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """The function's keyword arguments from the stored input."""
        self.resolve()
        assert self.args_model is not None
        model = self.args_model.model_validate(dict(stored))
        return {p.name: getattr(model, p.name) for p in self.params}


@overload
def workflow(
    fn: Callable[Concatenate[Workflow, P], Coroutine[Any, Any, R]], /
) -> WorkflowMember[P, R]: ...
@overload
def workflow(
    *, timeout: float | timedelta | None = None, internal: bool = False
) -> Callable[
    [Callable[Concatenate[Workflow, P], Coroutine[Any, Any, R]]], WorkflowMember[P, R]
]: ...
def workflow(
    fn: Any = None, /, *, timeout: float | timedelta | None = None, internal: bool = False
) -> Any:
    """Declare a workflow of an actor type (the workflows spec, W1).

    ``async def fulfil(wf: akter.Workflow, sku: str) -> str`` inside the actor class: it takes
    ``wf`` first and no ``self``. ``timeout=`` (default 30 days) cancels the run when it passes.
    ``internal=True``: only System callers may start it (a turn's ``self.start_workflow``,
    in-process System code); a User or Anonymous caller is refused (``unknown_member``) and
    OpenAPI does not list it.
    """
    timeout_ms = DEFAULT_TIMEOUT_MS if timeout is None else ms_from_duration(timeout, "timeout")
    if timeout_ms < 1:
        raise DefinitionError("@akter.workflow(timeout=) must be positive.")

    def declare(f: Any) -> WorkflowMember[Any, Any]:
        return WorkflowMember(f, timeout_ms, internal)

    return declare(fn) if fn is not None else declare


__all__ = [
    "FinalStatus",
    "RunOps",
    "RunStatus",
    "StepDriver",
    "StepRecordView",
    "Workflow",
    "WorkflowContext",
    "WorkflowFailure",
    "WorkflowMember",
    "WorkflowOutcome",
    "WorkflowRun",
    "WorkflowStarter",
    "WorkflowStatus",
    "signal_name",
    "workflow",
]
