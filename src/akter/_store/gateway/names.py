"""The deployment's registry of declared names and the orphan counts (evolution E2).

Plain values in and out: a recorded name is ``(actor_type, kind, name)`` with ``kind`` one of
``actor_type`` (from the deployment's placements), ``command``, ``job`` or ``event``. The counts
are cross-actor by design (listed in the catalogue test's ``CROSS_ACTOR``), each bounded by
``cap`` rows, and run on the framework pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from psycopg.rows import dict_row

from akter._store.gateway.citus_claims import each_alone

if TYPE_CHECKING:
    import psycopg

    from akter._store.pool import Store
    from akter._store.queries import Queries

#: A recorded name: (actor type, kind, name).
Name = tuple[str, str, str]
#: Row counts by what they count (``actors``, ``outbox``, ``dead_letters``, ``events``).
Counts = dict[str, int]
MemberKind = Literal["command", "job", "event"]


async def record(
    conn: psycopg.AsyncConnection[object], queries: Queries, names: Sequence[Name]
) -> None:
    """Add ``names`` (kinds ``command``, ``job``, ``event``) to the registry; never removes."""
    if not names:
        return
    await conn.execute(
        queries["names_record"],
        {
            "types": [n[0] for n in names],
            "kinds": [n[1] for n in names],
            "names": [n[2] for n in names],
        },
    )


class NamesGateway:
    """Reads of the name registry, the capped counts of orphan names, and forgetting."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def recorded(self) -> list[Name]:
        """Every recorded actor type and declared name."""
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(self._store.queries["names_recorded"])
            return [(str(r[0]), str(r[1]), str(r[2])) for r in await cur.fetchall()]

    async def count_types(self, types: Sequence[str], *, cap: int) -> dict[str, Counts]:
        """Per actor type: its actors, pending outbox rows, dead letters and events."""
        if not types:
            return {}
        queries = self._store.queries
        async with self._store.framework.connection() as conn:
            if self._store.strategy == "citus":
                # Citus cannot push down the unnest join's correlated counts: one count per name.
                rows = await each_alone(
                    conn,
                    queries["citus_names_count_type"],
                    [{"type": t, "cap": cap} for t in types],
                )
            else:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(queries["names_count_types"], {"types": list(types), "cap": cap})
                rows = await cur.fetchall()
        return {str(r.pop("actor_type")): _counts(r) for r in rows}

    async def count_members(
        self, kind: MemberKind, pairs: Sequence[tuple[str, str]], *, cap: int
    ) -> dict[tuple[str, str], Counts]:
        """Per ``(actor type, name)`` of ``kind``: the rows stored under that name."""
        if not pairs:
            return {}
        queries = self._store.queries
        async with self._store.framework.connection() as conn:
            if self._store.strategy == "citus":
                # Citus cannot push down the unnest join's correlated counts: one count per name.
                one = (
                    queries["citus_names_count_command"]
                    if kind == "command"
                    else queries["citus_names_count_job"]
                    if kind == "job"
                    else queries["citus_names_count_event"]
                )
                rows = await each_alone(
                    conn, one, [{"type": t, "name": n, "cap": cap} for t, n in pairs]
                )
            else:
                statement = (
                    queries["names_count_commands"]
                    if kind == "command"
                    else queries["names_count_jobs"]
                    if kind == "job"
                    else queries["names_count_events"]
                )
                params = {"types": [p[0] for p in pairs], "names": [p[1] for p in pairs]}
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(statement, {**params, "cap": cap})
                rows = await cur.fetchall()
        return {(str(r["actor_type"]), str(r["name"])): _counts(r) for r in rows}

    async def forget(self, names: Sequence[Name]) -> None:
        """Remove recorded member names (never actor types: their placements are kept)."""
        if not names:
            return
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["names_forget"],
                {
                    "types": [n[0] for n in names],
                    "kinds": [n[1] for n in names],
                    "names": [n[2] for n in names],
                },
            )


def _counts(row: Mapping[str, Any]) -> Counts:
    """A count row's counts by column (its ``actor_type`` and ``name`` are the key)."""
    return {k: int(v) for k, v in row.items() if k not in ("actor_type", "name")}
