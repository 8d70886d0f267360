"""Running the staging statements on the application's connection, whatever it is.

Supported: a psycopg 3 ``Connection`` / ``AsyncConnection``; a SQLAlchemy ``Connection`` /
``Session`` / ``AsyncConnection`` / ``AsyncSession`` on a pyformat driver (``postgresql+psycopg``,
``postgresql+psycopg2``); Django's connection (``django.db.connection`` or
``connections[alias]``) on its PostgreSQL backend. Each statement goes through the
connection's own execute, so it joins the transaction the application holds (SQLAlchemy's and
Django's bookkeeping included). Nothing here imports SQLAlchemy or Django unless the
connection is one of theirs.

A statement that fails because the schema is not there (another database, a schema never
migrated) is re-raised as ``ConfigurationError`` naming the schema; the database has then
aborted the application's transaction, so nothing it staged or wrote is committed.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from akter._store.gateway.staging import Rows, Statement
from akter.errors import ConfigurationError

#: Runs one statement on the application's connection: its rows as dicts.
SyncRun = Callable[[str, dict[str, Any]], Rows]
AsyncRun = Callable[[str, dict[str, Any]], Awaitable[Rows]]

T = TypeVar("T")

#: SQLSTATEs of a schema that is not there (or not this code's): undefined table, schema,
#: function, column.
_MISSING = {"42P01", "3F000", "42883", "42703"}


def is_async(conn: Any) -> bool:
    """Whether ``conn`` is one of the async connections (its statements are awaited)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return True
    module = type(conn).__module__
    return module.startswith("sqlalchemy.ext.asyncio")


def sync_runner(conn: Any) -> SyncRun:
    """The statement runner of a sync connection, or ``TypeError`` naming what is supported."""
    if isinstance(conn, psycopg.Connection):
        pg: psycopg.Connection[Any] = conn

        def run_psycopg(sql: str, params: dict[str, Any]) -> Rows:
            with pg.cursor(row_factory=dict_row) as cur:
                cur.execute(sql, params)
                return cur.fetchall() if cur.description else []

        return run_psycopg
    module = type(conn).__module__
    if module.startswith("sqlalchemy.orm"):
        return _sqlalchemy_run(conn.connection())
    if module.startswith("sqlalchemy"):
        return _sqlalchemy_run(conn)
    if module.startswith("django"):
        return _django_run(conn)
    raise _unsupported(conn)


def async_runner(conn: Any) -> AsyncRun:
    """The statement runner of an async connection."""
    if isinstance(conn, psycopg.AsyncConnection):
        pg: psycopg.AsyncConnection[Any] = conn

        async def run_psycopg(sql: str, params: dict[str, Any]) -> Rows:
            async with pg.cursor(row_factory=dict_row) as cur:
                await cur.execute(sql, params)
                return await cur.fetchall() if cur.description else []

        return run_psycopg
    if type(conn).__module__.startswith("sqlalchemy.ext.asyncio"):

        async def run_sqlalchemy(sql: str, params: dict[str, Any]) -> Rows:
            target = conn
            if hasattr(conn, "get_bind") and inspect.iscoroutinefunction(conn.connection):
                target = await conn.connection()  # an AsyncSession: its transaction's connection
            _check_pyformat(target.dialect)
            result = await target.exec_driver_sql(sql, params)
            return [dict(r) for r in result.mappings().all()] if result.returns_rows else []

        return run_sqlalchemy
    raise _unsupported(conn)


def _sqlalchemy_run(conn: Any) -> SyncRun:
    _check_pyformat(conn.dialect)

    def run(sql: str, params: dict[str, Any]) -> Rows:
        result = conn.exec_driver_sql(sql, params)
        return [dict(r) for r in result.mappings().all()] if result.returns_rows else []

    return run


def _check_pyformat(dialect: Any) -> None:
    if dialect.name != "postgresql" or dialect.paramstyle != "pyformat":
        raise ConfigurationError(
            f"akter.stage needs a PostgreSQL driver with pyformat parameters "
            f"(postgresql+psycopg or postgresql+psycopg2), not {dialect.name}+{dialect.driver}."
        )


def _django_run(conn: Any) -> SyncRun:
    if getattr(conn, "vendor", None) != "postgresql":
        raise ConfigurationError(
            f"akter.stage needs Django's PostgreSQL backend, not {getattr(conn, 'vendor', conn)!r}."
        )

    def run(sql: str, params: dict[str, Any]) -> Rows:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            if cur.description is None:
                return []
            names = [c[0] for c in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    return run


def _unsupported(conn: Any) -> TypeError:
    return TypeError(
        f"akter.stage takes a psycopg Connection or AsyncConnection, a SQLAlchemy Connection, "
        f"Session, AsyncConnection or AsyncSession, or a Django connection; not {conn!r}. "
        "(An async connection goes to akter.astage.)"
    )


def drive_sync(plan: Generator[Statement, Rows, T], run: SyncRun, schema: str) -> T:
    """Run ``plan``'s statements with ``run``; its return value."""
    try:
        statement = next(plan)
        while True:
            statement = plan.send(_guarded(run, statement, schema))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(plan: Generator[Statement, Rows, T], run: AsyncRun, schema: str) -> T:
    """Run ``plan``'s statements with the awaited ``run``; its return value."""
    try:
        statement = next(plan)
        while True:
            try:
                rows = await run(*statement)
            except Exception as exc:
                raise _translated(exc, schema) from exc
            statement = plan.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _guarded(run: SyncRun, statement: Statement, schema: str) -> Rows:
    try:
        return run(*statement)
    except Exception as exc:
        raise _translated(exc, schema) from exc


def _translated(exc: Exception, schema: str) -> Exception:
    """A missing schema's error as ``ConfigurationError``; anything else as it was."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        state = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if state in _MISSING:
            return ConfigurationError(
                f"Staging found no migrated akter schema {schema!r} on this connection's "
                f"database ({seen}): is the connection to the application's akter database, "
                "and has a runtime of this version started there? The transaction is aborted; "
                "nothing was staged."
            )
        seen = getattr(seen, "orig", None) or seen.__cause__
    return exc
