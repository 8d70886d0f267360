"""The runner registry's statements (semantics §8): registration, heartbeats, singleton leases.

Every statement runs on the framework pool, so a runner whose turns hold every pooled
connection still heartbeats and refreshes its leases (README, "Connections"). Statements raise
the driver's errors; the registry logs them and tries again at its next round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString

from psycopg.rows import DictRow, dict_row

from akter._store import citus

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


@dataclass(frozen=True, slots=True)
class LiveRunner:
    """A runner whose heartbeat is recent (``live_runners``)."""

    runner_id: str
    started_at_ms: int
    heartbeat_at_ms: int
    http_address: str | None
    actor_types: list[str]
    job_types: list[str]
    version: str
    draining: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LiveRunner:
        """The runner from ``live_runners``'s row."""
        return cls(
            runner_id=str(row["runner_id"]),
            started_at_ms=int(row["started_at_ms"]),
            heartbeat_at_ms=int(row["heartbeat_at_ms"]),
            http_address=row["http_address"],
            actor_types=[str(t) for t in row["actor_types"]],
            job_types=[str(t) for t in row["job_types"]],
            version=str(row["version"]),
            draining=bool(row["draining"]),
        )


@dataclass(frozen=True, slots=True)
class PrunedRunner:
    """A runner's row ``prune_runners`` deleted; ``ahead_ms``: its heartbeat's lead (≥ 0)."""

    runner_id: str
    ahead_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PrunedRunner:
        """The runner from ``prune_runners``'s row."""
        return cls(runner_id=str(row["runner_id"]), ahead_ms=int(row["ahead_ms"]))


@dataclass(frozen=True, slots=True)
class SingletonLease:
    """A singleton lease this runner holds (``acquire_singleton``, ``renew_singletons``).

    ``acquired_at_ms`` is the lease's epoch (it changes only when the lease changes hands);
    ``skew_ms``: how far ahead of the clock a skewed lease this one replaced was (``None``: none
    was, or a renewal).
    """

    actor_type: str
    owner: str
    lease_until_ms: int
    acquired_at_ms: int
    skew_ms: int | None = None

    @classmethod
    def from_row(
        cls, row: Mapping[str, Any], *, actor_type: str | None = None, skew_ms: int | None = None
    ) -> SingletonLease:
        """The lease from a lease statement's row (``actor_type``: when the row has none)."""
        return cls(
            actor_type=str(row["actor_type"]) if actor_type is None else actor_type,
            owner=str(row["owner"]),
            lease_until_ms=int(row["lease_until_ms"]),
            acquired_at_ms=int(row["acquired_at_ms"]),
            skew_ms=skew_ms,
        )


