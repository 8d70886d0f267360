"""Actor declarations: ``Actor[State]``, ``@command``, ``@query``, events and definitions.

An actor class is a declaration. At run time the engine instantiates it once per turn with a
turn context bound to it, so ``self`` inside a command is both the actor (its methods are
callable) and the turn's capability surface (``self.state``, ``self.send`` ...). See
:mod:`akter.context` for the capabilities themselves.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from typing_extensions import TypeVar

from akter._ids import ACTOR_TYPE_RE, MEMBER_NAME_RE
from akter._members import _MEMBER_ATTR, _OWNER_ATTR, MemberSpec, unstorable_argument
from akter._members import ARGUMENT_INT_RANGE as ARGUMENT_INT_RANGE  # re-exported
from akter._members import MAX_ARGUMENT_DEPTH as MAX_ARGUMENT_DEPTH
from akter._members import command as command
from akter._members import query as query
from akter._members import storable_payload as storable_payload
from akter._members import unstorable_text as unstorable_text
from akter._policy import POLICY_FIELDS, Policy, ResolvedPolicy
from akter.callers import ActorRef, Caller, System
from akter.context import TurnApi
from akter.errors import DefinitionError, invalid_input, invalid_input_from

S = TypeVar("S", bound=BaseModel, default=BaseModel)

AccessKind = Literal["command", "query", "events", "progress"]
AccessPolicy = Callable[[Caller, ActorRef, str, AccessKind], "bool | Awaitable[bool]"]

RESERVED_MEMBER_NAMES = frozenset(
    {
        "id", "tenant", "ref", "caller", "principal", "command_id", "now", "now_ms", "state",
        "emit", "send", "later", "cancel_timer", "enqueue", "cancel_job", "mint", "create",
        "events", "cursor", "with_command_id", "run", "runtime", "progress",
    }
)  # fmt: skip


def public(caller: Caller, ref: ActorRef, member: str, kind: AccessKind) -> bool:
    """An access policy that allows every caller (``access=akter.public``)."""
    return True


def default_access(caller: Caller, ref: ActorRef, member: str, kind: AccessKind) -> bool:
    """The secure default: only ``System`` callers."""
    return isinstance(caller, System)


class EmptyState(BaseModel):
    """The state of an actor declared without a state model."""


class Event(BaseModel):
    """Base of declared events: pydantic models emitted by turns with ``self.emit``.

    The tag is the class name unless given with ``class Paid(akter.Event, tag="paid"):``.
    """

    model_config = ConfigDict(frozen=True)
    event_tag: ClassVar[str] = "Event"

    def __init_subclass__(cls, *, tag: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.event_tag = cls.__name__ if tag is None else tag
        if not cls.event_tag or len(cls.event_tag) > 200:
            raise DefinitionError(f"Event tag {cls.event_tag!r} must be 1–200 characters.")
        # Process-wide fallback for decoding; tags are checked for uniqueness per Runtime over
        # the events its actors declare (``events=[...]``).
        _EVENTS[cls.event_tag] = cls

    @classmethod
    def registry(cls) -> dict[str, type[Event]]:
        """Declared event classes by tag."""
        return dict(_EVENTS)


_EVENTS: dict[str, type[Event]] = {}


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

    @property
    def internal(self) -> bool:
        """Whether only System callers may reach it."""
        return self.spec.internal or self.spec.route is not None

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Bind a call's arguments by name, fill defaults and validate: the JSON payload."""
        try:
            bound = self._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise invalid_input(
                f"Invalid arguments for {self.owner.name}.{self.name}: {exc}."
            ) from None
        values = dict(bound.arguments)
        values.pop(next(iter(self._signature.parameters)))
        return self.validate_payload(values)

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

    cls: type[Actor[Any]]
    name: str
    state_model: type[BaseModel]
    singleton: bool
    placement: Literal["tenant", "actor"]
    access: AccessPolicy
    policy: ResolvedPolicy
    members: dict[str, Member] = field(default_factory=dict)
    jobs: dict[str, Any] = field(default_factory=dict)
    events: tuple[type[Event], ...] = ()
    schedules: list[Any] = field(default_factory=list)
    resolved: bool = False

    @property
    def gated(self) -> bool:
        """Whether the type has ``creates=True`` commands."""
        return any(m.spec.creates for m in self.members.values())

    def member(self, name: str, kind: Literal["command", "query"] | None = None) -> Member:
        """Look up a member by name, raising ``InvalidInput/unknown_member``."""
        self.resolve()
        found = self.members.get(name)
        if found is None or (kind is not None and found.kind != kind):
            what = kind or "member"
            raise invalid_input(
                f"Actor type {self.name!r} has no {what} {name!r}.", code="unknown_member"
            )
        return found

    def default_state(self) -> BaseModel:
        """A fresh default state."""
        return self.state_model()

    def resolve(self) -> None:
        """Resolve annotations into validation models (deferred for forward references)."""
        if self.resolved:
            return
        for member in self.members.values():
            _resolve_member(member)
        for job in self.jobs.values():
            job.resolve()
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


# --- the Actor base -------------------------------------------------------------------------


