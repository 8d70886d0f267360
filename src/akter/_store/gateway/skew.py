"""The clock-skew watch's statements (``akter._engine.loop.skew``): one probe, two releases.

A check runs them in order on one pooled connection (the callers' pool, as the relay pass
that runs it always has): the probe, then the release of skewed job leases, then, when a skew is
suspected, the release of skewed intent claims.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import DictRow, dict_row

from akter._kinds import RowKind
from akter._store.gateway import citus_claims

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store

Row = DictRow


@dataclass(frozen=True, slots=True)
class SkewProbe:
    """The framework clock and how far stored times lie ahead of it (``clock_skew_probe``).

    Each lead is ``None`` when no such row exists.
    """

    now: int
    heartbeat_ahead_ms: int | None
    lease_ahead_ms: int | None
    job_lease_ahead_ms: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SkewProbe:
        """The probe from its statement's one row."""
        return cls(
            now=int(row["now"]),
            heartbeat_ahead_ms=_ms(row["heartbeat_ahead_ms"]),
            lease_ahead_ms=_ms(row["lease_ahead_ms"]),
            job_lease_ahead_ms=_ms(row["job_lease_ahead_ms"]),
        )


@dataclass(frozen=True, slots=True)
class Released:
    """One outbox row a skew release made due (``release_skewed_jobs`` / ``_intents``).

    ``name``: the job's ``type.job`` and id, or the intent's id.
    """

    intent_id: str
    name: str
    ahead_ms: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Released:
        """The released row from either release statement's row."""
        intent_id = str(row["intent_id"])
        name = (
            f"{row['actor_type']}.{row['command']} {intent_id}" if "command" in row else intent_id
        )
        return cls(intent_id=intent_id, name=name, ahead_ms=int(row["ahead_ms"]))


def _ms(value: Any) -> int | None:
    return None if value is None else int(value)


class SkewSession:
    """The statements of one skew check, on its connection."""

    def __init__(self, store: Store, cur: psycopg.AsyncCursor[Row], off: int) -> None:
        self._store = store
        self._cur = cur
        self._off = off

    async def probe(self) -> tuple[SkewProbe, float]:
        """The framework clock and the leads of heartbeats and leases; and when it was sent."""
        sent = time.monotonic()  # after the pool wait: only the round trip blurs it
        await self._cur.execute(self._store.queries["clock_skew_probe"], {"off": self._off})
        found = await self._cur.fetchone()
        assert found is not None
        return SkewProbe.from_row(found), sent

    async def release_jobs(
        self, *, skew_ms: int, types: Sequence[str], jobs: Sequence[str], limit: int
    ) -> list[Released]:
        """Make running attempts of these job types whose lease lies beyond ``skew_ms`` due."""
        params = {
            "off": self._off,
            "skew_ms": skew_ms,
            "types": list(types),
            "jobs": list(jobs),
            "limit": limit,
        }
        if self._store.strategy == "citus":
            rows = await citus_claims.release_skewed(
                self._cur, self._store.queries, RowKind.JOB, params
            )
        else:
            await self._cur.execute(self._store.queries["release_skewed_jobs"], params)
            rows = await self._cur.fetchall()
        return [Released.from_row(r) for r in rows]

    async def release_intents(
        self, *, skew_ms: int, types: Sequence[str], limit: int
    ) -> list[Released]:
        """Make claimed intents of ``types`` due further ahead than ``skew_ms`` due now."""
        params = {"off": self._off, "skew_ms": skew_ms, "types": list(types), "limit": limit}
        if self._store.strategy == "citus":
            rows = await citus_claims.release_skewed(
                self._cur, self._store.queries, RowKind.INTENT, params
            )
        else:
            await self._cur.execute(self._store.queries["release_skewed_intents"], params)
            rows = await self._cur.fetchall()
        return [Released.from_row(r) for r in rows]


class SkewGateway:
    """Opens the connection of one skew check."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[SkewSession]:
        """One check's statements on one pooled connection, at the current clock offset."""
        off = self._clock.offset_ms
        async with self._store.pool.connection() as conn:
            yield SkewSession(self._store, conn.cursor(row_factory=dict_row), off)
