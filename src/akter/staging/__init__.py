"""Commands to actors staged in the application's own transaction (docs/guides/own-transaction.md).

``akter.stage(conn, Account, "a-1").deposit(cents=500)`` writes one intent row into akter's
outbox on the application's connection, inside whatever transaction it holds, and returns the
command id. After COMMIT the relay delivers it once, as it delivers any intent; if the
transaction rolls back, nothing happens. No runtime is needed to stage: only the actor classes
and the connection.

Sync connections (psycopg ``Connection``, SQLAlchemy ``Connection``/``Session``, Django's) return
the id; async ones (psycopg ``AsyncConnection``, SQLAlchemy ``AsyncConnection``/``AsyncSession``)
return an awaitable of it: ``await akter.stage(aconn, ...).deposit(...)`` (``akter.astage`` is
the same, typed for async connections alone).

Typing: a stager's attribute calls (``.deposit(cents=500)``) are typed ``str`` (or an
awaitable of it) but their arguments are not checked statically (Python's type system cannot map
an actor's methods to another return type). ``.send(Account.deposit, cents=500)`` is the fully
checked spelling: its arguments type-check against the command's parameters. Both validate the
arguments at run time exactly as a handle does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload

import psycopg

from akter._members import ActorDefinition, Command
from akter._store import app_connections as _connections
from akter._store.gateway.staging import StageRow, plan
from akter._store.migrate import SCHEMA_VERSION
from akter._store.queries import Queries
from akter.callers import Caller
from akter.errors import ActorError
from akter.staging import _rows

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

    from akter.actor import Actor

A = TypeVar("A", bound="Actor[Any]")
P = ParamSpec("P")

_QUERIES: dict[str, Queries] = {}


def _queries(schema: str) -> Queries:
    found = _QUERIES.get(schema)
    if found is None:
        found = _QUERIES[schema] = Queries(schema)
    return found


@dataclass(frozen=True, slots=True)
class _Target:
    """Who a stager stages to, and how: everything but the command."""

    definition: ActorDefinition
    tenant: str
    id: str
    caller: Caller
    pinned: str | None
    timing: tuple[int | None, int | None]

    def row(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StageRow:
        return _rows.command_row(
            self.definition,
            self.tenant,
            self.id,
            name,
            args,
            kwargs,
            self.caller,
            self.pinned,
            self.timing,
        )

    def start_row(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StageRow:
        flow = self.definition.workflows[name]
        return _rows.workflow_row(
            self.definition,
            self.tenant,
            self.id,
            flow,
            args,
            kwargs,
            self.caller,
            self.pinned,
            self.timing,
        )


def _target(
    actor: type[Any],
    id: str,
    tenant: str,
    caller: Caller | None,
    command_id: str | None,
    after: float | timedelta | None,
    at: datetime | None,
) -> _Target:
    definition = _rows.definition(actor)
    tenant, id = _rows.address(definition, id, tenant)
    return _Target(
        definition,
        tenant,
        id,
        _rows.check_caller(caller),
        _rows.check_pinned(command_id),
        _rows.due(after, at),
    )


class DjangoConnection(Protocol):
    """Django's database connection as staging uses it (``django.db.connection``)."""

    vendor: str

    def cursor(self) -> Any:
        """A cursor of the connection."""
        ...


class StagedCommand:
    """One command built by :func:`staged`, for :func:`stage_many`: validated, not written."""

    __slots__ = ("row",)

    def __init__(self, row: StageRow) -> None:
        self.row = row

    def __repr__(self) -> str:
        return f"<akter staged {self.row.type}/{self.row.id!r}.{self.row.command}>"


class _Member:
    """``stager.<command>(...)``, or ``stager.<workflow>.start(...)``."""

    __slots__ = ("_finish", "_name", "_target")

    def __init__(self, target: _Target, name: str, finish: Any) -> None:
        self._target = target
        self._name = name
        self._finish = finish

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._name in self._target.definition.workflows:
            raise ActorError(
                "InvalidInput",
                f"{self._target.definition.name}.{self._name} is a workflow: stage its start "
                f"with .{self._name}.start(...).",
                code="unknown_member",
            )
        return self._finish(self._target.row(self._name, args, kwargs))

    def start(self, *args: Any, **kwargs: Any) -> Any:
        """Stage a start of this workflow: the run id (a handle's ``.start``, staged)."""
        if self._name not in self._target.definition.workflows:
            raise ActorError(
                "InvalidInput",
                f"Actor type {self._target.definition.name!r} has no workflow {self._name!r}.",
                code="unknown_member",
            )
        return self._finish(self._target.start_row(self._name, args, kwargs))


