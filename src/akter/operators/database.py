"""The database akter runs on: the embedded server, the schema's migrations, Citus placement.

The embedded PostgreSQL server (``akter db``, ``akter dev``, the test kit's ``akter_db``) is
named here so that the surfaces reach it through a public module, never through the store.
:class:`Database` answers for one runtime's schema: which migrations are applied, and the
Citus distribution of its tables.
"""

from __future__ import annotations

from typing import LiteralString

import psycopg

from akter._engine.services import Services
from akter._store.citus import Distribution, all_tenant_placed, detect_strategy
from akter._store.embedded import (
    EmbeddedPostgres,
    default_data_dir,
    running_url,
    server_bin,
    shutdown,
)
from akter._store.gateway.ops import migrations_applied
from akter._store.migrate import known_migrations, migrate_and_distribute


class Database:
    """One runtime's schema on its database (module docstring)."""

    def __init__(self, services: Services) -> None:
        self._services = services

    @property
    def placements(self) -> dict[str, str]:
        """Each hosted actor type's Citus placement (``tenant`` or ``actor``), by name."""
        return {d.name: d.placement for d in self._services.definitions.values()}

    @property
    def all_tenant_placed(self) -> bool:
        """Whether every hosted type is placed by tenant (a tenant's actors share one shard)."""
        return all_tenant_placed(self.placements)

    def known_migrations(self) -> list[str]:
        """The ids of the migrations this code knows, in order."""
        return [m.id for m in known_migrations()]

    async def applied_migrations(self, url: str) -> set[str]:
        """The ids applied to the schema at ``url`` (none while it is missing), read directly."""
        return await migrations_applied(url, self._services.store.queries)

    async def is_citus(self, url: str) -> bool:
        """Whether the database at ``url`` has the ``citus`` extension (a coordinator)."""
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await detect_strategy(conn, self._services.store.queries) == "citus"

    async def distribute(self, url: str) -> Distribution:
        """Migrate the schema on the Citus coordinator at ``url``, then distribute its tables.

        Idempotent; against a worker or a server without Citus it refuses before writing.
        """
        return await migrate_and_distribute(
            url,
            self._services.store.queries,
            retry_window_ms=self._services.config.window_ms,
            placements=self.placements,
        )

    def substitute(self, sql: str) -> LiteralString:
        """``sql`` with ``{schema}`` replaced by the schema's quoted name (tests, ad hoc reads)."""
        return self._services.store.queries.substitute(sql)


__all__ = [
    "Database",
    "Distribution",
    "EmbeddedPostgres",
    "default_data_dir",
    "running_url",
    "server_bin",
    "shutdown",
]
