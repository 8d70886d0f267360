"""The workflow engine's statements (issue 15): runs, their journal and their signals.

Every statement runs on the framework pool, like job claims and settles: a runner whose turns
hold every pooled connection still records its workflow steps. A write of a running attempt is
guarded by the run's ``token`` (bumped by every claim): when it returns nothing, the attempt
lost its lease and wrote nothing. Statements raise the driver's errors; the engine hands the run
back and tries again later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from akter._ids import bucket
from akter._kinds import RowKind, StepKind

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

    from akter._staging import StagedRun
    from akter._store.pipeline import Answer, TurnPipeline
    from akter._store.pool import Clock, Connection, Store
    from akter._store.queries import Queries

Row = dict[str, Any]


@dataclass(frozen=True)
class RunKey:
    """Where a run lives: its actor's routing key and its id."""

    routing_key: int
    run_id: str


@dataclass(frozen=True)
class StepRecord:
    """One journal record to write: new, or a pending step that is now done."""

    seq: int
    kind: StepKind
    name: str
    status: str  # "pending" | "done"
    detail: str | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class OutboxRow:
    """An outbox row a workflow write stages with it (a job step's job, an on_complete intent).

    The row belongs to the run's actor.
    """

    intent_id: str
    kind: RowKind
    tenant: str
    actor_type: str
    actor_id: str
    command: str
    payload: str
    caller: str
    payload_version: int = 0
    priority: int = 0
    max_wait_ms: int | None = None
    #: A job with a per-actor cap: its ready time keeps the group's enqueue order (§5.3.4).
    capped: bool = False


def start_in_turn(
    pipe: TurnPipeline,
    q: Queries,
    key: Mapping[str, Any],
    *,
    commit_ms: int,
    runs: Sequence[StagedRun],
    traceparent: str | None,
) -> Awaitable[Answer]:
    """Queue a turn's workflow starts in its commit flight (``wf_start_in_turn``).

    The runs live in the turn's actor's shard (its routing key): one single-shard statement.
    A keyed start whose key a live run holds fails the flight (:func:`live_key_taken`).
    """
    return pipe.execute(
        q["wf_start_in_turn"],
        {
            **key,
            "commit": commit_ms,
            "run_ids": [r.run_id for r in runs],
            "workflows": [r.workflow for r in runs],
            "keys": [r.key for r in runs],
            "inputs": [r.input for r in runs],
            "input_hashes": [r.input_hash for r in runs],
            "callers": [r.caller for r in runs],
            "timeouts": [r.timeout_ms for r in runs],
            "traceparent": traceparent,
        },
    )


@dataclass(frozen=True)
class JobOutcome:
    """What a job step's delivered outcome did.

    ``status``: ``recorded`` (on the pending step, or on the cancel record that took its
    place), ``repeat`` (the step holds it already) or ``unmatched`` (no step takes it);
    ``woke``: the run was woken.
    """

    status: str
    woke: bool = False


@dataclass(frozen=True)
class JobStepCancel:
    """What a cancel at a pending job step did (``WorkflowsGateway.cancel_job_step``).

    ``status``: ``cancelled`` (the job was cancelled and the cancel record written),
    ``arrived`` (the step is no longer a pending job step: ``record`` holds what it is now) or
    ``lost`` (the lease was lost; nothing written). ``deleted``: the job never ran and is gone;
    ``running``: an attempt was running when it was marked cancelled.
    """

    status: str
    record: Row | None = None
    deleted: bool = False
    running: bool = False


def live_key_taken(exc: BaseException) -> bool:
    """Whether a unique violation of a turn that starts keyed runs may be a live key's.

    ``wf_start_in_turn``'s unique violation on ``workflows_live_key`` (on Citus the shard's
    copy of the index, named with the shard's id appended). Citus re-raises a worker's error
    without the constraint's name: a violation that names none counts too (the engine's answer
    to it, one more run of the batch, is safe whatever the cause).
    """
    if not isinstance(exc, psycopg.errors.UniqueViolation):
        return False
    name = exc.diag.constraint_name
    return name is None or name.startswith("workflows_live_key")


def live_keyed_runs(pipe: TurnPipeline, q: Queries, key: Mapping[str, Any]) -> Awaitable[Answer]:
    """Queue the read of the actor's live keyed runs (``wf_live_keys``) in a turn's flight."""
    return pipe.execute(q["wf_live_keys"], key)