class _Base(Generic[A]):
    __slots__ = ("_run", "_schema", "_target")

    def __init__(self, target: _Target, run: Any, schema: str) -> None:
        self._target = target
        self._run = run
        self._schema = schema

    def _finish(self, row: StageRow) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Member(self._target, name, self._finish)

    def __repr__(self) -> str:
        t = self._target
        return f"<akter stager {t.definition.name}/{t.id!r} tenant={t.tenant!r}>"


class StagedCall(Protocol):
    """A stager's member as the type checker sees it: called, or ``.start(...)``ed (a workflow)."""

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        """Stage the command: its command id."""
        ...

    def start(self, *args: Any, **kwargs: Any) -> str:
        """Stage a start of the workflow: its run id."""
        ...


class AsyncStagedCall(Protocol):
    """An async stager's member as the type checker sees it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[str]:
        """Stage the command: its command id."""
        ...

    def start(self, *args: Any, **kwargs: Any) -> Awaitable[str]:
        """Stage a start of the workflow: its run id."""
        ...


class Stager(_Base[A]):
    """Stages commands to one actor on a sync connection: each call returns the command id."""

    __slots__ = ()

    def _finish(self, row: StageRow) -> str:
        return _connections.drive_sync(
            plan(_queries(self._schema), [row], SCHEMA_VERSION), self._run, self._schema
        )[0]

    def send(self, command: Command[A, P, Any], /, *args: P.args, **kwargs: P.kwargs) -> str:
        """Stage ``command`` (``Account.deposit``) with arguments checked statically."""
        return self._finish(self._target.row(command.__name__, args, kwargs))

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> StagedCall: ...


class AsyncStager(_Base[A]):
    """Stages commands to one actor on an async connection: each call awaits the command id."""

    __slots__ = ()

    async def _finish(self, row: StageRow) -> str:
        ids = await _connections.drive_async(
            plan(_queries(self._schema), [row], SCHEMA_VERSION), self._run, self._schema
        )
        return ids[0]

    async def send(self, command: Command[A, P, Any], /, *args: P.args, **kwargs: P.kwargs) -> str:
        """Stage ``command`` (``Account.deposit``) with arguments checked statically."""
        return await self._finish(self._target.row(command.__name__, args, kwargs))

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> AsyncStagedCall: ...


class Builder(_Base[A]):
    """:func:`staged`'s builder: each call returns a :class:`StagedCommand` for stage_many."""

    __slots__ = ()

    def _finish(self, row: StageRow) -> StagedCommand:
        return StagedCommand(row)

    def send(
        self, command: Command[A, P, Any], /, *args: P.args, **kwargs: P.kwargs
    ) -> StagedCommand:
        """A staged ``command`` with arguments checked statically."""
        return self._finish(self._target.row(command.__name__, args, kwargs))

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


