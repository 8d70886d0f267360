"""The relay's statements on the outbox: claims, settles, backoffs, releases and tick rewrites.

Claims and settles run on two connections of the relay's own, outside both pools (README,
"Connections"; ``akter._engine.relay.intents``): under load the pool's callers kept a claim or
a settle waiting for a connection longer than the statement took, and a settle never waits behind a
claim. Backoffs, releases and tick rewrites use the framework pool. Also here (``OutboxRows``):
the seeding of a singleton's default row and schedule ticks at start, and an actor's outbox rows
for progress feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from akter._store.gateway import citus_claims

if TYPE_CHECKING:
    from akter._store.pool import Clock, Store


@dataclass(frozen=True, slots=True)
class ClaimedIntent:
    """One outbox row as ``claim_intents`` returned it (leased for one delivery).

    Attributes:
        payload: The command's payload, as stored JSON text.
        caller: The stored caller, as JSON text (``akter.callers.caller_from_json``).
        attempts: The delivery attempt this claim runs.
        timer_key: The timer or schedule entry key (``$cron:...``); ``None`` for an intent.
        claimed_until: The lease end the claim wrote: the claim token of its settle.
        now: The framework clock the claim statement read.
        candidates: How many due rows the claim's probe found (the same on every row).
    """

    routing_key: int
    intent_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    target_type: str
    target_id: str
    command: str
    payload: str
    payload_version: int
    caller: str
    attempts: int
    scheduled_at_ms: int
    timer_key: str | None
    traceparent: str | None
    claimed_until: int
    now: int
    candidates: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClaimedIntent:
        """The claimed row from a ``claim_intents`` (or ``citus_claim_intent``) result row."""
        return cls(
            routing_key=int(row["routing_key"]),
            intent_id=str(row["intent_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            target_type=str(row["target_type"]),
            target_id=str(row["target_id"]),
            command=str(row["command"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            caller=str(row["caller"]),
            attempts=int(row["attempts"]),
            scheduled_at_ms=int(row["scheduled_at_ms"]),
            timer_key=row["timer_key"],
            traceparent=row["traceparent"],
            claimed_until=int(row["claimed_until"]),
            now=int(row["now"]),
            candidates=int(row["candidates"]),
        )


@dataclass(frozen=True, slots=True)
class IntentKey:
    """An intent row a local commit just made due, as a keyed claim names it (Citus)."""

    routing_key: int
    intent_id: str
    target_type: str


@dataclass(frozen=True, slots=True)
class IntentClaim:
    """One claimed outbox row: its key and the claim token that guards its settle."""

    routing_key: int
    intent_id: str
    token: int

    def params(self) -> dict[str, object]:
        """The statement parameters naming the claim."""
        return {"rk": self.routing_key, "intent_id": self.intent_id, "token": self.token}


class OwnConnection:
    """An autocommit connection of the relay's own, used by one statement at a time.

    Opened on first use. A statement that failed or was interrupted may leave the connection
    unusable, so it is closed and the next use opens a new one (an outage then fails that pass
    or settle, as a pooled connection would).
    """

    def __init__(self, store: Store, *, citus_options: str = "") -> None:
        self._store = store
        self._citus_options = citus_options
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The connection, for one statement (opened or reopened as needed)."""
        async with self._lock:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                if self._citus_options and self._store.strategy == "citus":
                    # Added to the URL's own options (a keyword would replace them).
                    given = conninfo_to_dict(self._store.url).get("options")
                    options = f"{given} {self._citus_options}" if given else self._citus_options
                    conn = await psycopg.AsyncConnection.connect(
                        self._store.url, autocommit=True, options=options
                    )
                else:
                    conn = await psycopg.AsyncConnection.connect(self._store.url, autocommit=True)
                self._conn = conn
            try:
                yield conn
            except BaseException:
                self._conn = None
                with contextlib.suppress(psycopg.Error, OSError):
                    await asyncio.shield(conn.close())
                raise

    async def close(self) -> None:
        """Close the connection if open."""
        async with self._lock:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None


