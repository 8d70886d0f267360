"""Owned tables' statements: reads in a ``READ ONLY`` transaction, and the start check's reads.

The reads' SQL is what ``akter._row_sql`` built with SQLAlchemy Core on the user's table: one
owner's rows for a query (:class:`QueryRows`), one tenant's for ``runtime.rows``
(:func:`read_only`). The catalog reads are ``owned_table_*`` (queries_tables.sql).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg import sql
from psycopg.rows import dict_row

from akter._store.gateway.errors import wrap_errors

if TYPE_CHECKING:
    from akter._store.pipeline import Answer, TurnPipeline
    from akter._store.pool import Connection, Store
    from akter._store.queries import Queries

Statement = tuple[str, dict[str, Any]]


async def read_only(
    store: Store, statement: Statement, *, wait_s: float, what: str
) -> list[tuple[Any, ...]]:
    """Run ``statement`` in a ``READ ONLY`` transaction on a pooled connection; its rows.

    A statement that writes fails with ``psycopg.errors.ReadOnlySqlTransaction``.
    """
    sql, params = statement
    with wrap_errors(store, wait_s=wait_s, what=what):
        async with store.pool.connection(timeout=wait_s) as conn:
            # Pipelined: BEGIN, SET and the statement in one round trip, COMMIT in another.
            async with conn.pipeline() as pipe, conn.transaction():
                await conn.execute("SET TRANSACTION READ ONLY")
                cur = await conn.execute(sql.encode(), params)
                await pipe.sync()  # the results are in: ``description`` tells whether rows came
                return list(await cur.fetchall()) if cur.description else []


async def owned_statement(pipe: TurnPipeline, statement: Statement) -> Answer:
    """Queue a statement on an owned table in the turn's flight (never prepared)."""
    sql, params = statement
    return await pipe.execute(sql, params, prepare=False)


async def owned_savepoint(pipe: TurnPipeline, q: Queries) -> Answer:
    """Queue ``owned_rows_savepoint``: before a command's first sent row writes."""
    return await pipe.execute(q["owned_rows_savepoint"])


async def owned_undo(pipe: TurnPipeline, q: Queries) -> Answer:
    """Queue ``owned_rows_undo``: the failed command's sent rows are rolled back."""
    return await pipe.execute(q["owned_rows_undo"])


@dataclass(frozen=True)
class QueryRows:
    """A query's ``self.rows`` side: its owner's keys and a read-only reader."""

    store: Store
    scope: tuple[int, str, str]
    wait_s: float
    what: str

    def stage(self, write: Any) -> None:
        """Never reached: a query's ``self.rows`` refuses writes before staging."""
        raise AssertionError("a query stages no row writes")

    async def read(self, statement: Statement) -> list[tuple[Any, ...]]:
        """The statement's rows (committed rows only)."""
        return await read_only(self.store, statement, wait_s=self.wait_s, what=self.what)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of an owned table as the database has it (``owned_table_columns``)."""

    name: str
    type: str
    not_null: bool
    #: Its position in the primary key (from 1), or ``None``.
    key_position: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Column:
        """The column from its statement's row."""
        return cls(row["name"], row["type"], bool(row["not_null"]), row["key_position"])


async def tables_columns(store: Store, tables: list[str]) -> list[list[Column] | None]:
    """The columns of each table (quoted names), ``None`` for one that is missing."""
    async with store.pool.connection() as conn:
        found = [await table_columns(conn, store.queries, table) for table in tables]
        await conn.rollback()
    return found


async def citus_colocated(store: Store, table: str, column: str) -> bool:
    """On Citus: whether ``table`` is distributed by ``column`` beside akter's ``actors``."""
    async with store.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(store.queries["owned_table_citus"], {"table": table, "column": column})
        row = await cur.fetchone()
        await conn.rollback()
    return bool(row and row["colocated"])


async def table_columns(conn: Connection, q: Any, table: str) -> list[Column] | None:
    """The columns of ``table`` (a quoted, maybe qualified name), or ``None`` if it is missing."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(q["owned_table_exists"], {"table": table})
    found = await cur.fetchone()
    if found is None or not found["found"]:
        return None
    await cur.execute(q["owned_table_columns"], {"table": table})
    return [Column.from_row(row) for row in await cur.fetchall()]


def quoted_name(schema: str | None, name: str) -> str:
    """A table's name as SQL quotes it (``"schema"."name"``), for ``to_regclass``."""
    parts = [p for p in (schema, name) if p]
    return sql.SQL(".").join(sql.Identifier(p) for p in parts).as_string(None)