@overload
def stage(
    conn: psycopg.AsyncConnection[Any] | AsyncConnection | AsyncSession,
    actor: type[A],
    id: str = "",
    *,
    tenant: str = "default",
    caller: Caller | None = None,
    command_id: str | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
    schema: str = "akter",
) -> AsyncStager[A]: ...
@overload
def stage(
    conn: psycopg.Connection[Any] | SAConnection | Session | DjangoConnection,
    actor: type[A],
    id: str = "",
    *,
    tenant: str = "default",
    caller: Caller | None = None,
    command_id: str | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
    schema: str = "akter",
) -> Stager[A]: ...
def stage(
    conn: Any,
    actor: type[A],
    id: str = "",
    *,
    tenant: str = "default",
    caller: Caller | None = None,
    command_id: str | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
    schema: str = "akter",
) -> Stager[A] | AsyncStager[A]:
    """A stager of commands to ``actor``/``id`` in the transaction ``conn`` holds.

    Args:
        conn: The application's connection (module docstring lists the kinds).
        actor: The actor class.
        id: The actor's id (``""`` for a singleton).
        tenant: The actor's tenant.
        caller: ``akter.System(source="transaction", on_behalf_of=...)`` (the default, without
            ``on_behalf_of``) or an ``akter.User`` the application vouches for (no access
            policy is checked at delivery, as for any intent).
        command_id: A pinned id (``v1.…`` of this deployment's window) for idempotency: staging
            it again with the same command and payload is a no-op returning it; with another,
            ``CommandConflict``, nothing written.
        after: Deliver this long after the staging statement (a durable timer).
        at: Deliver at this aware datetime instead (a past one is due at once).
        schema: The schema holding akter's tables (``RuntimeConfig.schema``).

    Raises:
        ActorError: ``InvalidInput`` naming the field (nothing written), ``CommandConflict``,
            ``InvalidCommandId``, ``CommandExpired``.
        ConfigurationError: No migrated akter schema on the connection's database.
    """
    target = _target(actor, id, tenant, caller, command_id, after, at)
    _queries(schema)  # the schema's name is checked before anything is sent (cached)
    if _connections.is_async(conn):
        return AsyncStager(target, _connections.async_runner(conn), schema)
    return Stager(target, _connections.sync_runner(conn), schema)


def astage(
    conn: psycopg.AsyncConnection[Any] | AsyncConnection | AsyncSession,
    actor: type[A],
    id: str = "",
    *,
    tenant: str = "default",
    caller: Caller | None = None,
    command_id: str | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
    schema: str = "akter",
) -> AsyncStager[A]:
    """:func:`stage` for an async connection (typed: each call is awaited)."""
    if not _connections.is_async(conn):
        raise TypeError(f"akter.astage takes an async connection, not {conn!r}; use akter.stage.")
    result = stage(
        conn,
        actor,
        id,
        tenant=tenant,
        caller=caller,
        command_id=command_id,
        after=after,
        at=at,
        schema=schema,
    )
    assert isinstance(result, AsyncStager)
    return result


def staged(
    actor: type[A],
    id: str = "",
    *,
    tenant: str = "default",
    caller: Caller | None = None,
    command_id: str | None = None,
    after: float | timedelta | None = None,
    at: datetime | None = None,
) -> Builder[A]:
    """One command for :func:`stage_many`: ``akter.staged(Account, "a-1").deposit(cents=5)``."""
    return Builder(_target(actor, id, tenant, caller, command_id, after, at), None, "")


@overload
def stage_many(
    conn: psycopg.AsyncConnection[Any] | AsyncConnection | AsyncSession,
    commands: Sequence[StagedCommand],
    *,
    schema: str = "akter",
) -> Awaitable[list[str]]: ...
@overload
def stage_many(
    conn: psycopg.Connection[Any] | SAConnection | Session | DjangoConnection,
    commands: Sequence[StagedCommand],
    *,
    schema: str = "akter",
) -> list[str]: ...
def stage_many(
    conn: Any, commands: Sequence[StagedCommand], *, schema: str = "akter"
) -> list[str] | Awaitable[list[str]]:
    """Stage many commands in one statement (two or three with pinned ids): their ids, in order.

    Ten thousand commands are one ``INSERT … SELECT FROM unnest(…)`` of parallel arrays, not ten
    thousand round trips. Each command was validated when :func:`staged` built it.
    """
    rows = [_checked(c) for c in commands]
    generator = plan(_queries(schema), rows, SCHEMA_VERSION)
    if _connections.is_async(conn):
        return _connections.drive_async(generator, _connections.async_runner(conn), schema)
    return _connections.drive_sync(generator, _connections.sync_runner(conn), schema)


def _checked(command: object) -> StageRow:
    if not isinstance(command, StagedCommand):
        raise TypeError(
            f"stage_many() takes commands built by akter.staged(...).<command>(...), not "
            f"{command!r}."
        )
    return command.row


__all__ = [
    "AsyncStagedCall",
    "AsyncStager",
    "Builder",
    "StagedCall",
    "StagedCommand",
    "Stager",
    "astage",
    "stage",
    "stage_many",
    "staged",
]
