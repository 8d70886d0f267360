"""A run's life: its start, claims, journal writes, suspends, releases and its end.

A write of a running attempt is guarded by the run's ``token`` (bumped by every claim): when it
returns nothing, the attempt lost its lease and wrote nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psycopg

from akter._ids import bucket
from akter._kinds import StepKind
from akter._store.gateway.workflows.base import GatewayBase
from akter._store.gateway.workflows.rows import (
    ClaimedRun,
    JobStepCancel,
    JournalRow,
    LockedStep,
    OutboxRow,
    RunKey,
    StartedRun,
    StepRecord,
)

if TYPE_CHECKING:
    from akter._store.pool import Connection


class WorkflowAttempts(GatewayBase):
    """The statements of a run's start and of its attempts."""

    # --- starting ---------------------------------------------------------------------------

    async def start(
        self,
        run: RunKey,
        *,
        ref: tuple[str, str, str],
        workflow: str,
        key: str | None,
        input: str,
        input_hash: str,
        caller: str,
        timeout_ms: int,
        actor: Mapping[str, Any],
        traceparent: str | None = None,
    ) -> StartedRun:
        """Create a run (and its actor's fence row) unless it, or a live run of ``key``, exists.

        Returns the run that holds.
        """
        tenant, actor_type, actor_id = ref
        params = {
            "rk": run.routing_key,
            "run_id": run.run_id,
            "tenant": tenant,
            "type": actor_type,
            "id": actor_id,
            "workflow": workflow,
            "key": key,
            "input": input,
            "input_hash": input_hash,
            "caller": caller,
            "timeout_ms": timeout_ms,
            "traceparent": traceparent,
        }
        queries = self._store.queries
        for _ in range(3):
            async with self._store.framework.connection() as conn, conn.transaction():
                # Job steps dead-letter against the actor's row: it exists from the start.
                await self._on(
                    conn,
                    queries["ensure_actor"],
                    {
                        "rk": run.routing_key,
                        "tenant": tenant,
                        "type": actor_type,
                        "id": actor_id,
                        **actor,
                    },
                )
                rows = await self._on(conn, queries["wf_start"], params)
                if rows and key is not None and rows[0]["run_id"] != run.run_id:
                    await self._on(
                        conn,
                        queries["wf_alias"],
                        {"rk": run.routing_key, "run_id": run.run_id, "target": rows[0]["run_id"]},
                    )
            if rows:
                return StartedRun.from_row(rows[0])
            # A concurrent start of the same run or key committed after this statement's
            # snapshot: the next one sees it.
        raise RuntimeError(f"Workflow run {run.run_id!r} could not be started or found.")

    # --- an attempt -------------------------------------------------------------------------

    async def claim(
        self, runner_id: str, types: Sequence[str], limit: int, lease_ms: int
    ) -> list[ClaimedRun]:
        """Lease up to ``limit`` runs whose wake time has come (SKIP LOCKED)."""
        params = {"runner": runner_id, "types": list(types), "limit": limit, "lease_ms": lease_ms}
        queries = self._store.queries
        if self._store.strategy != "citus":
            return [ClaimedRun.from_row(r) for r in await self._run(queries["wf_claim"], params)]
        # Citus: an unlocked scan, then one single-shard claim per candidate (each skips a run
        # another claimer holds), all on one clock reading.
        async with self._store.framework.connection() as conn:
            now = await self._clock.read_on(conn)
            scan = await self._on(conn, queries["citus_wf_claim_scan"], {**params, "now": now})
            claimed: list[ClaimedRun] = []
            for c in scan:
                found = await self._on(
                    conn,
                    queries["citus_wf_claim"],
                    {**params, "now": now, "rk": c["routing_key"], "run_id": c["run_id"]},
                )
                claimed += [ClaimedRun.from_row(r) for r in found]
            return claimed

    async def journal(self, run: RunKey) -> list[JournalRow]:
        """The run's journal, then its unconsumed signals (one query)."""
        rows = await self._run(
            self._store.queries["wf_journal"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return [JournalRow.from_row(r) for r in rows]

    async def record(
        self,
        run: RunKey,
        token: int,
        lease_ms: int,
        records: Sequence[StepRecord],
        *,
        consumed: Sequence[tuple[str, int]] = (),
        outbox: Sequence[OutboxRow] = (),
    ) -> bool:
        """Write records (and stage ``outbox`` rows) while ``token`` holds the run.

        Returns False, having written nothing, when the attempt lost its lease.
        """
        async with self._store.framework.connection() as conn:
            if not outbox:  # one statement: it commits alone (autocommit), no BEGIN/COMMIT
                return await self._write_records(
                    conn, run, token, lease_ms, records, consumed=consumed
                )
            async with conn.transaction():
                if not await self._write_records(
                    conn, run, token, lease_ms, records, consumed=consumed
                ):
                    return False
                await self._stage(conn, run.routing_key, outbox)
        return True

    async def _write_records(
        self,
        conn: Connection,
        run: RunKey,
        token: int,
        lease_ms: int,
        records: Sequence[StepRecord],
        *,
        consumed: Sequence[tuple[str, int]] = (),
    ) -> bool:
        params = {
            "rk": run.routing_key,
            "run_id": run.run_id,
            "token": token,
            "lease_ms": lease_ms,
            "seqs": [r.seq for r in records],
            "kinds": [r.kind for r in records],
            "names": [r.name for r in records],
            "statuses": [r.status for r in records],
            "details": [r.detail for r in records],
            "outcomes": [r.outcome for r in records],
            "signal_ids": [s for s, _ in consumed],
            "signal_seqs": [n for _, n in consumed],
        }
        rows = await self._on(conn, self._store.queries["wf_record"], params)
        return bool(rows and rows[0]["held"])

    async def renew(self, run: RunKey, token: int, lease_ms: int) -> bool:
        """Extend the lease; False when it was lost."""
        rows = await self._run(
            self._store.queries["wf_renew"],
            {"rk": run.routing_key, "run_id": run.run_id, "token": token, "lease_ms": lease_ms},
        )
        return bool(rows)

    async def step_receipt(self, routing_key: int, ref: Any, command_id: str) -> bool:
        """Whether ``command_id`` has a receipt at actor ``ref`` (a pending command step's)."""
        rows = await self._run(
            self._store.queries["wf_step_receipt"],
            {
                "rk": routing_key,
                "tenant": ref.tenant,
                "type": ref.type,
                "id": ref.id,
                "command_id": command_id,
            },
        )
        return bool(rows)

    async def suspend(
        self,
        run: RunKey,
        token: int,
        wake_at: int | None,
        waiting: str,
        records: Sequence[StepRecord] = (),
        lease_ms: int = 0,
        by_deadline: bool = True,
    ) -> str | None:
        """Write ``records``, then hand the run back until ``wake_at``, in one transaction.

        With ``by_deadline`` the wake time is capped at the run's deadline (none: the deadline).
        Returns the run's new status; ``None`` when the lease was lost (nothing written).
        """
        params = {
            "rk": run.routing_key,
            "run_id": run.run_id,
            "token": token,
            "wake_at": wake_at,
            "waiting": waiting,
            "by_deadline": by_deadline,
        }
        async with self._store.framework.connection() as conn:
            if not records:  # one statement: it commits alone
                rows = await self._on(conn, self._store.queries["wf_suspend"], params)
                return str(rows[0]["status"]) if rows else None
            async with conn.transaction():
                if not await self._write_records(conn, run, token, lease_ms, records):
                    return None
                rows = await self._on(conn, self._store.queries["wf_suspend"], params)
        return str(rows[0]["status"]) if rows else None

    async def release(self, run: RunKey, token: int, delay_ms: int, why: str) -> bool:
        """Hand the run back, runnable after ``delay_ms``."""
        rows = await self._run(
            self._store.queries["wf_release"],
            {
                "rk": run.routing_key,
                "run_id": run.run_id,
                "token": token,
                "delay_ms": delay_ms,
                "waiting": why,
            },
        )
        return bool(rows)

    async def finish(
        self,
        run: RunKey,
        token: int,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        outbox: Sequence[OutboxRow] = (),
        records: Sequence[StepRecord] = (),
        lease_ms: int = 0,
    ) -> bool:
        """Write ``records``, end the run and stage ``outbox`` rows, in one transaction.

        Returns False, having written nothing, when the lease was lost.
        """
        params = {
            "rk": run.routing_key,
            "run_id": run.run_id,
            "token": token,
            "status": status,
            "result": result,
            "error": error,
        }
        async with self._store.framework.connection() as conn:
            if not records and not outbox:  # one statement: it commits alone
                return bool(await self._on(conn, self._store.queries["wf_finish"], params))
            async with conn.transaction():
                if records and not await self._write_records(conn, run, token, lease_ms, records):
                    return False
                rows = await self._on(conn, self._store.queries["wf_finish"], params)
                if not rows:
                    return False
                if outbox:
                    await self._stage(conn, run.routing_key, outbox)
        return True

    async def _stage(self, conn: Connection, rk: int, rows: Sequence[OutboxRow]) -> None:
        first = rows[0]
        await self._on(
            conn,
            self._store.queries["insert_outbox"],
            {
                "rk": rk,
                "bucket": bucket(rk),
                "tenant": first.tenant,
                "type": first.actor_type,
                "id": first.actor_id,
                "traceparent": None,
                "commit": await self._clock.read_on(conn),
                "intent_ids": [r.intent_id for r in rows],
                "kinds": [r.kind for r in rows],
                "target_types": [r.actor_type for r in rows],
                "target_ids": [r.actor_id for r in rows],
                "commands": [r.command for r in rows],
                "payloads": [r.payload for r in rows],
                "payload_versions": [r.payload_version for r in rows],
                "callers": [r.caller for r in rows],
                "delays": [None for _ in rows],
                "ats": [None for _ in rows],
                "timer_keys": [None for _ in rows],
                "ords": [1 if r.capped else 0 for r in rows],
                "priorities": [r.priority for r in rows],
                "max_waits": [r.max_wait_ms for r in rows],
            },
        )

    async def cancel_job_step(
        self,
        run: RunKey,
        token: int,
        lease_ms: int,
        records: Sequence[StepRecord],
        cancel: StepRecord,
        job_id: str,
        never_ran: Callable[[str], str],
    ) -> JobStepCancel:
        """A cancel reaching a pending job step: cancel its job and write ``cancel``, at once.

        In one transaction, while ``token`` holds the run and the step is still pending: the
        job is deleted when it never ran (``cancel`` then records ``never_ran(payload)`` as the
        job's outcome) or marked cancelled (its settle records the outcome on ``cancel``
        later), then ``records`` and ``cancel`` are written. Writes nothing when the step
        took its job's outcome meanwhile (``arrived``) or the lease was lost.
        """
        queries = self._store.queries
        key = {"rk": run.routing_key, "run_id": run.run_id}
        async with self._store.framework.connection() as conn, conn.transaction():
            locked = await self._on(conn, queries["wf_lock_job_step"], {**key, "seq": cancel.seq})
            step = LockedStep.from_row(locked[0]) if locked else None
            if step is None or (step.kind, step.status) != (StepKind.JOB, "pending"):
                return JobStepCancel("arrived", record=step)
            job = {"rk": run.routing_key, "job_id": job_id}
            deleted = await self._on(conn, queries["wf_cancel_job_unstarted"], job)
            running = False
            if deleted:
                cancel = replace(cancel, outcome=never_ran(str(deleted[0]["payload"])))
            else:
                now = await self._clock.read_on(conn)
                marked = await self._on(conn, queries["wf_cancel_job_started"], {**job, "now": now})
                running = bool(marked and marked[0]["running"])
            if not await self._write_records(conn, run, token, lease_ms, [*records, cancel]):
                raise psycopg.Rollback()  # nothing of it stays: the job is left as it was
            return JobStepCancel("cancelled", deleted=bool(deleted), running=running)
        return JobStepCancel("lost")
