"""Evolving code over durable data (spec evolution.md): migration chains and the loss guard.

A *chain* is the list of migrations of one stored shape — an actor type's state, a command's or
job's payload, an event's payload — indexed by the version each one upgrades from. Its length is
the code's version of that shape: a row stored at version ``k`` is read by running migrations
``k … n-1`` on its JSON. Declarations:

- ``@akter.migrate_state(from_version=k)`` on a plain function in an actor class body;
- ``@Account.deposit.migrate_payload(from_version=k)`` / ``@charge.migrate_payload(...)`` on a
  command or a job (the decorator is an attribute of the member);
- ``@Paid.migrate(from_version=k)`` on an event class.

A migration is a pure function of the stored JSON object (``dict`` in, ``dict`` out), or one
annotated with pydantic models (``def f(old: V0) -> V1``): akter then validates the input and
dumps the output in JSON mode. :func:`lost_keys` is the loss guard's comparison.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, overload

from pydantic import BaseModel, ValidationError
from typing_extensions import TypeVar

from akter.errors import DefinitionError, invalid_input

M1 = TypeVar("M1", bound=BaseModel)
M2 = TypeVar("M2", bound=BaseModel)
JsonObject = dict[str, Any]

#: The most migrations one chain may hold (a guard against a runaway version number).
MAX_VERSION = 10_000


class MigrationFailed(Exception):
    """A migration raised, returned something other than a JSON object, or its input failed."""


@dataclass(frozen=True)
class Migration:
    """One declared migration: it upgrades a stored shape from ``from_version``."""

    from_version: int
    fn: Callable[[Any], Any]
    #: The pydantic model the function takes, for a typed migration.
    takes: type[BaseModel] | None = None

    @property
    def name(self) -> str:
        """The function's name, for messages."""
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def apply(self, value: JsonObject) -> JsonObject:
        """Run the migration on a JSON object (its own copy of it)."""
        try:
            if self.takes is not None:
                result = self.fn(self.takes.model_validate(value))
            else:
                result = self.fn(_copy(value))
        except ValidationError as exc:
            raise MigrationFailed(
                f"the stored value fails {self.takes.__name__ if self.takes else 'the input'} "
                f"of migration {self.name}: {exc}"
            ) from None
        except Exception as exc:
            raise MigrationFailed(
                f"migration {self.name} raised {type(exc).__name__}: {exc}"
            ) from None
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        if not isinstance(result, dict):
            raise MigrationFailed(
                f"migration {self.name} returned {type(result).__name__}, not a JSON object"
            )
        return result


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value (a migration may mutate its input: ``old.pop(...)``)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@dataclass(frozen=True)
class Chain:
    """The migrations of one stored shape, by ``from_version`` 0 … n-1."""

    steps: tuple[Migration, ...] = ()

    @property
    def version(self) -> int:
        """The code's version of the shape: the number of migrations."""
        return len(self.steps)

    def upgrade(self, value: JsonObject, from_version: int) -> JsonObject:
        """Run migrations ``from_version … n-1`` on ``value``.

        Raises:
            MigrationFailed: A migration failed, or ``from_version`` is not in ``0 … n``.
        """
        if not 0 <= from_version <= self.version:
            raise MigrationFailed(
                f"stored at version {from_version}, and this code knows versions 0 to "
                f"{self.version}"
            )
        for step in self.steps[from_version:]:
            value = step.apply(value)
        return value


def build_chain(owner: str, migrations: Iterable[Migration]) -> Chain:
    """The chain of ``migrations``; their versions must be contiguous from 0.

    Raises:
        DefinitionError: A gap, a duplicate or a negative ``from_version``.
    """
    by_version: dict[int, Migration] = {}
    for migration in migrations:
        other = by_version.get(migration.from_version)
        if other is not None and other.fn is not migration.fn:
            raise DefinitionError(
                f"{owner}: two migrations from version {migration.from_version} "
                f"({other.name}, {migration.name})."
            )
        by_version[migration.from_version] = migration
    expected = list(range(len(by_version)))
    if sorted(by_version) != expected:
        raise DefinitionError(
            f"{owner}: migrations must be declared from version 0 without gaps; found "
            f"from_version {sorted(by_version)}."
        )
    return Chain(tuple(by_version[v] for v in expected))


