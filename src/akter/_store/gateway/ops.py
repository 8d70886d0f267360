"""Operators' reads: what the CLI and the web console show of the durable rows.

Nothing here writes, and nothing runs inside a turn. Four kinds of caller:

- the CLI's one-shot commands (``akter inspect``, ``outbox``, ``jobs list``) read synchronously
  over a connection of their own to a URL, without starting a runtime;
- the CLI's commands that run a runtime (``akter migrate``, ``jobs watch``, ``bench``) read
  through its :class:`~akter._store.pool.Store` (``migrate`` before the schema may exist);
- the console reads through the runtime's store, every statement under a transaction-local
  ``statement_timeout``: past it the read is refused as ``ActorError`` ``Timeout`` (504);
- the test kit (``ActorTest.inspect``) reads an actor's whole history over its own connection.

An actor's rows are keyed by :func:`actor_key`. Rows come back as dicts by column name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg.errors import QueryCanceled
from psycopg.rows import dict_row

from akter._store.pool import Store
from akter._store.queries import Queries
from akter.errors import ActorError

#: An inspection row for display (``akter inspect``, ``akter outbox``, the console, the test
#: kit's ``inspect``): every column by name, shown to people as JSON, not read by the engine.
Row = dict[str, Any]
#: The parameters that address one actor's rows: ``rk``, ``tenant``, ``type`` and ``id``.
Key = Mapping[str, Any]


def actor_key(rk: int, tenant: str, actor_type: str, actor_id: str) -> Key:
    """The statement parameters that address one actor's rows."""
    return {"rk": rk, "tenant": tenant, "type": actor_type, "id": actor_id}


# --- the CLI's one-shot reads (a URL, a connection of their own) ------------------------------


@dataclass(frozen=True)
class ActorRows:
    """What ``akter inspect`` shows of one actor: its row, receipts and outbox rows."""

    actor: Row | None
    receipts: list[Row]
    outbox: list[Row]


def inspect_actor(url: str, queries: Queries, key: Key) -> ActorRows:
    """One actor's committed row (``None`` if it never committed), receipts and outbox rows."""
    actor = _fetch(url, queries["query_actor"], key)
    receipts = _fetch(url, queries["inspect_receipts"], key)
    outbox = _fetch(url, queries["inspect_outbox"], key)
    return ActorRows(actor[0] if actor else None, receipts, outbox)


def outbox_overview(url: str, queries: Queries, limit: int) -> list[Row]:
    """Pending outbox rows across actors, oldest due first (``akter outbox``)."""
    return _fetch(url, queries["outbox_overview"], {"limit": limit})


def jobs_overview(url: str, queries: Queries, limit: int) -> list[Row]:
    """Job rows across actors, oldest due first (``akter jobs list``)."""
    return _fetch(url, queries["jobs_overview"], {"limit": limit})


def _fetch(url: str, statement: LiteralString, params: Mapping[str, Any]) -> list[Row]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []


# --- reads through a runtime's store -----------------------------------------------------------


async def migrations_applied(url: str, queries: Queries) -> set[str]:
    """The ids of the migrations applied to the schema; none while it or its table is missing.

    Reads over a connection of its own: the runtime (and its pools) may not be started yet.
    """
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(queries["migrations_applied"])
            return {str(row[0]) for row in await cur.fetchall()}
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        return set()


@dataclass(frozen=True)
class ActorHistory:
    """Everything durable of one actor: its row, receipts, outbox rows and retained events."""

    actor: Row | None
    receipts: list[Row]
    outbox: list[Row]
    events: list[Row]


