"""The job executor's statements (semantics §5): claims, group locks, renewals and settles.

Every statement runs on the framework pool (README, "Connections"): user turns never hold up a
claim, a renewal or a settle. Capped groups are claimed and woken under the group lock, in a
transaction of their own or, on plain PostgreSQL, several free groups in one (``claim_groups``,
docs/flow-control.md F2.9), waiting at most ``GROUP_LOCK_WAIT`` for it (so does a capped
type's claim for its type lock), and end on the server if their session goes silent inside them for
``CLAIM_IDLE_BOUND``. Also here: an operator's
cancellation of one job by its id (``akter jobs cancel``), on the callers' pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from psycopg.rows import dict_row

from akter._local_clock import LocalClock
from akter._store.gateway import citus_claims

if TYPE_CHECKING:
    from psycopg import AsyncCursor

    from akter._store.pool import Clock, Connection, Store

Row = dict[str, Any]

#: Longest wait for a capped group's or capped type's lock before it is left for a later pass.
GROUP_LOCK_WAIT = "2000ms"
#: How long a claim's transaction may sit idle inside it before the server ends it: a claimer
#: frozen between two statements gives its group and type locks back (tests/integration/
#: test_frozen_claimer.py).
CLAIM_IDLE_BOUND = "10000ms"
#: The parameters of ``job_group_settings``.
CLAIM_SETTINGS = {"lock_timeout": GROUP_LOCK_WAIT, "idle_bound": CLAIM_IDLE_BOUND}


class JobRow(Protocol):
    """What the settle statements need of a claimed job row."""

    @property
    def routing_key(self) -> int: ...
    @property
    def intent_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def actor_type(self) -> str: ...
    @property
    def actor_id(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def payload(self) -> str: ...
    @property
    def payload_version(self) -> int: ...


@dataclass(frozen=True)
class JobType:
    """One executed job type as the claim statements take it."""

    actor_type: str
    job: str
    max_attempts: int


@dataclass(frozen=True, slots=True)
class JobKey:
    """A job row this runner just committed, as a keyed claim names it."""

    routing_key: int
    intent_id: str
    actor_type: str
    job: str


@dataclass(frozen=True)
class Group:
    """One job type of one actor whose attempts run under a per-actor cap."""

    routing_key: int
    tenant_id: str
    actor_type: str
    actor_id: str
    command: str

    def params(self) -> dict[str, Any]:
        """The parameters naming the group."""
        return {
            "rk": self.routing_key,
            "tenant": self.tenant_id,
            "type": self.actor_type,
            "id": self.actor_id,
            "job": self.command,
        }


@dataclass(frozen=True)
class GroupClaim:
    """One group of a batched claim (``JobsGateway.claim_groups``) and what it may take."""

    group: Group
    #: At most this many rows (the executor's free slots given to the group).
    free: int
    #: The job's ``per_actor`` cap.
    cap: int
    max_attempts: int


def _group_arrays(groups: Sequence[Group]) -> dict[str, list[Any]]:
    """A batch of groups as the array parameters of ``job_groups_lock_*``."""
    return {
        "rks": [g.routing_key for g in groups],
        "tenants": [g.tenant_id for g in groups],
        "types": [g.actor_type for g in groups],
        "ids": [g.actor_id for g in groups],
        "jobs": [g.command for g in groups],
    }


@dataclass(frozen=True)
class Ended:
    """What a settle's guarded end of a row did (``JobsGateway.end``)."""

    #: The row was ended (deleted or rewritten into its route).
    changed: bool
    #: When it was not and the write waits for newer attempts: ``job_newer_live``'s answer.
    held: Row | None
    #: With a group wake: whether a waiting row woke; None when the wake was not done (no
    #: group asked for, or its lock was busy): the executor wakes the group on its own then.
    woke: bool | None


@dataclass(frozen=True)
class RouteWrite:
    """A settle that rewrites the job row into a route intent (command and canonical payload).

    ``traceparent``: the attempt's span, which the route's delivery continues (``None`` keeps
    the row's own).
    """

    command: str
    payload: str
    traceparent: str | None = None
    #: The route command's payload version (evolution E3).
    payload_version: int = 0


@dataclass(frozen=True)
class Cancelled:
    """What an operator's cancellation by id did: ``deleted``, ``cancelled`` or ``unknown``."""

    outcome: Literal["deleted", "cancelled", "unknown"]
    #: An attempt of the job was running (its runner should be signalled).
    running: bool = False