def check_version(owner: str, version: Any, chain: Chain) -> int:
    """A declared ``version=`` must equal the number of payload migrations declared.

    Called once the chain is complete (at resolution); ``version`` may be 0 with no chain.

    Raises:
        DefinitionError: A non-integer, or a version that disagrees with the migrations.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise DefinitionError(f"{owner}: version= must be a non-negative integer.")
    if version != chain.version:
        raise DefinitionError(
            f"{owner}: version={version} needs migrations from versions 0 to {version - 1} "
            f"(declared: {chain.version})."
        )
    return version


def check_aliases(owner: str, aliases: Any) -> tuple[str, ...]:
    """``aliases=`` as a tuple of distinct non-empty names."""
    if isinstance(aliases, str) or not isinstance(aliases, tuple | list):
        raise DefinitionError(f"{owner}: aliases= takes a tuple of names, not {aliases!r}.")
    names = tuple(aliases)
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise DefinitionError(f"{owner}: alias {name!r} must be 1–200 characters.")
    if len(set(names)) != len(names):
        raise DefinitionError(f"{owner}: aliases= lists a name twice.")
    return names


# --- declaring migrations -------------------------------------------------------------------


class MigrationDecorator(Protocol):
    """What ``migrate_state(...)`` and ``migrate_payload(...)`` return: the decorator."""

    @overload
    def __call__(self, fn: Callable[[JsonObject], JsonObject], /) -> Migration: ...
    @overload
    def __call__(self, fn: Callable[[M1], M2], /) -> Migration: ...


def declare(from_version: int, record: Callable[[Migration], None] | None = None) -> Any:
    """The decorator behind every migration declaration.

    ``record`` receives the migration (payload migrations attach it to their member); state
    migrations are found by the actor class, which collects :class:`StateMigration` objects.
    """
    if isinstance(from_version, bool) or not isinstance(from_version, int):
        raise DefinitionError(f"from_version must be an integer, not {from_version!r}.")
    if not 0 <= from_version < MAX_VERSION:
        raise DefinitionError(f"from_version must be from 0 to {MAX_VERSION - 1}.")

    def mark(fn: Any) -> Migration:
        if isinstance(fn, staticmethod):
            fn = fn.__func__
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise DefinitionError(f"A migration must be a plain (not async) function: {fn!r}.")
        params = list(inspect.signature(fn).parameters.values())
        if len(params) != 1 or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise DefinitionError(
                f"Migration {fn.__qualname__}: takes exactly one argument, the stored object "
                "(no self)."
            )
        migration = Migration(from_version, fn, _model_taken(fn, params[0].name))
        if record is not None:
            record(migration)
        return (
            StateMigration(migration.from_version, migration.fn, migration.takes)
            if record is None
            else migration
        )

    return mark


def _model_taken(fn: Any, param: str) -> type[BaseModel] | None:
    try:
        hints = typing.get_type_hints(fn)
    except NameError:
        return None  # a forward reference: treated as a dict migration
    taken = hints.get(param)
    return taken if isinstance(taken, type) and issubclass(taken, BaseModel) else None


@dataclass(frozen=True)
class StateMigration(Migration):
    """A state migration declared in an actor class body (collected by the class)."""


_MIGRATIONS_ATTR = "__akter_payload_migrations__"


def attach_payload_migrations(fn: Any) -> None:
    """Give a command function its ``migrate_payload`` decorator and the list it fills."""
    migrations: list[Migration] = []
    setattr(fn, _MIGRATIONS_ATTR, migrations)

    def migrate_payload(*, from_version: int) -> MigrationDecorator:
        return typing.cast(MigrationDecorator, declare(from_version, migrations.append))

    fn.migrate_payload = migrate_payload


def payload_chain(owner: str, fn: Any, version: int) -> Chain:
    """The payload chain declared on a command function, checked against its ``version=``."""
    chain = build_chain(owner, getattr(fn, _MIGRATIONS_ATTR, ()))
    check_version(owner, version, chain)
    return chain


def migrate_state(*, from_version: int) -> MigrationDecorator:
    """Declare a migration of an actor type's stored state from ``from_version``.

    The function takes the stored JSON object (no ``self``) and returns the next version's
    object; or it is annotated with pydantic models (``def f(old: V0) -> V1``). The type's
    state version is the number of migrations; they must be contiguous from 0.
    """
    return typing.cast(MigrationDecorator, declare(from_version))


# --- decoding stored rows under the current code (evolution E1, E3) --------------------------

StateProblem = Literal["too_new", "migration", "invalid", "lost"]


class StateDecodeError(Exception):
    """A stored state this code cannot use: why (``kind``) and a message naming the actor.

    ``too_new``: stored at a version above the code's (``StateTooNew``, retryable); the other
    kinds are defects of the code against the data (a failing migration, a state that fails
    validation, keys the next write would drop).
    """

    def __init__(self, kind: StateProblem, message: str, lost: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.kind: StateProblem = kind
        self.message = message
        self.lost = lost


class PayloadTooNew(Exception):
    """A stored payload at a version above the code's: left for a runner that knows it."""