class WorkflowsGateway:
    """The workflow statements (module docstring), on the framework clock's offset."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def _run(self, statement: LiteralString, params: dict[str, Any]) -> list[Row]:
        async with self._store.framework.connection() as conn:
            return await self._on(conn, statement, params)

    async def _on(
        self, conn: Connection, statement: LiteralString, params: dict[str, Any]
    ) -> list[Row]:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(statement, {"off": self._clock.offset_ms, **params})
        return await cur.fetchall() if cur.description else []

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
        actor: dict[str, Any],
        traceparent: str | None = None,
    ) -> Row:
        """Create a run (and its actor's fence row) unless it, or a live run of ``key``, exists.

        Returns ``run_id``, ``input_hash``, ``workflow`` and ``created`` of the run that holds.
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
                return rows[0]
            # A concurrent start of the same run or key committed after this statement's
            # snapshot: the next one sees it.
        raise RuntimeError(f"Workflow run {run.run_id!r} could not be started or found.")

    # --- an attempt -------------------------------------------------------------------------

    async def claim(
        self, runner_id: str, types: Sequence[str], limit: int, lease_ms: int
    ) -> list[Row]:
        """Lease up to ``limit`` runs whose wake time has come (SKIP LOCKED)."""
        params = {"runner": runner_id, "types": list(types), "limit": limit, "lease_ms": lease_ms}
        queries = self._store.queries
        if self._store.strategy != "citus":
            return await self._run(queries["wf_claim"], params)
        # Citus: an unlocked scan, then one single-shard claim per candidate (each skips a run
        # another claimer holds), all on one clock reading.
        async with self._store.framework.connection() as conn:
            now = await self._clock.read_on(conn)
            scan = await self._on(conn, queries["citus_wf_claim_scan"], {**params, "now": now})
            claimed: list[Row] = []
            for c in scan:
                claimed += await self._on(
                    conn,
                    queries["citus_wf_claim"],
                    {**params, "now": now, "rk": c["routing_key"], "run_id": c["run_id"]},
                )
            return claimed

    async def journal(self, run: RunKey) -> list[Row]:
        """The run's journal, then its unconsumed signals (one query)."""
        return await self._run(
            self._store.queries["wf_journal"], {"rk": run.routing_key, "run_id": run.run_id}
        )

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

    # --- from outside an attempt ------------------------------------------------------------

    async def locate(self, run_id: str) -> Row | None:
        """A run's routing key and actor, by id alone."""
        rows = await self._run(self._store.queries["wf_locate"], {"run_id": run_id})
        return rows[0] if rows else None

    async def get(self, run: RunKey) -> Row | None:
        """The run's row."""
        rows = await self._run(
            self._store.queries["wf_get"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return rows[0] if rows else None

    async def steps(self, run: RunKey, after: int = -1) -> list[Row]:
        """The run's journal after ``after`` (a seq), in order."""
        return await self._run(
            self._store.queries["wf_steps"],
            {"rk": run.routing_key, "run_id": run.run_id, "after": after},
        )

    async def signals(self, run: RunKey) -> list[Row]:
        """The run's signals in arrival order."""
        return await self._run(
            self._store.queries["wf_signals"], {"rk": run.routing_key, "run_id": run.run_id}
        )

    async def signal(
        self, run: RunKey, signal_id: str, name: str, payload: str
    ) -> tuple[bool, bool]:
        """Keep a signal for a live run: (the run took it or had it already, it is new).

        A signal id the run kept before answers as taken even once the run has ended, so a
        retried send gets the answer of the first one.
        """
        rows = await self._run(
            self._store.queries["wf_signal"],
            {
                "rk": run.routing_key,
                "run_id": run.run_id,
                "signal_id": signal_id,
                "name": name,
                "payload": payload,
            },
        )
        return bool(rows[0]["live"] or rows[0]["known"]), bool(rows[0]["kept"])

    async def cancel(self, run: RunKey) -> bool:
        """Ask a live run to cancel; False when it is not live."""
        rows = await self._run(
            self._store.queries["wf_cancel"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return bool(rows)

    async def abandon_diverged(self, run: RunKey, error: str) -> bool:
        """End a diverged run as cancelled; False when it is not diverged."""
        rows = await self._run(
            self._store.queries["wf_abandon_diverged"],
            {"rk": run.routing_key, "run_id": run.run_id, "error": error},
        )
        return bool(rows)

    async def retry(self, run: RunKey) -> bool:
        """Make a diverged run runnable again; False when it is not diverged."""
        rows = await self._run(
            self._store.queries["wf_retry"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return bool(rows)

    async def job_outcome(self, run: RunKey, seq: int, outcome: str) -> JobOutcome:
        """Record a job step's outcome once.

        On the pending step (waking the run), or on the cancel record that took its place.
        """
        rows = await self._run(
            self._store.queries["wf_job_outcome"],
            {"rk": run.routing_key, "run_id": run.run_id, "seq": seq, "outcome": outcome},
        )
        row = rows[0]
        if row["recorded"]:
            return JobOutcome("recorded", woke=bool(row["woke"]))
        return JobOutcome("repeat" if row["known"] else "unmatched", woke=False)

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
            step = await self._on(conn, queries["wf_lock_job_step"], {**key, "seq": cancel.seq})
            if not step or (step[0]["kind"], step[0]["status"]) != (StepKind.JOB, "pending"):
                return JobStepCancel("arrived", record=step[0] if step else None)
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

    async def actor_runs(
        self, routing_key: int, ref: tuple[str, str, str], limit: int
    ) -> list[Row]:
        """One actor's runs for operators, newest first."""
        tenant, actor_type, actor_id = ref
        return await self._run(
            self._store.queries["wf_actor_runs"],
            {
                "rk": routing_key,
                "tenant": tenant,
                "type": actor_type,
                "id": actor_id,
                "limit": limit,
            },
        )

    async def sample(self) -> list[Row]:
        """Per actor type with live runs: ``running`` (under a live lease) and ``suspended``."""
        return await self._run(self._store.queries["sample_workflows"], {})

    async def list(
        self, *, status: str | None = None, actor_type: str | None = None, limit: int = 100
    ) -> list[Row]:
        """Runs for operators, newest first."""
        return await self._run(
            self._store.queries["wf_list"], {"status": status, "type": actor_type, "limit": limit}
        )

    async def prune(self, actor_type: str, keep_ms: int, limit: int) -> int:
        """Delete up to ``limit`` finished runs of a type older than ``keep_ms``."""
        rows = await self._run(
            self._store.queries["wf_prune"],
            {"type": actor_type, "keep_ms": keep_ms, "limit": limit},
        )
        return int(rows[0]["pruned"]) if rows else 0