def _key(row: JobRow) -> dict[str, Any]:
    return {"rk": row.routing_key, "job_id": row.intent_id}


class JobsGateway:
    """The executor's statements (module docstring), on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock, local: LocalClock | None = None) -> None:
        self._store = store
        self._clock = clock
        self._local = local or LocalClock()

    @property
    def _off(self) -> int:
        return self._clock.offset_ms

    # --- claims -------------------------------------------------------------------------------

    async def claim_uncapped(
        self,
        jobs: Sequence[JobType],
        *,
        free: int,
        probe: int,
        lease_ms: int,
        limit: tuple[str, str, int] | None = None,
    ) -> tuple[list[Row], float]:
        """Claim due rows of uncapped ``jobs``; the rows and the monotonic time they were sent.

        ``limit``: the (actor type, job, cap) of a type with a deployment-wide cap (``jobs``
        are its names): its ``job_limits`` row is locked first, and the claim takes at most
        the cap minus the attempts still live.
        """
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "probe": probe,
            "free": free,
            "lease": lease_ms,
            "slots": None,
        }
        if self._store.strategy == "citus":
            return await self._claim_uncapped_citus(params, limit, [j.job for j in jobs])
        q = self._store.queries
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            if limit is None:
                sent_at = self._local.now()
                # Planned per pass (no cached generic plan), like the intent claim: outbox.py.
                await cur.execute(q["claim_jobs"], params, prepare=False)
                return await cur.fetchall(), sent_at
            async with conn.transaction():
                await self._settings(conn)
                params["slots"] = await self._slots(cur, limit, [j.job for j in jobs])
                sent_at = self._local.now()
                await cur.execute(q["claim_jobs"], params, prepare=False)
                return await cur.fetchall(), sent_at

    @property
    def keyed_claims(self) -> bool:
        """Whether :meth:`claim_keyed` runs here (plain PostgreSQL; on Citus the full claim)."""
        return self._store.strategy != "citus"

    async def claim_keyed(
        self, jobs: Sequence[JobType], keys: Sequence[JobKey], *, lease_ms: int
    ) -> tuple[list[Row], float]:
        """Claim the rows ``keys`` names that are due, unparked, unlocked and of uncapped ``jobs``.

        The rows and the monotonic time they were sent. For the rows a local commit just made
        due: found by primary key, not by the bucket probe of :meth:`claim_uncapped`, so the
        statement is prepared like any other.
        """
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "rks": [k.routing_key for k in keys],
            "ids": [k.intent_id for k in keys],
            "lease": lease_ms,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            sent_at = self._local.now()
            await cur.execute(self._store.queries["claim_jobs_keyed"], params)
            return await cur.fetchall(), sent_at

    async def _slots(self, cur: Any, limit: tuple[str, str, int], names: Sequence[str]) -> int:
        """Lock a capped type's ``job_limits`` row; its free slots under the declared cap.

        Live attempts are counted after the lock, in a statement of their own: READ COMMITTED
        gives it a snapshot taken after the previous holder committed its claim.
        """
        q = self._store.queries
        actor_type, job, cap = limit
        await cur.execute(q["job_limit_lock"], {"type": actor_type, "job": job, "cap": cap})
        await cur.execute(
            q["job_type_live"], {"type": actor_type, "jobs": list(names), "off": self._off}
        )
        live = await cur.fetchone()
        assert live is not None
        return max(0, cap - int(live["live"]))

    async def _slots_citus(
        self, cur: Any, limit: tuple[str, str, int], names: Sequence[str]
    ) -> tuple[int, int]:
        """``_slots`` on Citus: also the clock, read once after the lock, for the claim.

        The live count compares lease ends with the coordinator's reading (``clock_now``), the
        clock every Citus claim writes them with, not with each worker's own.
        """
        q = self._store.queries
        actor_type, job, cap = limit
        await cur.execute(q["job_limit_lock"], {"type": actor_type, "job": job, "cap": cap})
        now = await citus_claims.read_clock(cur, q, self._off)
        await cur.execute(
            q["citus_job_type_live"], {"type": actor_type, "jobs": list(names), "now": now}
        )
        live = await cur.fetchone()
        assert live is not None
        return max(0, cap - int(live["live"])), now

    async def _settings(self, conn: Connection) -> None:
        """A capped claim's or wake's lock wait and idle bound (``CLAIM_SETTINGS``).

        On Citus the type and group locks wait on a worker, which ``set_config`` does not
        reach: a ``SET LOCAL``, propagated to every worker the transaction touches, bounds the
        wait there (pipelined with the rest: no round trip of its own).
        """
        q = self._store.queries
        if self._store.strategy == "citus":
            await conn.execute(q["citus_job_group_settings"], CLAIM_SETTINGS)
            await conn.execute(q["citus_job_lock_wait"])
        else:
            await conn.execute(q["job_group_settings"], CLAIM_SETTINGS)

    async def _lock_group(self, conn: Connection, params: dict[str, Any]) -> None:
        """:meth:`_settings`, then the group lock (``job_group_lock``), in a transaction.

        On plain PostgreSQL one statement does both (``job_group_lock_bounded``): a capped claim
        or wake sends one statement fewer.
        """
        if self._store.strategy == "citus":
            await self._settings(conn)
            await conn.execute(self._store.queries["job_group_lock"], params)
        else:
            await conn.execute(
                self._store.queries["job_group_lock_bounded"], {**params, **CLAIM_SETTINGS}
            )

    async def discover_groups(self, jobs: Sequence[JobType], *, free: int) -> list[Group]:
        """The capped groups with due rows, by their earliest due time, at most ``free``."""
        params = {
            "off": self._off,
            "types": [j.actor_type for j in jobs],
            "jobs": [j.job for j in jobs],
            "probe": 2 * free,
            "free": free,
        }
        if self._store.strategy == "citus":
            rows = await self._discover_groups_citus(params)
        else:
            async with self._store.framework.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    self._store.queries["discover_capped_groups"], params, prepare=False
                )
                rows = await cur.fetchall()
        return [
            Group(
                int(r["routing_key"]),
                str(r["tenant_id"]),
                str(r["actor_type"]),
                str(r["actor_id"]),
                str(r["command"]),
            )
            for r in rows
        ]

    async def _claim_uncapped_citus(
        self, params: dict[str, Any], limit: tuple[str, str, int] | None, names: Sequence[str]
    ) -> tuple[list[Row], float]:
        """The uncapped claim on Citus: a scan, then single-shard claims (``citus_claims``).

        A type with a deployment-wide cap is claimed in one transaction under its type lock,
        as on plain PostgreSQL: the lock is released only once the claims have committed on
        every worker, so the next claimer's live count sees them. The candidates are scanned
        first, without the lock: a type with no due row costs no locked transaction (one
        writes the job_limits reference table on every node, a two-phase commit), and a row
        that stopped being due meanwhile is skipped by its claim.
        """
        q = self._store.queries
        async with self._store.framework.connection() as conn:
            sent_at = self._local.now()  # before the clock reading: a lease starts no earlier
            if limit is None:
                return await citus_claims.claim_jobs(conn, q, params), sent_at
            candidates = await citus_claims.job_candidates(conn, q, params)
            if not candidates:
                return [], sent_at
            async with conn.transaction():
                await self._settings(conn)
                cur = conn.cursor(row_factory=dict_row)
                params["slots"], now = await self._slots_citus(cur, limit, names)
                rows = await citus_claims.claim_job_candidates(conn, q, params, candidates, now=now)
            return rows, sent_at

    async def _discover_groups_citus(self, params: dict[str, Any]) -> list[Row]:
        """The capped groups' discovery on Citus (``citus_claims``)."""
        async with self._store.framework.connection() as conn:
            return await citus_claims.discover_groups(conn, self._store.queries, params)

    async def claim_group(
        self,
        group: Group,
        *,
        free: int,
        cap: int,
        max_attempts: int,
        lease_ms: int,
        limit: tuple[str, str, int] | None = None,
        names: Sequence[str] = (),
    ) -> tuple[list[Row], float]:
        """Claim one capped group in its own transaction (semantics §5.6 steps 1-7).

        ``limit``: the group's job type also has a deployment-wide cap; its ``job_limits``
        row is locked after the group lock (the one lock order), and the claim also stays
        within the cap minus the type's live attempts.
        """
        params = {
            **group.params(),
            "off": self._off,
            "free": free,
            "cap": cap,
            "max_attempts": max_attempts,
            "lease": lease_ms,
            "slots": None,
        }
        async with self._store.framework.connection() as conn:
            if limit is None:
                return await self._claim_group_pipelined(conn, params)
            return await self._claim_group_limited(conn, params, limit, names)

    @property
    def batched_group_claims(self) -> bool:
        """Whether :meth:`claim_groups` runs here (plain PostgreSQL; on Citus one group each)."""
        return self._store.strategy != "citus"

    async def claim_groups(
        self, claims: Sequence[GroupClaim], *, lease_ms: int
    ) -> tuple[dict[int, list[Row]], float]:
        """Claim a batch of capped groups in one transaction of two round trips (plain only).

        The first round trip takes the group locks nobody holds (``job_groups_lock_skip``); the
        second waits for those groups' in-flight renewals and settles, then sends each locked
        group's own ``claim_capped_group`` and the commit. A claim's snapshot is thus taken
        after its group lock was granted, as in :meth:`claim_group`: a claim sharing a statement
        with its lock could miss the rows the previous holder had just claimed and run more
        attempts than the cap. Returns the claimed rows by position in ``claims`` (a group
        whose lock another transaction held is absent: the caller claims it on its own, which
        waits for the lock) and the monotonic time the claims were sent.
        """
        q = self._store.queries
        groups = [c.group for c in claims]
        async with self._store.framework.connection() as conn:
            lock = conn.cursor(row_factory=dict_row)
            pending: list[tuple[int, AsyncCursor[Any]]] = []
            sent_at = self._local.now()
            async with conn.pipeline(), conn.transaction():
                await lock.execute(
                    q["job_groups_lock_skip"], {**_group_arrays(groups), **CLAIM_SETTINGS}
                )
                locked = [int(r["i"]) - 1 for r in await lock.fetchall()]
                if locked:
                    await conn.execute(
                        q["job_groups_lock_running"], _group_arrays([groups[i] for i in locked])
                    )
                    sent_at = self._local.now()
                    for i in locked:
                        claim = claims[i]
                        cur = conn.cursor(row_factory=dict_row)
                        await cur.execute(
                            q["claim_capped_group"],
                            {
                                **claim.group.params(),
                                "off": self._off,
                                "free": claim.free,
                                "cap": claim.cap,
                                "max_attempts": claim.max_attempts,
                                "lease": lease_ms,
                                "slots": None,
                            },
                        )
                        pending.append((i, cur))
            return {i: await cur.fetchall() for i, cur in pending}, sent_at

    async def _claim_group_pipelined(
        self, conn: Connection, params: dict[str, Any]
    ) -> tuple[list[Row], float]:
        """The group claim's statements in one round trip.

        Sent one at a time, the settings, lock and defer round trips were most of a capped
        claim's cost (docs/benchmarks.md, "Jobs vs peers"); the settings now ride in the lock
        statement and the defer in the claim's.
        """
        q = self._store.queries
        claim = conn.cursor(row_factory=dict_row)
        async with conn.pipeline(), conn.transaction():
            await self._lock_group(conn, params)
            await conn.execute(q["job_group_lock_running"], params)
            sent_at = self._local.now()
            await claim.execute(q["claim_capped_group"], params)
        return await claim.fetchall(), sent_at

    async def _claim_group_limited(
        self,
        conn: Connection,
        params: dict[str, Any],
        limit: tuple[str, str, int],
        names: Sequence[str],
    ) -> tuple[list[Row], float]:
        """The group claim of a type with a deployment-wide cap: its free slots first."""
        q = self._store.queries
        async with conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await self._lock_group(conn, params)
            await cur.execute(q["job_group_lock_running"], params)
            if self._store.strategy == "citus":
                params["slots"], _ = await self._slots_citus(cur, limit, names or [limit[1]])
            else:
                params["slots"] = await self._slots(cur, limit, names or [limit[1]])
            sent_at = self._local.now()
            # Rows the type's deployment-wide cap held back stay due, for the next pass: a
            # deferred row waits for a wake from its own group, which may have none running
            # (the statement defers only when it took fewer rows than ``slots``).
            await cur.execute(q["claim_capped_group"], params)
            rows = await cur.fetchall()
        return rows, sent_at

    async def wake_waiting(self, group: Group) -> bool:
        """Make the group's oldest waiting row due now, under the group lock; True if one woke."""
        q = self._store.queries
        params = {**group.params(), "off": self._off}
        async with self._store.framework.connection() as conn:
            cur = conn.cursor()
            # One round trip, like the group claim: the lock waits inside the pipeline.
            async with conn.pipeline(), conn.transaction():
                await self._lock_group(conn, params)
                await cur.execute(q["wake_waiting_job"], params)
            return bool(await cur.fetchall())

    # --- leases -------------------------------------------------------------------------------

    async def shift_leases(self, ms: int, rows: Sequence[tuple[JobRow, int]]) -> dict[str, int]:
        """Push the leases of running attempts ``(row, attempt)`` by ``ms``; new ends by job id."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["shift_job_leases"],
                {
                    "ms": ms,
                    "rks": [row.routing_key for row, _ in rows],
                    "job_ids": [row.intent_id for row, _ in rows],
                    "attempts": [attempt for _, attempt in rows],
                },
            )
            return {str(r["intent_id"]): int(r["due_at_ms"]) for r in await cur.fetchall()}

    async def renew(self, row: JobRow, *, attempt: int, lease_ms: int) -> tuple[bool, int] | None:
        """Renew an attempt's lease: (cancelled, lease end), or None if the row moved on."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["renew_job"],
                {**_key(row), "attempt": attempt, "lease": lease_ms, "off": self._off},
            )
            found = await cur.fetchone()
        if found is None:
            return None
        return bool(found["cancelled"]), int(found["due_at_ms"])

    async def unclaim(self, row: Any, *, park: bool, error: str, wait_ms: int = 0) -> bool:
        """Undo a claim the code cannot run (evolution E3): park the row, or hand it back.

        ``row`` is the claim (a ``ClaimedJob``): its attempt and lease end guard the write, and
        its ``prior_*`` values are what the claim replaced. False when the claim was lost.
        """
        params = {
            **_key(row),
            "attempt": row.attempts,
            "token": row.claimed_until,
            "prior_attempts": row.prior_attempts,
            "prior_ambiguous": row.prior_ambiguous,
            "prior_maybe_applied": row.prior_maybe_applied,
            "error": error,
            "wait": wait_ms,
            "off": self._off,
        }
        q = self._store.queries
        statement = q["park_job"] if park else q["release_job_uncounted"]
        async with self._store.framework.connection() as conn:
            cur = await conn.execute(statement, params)
            return bool(await cur.fetchall())

    # --- settles ------------------------------------------------------------------------------

    async def record_failure(
        self,
        row: JobRow,
        *,
        attempt: int,
        cause: str,
        not_started: bool,
        ambiguous: bool,
        final: bool,
        backoff_ms: int,
    ) -> tuple[bool, bool, bool] | None:
        """Record a failed attempt: (cancelled, maybe_applied, ambiguous), or None if stale."""
        params = {
            **_key(row),
            "attempt": attempt,
            "cause": cause,
            "not_started": not_started,
            "ambiguous": ambiguous,
            "final": final,
            "backoff": backoff_ms,
            "off": self._off,
        }
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._store.queries["record_job_failure"], params)
            rows = await cur.fetchall()
        if not rows:
            return None
        found = rows[0]
        return bool(found["cancelled"]), bool(found["maybe_applied"]), bool(found["ambiguous"])

    async def cancelled_at(self, row: JobRow, *, attempt: int) -> bool | None:
        """``maybe_applied`` of the row if it is cancelled at ``attempt``; None if it is not."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["cancelled_job_at"],
                {**_key(row), "attempt": attempt, "off": self._off},
            )
            rows = await cur.fetchall()
        return bool(rows[0]["maybe_applied"]) if rows else None

    async def mark_letter_ambiguous(self, row: JobRow) -> bool:
        """Mark the job's dead letter ambiguous (a late success); True if there was one."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["mark_dead_letter_ambiguous"], {**_key(row), "off": self._off}
            )
            return bool(await cur.fetchall())

    async def insert_late_letter(self, row: JobRow, *, attempts: int, route: str) -> bool:
        """Record an ambiguous letter for a success after the cancellation's route; True if new."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["insert_late_dead_letter"],
                {**self._letter(row), "attempts": attempts, "route": route, "off": self._off},
            )
            return bool(await cur.fetchall())

    async def end(
        self,
        row: JobRow,
        route: RouteWrite | None,
        *,
        cancelled: bool,
        attempt: int | None,
        after: int | None,
        wake: Group | None = None,
    ) -> Ended:
        """End the row under its guard (rewrite into ``route``, or delete).

        When nothing changed and ``after`` is set, ``held`` is the ``job_newer_live`` answer on
        the same connection (None: no newer attempt holds the row). With ``wake`` (a capped
        row's group) the settle's own transaction also wakes the group's next waiting row,
        when the group lock is free (``wake_waiting_job_if_free``): one round trip for both.
        """
        async with self._store.framework.connection() as conn:
            if wake is None:
                changed = await self._write(
                    conn, row, route, cancelled=cancelled, attempt=attempt, after=after
                )
                woke = None
            else:
                changed, woke = await self._write_and_wake(
                    conn, row, route, wake, cancelled=cancelled, attempt=attempt, after=after
                )
            if changed or after is None:
                return Ended(changed, None, woke)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["job_newer_live"],
                {**_key(row), "after": after, "cancelled": cancelled, "off": self._off},
            )
            return Ended(False, await cur.fetchone(), woke)

    async def _write_and_wake(
        self,
        conn: Connection,
        row: JobRow,
        route: RouteWrite | None,
        group: Group,
        *,
        cancelled: bool,
        attempt: int | None,
        after: int | None,
    ) -> tuple[bool, bool | None]:
        """The settle and the group's wake in one pipelined transaction: (changed, woke).

        No claim settings (``_settings``): the settle may wait for a claim that holds its row,
        as an autocommit settle does (failing at the claims' lock wait would drop the attempt's
        outcome), and the wake never waits (``SKIP LOCKED``).
        """
        wake = conn.cursor()
        async with conn.pipeline(), conn.transaction():
            settled = await self._send_write(
                conn, row, route, cancelled=cancelled, attempt=attempt, after=after
            )
            await wake.execute(
                self._store.queries["wake_waiting_job_if_free"],
                {**group.params(), "off": self._off},
            )
        changed = bool(await settled.fetchall())
        answer = await wake.fetchone()
        assert answer is not None
        held, woke = bool(answer[0]), bool(answer[1])
        return changed, woke if held else None

    async def dead_letter(
        self,
        row: JobRow,
        route: RouteWrite | None,
        *,
        cancelled: bool,
        attempt: int,
        cause: str,
        ambiguous: bool,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """End the row and insert its dead letter in one transaction; True iff it committed.

        ``before_commit`` runs inside the transaction, after both writes (a fault point).
        """
        async with self._store.framework.connection() as conn:
            async with conn.transaction():
                if not await self._write(
                    conn, row, route, cancelled=cancelled, attempt=attempt, after=None
                ):
                    return False
                await conn.execute(
                    self._store.queries["insert_dead_letter"],
                    {
                        **self._letter(row),
                        "off": self._off,
                        "attempts": attempt,
                        "cause": cause,
                        "ambiguous": ambiguous,
                    },
                )
                if before_commit is not None:
                    await before_commit()
        return True

    async def _write(
        self,
        conn: Connection,
        row: JobRow,
        route: RouteWrite | None,
        *,
        cancelled: bool,
        attempt: int | None,
        after: int | None,
    ) -> bool:
        cur = await self._send_write(
            conn, row, route, cancelled=cancelled, attempt=attempt, after=after
        )
        return bool(await cur.fetchall())

    async def _send_write(
        self,
        conn: Connection,
        row: JobRow,
        route: RouteWrite | None,
        *,
        cancelled: bool,
        attempt: int | None,
        after: int | None,
    ) -> AsyncCursor[Any]:
        """Send the guarded end of the row; its cursor yields the row iff it changed."""
        params: dict[str, Any] = {
            **_key(row),
            "cancelled": cancelled,
            "attempt": attempt,
            "after": after,
            "off": self._off,
        }
        if route is None:
            return await conn.execute(self._store.queries["settle_job_delete"], params)
        params.update(
            command=route.command,
            payload=route.payload,
            traceparent=route.traceparent,
            payload_version=route.payload_version,
        )
        return await conn.execute(self._store.queries["settle_job_route"], params)

    @staticmethod
    def _letter(row: JobRow) -> dict[str, Any]:
        return {
            **_key(row),
            "tenant": row.tenant_id,
            "type": row.actor_type,
            "id": row.actor_id,
            "job": row.command,
            "payload": row.payload,
            "payload_version": row.payload_version,
        }

    # --- operators ----------------------------------------------------------------------------

    async def cancel_by_id(self, job_id: str) -> Cancelled:
        """Cancel a job by id in its own transaction on a pooled connection (``akter jobs``)."""
        q = self._store.queries
        async with self._store.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(q["cancel_job_by_id_unstarted"], {"job_id": job_id})
            if await cur.fetchall():
                return Cancelled("deleted")
            cur = await conn.execute(
                q["cancel_job_by_id_started"], {"job_id": job_id, "off": self._off}
            )
            rows = await cur.fetchall()
        if not rows:
            return Cancelled("unknown")
        return Cancelled("cancelled", running=any(bool(r[1]) for r in rows))
