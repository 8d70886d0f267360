"""Actor declarations: ``Actor[State]``, ``@command``, ``@query``, events and definitions.

An actor class is a declaration. At run time the engine instantiates it once per turn with a
turn context bound to it, so ``self`` inside a command is both the actor (its methods are
callable) and the turn's capability surface (``self.state``, ``self.send`` ...). See
:mod:`akter.context` for the capabilities themselves.

The class keywords are checked and the members collected here; the member and definition types
(``@command``, ``@query``, :class:`ActorDefinition`, :class:`Member`) live in
:mod:`akter._members` and the event base in :mod:`akter._event_decl`, re-exported from here.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal

from pydantic import BaseModel, ValidationError
from typing_extensions import TypeVar

from akter._broadcasts import Broadcasts
from akter._event_decl import Event
from akter._evolution import StateMigration, build_chain
from akter._ids import ACTOR_TYPE_RE, MEMBER_NAME_RE
from akter._members import (
    _MEMBER_ATTR,
    _OWNER_ATTR,
    AccessKind,
    AccessPolicy,
    ActorDefinition,
    EmptyState,
    Member,
    MemberSpec,
    command,
    definition_of,
    member_of,
    query,
)
from akter._policy import POLICY_FIELDS, Policy
from akter._rows import RowsApi
from akter._storable import (
    ARGUMENT_INT_RANGE,
    MAX_ARGUMENT_DEPTH,
    storable_payload,
    unstorable_argument,
    unstorable_text,
)
from akter.callers import ActorRef, Caller, System
from akter.context import TurnApi
from akter.errors import DefinitionError
from akter.subscriptions import Subscribing

if TYPE_CHECKING:
    from akter.job_streams import StreamReader

__all__ = [
    "ARGUMENT_INT_RANGE",
    "MAX_ARGUMENT_DEPTH",
    "RESERVED_MEMBER_NAMES",
    "AccessKind",
    "AccessPolicy",
    "Actor",
    "ActorDefinition",
    "EmptyState",
    "Event",
    "Member",
    "MemberSpec",
    "command",
    "default_access",
    "definition_of",
    "member_of",
    "public",
    "query",
    "storable_payload",
    "unstorable_argument",
    "unstorable_text",
]

S = TypeVar("S", bound=BaseModel, default=BaseModel)

RESERVED_MEMBER_NAMES = frozenset(
    {
        "id", "tenant", "ref", "caller", "principal", "command_id", "now", "now_ms", "state",
        "emit", "send", "later", "cancel_timer", "enqueue", "enqueue_many", "cancel_job", "mint",
        "create",
        "events", "cursor", "with_command_id", "run", "runtime", "progress", "start_workflow",
        "signal_workflow", "cancel_workflow", "job_stream", "broadcast", "broadcasts", "watch",
        "rows",
        "subscribe", "unsubscribe",
    }
)  # fmt: skip


def public(caller: Caller, ref: ActorRef, member: str, kind: AccessKind) -> bool:
    """An access policy that allows every caller (``access=akter.public``)."""
    return True


def default_access(caller: Caller, ref: ActorRef, member: str, kind: AccessKind) -> bool:
    """The secure default: only ``System`` callers."""
    return isinstance(caller, System)


# --- the Actor base -------------------------------------------------------------------------


class Actor(TurnApi[S], Broadcasts, RowsApi, Subscribing, Generic[S]):
    """Base class of actors: ``class Order(akter.Actor[OrderState], name=..., ...)``.

    Class keywords: ``name=`` (default: the class name), ``singleton=True``, ``access=`` (an
    access policy; default System-only), ``placement="tenant" | "actor"``, ``events=`` (the
    event classes it emits; when given, emitting another class is refused), ``policy=``
    (:class:`akter.Policy`) or individual policy fields (``execution_timeout=5`` ...),
    ``tables=`` (its owned tables: ``sa.Table`` objects or ``akter.owned(...)``).
    """

    __akter_definition__: ClassVar[ActorDefinition]

    def job_stream(self, job_id: str, after: int = 0) -> StreamReader:
        """On a handle: one of this actor's jobs' output stream (docs/guides/job-streams.md)."""
        raise TypeError("job_stream() is a handle method; call it on runtime.get(...).")

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        singleton: bool = False,
        access: AccessPolicy | None = None,
        placement: Literal["tenant", "actor"] = "tenant",
        policy: Policy | None = None,
        events: tuple[type[Event], ...] | list[type[Event]] = (),
        tables: tuple[Any, ...] | list[Any] = (),
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
        if tables:
            definition.tables = _owned_tables(type_name, tables)
        cls.__akter_definition__ = definition
        try:
            definition.resolve()
        except DefinitionError as exc:
            if "cannot resolve an annotation" not in str(exc):
                raise
            # Forward references: resolved when the Runtime is built.


def _owned_tables(type_name: str, tables: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """The declarations of ``tables=``, each claimed by ``type_name`` (one owner type each)."""
    from akter._tables import owned_of

    declared = tuple(owned_of(t) for t in tables)
    for table in declared:
        table.claim(type_name)
    return declared


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
    from akter.workflows import WorkflowMember

    seen: dict[str, str] = {}
    state_migrations: dict[int, tuple[type, StateMigration]] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, StateMigration):
                # A subclass may redeclare a base's migration; one class may not declare two.
                other = state_migrations.get(value.from_version)
                if other is not None and other[0] is klass:
                    raise DefinitionError(
                        f"{definition.name} state: two migrations from version "
                        f"{value.from_version} ({other[1].name}, {value.name})."
                    )
                state_migrations[value.from_version] = (klass, value)
                continue
            spec = getattr(value, _MEMBER_ATTR, None)
            if isinstance(value, Job):
                _check_member_name(definition.name, attr, seen, "job")
                definition.jobs[attr] = value
                continue
            if isinstance(value, WorkflowMember):
                _check_member_name(definition.name, attr, seen, "workflow")
                definition.workflows[attr] = value
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
    for flow in definition.workflows.values():
        flow.bind_owner(definition)
        if flow.on_complete_name is not None and flow.on_complete_name not in definition.members:
            raise DefinitionError(
                f"{definition.name}.{flow.name}: its on_complete command "
                f"{flow.on_complete_name!r} must be a method of {definition.name}."
            )
    definition.state_chain = build_chain(
        f"{definition.name} state", [m for _, m in state_migrations.values()]
    )
    _collect_aliases(definition)
    from dataclasses import replace

    from akter.schedules import check_unique, check_zero_arg, entries_of

    for member in definition.members.values():
        entries = entries_of(member.fn)
        if entries:
            check_zero_arg(member.fn)
            definition.schedules.extend(replace(e, command=member.name) for e in entries)
    check_unique(definition.schedules, definition.name)


def _collect_aliases(definition: ActorDefinition) -> None:
    """Map the earlier names of commands and jobs to their current names (evolution E2).

    An alias must not be the name or alias of another command, query or job of the type.
    """
    names = {**dict.fromkeys(definition.members, "member"), **dict.fromkeys(definition.jobs, "job")}
    declared = [(name, member.spec.aliases) for name, member in definition.members.items()] + [
        (name, job.aliases) for name, job in definition.jobs.items()
    ]
    for name, aliases in declared:
        for alias in aliases:
            if alias in names:
                raise DefinitionError(
                    f"{definition.name}.{name}: the alias {alias!r} is the name of a "
                    f"{names[alias]} of {definition.name}."
                )
            other = definition.aliases.setdefault(alias, name)
            if other != name:
                raise DefinitionError(
                    f"{definition.name}: the alias {alias!r} is claimed by both {other!r} "
                    f"and {name!r}."
                )


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
