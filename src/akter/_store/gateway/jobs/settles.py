"""Job settles: lease shifts and renewals, undone claims, failures, ends and dead letters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from akter._store.gateway.jobs.base import GatewayBase
from akter._store.gateway.jobs.rows import ClaimedJob, Ended, Group, JobRow, RouteWrite, key

if TYPE_CHECKING:
    from psycopg import AsyncCursor

    from akter._store.pool import Connection


class JobSettles(GatewayBase):
    """The lease and settle statements of the job gateway."""

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
                {**key(row), "attempt": attempt, "lease": lease_ms, "off": self._off},
            )
            found = await cur.fetchone()
        if found is None:
            return None
        return bool(found["cancelled"]), int(found["due_at_ms"])

    async def unclaim(self, row: ClaimedJob, *, park: bool, error: str, wait_ms: int = 0) -> bool:
        """Undo a claim the code cannot run (evolution E3): park the row, or hand it back.

        ``row`` is the claim: its attempt and lease end guard the write, and
        its ``prior_*`` values are what the claim replaced. False when the claim was lost.
        """
        params = {
            **key(row),
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
            **key(row),
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
                {**key(row), "attempt": attempt, "off": self._off},
            )
            rows = await cur.fetchall()
        return bool(rows[0]["maybe_applied"]) if rows else None

    async def mark_letter_ambiguous(self, row: JobRow) -> bool:
        """Mark the job's dead letter ambiguous (a late success); True if there was one."""
        async with self._store.framework.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._store.queries["mark_dead_letter_ambiguous"], {**key(row), "off": self._off}
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
                {**key(row), "after": after, "cancelled": cancelled, "off": self._off},
            )
            newer = await cur.fetchone()
            return Ended(False, None if newer is None else bool(newer["live"]), woke)

    @property
    def batched_settles(self) -> bool:
        """Whether many successes may end in one statement (``end_successes``): plain only."""
        return self._store.strategy != "citus"

    async def end_successes(
        self, successes: Sequence[tuple[JobRow, RouteWrite | None]]
    ) -> set[str]:
        """End many first successes under the open guard, any attempt; the job ids it took.

        Routed rows are rewritten by ``settle_jobs_route_batch``, the others deleted by
        ``settle_jobs_delete_batch``; both in one transaction of one round trip when the batch
        has both kinds, else one autocommit statement. A job id the answer lacks was not
        changed: its guard did not hold (cancelled, or already ended).
        """
        routed = [(row, route) for row, route in successes if route is not None]
        plain = [row for row, route in successes if route is None]
        q = self._store.queries
        async with self._store.framework.connection() as conn:
            if routed and plain:
                async with conn.pipeline(), conn.transaction():
                    first = await conn.execute(
                        q["settle_jobs_route_batch"], self._routed_params(routed)
                    )
                    second = await conn.execute(
                        q["settle_jobs_delete_batch"], self._deleted_params(plain)
                    )
                rows = [*await first.fetchall(), *await second.fetchall()]
            elif routed:
                cur = await conn.execute(q["settle_jobs_route_batch"], self._routed_params(routed))
                rows = await cur.fetchall()
            else:
                cur = await conn.execute(q["settle_jobs_delete_batch"], self._deleted_params(plain))
                rows = await cur.fetchall()
        return {str(r[0]) for r in rows}

    def _routed_params(self, routed: Sequence[tuple[JobRow, RouteWrite]]) -> dict[str, object]:
        return {
            "rks": [row.routing_key for row, _ in routed],
            "job_ids": [row.intent_id for row, _ in routed],
            "commands": [route.command for _, route in routed],
            "payloads": [route.payload for _, route in routed],
            "traceparents": [route.traceparent for _, route in routed],
            "versions": [route.payload_version for _, route in routed],
            "off": self._off,
        }

    @staticmethod
    def _deleted_params(rows: Sequence[JobRow]) -> dict[str, object]:
        return {
            "rks": [row.routing_key for row in rows],
            "job_ids": [row.intent_id for row in rows],
        }

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
        params: dict[str, object] = {
            **key(row),
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
    def _letter(row: JobRow) -> dict[str, object]:
        return {
            **key(row),
            "tenant": row.tenant_id,
            "type": row.actor_type,
            "id": row.actor_id,
            "job": row.command,
            "payload": row.payload,
            "payload_version": row.payload_version,
        }
