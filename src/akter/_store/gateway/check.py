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
from dataclasses import dataclass
from types import TracebackType
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.errors import QueryCanceled
from psycopg.rows import DictRow, dict_row

from akter._store.gateway.tables import Column
from akter._store.queries import Queries
from akter.check import CheckUnavailable

#: A result row as the driver returns it; each scan turns it into its typed row below.
Row = DictRow
#: A keyset cursor: the parameters naming the last row of a page.
Cursor = Mapping[str, Any]
T = TypeVar("T")
#: Below every real routing key: the first page's cursor.
_FIRST_RK = -(1 << 63)


@dataclass(frozen=True, slots=True)
class ActorRow:
    """An actor's row as the check reads it; ``state`` (decoded JSON) only when read."""

    routing_key: int
    tenant_id: str
    actor_type: str
    actor_id: str
    state_version: int
    state: Any

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ActorRow:
        """The actor from ``check_actors_page``'s or ``check_sample_states``'s row."""
        return cls(
            routing_key=int(row["routing_key"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            state_version=int(row["state_version"]),
            state=row["state"],
        )


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """An outbox row (pending or parked) as the check reads it (``check_outbox_page``).

    ``payload``: the stored JSON text, undecoded (the check decodes it and reports failures).
    """

    routing_key: int
    intent_id: str
    kind: str
    tenant_id: str
    actor_type: str
    actor_id: str
    target_type: str
    target_id: str
    command: str
    payload: str
    payload_version: int
    timer_key: str | None
    running: bool
    due_at_ms: int
    parked_at_ms: int | None
    last_error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OutboxEntry:
        """The row from ``check_outbox_page``'s row."""
        parked = row["parked_at_ms"]
        return cls(
            routing_key=int(row["routing_key"]),
            intent_id=str(row["intent_id"]),
            kind=str(row["kind"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            target_type=str(row["target_type"]),
            target_id=str(row["target_id"]),
            command=str(row["command"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            timer_key=row["timer_key"],
            running=bool(row["running"]),
            due_at_ms=int(row["due_at_ms"]),
            parked_at_ms=None if parked is None else int(parked),
            last_error=row["last_error"],
        )


@dataclass(frozen=True, slots=True)
class CheckedLetter:
    """A dead letter as the check reads it (``check_dead_letters_page``); ``payload``: text."""

    routing_key: int
    job_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    job: str
    payload: str
    payload_version: int
    cause: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckedLetter:
        """The letter from ``check_dead_letters_page``'s row."""
        return cls(
            routing_key=int(row["routing_key"]),
            job_id=str(row["job_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            job=str(row["job"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            cause=str(row["cause"]),
        )


@dataclass(frozen=True, slots=True)
class CheckedRun:
    """An unfinished workflow run as the check reads it (``check_workflows_page``)."""

    routing_key: int
    run_id: str
    actor_type: str
    actor_id: str
    workflow: str
    input: str
    status: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckedRun:
        """The run from ``check_workflows_page``'s row."""
        return cls(
            routing_key=int(row["routing_key"]),
            run_id=str(row["run_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            workflow=str(row["workflow"]),
            input=str(row["input"]),
            status=str(row["status"]),
        )


@dataclass(frozen=True, slots=True)
class CheckedEvent:
    """An event's key, tag and payload version (``check_events_page``)."""

    routing_key: int
    tenant_id: str
    actor_type: str
    actor_id: str
    seq: int
    tag: str
    payload_version: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckedEvent:
        """The event from ``check_events_page``'s row."""
        return cls(
            routing_key=int(row["routing_key"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            seq=int(row["seq"]),
            tag=str(row["tag"]),
            payload_version=int(row["payload_version"]),
        )


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

    async def owned_table(self, table: str) -> list[Column] | None:
        """An owned table's columns, ``None`` when it does not exist (``owned_table_*``)."""
        q, what = self.queries, f"the owned table {table}"
        found = await self._read(what, q["owned_table_exists"], {"table": table})
        if not found or not found[0]["found"]:
            return None
        rows = await self._read(what, q["owned_table_columns"], {"table": table})
        return [Column.from_row(row) for row in rows]

    async def now_ms(self, offset_ms: int) -> int:
        """The framework clock (database time plus the runtime's offset)."""
        (row,) = await self._read("the clock", self.queries["clock_now"], {"off": offset_ms})
        return int(row["now_ms"])

    async def live_job_types(self, offset_ms: int, live_ms: int, skew_ms: int) -> set[str]:
        """The job types (``Type.job``) that live runners execute."""
        params = {"off": offset_ms, "live_ms": live_ms, "skew_ms": skew_ms}
        rows = await self._read("the runners", self.queries["check_live_job_types"], params)
        return {str(row["job_type"]) for row in rows}

    async def subscriptions(self, offset_ms: int) -> list[tuple[str, int, int]]:
        """Every subscription recorded or with feeds: ``(name, feeds with work, parked feeds)``."""
        recorded = await self._read("the subscriptions", self.queries["sub_recorded"], {})
        feeds = await self._read(
            "the subscription feeds", self.queries["sub_overview"], {"off": offset_ms}
        )
        found = {str(r["name"]): (0, 0) for r in recorded}
        for r in feeds:
            found[str(r["subscription"])] = (int(r["pending"]), int(r["parked"]))
        return [(name, *counts) for name, counts in sorted(found.items())]

    async def estimates(self) -> dict[str, int]:
        """The planner's row estimate per scanned table (known after an ANALYZE)."""
        params = {"schema": self.queries.schema}
        rows = await self._read("the estimates", self.queries["check_table_estimates"], params)
        return {str(row["relname"]): int(row["estimate"]) for row in rows if row["estimate"] >= 0}

    # --- paged scans ---------------------------------------------------------------------------

    async def actors(self, *, with_state: bool) -> AsyncIterator[list[ActorRow]]:
        """Pages of actor rows in key order (with their states when ``with_state``)."""
        statement = self.queries["check_actors_page"]
        cursor: Cursor = {"rk": _FIRST_RK, "tenant": "", "type": "", "id": ""}
        async for page in self._pages(
            "the actors", statement, ActorRow.from_row, cursor, _actor_cursor, with_state
        ):
            yield page

    async def sample_states(self, actor_type: str, limit: int) -> list[ActorRow]:
        """The first ``limit`` actor rows of a type in key order, with their states."""
        params = {"type": actor_type, "limit": limit}
        rows = await self._read(
            f"the states of {actor_type!r}", self.queries["check_sample_states"], params
        )
        return [ActorRow.from_row(r) for r in rows]

    async def outbox(self) -> AsyncIterator[list[OutboxEntry]]:
        """Pages of outbox rows (pending and parked) in key order."""
        cursor: Cursor = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_outbox_page"]
        async for page in self._pages(
            "the outbox", statement, OutboxEntry.from_row, cursor, _outbox_cursor
        ):
            yield page

    async def dead_letters(self) -> AsyncIterator[list[CheckedLetter]]:
        """Pages of dead letters in key order."""
        cursor: Cursor = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_dead_letters_page"]
        async for page in self._pages(
            "the dead letters", statement, CheckedLetter.from_row, cursor, _letter_cursor
        ):
            yield page

    async def workflows(self) -> AsyncIterator[list[CheckedRun]]:
        """Pages of unfinished workflow runs in key order."""
        cursor: Cursor = {"rk": _FIRST_RK, "id": ""}
        statement = self.queries["check_workflows_page"]
        async for page in self._pages(
            "the workflows", statement, CheckedRun.from_row, cursor, _run_cursor
        ):
            yield page

    async def events(self) -> AsyncIterator[list[CheckedEvent]]:
        """Pages of event keys, tags and payload versions in key order."""
        cursor: Cursor = {"rk": _FIRST_RK, "tenant": "", "type": "", "id": "", "seq": 0}
        statement = self.queries["check_events_page"]
        async for page in self._pages(
            "the events", statement, CheckedEvent.from_row, cursor, _event_cursor
        ):
            yield page

    async def _pages(
        self,
        what: str,
        statement: LiteralString,
        from_row: Callable[[Row], T],
        cursor: Cursor,
        next_cursor: Callable[[T], Cursor],
        with_state: bool | None = None,
    ) -> AsyncIterator[list[T]]:
        extra: Cursor = {} if with_state is None else {"with_state": with_state}
        while True:
            params = {**cursor, **extra, "limit": self.batch_size}
            page = [from_row(r) for r in await self._read(what, statement, params)]
            if not page:
                return
            yield page
            if len(page) < self.batch_size:
                return
            cursor = next_cursor(page[-1])


def _actor_cursor(row: ActorRow) -> Cursor:
    return {
        "rk": row.routing_key,
        "tenant": row.tenant_id,
        "type": row.actor_type,
        "id": row.actor_id,
    }


def _outbox_cursor(row: OutboxEntry) -> Cursor:
    return {"rk": row.routing_key, "id": row.intent_id}


def _letter_cursor(row: CheckedLetter) -> Cursor:
    return {"rk": row.routing_key, "id": row.job_id}


def _run_cursor(row: CheckedRun) -> Cursor:
    return {"rk": row.routing_key, "id": row.run_id}


def _event_cursor(row: CheckedEvent) -> Cursor:
    return {
        "rk": row.routing_key,
        "tenant": row.tenant_id,
        "type": row.actor_type,
        "id": row.actor_id,
        "seq": row.seq,
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "ActorRow",
    "CheckGateway",
    "CheckedEvent",
    "CheckedLetter",
    "CheckedRun",
    "OutboxEntry",
    "application_name",
]
