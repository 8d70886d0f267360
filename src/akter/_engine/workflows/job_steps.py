"""A workflow's job steps (``wf.job(...)``).

A job step stages the job row with its ``pending`` record in one transaction, then suspends; the
job's settle routes its outcome to the step (``$workflow.job``) and wakes the run. A cancel (or
the run's deadline) that reaches a run suspended at a job step cancels the job in the same write
as the step's cancel record.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
from pydantic import BaseModel, TypeAdapter

from akter import telemetry
from akter._engine.workflows.control import Diverged, LeaseLost, Outage, Record, Suspend, durable
from akter._engine.workflows.journal import Journal, args_digest, describe_call, record_detail
from akter._ids import canonical_json
from akter._kinds import RowKind, StepKind
from akter._staging import framework_id
from akter._store.gateway.workflows import OutboxRow, StepRecord
from akter.callers import caller_to_json
from akter.errors import JobCancelled, JobDeadLettered, WorkflowCancelled, invalid_input
from akter.jobs import Cancelled, DeadLetter, Job

log = logging.getLogger("akter.workflows")


class JobSteps(Journal):
    """Job steps of a run attempt (module docstring)."""

    @durable
    async def job(self, job: Job[Any, Any], payload: BaseModel) -> Any:
        """A job step: staged with its pending record, then a suspension until its outcome."""
        definition = self.services.registry.definition(self.ref.type)
        if not isinstance(job, Job) or job.owner is not definition:
            raise invalid_input(
                f"wf.job() takes a job of {definition.name!r} (the workflow's actor type), "
                f"not {job!r}."
            )
        seq, rec = self._next(StepKind.JOB, job.name)
        body = job.validate_payload(payload)
        assert job.payload_model is not None
        args = args_digest(job.payload_model, body)
        if rec is not None:
            was_args = record_detail(rec).get("args")
            if was_args is not None and was_args != args:
                was = describe_call(StepKind.JOB, job.name, None, was_args)
                now = describe_call(StepKind.JOB, job.name, None, args)
                raise Diverged(
                    f"Step {seq} of workflow run {self.run_id!r} was recorded as {was}, but the "
                    f"code now asks for {now}; the run is parked. "
                    "Restore the call (or guard the change with wf.patched()), then 'akter "
                    f"workflows retry {self.run_id}', or cancel the run."
                )
        if rec is not None and rec.status == "done":
            return _replay_job(job, rec)
        if rec is not None and self._cancelling():
            return await self._cancel_job(seq, job, rec)
        if rec is None:
            policy = definition.policy
            job_id = framework_id(
                self._now(), 0, None, policy.execution_timeout, self.services.config.window_ms
            )
            row = OutboxRow(
                intent_id=job_id,
                kind=RowKind.JOB,
                tenant=self.ref.tenant,
                actor_type=self.ref.type,
                actor_id=self.ref.id,
                command=job.name,
                payload=canonical_json(body),
                caller=caller_to_json(self._caller((self.run_id, seq))),
                payload_version=job.version,
                priority=job.options.priority,
                max_wait_ms=job.options.max_wait_ms,
                capped=job.options.per_actor is not None,
            )
            detail = canonical_json({"job_id": job_id, "args": args})
            with telemetry.workflow_step(StepKind.JOB, job.name, seq):
                await self._record(
                    StepRecord(seq, StepKind.JOB, job.name, "pending", detail), outbox=(row,)
                )
            self.services.metrics.count("akter.outbox.staged", kind=RowKind.JOB)
        else:
            job_id = str(json.loads(rec.detail or "{}").get("job_id", "?"))
        raise Suspend(None, f"job {job.name} {job_id}")

    async def _cancel_job(self, seq: int, job: Job[Any, Any], rec: Record) -> Any:
        """A cancel (or the deadline) reaches a run suspended at a job step: cancel the job.

        As a turn's ``cancel_job`` (semantics §5.8): a job that never ran is deleted (it never
        runs; the cancel record holds its ``Failed`` report at once); an attempted one is
        marked cancelled, a running attempt here interrupted, and its one settle records the
        job's outcome on the cancel record. The job's cancellation and the cancel record are
        one write. When the job's outcome was recorded at the step meanwhile, it is answered
        instead, and the cancel reaches the next durable await.

        Raises:
            WorkflowCancelled: the job was cancelled.
        """
        job_id = str(json.loads(rec.detail or "{}")["job_id"])
        message = self._cancel_message()
        detail = canonical_json({"job_id": job_id, "job": job.name})

        def never_ran(payload: str) -> str:
            report = {
                "job_id": job_id,
                "job": json.loads(payload),
                "attempts": 0,
                "outcome": {"kind": "Failed", "cause": "Cancelled before it ran: " + message},
                "ambiguous": False,
            }
            return canonical_json({"cancelled": report})

        info = {"run_id": self.run_id, "seqs": [r.seq for r in self.buffered] + [seq]}
        await self.services.hooks.at("before_step_record", info)
        try:
            done = await self.gateway.cancel_job_step(
                self.claimed.run,
                self.claimed.token,
                self.services.config.workflow_lease_ms,
                self.buffered,
                StepRecord(seq, StepKind.CANCEL, "cancel", "done", detail),
                job_id,
                never_ran,
            )
        except (psycopg.Error, OSError) as exc:
            raise Outage(f"The cancel of job step {seq} could not be written: {exc}") from exc
        if done.status == "lost":
            raise LeaseLost(self.run_id)
        if done.status == "arrived":
            now = done.record
            if now is None or now.kind != StepKind.JOB or now.outcome is None:
                raise Outage(f"Job step {seq} changed under this attempt: {now}")
            arrived = Record(seq, StepKind.JOB, job.name, "done", rec.detail, now.outcome)
            return _replay_job(job, arrived)
        self.buffered.clear()
        self.cancel_delivered = True
        await self.services.hooks.at("after_step_record", info)
        if done.running:
            self.cancel_jobs([job_id])  # elsewhere the attempt notices at its next renewal
        if not done.deleted:
            self.wake()  # a cancelled row not running is settled by the next job claim
        log.info(
            "Workflow run cancelled at a job step; its job is cancelled: run id %r, job id %r",
            self.run_id,
            job_id,
            extra={"run_id": self.run_id, "job_id": job_id, "never_ran": done.deleted},
        )
        raise WorkflowCancelled(message)


def _replay_job(job: Job[Any, Any], rec: Record) -> Any:
    outcome = json.loads(rec.outcome or "null")
    if "ok" in outcome:
        return _job_result(job).validate_python(outcome["ok"])
    if "dead_letter" in outcome:
        raise JobDeadLettered(DeadLetter[Any].model_validate(outcome["dead_letter"]))
    raise JobCancelled(Cancelled[Any, Any].model_validate(outcome["cancelled"]))


def _job_result(job: Job[Any, Any]) -> TypeAdapter[Any]:
    return job.result
