"""Operators' statements on parked outbox rows (evolution E3), on the callers' pool.

A retry or a discard locks the rows it names first, in one transaction: ids that name no
parked row refuse the whole call before anything is written. A discard deletes and audits in
one statement, so there is never an audit without its delete or a delete without its audit.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from psycopg.rows import DictRow, dict_row

from akter._store.gateway.citus_claims import each_alone, read_clock

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

Row = DictRow


@dataclass(frozen=True, slots=True)
class ParkedEntry:
    """One parked outbox row as ``parked_list`` returns it (``akter.outbox.ParkedRow``'s source).

    ``actor_type`` and ``actor_id``: the receiving actor (an intent's target, a job's owner);
    ``payload``: the stored JSON text, as stored.
    """

    routing_key: int
    intent_id: str
    kind: str
    tenant_id: str
    actor_type: str
    actor_id: str
    command: str
    payload: str
    payload_version: int
    attempts: int
    parked_at_ms: int
    last_error: str | None
    timer_key: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ParkedEntry:
        """The parked row from ``parked_list``'s row."""
        return cls(
            routing_key=int(row["routing_key"]),
            intent_id=str(row["intent_id"]),
            kind=str(row["kind"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            command=str(row["command"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            attempts=int(row["attempts"]),
            parked_at_ms=int(row["parked_at_ms"]),
            last_error=row["last_error"],
            timer_key=row["timer_key"],
        )


@dataclass(frozen=True, slots=True)
class DueJobs:
    """How many due, unparked rows of one (actor type, job) wait (``sample_due_jobs``)."""

    actor_type: str
    job: str
    due: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> DueJobs:
        """The count from ``sample_due_jobs``'s row."""
        return cls(actor_type=str(row["actor_type"]), job=str(row["job"]), due=int(row["due"]))


#: Runs inside a retry's or discard's transaction after its write (the ids; a fault point).
BeforeCommit = Callable[[list[str]], Awaitable[None]]


@dataclass(frozen=True)
class Selection:
    """Which parked rows an operator means: ``ids`` (``None``: all) and filters."""

    ids: Sequence[str] | None = None
    actor_type: str | None = None
    command: str | None = None

    def params(self) -> dict[str, object]:
        """The ``parked_lock`` parameters."""
        return {
            "ids": None if self.ids is None else list(self.ids),
            "type": self.actor_type,
            "command": self.command,
        }


class UnknownParked(Exception):
    """Ids that name no parked row (nothing was written)."""

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__(", ".join(missing))
        self.missing = tuple(missing)


class ParkedGateway:
    """List, retry and discard parked rows."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def list(
        self, *, kind: str | None, actor_type: str | None, command: str | None, limit: int
    ) -> list[ParkedEntry]:
        """Parked rows, oldest parking first."""
        async with self._store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["parked_list"],
                {"kind": kind, "type": actor_type, "command": command, "limit": limit},
            )
            return [ParkedEntry.from_row(r) for r in await cur.fetchall()]

    async def retry(
        self,
        selection: Selection,
        *,
        before_commit: BeforeCommit,
    ) -> int:
        """Make the selected parked rows due now; returns how many.

        ``before_commit`` runs inside the transaction after the write (a fault point).

        Raises:
            UnknownParked: Some ids name no parked row (nothing written).
        """

        async def write(cur: Any, keys: Mapping[str, Any]) -> int:
            await cur.execute(self._store.queries["retry_parked"], {**keys, "off": self._off})
            done = len(await cur.fetchall())
            await before_commit(list(keys["ids"]))
            return done

        return await self._locked(selection, write)

    async def discard(
        self,
        selection: Selection,
        *,
        operator: str,
        reason: str,
        before_commit: BeforeCommit,
    ) -> int:
        """Delete the selected parked rows, one audit row each, in one transaction.

        ``before_commit`` runs inside the transaction after the write (a fault point).

        Raises:
            UnknownParked: Some ids name no parked row (nothing written).
        """

        async def write(cur: Any, keys: Mapping[str, Any]) -> int:
            audit_ids = [uuid.uuid4().hex for _ in keys["ids"]]
            await cur.execute(
                self._store.queries["discard_parked"],
                {
                    **keys,
                    "audit_ids": audit_ids,
                    "operator": operator,
                    "reason": reason,
                    "off": self._off,
                },
            )
            done = len(await cur.fetchall())
            await before_commit(list(keys["ids"]))
            return done

        return await self._locked(selection, write)

    # --- the maintenance owner's reads and sweep ---------------------------------------------

    async def due_jobs(self) -> builtins.list[DueJobs]:
        """Due unparked job rows by (actor type, job), across actors.

        (The parked rows by kind are read with the other outbox gauges, in ``sample_outbox``.)
        """
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["sample_due_jobs"], {"off": self._off})
            return [DueJobs.from_row(r) for r in await cur.fetchall()]

    async def park_undeclared(self, actor_type: str, job: str, *, error: str, batch: int) -> int:
        """Park one batch of an undeclared, unserved job's rows; how many were parked."""
        queries = self._store.queries
        params = {"type": actor_type, "job": job, "error": error, "batch": batch, "off": self._off}
        async with self._store.framework.connection() as conn:
            if self._store.strategy != "citus":
                cur = await conn.execute(queries["park_undeclared_jobs"], params)
                return len(await cur.fetchall())
            # Citus: no multi-shard SKIP LOCKED. One clock reading, an unlocked scan, then one
            # keyed park per row in its own shard (each its own transaction, a held row skipped).
            dcur = conn.cursor(row_factory=dict_row)
            base = {**params, "now": await read_clock(dcur, queries, self._off)}
            await dcur.execute(queries["citus_park_undeclared_scan"], base)
            candidates = await dcur.fetchall()
            parked = await each_alone(
                conn,
                queries["citus_park_undeclared_job"],
                [{**base, "rk": c["routing_key"], "intent_id": c["intent_id"]} for c in candidates],
            )
            return len(parked)

    @property
    def _off(self) -> int:
        return self._clock.offset_ms

    async def _locked(
        self, selection: Selection, write: Callable[[Any, Mapping[str, Any]], Awaitable[int]]
    ) -> int:
        async with self._store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            if self._store.strategy == "citus":
                rows = await self._lock_each(conn, cur, selection)
            else:
                await cur.execute(self._store.queries["parked_lock"], selection.params())
                rows = await cur.fetchall()
            if selection.ids is not None:
                found = {str(r["intent_id"]) for r in rows}
                missing = [i for i in dict.fromkeys(selection.ids) if i not in found]
                if missing:
                    raise UnknownParked(missing)
            if not rows:
                return 0
            keys: Mapping[str, Any] = {
                "rks": [int(r["routing_key"]) for r in rows],
                "ids": [str(r["intent_id"]) for r in rows],
            }
            return await write(cur, keys)

    async def _lock_each(self, conn: Any, cur: Any, selection: Selection) -> builtins.list[Row]:
        """``parked_lock`` on Citus: an unlocked scan, then one keyed lock per row, in order.

        Citus has no row lock in a statement that spans shards. The locks are taken in this
        transaction in ``(routing_key, intent_id)`` order, like the plain statement's, and a
        row that stopped being parked between the scan and its lock is left out.
        """
        queries = self._store.queries
        await cur.execute(queries["citus_parked_scan"], selection.params())
        scanned = await cur.fetchall()
        cursors = []
        async with conn.pipeline():
            for row in scanned:
                one = conn.cursor(row_factory=dict_row)
                await one.execute(
                    queries["citus_parked_lock"],
                    {"rk": row["routing_key"], "intent_id": row["intent_id"]},
                )
                cursors.append(one)
        return [r for one in cursors for r in await one.fetchall()]