class RunnersGateway:
    """The registry's statements (module docstring), on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def _run(self, statement: LiteralString, params: Mapping[str, Any]) -> list[DictRow]:
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(statement, {"off": self._clock.offset_ms, **params})
            return await cur.fetchall() if cur.description else []

    async def register(
        self,
        runner_id: str,
        *,
        http_address: str | None,
        actor_types: Sequence[str],
        job_types: Sequence[str],
        version: str,
        models: dict[str, Any] | None = None,
    ) -> None:
        """Write this runner's row (again, after it was pruned).

        ``models``: per hosted actor type, what its code declares (``akter._engine.declared``,
        migration 0014).
        """
        await self._run(
            self._store.queries["register_runner"],
            {
                "runner_id": runner_id,
                "http_address": http_address,
                "actor_types": list(actor_types),
                "job_types": list(job_types),
                "version": version,
                "models": json.dumps(models or {}),
            },
        )

    async def heartbeat(self, runner_id: str, *, draining: bool) -> bool:
        """Refresh this runner's heartbeat; False when its row is gone (it must register)."""
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(
                self._store.queries["heartbeat_runner"],
                {"off": self._clock.offset_ms, "runner_id": runner_id, "draining": draining},
            )
            return await cur.fetchone() is not None

    async def mark_draining(self, runner_id: str) -> None:
        """Say this runner drains (its last heartbeat)."""
        await self._run(
            self._store.queries["heartbeat_runner"], {"runner_id": runner_id, "draining": True}
        )

    async def unregister(self, runner_id: str) -> None:
        """Remove this runner's row."""
        await self._run(self._store.queries["unregister_runner"], {"runner_id": runner_id})

    async def live(self, *, live_ms: int, skew_ms: int) -> list[LiveRunner]:
        """Runners whose heartbeat is younger than ``live_ms`` and not skewed ahead."""
        rows = await self._run(
            self._store.queries["live_runners"], {"live_ms": live_ms, "skew_ms": skew_ms}
        )
        return [LiveRunner.from_row(r) for r in rows]

    async def state_paths(
        self, actor_type: str, version: int, model: str, *, live_ms: int, skew_ms: int
    ) -> list[list[str]]:
        """The key paths of live runners' models of ``actor_type`` at ``version``, newer ones.

        Newer than ``model``: first recorded in the name registry after it.
        """
        rows = await self._run(
            self._store.queries["live_state_paths"],
            {
                "actor_type": actor_type,
                "version": version,
                "model": model,
                "live_ms": live_ms,
                "skew_ms": skew_ms,
            },
        )
        return [list(r["paths"]) for r in rows if isinstance(r["paths"], list)]

    async def declares_command(
        self, actor_type: str, command: str, *, live_ms: int, skew_ms: int
    ) -> bool:
        """Whether a live runner's code declares ``actor_type``'s ``command``."""
        rows = await self._run(
            self._store.queries["live_declares_command"],
            {"actor_type": actor_type, "command": command, "live_ms": live_ms, "skew_ms": skew_ms},
        )
        return bool(rows and rows[0]["declared"])

    async def declares_job(self, actor_type: str, job: str, *, live_ms: int, skew_ms: int) -> bool:
        """Whether a live runner's code declares ``actor_type``'s ``job``."""
        rows = await self._run(
            self._store.queries["live_declares_job"],
            {"actor_type": actor_type, "job": job, "live_ms": live_ms, "skew_ms": skew_ms},
        )
        return bool(rows and rows[0]["declared"])

    async def prune(self, *, prune_ms: int, live_ms: int) -> list[PrunedRunner]:
        """Forget silent runners and runners ahead of the clock; the rows pruned."""
        rows = await self._run(
            self._store.queries["prune_runners"], {"prune_ms": prune_ms, "live_ms": live_ms}
        )
        return [PrunedRunner.from_row(r) for r in rows]

    async def acquire_singleton(
        self,
        actor_type: str,
        routing_key: int,
        runner_id: str,
        *,
        lease_ms: int,
        skew_ms: int,
        lock_wait_ms: int,
    ) -> list[SingletonLease]:
        """Take or refresh a singleton lease in one transaction; one row iff this runner owns it.

        One clock reading for the round (``clock_now``, a table-less statement: on Citus it runs
        on the coordinator), then the takeover lock, then the upsert. A takeover waits at most
        ``lock_wait_ms`` for the old owner's fenced turns (on Citus also on the lease's worker,
        by a propagated ``SET LOCAL``). The row's ``skew_ms`` says how far ahead of the clock a
        skewed lease it replaced was (``None``: none was). ``routing_key`` is the singleton
        actor's: the row's shard on Citus.
        """
        q = self._store.queries
        params = {
            "off": self._clock.offset_ms,
            "rk": routing_key,
            "actor_type": actor_type,
            "runner_id": runner_id,
            "lease_ms": lease_ms,
            "skew_ms": skew_ms,
        }
        async with self._store.framework.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(q["singleton_lock_timeout"], {"lock_timeout": str(lock_wait_ms)})
            if self._store.strategy == "citus":  # the takeover's lock waits in the lease's shard
                await citus.bound_worker_locks(cur, q, citus.worker_lock_wait(q, lock_wait_ms))
            await cur.execute(q["clock_now"], params)
            clock = await cur.fetchone()
            assert clock is not None
            params["now"] = int(clock["now_ms"])
            await cur.execute(q["singleton_takeover"], params)
            leads = [int(r["ahead_ms"]) for r in await cur.fetchall()]
            await cur.execute(q["acquire_singleton"], params)
            rows = await cur.fetchall()
        skewed = [lead for lead in leads if lead > skew_ms]
        lead = max(skewed) if skewed else None
        return [SingletonLease.from_row(r, actor_type=actor_type, skew_ms=lead) for r in rows]

    async def renew_singletons(
        self, actor_types: Sequence[str], runner_id: str, *, lease_ms: int
    ) -> list[SingletonLease]:
        """Extend every lease of ``actor_types`` this runner still owns, in one statement.

        One lease per lease renewed; a lease missing from them is no longer this runner's.
        """
        rows = await self._run(
            self._store.queries["renew_singletons"],
            {"types": list(actor_types), "runner_id": runner_id, "lease_ms": lease_ms},
        )
        return [SingletonLease.from_row(r) for r in rows]

    async def release_singleton(self, actor_type: str, routing_key: int, runner_id: str) -> None:
        """End this runner's lease of ``actor_type`` at once (a stopping owner).

        On Citus the clock is read first (on the coordinator) and passed in: in the lease row's
        shard ``now_ms()`` would be the worker's clock.
        """
        q = self._store.queries
        params: dict[str, object] = {
            "actor_type": actor_type,
            "rk": routing_key,
            "runner_id": runner_id,
        }
        if self._store.strategy != "citus":
            await self._run(q["release_singleton"], params)
            return
        clock = await self._run(q["clock_now"], {})
        await self._run(q["citus_release_singleton"], {**params, "now": clock[0]["now_ms"]})