async def actor_history(url: str, queries: Queries, key: Key) -> ActorHistory:
    """One actor's durable rows over a connection of its own (the test kit's ``inspect``)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(queries["query_actor"], key)
        actor = await cur.fetchone()
        await cur.execute(queries["inspect_receipts"], key)
        receipts = await cur.fetchall()
        await cur.execute(queries["inspect_outbox"], key)
        outbox = await cur.fetchall()
        await cur.execute(queries["inspect_events"], key)
        events = await cur.fetchall()
    return ActorHistory(actor, receipts, outbox, events)


async def committed_states(store: Store, keys: Iterable[Key]) -> list[Any]:
    """Each actor's committed state (``None`` for one that never committed), on one connection."""
    states: list[Any] = []
    async with store.pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        for key in keys:
            await cur.execute(store.queries["query_actor"], key)
            row = await cur.fetchone()
            states.append(None if row is None else row["state"])
    return states


# --- the console's reads (bounded by a statement timeout) --------------------------------------


async def console_types(store: Store, cap: int, timeout_ms: int) -> list[Row]:
    """Actors and tenants per type, counted in a sample of at most ``cap`` actor rows."""
    return await _timed(store, store.queries["console_types"], {"cap": cap}, timeout_ms)


async def console_totals(store: Store, cap: int, timeout_ms: int) -> Row:
    """Pending intents, job rows and dead letters, each counted up to ``cap``."""
    (totals,) = await _timed(store, store.queries["console_totals"], {"cap": cap}, timeout_ms)
    return totals


async def console_actors(
    store: Store,
    actor_type: str,
    tenant: str | None,
    after: tuple[str, str],
    limit: int,
    timeout_ms: int,
) -> list[Row]:
    """Up to ``limit`` actors of a type after the ``(tenant, id)`` cursor ``after``."""
    params = {
        "type": actor_type,
        "tenant": tenant,
        "after_tenant": after[0],
        "after_id": after[1],
        "limit": limit,
    }
    return await _timed(store, store.queries["console_actors"], params, timeout_ms)


async def console_actor(store: Store, key: Key, timeout_ms: int) -> Row | None:
    """One actor's committed row with its receipt count, or ``None``."""
    rows = await _timed(store, store.queries["console_actor"], key, timeout_ms)
    return rows[0] if rows else None


async def console_recent_events(store: Store, key: Key, limit: int, timeout_ms: int) -> list[Row]:
    """One actor's newest ``limit`` retained events, newest first."""
    params = {**key, "limit": limit}
    return await _timed(store, store.queries["console_recent_events"], params, timeout_ms)


async def console_actor_outbox(store: Store, key: Key, timeout_ms: int) -> list[Row]:
    """The outbox rows one actor sent or owns, with their roles and status."""
    return await _timed(store, store.queries["console_actor_outbox"], key, timeout_ms)


async def console_outbox(store: Store, limit: int, timeout_ms: int) -> list[Row]:
    """Pending intents, timers and ticks across actors, oldest due first."""
    return await _timed(store, store.queries["console_outbox"], {"limit": limit}, timeout_ms)


async def console_jobs(store: Store, limit: int, timeout_ms: int) -> list[Row]:
    """Job rows across actors with their status, oldest first."""
    return await _timed(store, store.queries["console_jobs"], {"limit": limit}, timeout_ms)


async def _timed(
    store: Store, statement: LiteralString, params: Mapping[str, Any], timeout_ms: int
) -> list[Row]:
    """Run a console statement under a transaction-local ``statement_timeout``."""
    try:
        async with store.pool.connection() as conn, conn.transaction():
            await conn.execute(
                store.queries["console_statement_timeout"], {"timeout": str(timeout_ms)}
            )
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(statement, params)
            return await cur.fetchall()
    except QueryCanceled:
        raise ActorError(
            "Timeout",
            f"The console's query took longer than {timeout_ms} ms and was cancelled; try "
            "again, or use the inspection views (v_actors, v_outbox, v_jobs).",
            code="console_query_timeout",
            retryable=True,
        ) from None


__all__ = [
    "ActorRows",
    "Key",
    "Row",
    "actor_key",
    "committed_states",
    "console_actor",
    "console_actor_outbox",
    "console_actors",
    "console_jobs",
    "console_outbox",
    "console_recent_events",
    "console_totals",
    "console_types",
    "inspect_actor",
    "jobs_overview",
    "migrations_applied",
    "outbox_overview",
]
