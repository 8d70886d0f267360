"""Workflow statements from outside an attempt: reads, signals and operator actions."""

from __future__ import annotations

from akter._store.gateway.workflows.base import GatewayBase
from akter._store.gateway.workflows.rows import (
    JobOutcome,
    RunKey,
    RunListing,
    RunRow,
    SignalRow,
    StepRow,
    WorkflowSample,
)


class WorkflowOperations(GatewayBase):
    """The statements that reach a run from outside its attempts."""

    async def locate(self, run_id: str) -> RunRow | None:
        """A run's row (its routing key and actor too), by id alone."""
        rows = await self._run(self._store.queries["wf_locate"], {"run_id": run_id})
        return RunRow.from_row(rows[0]) if rows else None

    async def get(self, run: RunKey) -> RunRow | None:
        """The run's row."""
        rows = await self._run(
            self._store.queries["wf_get"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return RunRow.from_row(rows[0], run.routing_key) if rows else None

    async def steps(self, run: RunKey, after: int = -1) -> list[StepRow]:
        """The run's journal after ``after`` (a seq), in order."""
        rows = await self._run(
            self._store.queries["wf_steps"],
            {"rk": run.routing_key, "run_id": run.run_id, "after": after},
        )
        return [StepRow.from_row(r) for r in rows]

    async def signals(self, run: RunKey) -> list[SignalRow]:
        """The run's signals in arrival order."""
        rows = await self._run(
            self._store.queries["wf_signals"], {"rk": run.routing_key, "run_id": run.run_id}
        )
        return [SignalRow.from_row(r) for r in rows]

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

    async def actor_runs(
        self, routing_key: int, ref: tuple[str, str, str], limit: int
    ) -> list[RunListing]:
        """One actor's runs for operators, newest first."""
        tenant, actor_type, actor_id = ref
        rows = await self._run(
            self._store.queries["wf_actor_runs"],
            {
                "rk": routing_key,
                "tenant": tenant,
                "type": actor_type,
                "id": actor_id,
                "limit": limit,
            },
        )
        return [RunListing.from_row(r) for r in rows]

    async def sample(self) -> list[WorkflowSample]:
        """Per actor type with live runs: ``running`` (under a live lease) and ``suspended``."""
        rows = await self._run(self._store.queries["sample_workflows"], {})
        return [WorkflowSample.from_row(r) for r in rows]

    async def list(
        self,
        *,
        status: str | None = None,
        actor_type: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
    ) -> list[RunListing]:
        """Runs for operators, newest first (each filter is skipped when ``None``)."""
        rows = await self._run(
            self._store.queries["wf_list"],
            {
                "status": status,
                "type": actor_type,
                "workflow": workflow,
                "tenant": tenant,
                "limit": limit,
            },
        )
        return [RunListing.from_row(r) for r in rows]

    async def prune(self, actor_type: str, keep_ms: int, limit: int) -> int:
        """Delete up to ``limit`` finished runs of a type older than ``keep_ms``."""
        rows = await self._run(
            self._store.queries["wf_prune"],
            {"type": actor_type, "keep_ms": keep_ms, "limit": limit},
        )
        return int(rows[0]["pruned"]) if rows else 0