#: The relay's claim connection on Citus: a candidate scan reads every shard, over at most 4
#: connections per worker, which the session keeps between passes. Citus's defaults (16 per
#: worker, 1 kept) opened up to 15 new worker connections per scan: 33-42 ms a scan of 32
#: shards on the loopback test cluster against 10 ms with them kept (docs/citus.md).
CITUS_SCAN_OPTIONS = (
    "-c citus.max_adaptive_executor_pool_size=4 -c citus.max_cached_conns_per_worker=4"
)


class OutboxGateway:
    """The relay's outbox statements (module docstring), on the framework clock's offset.

    It owns the relay's two dedicated connections (opened on first use; ``close`` them).
    """

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._claim_conn = OwnConnection(store, citus_options=CITUS_SCAN_OPTIONS)
        self._settle_conn = OwnConnection(store)

    async def close(self) -> None:
        """Close the relay's own connections."""
        await self._claim_conn.close()
        await self._settle_conn.close()

    @property
    def probes_cheaply(self) -> bool:
        """Whether :meth:`any_due` and :meth:`next_due` ask the server (one cheap statement).

        On Citus they answer "due" without asking, so a probing pass is a full claim there.
        """
        return self._store.strategy != "citus"

    async def claim(
        self,
        *,
        types: Sequence[str],
        probe: int,
        free: int,
        lease_ms: int,
        max_backoff_ms: int,
    ) -> list[ClaimedIntent]:
        """Claim up to ``free`` due intents of ``types`` (the relay's claim connection)."""
        params: dict[str, object] = {
            "off": self._clock.offset_ms,
            "types": list(types),
            "probe": probe,
            "free": free,
            "lease": lease_ms,
            "max_backoff": max_backoff_ms,
        }
        if self._store.strategy == "citus":
            return await self._claim_citus(params)
        async with self._claim_conn.use() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["claim_intents"],
                params,
                # Never a cached generic plan: one made while the outbox was small can scan a
                # million sleeping timers per pass later (one claim took 101 s in the bench).
                prepare=False,
            )
            return [ClaimedIntent.from_row(row) for row in await cur.fetchall()]

    @property
    def claims_by_key(self) -> bool:
        """Whether :meth:`claim_keyed` spares a scan: on Citus, where a scan reads every shard.

        On plain PostgreSQL the one-statement claim probes the due index, and the relay keeps
        it for every pass.
        """
        return self._store.strategy == "citus"

    async def claim_keyed(
        self, keys: Sequence[IntentKey], *, lease_ms: int, max_backoff_ms: int
    ) -> list[ClaimedIntent]:
        """Claim the named intents that are still due (Citus: one single-shard claim each).

        No scan: a row another claimer took, or that stopped being due, is skipped.
        """
        params: dict[str, object] = {
            "off": self._clock.offset_ms,
            "lease": lease_ms,
            "max_backoff": max_backoff_ms,
        }
        named = [(k.routing_key, k.intent_id) for k in keys]
        async with self._claim_conn.use() as conn:
            rows = await citus_claims.claim_intents_keyed(conn, self._store.queries, params, named)
            return [ClaimedIntent.from_row(row) for row in rows]

    async def _claim_citus(self, params: dict[str, object]) -> list[ClaimedIntent]:
        """The claim on Citus: a scan, then single-shard claims (``gateway.citus_claims``)."""
        async with self._claim_conn.use() as conn:
            rows = await citus_claims.claim_intents(conn, self._store.queries, params)
            return [ClaimedIntent.from_row(row) for row in rows]

    async def settle(self, claims: Sequence[IntentClaim]) -> None:
        """Delete delivered intents under their claim tokens, in one statement."""
        if self._store.strategy == "citus":
            return await self._settle_citus(claims)
        async with self._settle_conn.use() as conn:
            await conn.execute(
                self._store.queries["settle_intents"],
                {
                    "rks": [c.routing_key for c in claims],
                    "intent_ids": [c.intent_id for c in claims],
                    "tokens": [c.token for c in claims],
                },
            )

    async def _settle_citus(self, claims: Sequence[IntentClaim]) -> None:
        """The settle on Citus: one single-shard delete per claim, pipelined."""
        async with self._settle_conn.use() as conn:
            statement = self._store.queries["citus_settle_intent"]
            await citus_claims.each_alone(conn, statement, [c.params() for c in claims])

    async def count_backlog(self, types: Sequence[str], limit: int) -> int:
        """Due intents of ``types``, counted up to ``limit`` (a framework connection)."""
        queries = self._store.queries
        params: dict[str, object] = {"off": self._clock.offset_ms, "types": list(types)}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            statement = queries["count_intent_backlog"]
            if self._store.strategy == "citus":  # no lateral probe: one clock read, a flat scan
                params["now"] = await citus_claims.read_clock(cur, queries, self._clock.offset_ms)
                statement = queries["count_intent_backlog_flat"]
            # Unprepared, like the claim: a generic plan made on a small outbox may seq-scan.
            await cur.execute(statement, {**params, "limit": limit}, prepare=False)
            row = await cur.fetchone()
            return int(row["backlog"]) if row else 0

    async def any_due(self) -> bool:
        """Whether any unparked intent or job row is due (the relay's claim connection).

        On Citus always ``True`` (the claims run as before): it plans no lateral probe over a
        distributed table.
        """
        if self._store.strategy == "citus":
            return True
        async with self._claim_conn.use() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["any_due"], {"off": self._clock.offset_ms}, prepare=False
            )
            row = await cur.fetchone()
            return bool(row and row["due"])

    async def next_due(self) -> int | None:
        """Milliseconds until the first unparked intent or job row is due (``None``: no row).

        At most zero when a row is due now. On Citus always ``0`` (the claims run as before,
        like :meth:`any_due`).
        """
        if self._store.strategy == "citus":
            return 0
        async with self._claim_conn.use() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["next_due"], {"off": self._clock.offset_ms}, prepare=False
            )
            row = await cur.fetchone()
            return None if row is None or row["wait_ms"] is None else int(row["wait_ms"])

    async def rewrite_tick(
        self, claim: IntentClaim, *, new_id: str, due: int, payload_version: int = 0
    ) -> None:
        """Rewrite a delivered schedule tick into the next one (new id, next due time)."""
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["rewrite_tick"],
                {
                    **claim.params(),
                    "new_id": new_id,
                    "due": due,
                    "version": payload_version,
                },
            )

    async def park(self, claim: IntentClaim, *, error: str) -> bool:
        """Park a claimed intent the code cannot deliver; False when the claim was lost."""
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(
                self._store.queries["park_intent"],
                {**claim.params(), "off": self._clock.offset_ms, "error": error},
            )
            return bool(await cur.fetchall())

    async def release_uncounted(self, claim: IntentClaim, *, wait_ms: int, error: str) -> None:
        """Hand back a claim at a payload version above the code's, uncounted."""
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["release_intent_uncounted"],
                {**claim.params(), "off": self._clock.offset_ms, "wait": wait_ms, "error": error},
            )

    async def backoff(self, claim: IntentClaim, *, max_backoff_ms: int, error: str) -> None:
        """Record a failed delivery and make the row due again after its backoff."""
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["backoff_intent"],
                {
                    **claim.params(),
                    "off": self._clock.offset_ms,
                    "max_backoff": max_backoff_ms,
                    "error": error,
                },
            )

    async def release(self, claim: IntentClaim) -> None:
        """Hand a claim back: the row is due now for any runner."""
        async with self._store.framework.connection() as conn:
            await conn.execute(
                self._store.queries["release_intent"],
                {**claim.params(), "off": self._clock.offset_ms},
            )


class OutboxRows:
    """Outbox statements outside the relay: seeding a singleton's default row and ticks.

    It does not use the relay's own connections, so any component may hold one.
    """

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def seed_ticks(
        self,
        actor: Mapping[str, Any],
        *,
        state: str,
        ticks: Mapping[str, Any],
        state_version: int,
    ) -> None:
        """Insert a singleton's default row (``actor``: rk, tenant, type, id) and its ticks.

        One framework transaction; ``ticks`` are the ``insert_ticks`` parameters (turn module);
        the default ``state`` is stored at the code's ``state_version``.
        """
        q = self._store.queries
        async with self._store.framework.connection() as conn, conn.transaction():
            await conn.execute(
                q["ensure_actor"],
                {
                    **actor,
                    "state": state,
                    "state_version": state_version,
                    "off": self._clock.offset_ms,
                },
            )
            await conn.execute(q["insert_ticks"], ticks)
