"""Forward-only migrations: numbered SQL files, each applied in one transaction."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import psycopg
from psycopg.rows import dict_row

from akter._store.citus import Distribution, check_coordinator, distribute
from akter._store.gateway import names as names_gateway
from akter._store.gateway.names import Name
from akter._store.queries import Queries

if TYPE_CHECKING:
    from akter._store.pool import Store
from akter.errors import ConfigurationError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 6


@dataclass(frozen=True)
class Migration:
    """One numbered migration file."""

    id: str
    text: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file's text."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def known_migrations() -> list[Migration]:
    """The migrations this code knows, in order."""
    folder = resources.files("akter._store").joinpath("schema")
    found = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [
        Migration(name.removesuffix(".sql"), folder.joinpath(name).read_text("utf-8"))
        for name in found
    ]


@dataclass(frozen=True)
class Deployment:
    """What the deployment row says."""

    deployment_id: str
    retry_window_ms: int
    placements: dict[str, str]


async def migrate(
    conn: psycopg.AsyncConnection[object],
    queries: Queries,
    *,
    retry_window_ms: int,
    placements: dict[str, str],
    names: Sequence[Name] = (),
) -> Deployment:
    """Apply pending migrations and check or create the deployment row.

    Runs under a session advisory lock so that concurrent starters do not race. A database with a
    gap in its applied ids, or an applied id this code does not know, is refused, and so is a
    deployment whose retry window or recorded type placements differ from this runtime's. Once
    the deployment is accepted, ``names`` (the ``(actor type, kind, name)`` commands, jobs and
    event tags this runtime declares) join the registry of declared names (evolution E2).
    """
    lock_name = f"akter.migrate.{queries.schema}"
    await conn.set_autocommit(True)
    await conn.execute(queries["migrations_lock"], {"lock_name": lock_name})
    try:
        await conn.execute(queries["migrations_bootstrap"])
        cur = await conn.execute(queries["migrations_applied"])
        applied = [str(row[0]) for row in await cur.fetchall()]  # type: ignore[index]
        known = known_migrations()
        known_ids = [m.id for m in known]
        unknown = [m for m in applied if m not in known_ids]
        if unknown:
            raise ConfigurationError(
                f"Schema {queries.schema!r} has migrations this code does not know: {unknown!r}; "
                "upgrade akter before starting."
            )
        if applied != known_ids[: len(applied)]:
            raise ConfigurationError(
                f"Schema {queries.schema!r} has a gap in its applied migrations: {applied!r}."
            )
        for migration in known[len(applied) :]:
            async with conn.transaction():
                await conn.execute(queries.substitute(migration.text))
                await conn.execute(
                    queries["migrations_record"],
                    {"id": migration.id, "checksum": migration.checksum},
                )
            log.info(
                "Applied migration %s to schema %r",
                migration.id,
                queries.schema,
                extra={"migration": migration.id},
            )
        deployment = await _check_deployment(conn, queries, retry_window_ms, placements)
        await names_gateway.record(conn, queries, names)
        return deployment
    finally:
        await conn.execute(queries["migrations_unlock"], {"lock_name": lock_name})


async def migrate_store(
    store: Store,
    *,
    retry_window_ms: int,
    placements: dict[str, str],
    names: Sequence[Name] = (),
) -> Deployment:
    """:func:`migrate` over a direct connection of its own (the pools may not be open yet)."""
    conn = await store.connect_direct()
    try:
        return await migrate(
            conn,
            store.queries,
            retry_window_ms=retry_window_ms,
            placements=placements,
            names=names,
        )
    finally:
        await conn.close()


async def _check_deployment(
    conn: psycopg.AsyncConnection[object],
    queries: Queries,
    retry_window_ms: int,
    placements: dict[str, str],
) -> Deployment:
    await conn.execute(
        queries["deployment_insert"],
        {
            "schema_version": SCHEMA_VERSION,
            "retry_window_ms": retry_window_ms,
            "deployment_id": str(uuid.uuid4()),
            "placements": json.dumps(placements),
        },
    )
    await conn.execute(queries["deployment_schema_version"], {"schema_version": SCHEMA_VERSION})
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(queries["deployment_get"])
    row = await cur.fetchone()
    assert row is not None
    if int(row["retry_window_ms"]) != retry_window_ms:
        raise ConfigurationError(
            f"The deployment in schema {queries.schema!r} uses a retry window of "
            f"{row['retry_window_ms']} ms but this runtime is configured with "
            f"{retry_window_ms} ms; use the deployment's window (changing it would "
            "invalidate issued command ids)."
        )
    recorded: dict[str, str] = dict(row["placements"])
    for actor_type, placement in placements.items():
        if actor_type in recorded and recorded[actor_type] != placement:
            raise ConfigurationError(
                f"Actor type {actor_type!r} is recorded with placement {recorded[actor_type]!r} "
                f"but declared with {placement!r}; changing placement would re-key its rows."
            )
    missing = {t: p for t, p in placements.items() if t not in recorded}
    if missing:
        await conn.execute(
            queries["deployment_record_placements"], {"placements": json.dumps(missing)}
        )
        recorded.update(missing)
    return Deployment(str(row["deployment_id"]), int(row["retry_window_ms"]), recorded)


async def migrate_and_distribute(
    url: str, queries: Queries, *, retry_window_ms: int, placements: dict[str, str]
) -> Distribution:
    """Apply the migrations on the coordinator, then :func:`distribute` (both idempotent).

    The coordinator is checked first: against a worker, nothing is written.
    """
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        await check_coordinator(conn, queries)
        await migrate(conn, queries, retry_window_ms=retry_window_ms, placements=placements)
        return await distribute(conn, queries, placements)
    finally:
        await conn.close()
