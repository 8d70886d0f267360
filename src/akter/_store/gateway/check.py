"""``akter check``'s reads (spec evolution.md E5): read-only pages of every durable table.

The check runs on a connection of its own (``application_name`` ``akter-check:<schema>``), never
through a runtime's pools: the runtime is not started. Every read is one ``READ ONLY``
transaction under a transaction-local ``statement_timeout``, so PostgreSQL itself refuses any
write, and the scans page through each table by primary key (keyset pagination, ``batch_size``
rows a page): no statement runs longer than a page, and no snapshot is held across pages.

Failures to run map to :class:`akter.check.CheckUnavailable`: an unreachable database, a read
past the statement timeout, a schema that disappeared under the scan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, LiteralString

import psycopg
from psycopg.errors import QueryCanceled
from psycopg.rows import dict_row

from akter._store.queries import Queries
from akter.check import CheckUnavailable

Row = dict[str, Any]
#: Below every real routing key: the first page's cursor.
_FIRST_RK = -(1 << 63)


def application_name(schema: str) -> str:
    """How a check's session is named in ``pg_stat_activity``: ``akter-check:<schema>``."""
    return f"akter-check:{schema}"[:63]


class CheckGateway:
    """The check's connection and its read-only, bounded, paged reads (module docstring).

    Args:
        url: The database URL.
        queries: The catalogue of the runtime's schema.
        timeout_ms: The ``statement_timeout`` of every read.
        batch_size: Rows per page of a scan.
        connect_timeout_s: How long to wait for the server to accept the connection.
    """

    def __init__(
        self,
        url: str,
        queries: Queries,
        *,
        timeout_ms: int,
        batch_size: int,
        connect_timeout_s: int = 10,
    ) -> None:
        self._url = url
        self.queries = queries
        self.timeout_ms = timeout_ms
        self.batch_size = batch_size
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.AsyncConnection[Row] | None = None

    @property
    def schema(self) -> str:
        """The schema the check reads."""
        return self.queries.schema

    async def __aenter__(self) -> CheckGateway:
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url,
                autocommit=True,
                row_factory=dict_row,
                application_name=application_name(self.queries.schema),
                connect_timeout=self._connect_timeout_s,
            )
        except psycopg.OperationalError as exc:
            raise CheckUnavailable(
                f"Cannot connect to the database: {_first_line(exc)}; check the runtime's "
                "database_url (or AKTER_DATABASE_URL) and that the server is up."
            ) from None
        # Every transaction.begin() below says BEGIN READ ONLY.
        await conn.set_read_only(True)
        self._conn = conn
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _read(
        self, what: str, statement: LiteralString, params: Mapping[str, Any]
    ) -> list[Row]:
        """One statement in its own READ ONLY transaction under the statement timeout."""
        conn = self._conn
        assert conn is not None, "use the gateway as an async context manager"
        try:
            async with conn.transaction():
                await conn.execute(
                    self.queries["check_statement_timeout"], {"timeout": str(self.timeout_ms)}
                )
                cur = await conn.execute(statement, params)
                return await cur.fetchall() if cur.description else []
        except QueryCanceled:
            raise CheckUnavailable(
                f"Reading {what} took longer than the check's statement timeout "
                f"({self.timeout_ms} ms) and was cancelled; nothing was written. Raise the "
                "timeout (--timeout, statement_timeout=) or lower the batch size "
                "(--batch-size, batch_size=)."
            ) from None
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
            raise CheckUnavailable(
                f"Reading {what} failed: {_first_line(exc)}; the schema {self.queries.schema!r} "
                "is missing or older than this code (run 'akter migrate' first)."
            ) from None
        except psycopg.OperationalError as exc:
            raise CheckUnavailable(
                f"Reading {what} failed: the database connection broke ({_first_line(exc)})."
            ) from None

    # --- the schema and the framework's rows -----------------------------------------------------

    async def schema_state(self) -> tuple[bool, bool]:
        """Whether the schema exists, and whether its migration ledger does."""
        (row,) = await self._read(
            "the schema", self.queries["check_schema_state"], {"schema": self.queries.schema}
        )
        return bool(row["has_schema"]), bool(row["has_ledger"])

    async def applied_migrations(self) -> list[str]:
        """The ids of the applied migrations, oldest first."""
        rows = await self._read("the migrations", self.queries["migrations_applied"], {})
        return [str(row["id"]) for row in rows]

    async def placements(self) -> dict[str, str]:
        """The deployment's recorded actor types and their placements (none before a start)."""
        rows = await self._read("the deployment", self.queries["deployment_get"], {})
        return dict(rows[0]["placements"]) if rows else {}

    async def now_ms(self, offset_ms: int) -> int:
        """The framework clock (database time plus the runtime's offset)."""
        (row,) = await self._read("the clock", self.queries["clock_now"], {"off": offset_ms})
        return int(row["now_ms"])

    async def live_job_types(self, offset_ms: int, live_ms: int, skew_ms: int) -> set[str]:
        """The job types (``Type.job``) that live runners execute."""
        params = {"off": offset_ms, "live_ms": live_ms, "skew_ms": skew_ms}
        rows = await self._read("the runners", self.queries["check_live_job_types"], params)
        return {str(row["job_type"]) for row in rows}

    async def estimates(self) -> dict[str, int]:
        """The planner's row estimate per scanned table (known after an ANALYZE)."""
        params = {"schema": self.queries.schema}
        rows = await self._read("the estimates", self.queries["check_table_estimates"], params)
        return {str(row["relname"]): int(row["estimate"]) for row in rows if row["estimate"] >= 0}

    # --- paged scans ---------------------------------------------------------------------------

    async def actors(self, *, with_state: bool) -> AsyncIterator[list[Row]]:
        """Pages of actor rows in key order (with their states when ``with_state``)."""
        statement = self.queries["check_actors_page"]
        cursor: Row = {"rk": _FIRST_RK, "tenant": "", "type": "", "id": ""}
        async for page in self._pages("the actors", statement, cursor, _actor_cursor, with_state):
            yield page

    async def sample_states(self, actor_type: str, limit: int) -> list[Row]:
        """The first ``limit`` actor rows of a type in key order, with their states."""
        params = {"type": actor_type, "limit": limit}
        return await self._read(
            f"the states of {actor_type!r}", self.queries["check_sample_states"], params
        )

    async def outbox(self) -> AsyncIterator[list[Row]]:
        """Pages of outbox rows (pending and parked) in key order."""
        cursor: Row = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_outbox_page"]
        async for page in self._pages("the outbox", statement, cursor, _outbox_cursor):
            yield page

    async def dead_letters(self) -> AsyncIterator[list[Row]]:
        """Pages of dead letters in key order."""
        cursor: Row = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_dead_letters_page"]
        async for page in self._pages("the dead letters", statement, cursor, _letter_cursor):
            yield page

    async def workflows(self) -> AsyncIterator[list[Row]]:
        """Pages of unfinished workflow runs in key order."""
        cursor: Row = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_workflows_page"]
        async for page in self._pages("the workflows", statement, cursor, _run_cursor):
            yield page

    async def events(self) -> AsyncIterator[list[Row]]:
        """Pages of event keys, tags and payload versions in key order."""
        cursor: Row = {"rk": _FIRST_RK, "tenant": "", "type": "", "id": "", "seq": 0}
        statement = self.queries["check_events_page"]
        async for page in self._pages("the events", statement, cursor, _event_cursor):
            yield page

    async def _pages(
        self,
        what: str,
        statement: LiteralString,
        cursor: Row,
        next_cursor: Callable[[Row], Row],
        with_state: bool | None = None,
    ) -> AsyncIterator[list[Row]]:
        extra: Row = {} if with_state is None else {"with_state": with_state}
        while True:
            params = {**cursor, **extra, "limit": self.batch_size}
            page = await self._read(what, statement, params)
            if not page:
                return
            yield page
            if len(page) < self.batch_size:
                return
            cursor = next_cursor(page[-1])


def _actor_cursor(row: Row) -> Row:
    return {
        "rk": row["routing_key"],
        "tenant": row["tenant_id"],
        "type": row["actor_type"],
        "id": row["actor_id"],
    }


def _outbox_cursor(row: Row) -> Row:
    return {"rk": row["routing_key"], "id": row["intent_id"]}


def _letter_cursor(row: Row) -> Row:
    return {"rk": row["routing_key"], "id": row["job_id"]}


def _run_cursor(row: Row) -> Row:
    return {"rk": row["routing_key"], "id": row["run_id"]}


def _event_cursor(row: Row) -> Row:
    return {**_actor_cursor(row), "seq": row["seq"]}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["CheckGateway", "Row", "application_name"]
