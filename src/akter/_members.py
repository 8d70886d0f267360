"""Members of actor types: what ``@command`` / ``@query`` record, and what they resolve to.

Below :mod:`akter.actor`, :mod:`akter.context` and :mod:`akter.jobs`: the decorators mark a
function with a :class:`MemberSpec` (job routes mark theirs the same way);
:class:`ActorDefinition` holds an actor type's resolved :class:`Member` objects, found with
:func:`definition_of` and :func:`member_of`. What a payload may hold is :mod:`akter._storable`'s.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, Literal, Protocol, Self, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from typing_extensions import ParamSpec, TypeVar

from akter._event_decl import Event
from akter._evolution import (
    Chain,
    MigrationDecorator,
    MigrationFailed,
    StateDecodeError,
    attach_payload_migrations,
    check_aliases,
    lost_keys,
    payload_chain,
    upgrade_payload,
)
from akter._policy import ResolvedPolicy

# storable_payload stays importable from here (the engine's workflow operations take it here).
from akter._storable import storable_payload as storable_payload
from akter._storable import unstorable_argument
from akter.callers import ActorRef, Caller
from akter.errors import (
    ActorError,
    DeclaredError,
    DefinitionError,
    invalid_input,
    invalid_input_from,
)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
A_contra = TypeVar("A_contra", contravariant=True)
A = TypeVar("A")
P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")

AccessKind = Literal["command", "query", "events", "progress", "rows"]
AccessPolicy = Callable[[Caller, ActorRef, str, AccessKind], "bool | Awaitable[bool]"]


@dataclass(frozen=True)
class MemberSpec:
    """What a decorator recorded on a function."""

    kind: Literal["command", "query"]
    creates: bool = False
    internal: bool = False
    errors: tuple[type[DeclaredError], ...] = ()
    route: tuple[str, Any] | None = None  # ("success" | "dead_letter" | "cancelled", Job)
    #: The payload version rows are staged at (evolution E3); checked against the migrations.
    version: int = 0
    #: Earlier names of the command that stored rows may carry (evolution E2).
    aliases: tuple[str, ...] = ()
    #: A query callers may watch (``@query(watch=True)``; docs/guides/live.md).
    watch: bool = False


def refuse_internal(
    type_name: str, name: str, kind: Literal["command", "workflow"], by: str
) -> ActorError:
    """The refusal of an internal command or workflow to a caller that may not reach it.

    ``by`` names who asked ("handles", "User callers"). Over HTTP it is a 404
    ``unknown_member``, as for a member that does not exist (semantics §9.4), with a message
    that says why.
    """
    if kind == "command":
        who = "the framework's System callers (relay deliveries, a workflow's command steps)"
        verb = "call"
    else:
        who = "System callers (a turn's self.start_workflow, in-process System code)"
        verb = "start"
    return ActorError(
        "InvalidInput",
        f"{type_name}.{name} is internal: only {who} may {verb} it, not {by}.",
        code="unknown_member",
    )


_MEMBER_ATTR = "__akter_member__"
_OWNER_ATTR = "__akter_owner__"


class Command(Protocol[A_contra, P, R_co]):
    """What ``@akter.command`` makes of a handler, for the type checker.

    On the class (``Order.pay``) it is the command itself, as ``send`` and ``later`` take it;
    on an instance (a handle, ``self`` in a turn) it is the bound coroutine function. At run
    time it is the handler function, with ``migrate_payload`` attached.
    """

    __name__: str

    def __call__(
        self, actor: A_contra, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R_co]:
        """Run the command on ``actor`` (as ``Order.pay(order, ...)``)."""
        ...

    @overload
    def __get__(self, obj: None, owner: Any, /) -> Self: ...
    @overload
    def __get__(self, obj: A_contra, owner: Any, /) -> Callable[P, Coroutine[Any, Any, R_co]]: ...

    def migrate_payload(self, *, from_version: int) -> MigrationDecorator:
        """Declare the migration of this command's stored payloads from ``from_version``."""
        ...