class Actor(TurnApi[S], Generic[S]):
    """Base class of actors: ``class Order(akter.Actor[OrderState], name=..., ...)``.

    Class keywords: ``name=`` (default: the class name), ``singleton=True``, ``access=`` (an
    access policy; default System-only), ``placement="tenant" | "actor"``, ``events=`` (the
    event classes it emits; when given, emitting another class is refused), ``policy=``
    (:class:`akter.Policy`) or individual policy fields (``execution_timeout=5`` ...).
    """

    __akter_definition__: ClassVar[ActorDefinition]

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        singleton: bool = False,
        access: AccessPolicy | None = None,
        placement: Literal["tenant", "actor"] = "tenant",
        policy: Policy | None = None,
        events: tuple[type[Event], ...] | list[type[Event]] = (),
        **options: Any,
    ) -> None:
        unknown = set(options) - POLICY_FIELDS
        if unknown:
            raise DefinitionError(f"{cls.__name__}: unknown class keyword(s) {sorted(unknown)!r}.")
        super().__init_subclass__()
        type_name = cls.__name__ if name is None else name
        if not isinstance(type_name, str) or not ACTOR_TYPE_RE.match(type_name):
            raise DefinitionError(
                f"Actor type name {type_name!r} is invalid: use 1–64 characters "
                "[A-Za-z][A-Za-z0-9_]*."
            )
        if placement not in ("tenant", "actor"):
            raise DefinitionError(f"{type_name}: placement must be 'tenant' or 'actor'.")
        if access is not None and not callable(access):
            raise DefinitionError(f"{type_name}: access= must be callable.")
        base = policy or Policy()
        if options:
            base = Policy(**{**base.__dict__, **options})
        definition = ActorDefinition(
            cls=cls,
            name=type_name,
            state_model=_check_state_model(type_name, _state_model_of(cls)),
            singleton=bool(singleton),
            placement=placement,
            access=access or default_access,
            policy=base.resolve(type_name),
            events=tuple(events),
        )
        for event in definition.events:
            if not (isinstance(event, type) and issubclass(event, Event)):
                raise DefinitionError(f"{type_name}: events= takes akter.Event subclasses.")
        _collect_members(cls, definition)
        cls.__akter_definition__ = definition
        try:
            definition.resolve()
        except DefinitionError as exc:
            if "cannot resolve an annotation" not in str(exc):
                raise
            # Forward references: resolved when the Runtime is built.


def _state_model_of(cls: type) -> type[BaseModel]:
    for base in getattr(cls, "__orig_bases__", ()):
        origin = typing.get_origin(base)
        if isinstance(origin, type) and issubclass(origin, Actor):
            (arg,) = typing.get_args(base)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
            raise DefinitionError(
                f"{cls.__name__}: the state type {arg!r} must be a pydantic BaseModel."
            )
    for base in cls.__mro__[1:]:
        definition = base.__dict__.get("__akter_definition__")
        if definition is not None:
            return typing.cast(ActorDefinition, definition).state_model
    return EmptyState


def _check_state_model(type_name: str, model: type[BaseModel]) -> type[BaseModel]:
    """Refuse a state model a new actor cannot start from (evolution E1).

    Every actor starts from ``model()``: a required field would fail every cold command.
    """
    required = [name for name, info in model.model_fields.items() if info.is_required()]
    if required:
        raise DefinitionError(
            f"{type_name}: the state model {model.__name__} has required field(s) "
            f"{', '.join(repr(r) for r in required)}; every state field needs a default, since "
            "a new actor starts from the defaults."
        )
    if model.__pydantic_complete__:  # else forward references: checked by the first turn
        try:
            model()
        except ValidationError as exc:
            raise DefinitionError(
                f"{type_name}: the default state {model.__name__}() fails validation: {exc}"
            ) from None
    return model


def _collect_members(cls: type, definition: ActorDefinition) -> None:
    from akter.jobs import Job

    seen: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            spec = getattr(value, _MEMBER_ATTR, None)
            if isinstance(value, Job):
                _check_member_name(definition.name, attr, seen, "job")
                definition.jobs[attr] = value
                continue
            if not isinstance(spec, MemberSpec):
                continue
            if spec.route is not None and not any(
                spec.route[1] is j for k in reversed(cls.__mro__) for j in vars(k).values()
            ):
                owner = spec.route[1].owner.name if spec.route[1].owner else "its actor"
                raise DefinitionError(
                    f"{definition.name}.{attr}: the on_{spec.route[0]} route of "
                    f"{spec.route[1]!r} must be a method of {owner}, the job's own actor class."
                )
            _check_member_name(definition.name, attr, seen, spec.kind)
            definition.members[attr] = Member(
                name=attr, kind=spec.kind, fn=value, spec=spec, owner=definition
            )
            if klass is cls:
                setattr(value, _OWNER_ATTR, definition)
    for job in definition.jobs.values():
        job.bind_owner(definition)
    from dataclasses import replace

    from akter.schedules import check_unique, check_zero_arg, entries_of

    for member in definition.members.values():
        entries = entries_of(member.fn)
        if entries:
            check_zero_arg(member.fn)
            definition.schedules.extend(replace(e, command=member.name) for e in entries)
    check_unique(definition.schedules, definition.name)


def _check_member_name(type_name: str, attr: str, seen: dict[str, str], kind: str) -> None:
    if not MEMBER_NAME_RE.match(attr) or attr.startswith(("_", "$")):
        raise DefinitionError(f"{type_name}.{attr}: member names must not start with '_' or '$'.")
    if attr in RESERVED_MEMBER_NAMES:
        raise DefinitionError(
            f"{type_name}.{attr}: {attr!r} is reserved by the turn context; rename the {kind}."
        )
    if attr in seen and seen[attr] != kind:
        raise DefinitionError(f"{type_name}.{attr}: the name is used twice ({seen[attr]}, {kind}).")
    seen[attr] = kind


def definition_of(actor: type[Actor[Any]] | Any) -> ActorDefinition:
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