def upgrade_payload(chain: Chain, stored: Any, version: int, what: str) -> dict[str, Any]:
    """A stored payload (an outbox row's, a dead letter's) upgraded to the code's version.

    Raises:
        PayloadTooNew: ``version`` is above the chain's.
        ActorError: ``InvalidInput`` when the payload is not an object or a migration fails.
    """
    if version > chain.version:
        raise PayloadTooNew(
            f"The payload of {what} is at version {version}; this code knows versions 0 to "
            f"{chain.version}."
        )
    if not isinstance(stored, dict):
        raise invalid_input(f"The stored payload of {what} is not a JSON object.")
    try:
        return chain.upgrade(stored, version)
    except MigrationFailed as exc:
        raise invalid_input(f"The stored payload of {what} cannot be migrated: {exc}.") from None


# --- the loss guard ---------------------------------------------------------------------------


def lost_keys(stored: Any, dumped: Any, path: str = "") -> list[str]:
    """Key paths present in ``stored`` and absent from ``dumped``, at any depth.

    ``stored`` is the stored JSON after migrations, ``dumped`` the validated model dumped as
    akter stores it: a key the dump lacks would be dropped by the next write. Lists are compared
    element by element (``items[2].sku``); values of different kinds are not compared further.
    """
    if stored == dumped:
        # Equal JSON values have the same keys at every depth; the comparison runs in C, about
        # 70 times faster than the walk (bench/evolution_guard.py), and a cold load of a row
        # this code wrote is the common case.
        return []
    lost: list[str] = []
    stack: list[tuple[Any, Any, str]] = [(stored, dumped, path)]
    while stack:
        old, new, where = stack.pop()
        if isinstance(old, dict) and isinstance(new, dict):
            for key, value in old.items():
                at = f"{where}.{key}" if where else str(key)
                if key not in new:
                    lost.append(at)
                else:
                    stack.append((value, new[key], at))
        elif isinstance(old, list) and isinstance(new, list):
            for i, (a, b) in enumerate(zip(old, new, strict=False)):
                stack.append((a, b, f"{where}[{i}]"))
            if len(old) > len(new):
                lost.append(f"{where}[{len(new)}:]")
    return sorted(lost)


# --- newer writers (evolution E4) -----------------------------------------------------------

#: The most levels of nested models :func:`declared_paths` follows (a recursive model stops).
PATH_DEPTH = 8
_INDEX = re.compile(r"\[\d+\]")


def declared_paths(model: type[BaseModel]) -> frozenset[str]:
    """The key paths a state model declares, in :func:`lost_keys`'s notation, items as ``[]``.

    ``items[].sku`` for a field ``items: list[Line]`` whose ``Line`` declares ``sku``. A runner
    records them for each type it hosts; an older runner that finds keys it would drop asks
    whether a live runner declares them (:func:`newer_writer_declares`). Models inside dicts are not
    followed (their keys are data).
    """
    paths: set[str] = set()
    stack: list[tuple[type[BaseModel], str, int]] = [(model, "", 0)]
    while stack:
        current, prefix, depth = stack.pop()
        for name, info in current.model_fields.items():
            at = f"{prefix}.{name}" if prefix else name
            paths.add(at)
            if depth < PATH_DEPTH:
                for inner, suffix in _models_in(info.annotation):
                    stack.append((inner, at + suffix, depth + 1))
    return frozenset(paths)


def _models_in(annotation: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    """The models an annotation holds directly, optionally, or as list items (with ``[]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, suffix)]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0], suffix)
    if origin is typing.Union or origin is types.UnionType:
        return [found for arg in args for found in _models_in(arg, suffix)]
    if origin in (list, tuple, set, frozenset) or (
        origin is not None and getattr(origin, "__name__", "") in ("Sequence", "MutableSequence")
    ):
        items = [a for a in args if a is not Ellipsis]
        return [found for arg in items for found in _models_in(arg, suffix + "[]")]
    return []


def newer_writer_declares(lost: Iterable[str], peers: Iterable[Iterable[str]]) -> bool:
    """Whether one of ``peers`` (the declared paths of live runners' models) declares ``lost``.

    ``lost`` are :func:`lost_keys`'s paths (list indexes become ``[]``; a list cut short,
    ``items[2:]``, is never explained: no model declares a list's length).
    """
    wanted = {_INDEX.sub("[]", path) for path in lost}
    if not wanted or any(path.endswith(":]") for path in lost):
        return False
    return any(wanted <= set(paths) for paths in peers)