class MemberOwner(Protocol):
    """What a job knows of the actor type it belongs to (an ``akter.ActorDefinition``)."""

    @property
    def name(self) -> str:
        """The actor type's name."""
        ...

    @property
    def members(self) -> Mapping[str, Any]:
        """The type's resolved commands and queries by name."""
        ...

    def resolve(self) -> None:
        """Resolve the members' annotations (deferred for forward references)."""
        ...


@overload
def command(fn: Callable[Concatenate[A, P], Coroutine[Any, Any, R]], /) -> Command[A, P, R]: ...
@overload
def command(
    *,
    creates: bool = False,
    internal: bool = False,
    errors: tuple[type[DeclaredError], ...] | list[type[DeclaredError]] = (),
    version: int = 0,
    aliases: tuple[str, ...] | list[str] = (),
) -> Callable[[Callable[Concatenate[A, P], Coroutine[Any, Any, R]]], Command[A, P, R]]: ...
def command(
    fn: Any = None,
    /,
    *,
    creates: bool = False,
    internal: bool = False,
    errors: tuple[type[DeclaredError], ...] | list[type[DeclaredError]] = (),
    version: int = 0,
    aliases: tuple[str, ...] | list[str] = (),
) -> Any:
    """Declare a command: a method that runs as one fenced turn.

    Args:
        fn: The handler (when used without parentheses).
        creates: The command creates the actor (types with such commands are gated).
        internal: Only ``System`` callers (the relay, a workflow's command steps) may run it;
            absent from handles, HTTP and OpenAPI.
        errors: The declared errors it may raise; empty means any ``DeclaredError``.
        version: The version of its payload (evolution E3): pending rows stored at an older
            version are upgraded by the ``@cmd.migrate_payload(from_version=k)`` chain, which
            must declare versions ``0 … version-1``.
        aliases: Earlier names of the command: pending rows and receipts that carry one are
            delivered to and compared with this command (evolution E2).
    """
    for err in errors:
        if not (isinstance(err, type) and issubclass(err, DeclaredError)):
            raise DefinitionError(f"errors= takes DeclaredError subclasses, not {err!r}.")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise DefinitionError(f"version= must be a non-negative integer, not {version!r}.")
    spec = MemberSpec(
        "command",
        creates=creates,
        internal=internal,
        errors=tuple(errors),
        version=version,
        aliases=check_aliases("@command", aliases),
    )

    def mark(f: Any) -> Any:
        if not inspect.iscoroutinefunction(f):
            raise DefinitionError(f"@command {getattr(f, '__name__', f)!r} must be 'async def'.")
        setattr(f, _MEMBER_ATTR, spec)
        attach_payload_migrations(f)
        return f

    return mark(fn) if fn is not None else mark


class Watchable(Protocol[P, R_co]):
    """A watchable query on a handle: call it for one value, or ``watch`` it for a live stream."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]:
        """The query's value now."""
        ...

    def watch(self, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[R_co]:
        """The value now, then again after each commit that changes it (docs/guides/live.md)."""
        ...


class WatchQuery(Protocol[A_contra, P, R_co]):
    """What ``@akter.query(watch=True)`` makes of a query, for the type checker.

    On an instance (a handle) it is a :class:`Watchable`: ``await handle.balance()`` and
    ``async for value in handle.balance.watch()``. At run time it is the query function.
    """

    __name__: str

    def __call__(
        self, actor: A_contra, /, *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, R_co]:
        """Run the query on ``actor``."""
        ...

    @overload
    def __get__(self, obj: None, owner: Any, /) -> Self: ...
    @overload
    def __get__(self, obj: A_contra, owner: Any, /) -> Watchable[P, R_co]: ...


@overload
def query(fn: F, /) -> F: ...
@overload
def query(*, watch: Literal[False] = False) -> Callable[[F], F]: ...
@overload
def query(
    *, watch: Literal[True]
) -> Callable[[Callable[Concatenate[A, P], Coroutine[Any, Any, R]]], WatchQuery[A, P, R]]: ...
def query(fn: Any = None, /, *, watch: bool = False) -> Any:
    """Declare a query: a read-only method on committed state, without lock, turn or receipt.

    Args:
        fn: The query (when used without parentheses).
        watch: Callers may watch it: ``handle.<query>.watch(...)`` yields its value now and
            after each commit that changes it (docs/guides/live.md).
    """
    if not isinstance(watch, bool):
        raise DefinitionError(f"@query(watch=...) takes True or False, not {watch!r}.")
    spec = MemberSpec("query", watch=watch)

    def mark(f: Any) -> Any:
        if not inspect.iscoroutinefunction(f):
            raise DefinitionError(f"@query {getattr(f, '__name__', f)!r} must be 'async def'.")
        setattr(f, _MEMBER_ATTR, spec)
        return f

    return mark(fn) if fn is not None else mark


# --- storable arguments ---------------------------------------------------------------------


class EmptyState(BaseModel):
    """The state of an actor declared without a state model."""


# --- resolved definitions -------------------------------------------------------------------


@dataclass
class Member:
    """A resolved command or query of one actor type."""

    name: str
    kind: Literal["command", "query"]
    fn: Callable[..., Awaitable[Any]]
    spec: MemberSpec
    owner: ActorDefinition
    params: list[inspect.Parameter] = field(default_factory=list)
    args_model: type[BaseModel] = EmptyState
    result: TypeAdapter[Any] = field(default_factory=lambda: TypeAdapter(Any))
    #: The payload migrations (evolution E3); its version is the one rows are staged at.
    payload_chain: Chain = field(default_factory=Chain)

    @property
    def version(self) -> int:
        """The payload version this code stages and delivers."""
        return self.payload_chain.version

    @property
    def internal(self) -> bool:
        """Whether only System callers may reach it."""
        return self.spec.internal or self.spec.route is not None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Bind a call's arguments by name, fill defaults and validate: the JSON payload."""
        plain = self._plain_params
        if plain is not None and len(args) <= len(plain[0]):
            # Zipped; a duplicate, unknown or missing argument gets the signature's message below.
            names, required = plain
            values = dict(zip(names, args, strict=False))
            if kwargs.keys() <= names.keys() and kwargs.keys().isdisjoint(values):
                values.update(kwargs)
                if required <= values.keys():
                    return self.validate_payload(values)
        try:
            bound = self._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise invalid_input(
                f"Invalid arguments for {self.owner.name}.{self.name}: {exc}."
            ) from None
        values = dict(bound.arguments)
        values.pop(next(iter(self._signature.parameters)))
        return self.validate_payload(values)

    @functools.cached_property
    def _plain_params(self) -> tuple[dict[str, None], frozenset[str]] | None:
        """The names after ``self`` and the required ones, if all are positional-or-keyword."""
        params = list(self._signature.parameters.values())[1:]
        if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
            return None
        required = frozenset(p.name for p in params if p.default is inspect.Parameter.empty)
        return dict.fromkeys(p.name for p in params), required

    def validate_payload(self, values: dict[str, Any]) -> dict[str, Any]:
        """Validate a payload given by parameter name (HTTP bodies, outbox rows)."""
        if not isinstance(values, dict):
            raise invalid_input(f"The payload of {self.owner.name}.{self.name} must be an object.")
        try:
            model = self.args_model.model_validate(values)
        except ValidationError as exc:
            raise invalid_input_from(exc, f"arguments for {self.owner.name}.{self.name}") from None
        return storable_payload(model, f"arguments for {self.owner.name}.{self.name}")

    def validate_json_body(self, raw: bytes, body: dict[str, Any]) -> None:
        """Check an HTTP body strictly: JSON ``true`` or ``"5"`` is not an ``int`` over HTTP.

        In-process calls keep pydantic's Python (lax) semantics; a remote caller gets the
        strict JSON mode, where only a JSON number is an ``int``. (JSON strict mode still
        reads ISO strings as datetimes, UUIDs and bytes: JSON has no other way to send them.)

        Args:
            raw: The body as received.
            body: The same body parsed (checked first, so a deep or unstorable value gets its
                named refusal before the strict parser's own limits).

        Raises:
            ActorError: ``InvalidInput`` naming the field.
        """
        what = f"arguments for {self.owner.name}.{self.name}"
        problem = unstorable_argument(body)
        if problem is not None:
            where, why = problem
            raise invalid_input(f"Invalid {what}: field {where!r} {why}.", field=where)
        try:
            self.args_model.model_validate_json(raw or b"{}", strict=True)
        except ValidationError as exc:
            raise invalid_input_from(exc, what) from None

    def decode_payload(self, stored: Any, version: int) -> dict[str, Any]:
        """A stored row's payload at ``version``, migrated and validated under this code.

        Raises:
            PayloadTooNew: The row is at a version above the command's.
            ActorError: ``InvalidInput`` naming the field when it fails after migrations.
        """
        what = f"{self.owner.name}.{self.name}"
        return self.validate_payload(upgrade_payload(self.payload_chain, stored, version, what))

    def arguments(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The Python values to call the handler with, from a validated payload."""
        model = self.args_model.model_validate(payload)
        return {p.name: getattr(model, p.name) for p in self.params}

    @functools.cached_property
    def _signature(self) -> inspect.Signature:
        return inspect.signature(self.fn)


@dataclass
class ActorDefinition:
    """Everything the runtime needs to know about one actor type."""

    cls: type[Any]  # the akter.Actor subclass
    name: str
    state_model: type[BaseModel]
    singleton: bool
    placement: Literal["tenant", "actor"]
    access: AccessPolicy
    policy: ResolvedPolicy
    members: dict[str, Member] = field(default_factory=dict)
    jobs: dict[str, Any] = field(default_factory=dict)
    #: The declared workflows by name (``akter.workflows.WorkflowMember``).
    workflows: dict[str, Any] = field(default_factory=dict)
    events: tuple[type[Event], ...] = ()
    schedules: list[Any] = field(default_factory=list)
    resolved: bool = False
    #: The state migrations (evolution E1); its version is the one this code writes.
    state_chain: Chain = field(default_factory=Chain)
    #: Earlier names of commands and jobs, to the current name (evolution E2).
    aliases: dict[str, str] = field(default_factory=dict)
    #: The owned tables (``akter._tables.OwnedTable``; ``tables=`` of the class).
    tables: tuple[Any, ...] = ()

    @property
    def state_version(self) -> int:
        """The state version this code reads and writes: the number of state migrations."""
        return self.state_chain.version

    @property
    def gated(self) -> bool:
        """Whether the type has ``creates=True`` commands."""
        return any(m.spec.creates for m in self.members.values())

    def canonical(self, name: str) -> str:
        """The current name of a member or job that stored rows may call by an alias."""
        return self.aliases.get(name, name)

    def job(self, name: str) -> Any | None:
        """The job declared under ``name`` or one of its aliases, if any (an ``akter.Job``)."""
        return self.jobs.get(self.aliases.get(name, name))

    def member(self, name: str, kind: Literal["command", "query"] | None = None) -> Member:
        """Look up a member by name or alias, raising ``InvalidInput/unknown_member``."""
        self.resolve()
        found = self.members.get(self.aliases.get(name, name))
        if found is None or (kind is not None and found.kind != kind):
            what = kind or "member"
            raise invalid_input(
                f"Actor type {self.name!r} has no {what} {name!r}.", code="unknown_member"
            )
        return found

    def default_state(self) -> BaseModel:
        """A fresh default state."""
        return self.state_model()

    def decode_state(
        self, stored: Any, version: int, actor: str, *, guard: bool = True
    ) -> tuple[BaseModel, Any]:
        """A stored state at ``version`` under this code: migrated, validated, loss-checked.

        ``actor`` names the actor in messages (``"Account/'a-1'"``). Returns the model and its
        JSON dump (what akter would store). ``guard=False`` skips the loss guard, for readers
        that never write (queries): only a write would drop the keys.

        Raises:
            StateDecodeError: Too new, a failing migration, a failing validation, or keys of
                the stored JSON the model would drop (the loss guard, evolution E1).
        """
        current = self.state_version
        if version > current:
            raise StateDecodeError(
                "too_new",
                f"The stored state of {actor} is at state version {version}, newer than this "
                f"code's {current}; a newer runner can serve it (retry), and this one never "
                "overwrites it.",
            )
        if not isinstance(stored, dict):
            raise StateDecodeError("invalid", f"The stored state of {actor} is not an object.")
        try:
            value = self.state_chain.upgrade(stored, version)
        except MigrationFailed as exc:
            raise StateDecodeError(
                "migration", f"The stored state of {actor} at version {version}: {exc}."
            ) from None
        try:
            model = self.state_model.model_validate(value)
            dumped = model.model_dump(mode="json")
        except (ValidationError, ValueError) as exc:
            raise StateDecodeError(
                "invalid",
                f"The stored state of {actor} (version {version}) fails validation against "
                f"{self.state_model.__name__}: {exc}",
            ) from None
        lost = tuple(lost_keys(value, dumped)) if guard else ()
        if lost:
            raise StateDecodeError(
                "lost",
                f"The stored state of {actor} (version {version}) holds "
                f"{', '.join(repr(k) for k in lost)}, which {self.state_model.__name__} would "
                "drop on the next write; nothing was written. Add a state migration "
                "(@akter.migrate_state) that moves or removes these keys, or keep the fields.",
                lost,
            )
        return model, dumped

    def resolve(self) -> None:
        """Resolve annotations into validation models (deferred for forward references)."""
        if self.resolved:
            return
        for member in self.members.values():
            _resolve_member(member)
        for job in self.jobs.values():
            job.resolve()
        for flow in self.workflows.values():
            flow.resolve()
        self.resolved = True


def _resolve_member(member: Member) -> None:
    where = f"{member.owner.name}.{member.name}"
    try:
        hints = typing.get_type_hints(member.fn, include_extras=True)
    except NameError as exc:
        raise DefinitionError(f"{where}: cannot resolve an annotation ({exc}).") from None
    sig = inspect.signature(member.fn)
    params = list(sig.parameters.values())
    if not params or params[0].name != "self":
        raise DefinitionError(f"{where}: the first parameter must be 'self'.")
    fields_: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise DefinitionError(f"{where}: *args and **kwargs are not supported.")
        if p.name not in hints:
            raise DefinitionError(f"{where}: parameter {p.name!r} needs a type annotation.")
        if p.name.startswith("_"):
            raise DefinitionError(f"{where}: parameter {p.name!r} must not start with '_'.")
        default = p.default if p.default is not inspect.Parameter.empty else ...
        fields_[p.name] = (hints[p.name], default)
    if member.kind == "command":
        member.payload_chain = payload_chain(where, member.fn, member.spec.version)
    if "return" not in hints:
        raise DefinitionError(f"{where}: the return type needs an annotation (use -> None).")
    try:
        member.args_model = create_model(
            f"{member.owner.name}_{member.name}_args",
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields_,
        )
        member.result = TypeAdapter(hints["return"])
    except Exception as exc:  # pydantic schema errors
        raise DefinitionError(f"{where}: unsupported annotation: {exc}") from None
    member.params = params[1:]
    if member.kind == "query" and member.params and member.spec.route is None:
        pass  # queries may take arguments


def definition_of(actor: Any) -> ActorDefinition:
    """The definition of an actor class."""
    definition = getattr(actor, "__akter_definition__", None)
    if not isinstance(definition, ActorDefinition) or definition.cls is not actor:
        raise DefinitionError(f"{actor!r} is not an akter.Actor subclass.")
    return definition


def member_of(fn: Any) -> Member:
    """The resolved member behind ``Other.command`` (used by ``send`` and ``later().send``)."""
    owner = getattr(fn, _OWNER_ATTR, None)
    if not isinstance(owner, ActorDefinition):
        raise invalid_input(f"{fn!r} is not a command of an akter actor.")
    owner.resolve()
    return owner.members[fn.__name__]
