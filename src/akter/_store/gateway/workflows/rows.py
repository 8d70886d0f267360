"""The workflow lane's typed rows, statement parameters and answers.

Each row type is built by its one ``from_row`` from a statement's result row (named beside
it); the statements live in ``queries_workflows.sql``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from akter._kinds import RowKind, StepKind

#: A run's status (the ``workflows.status`` check constraint; ``akter.workflows.RunStatus``).
RunStatus = Literal[
    "runnable", "running", "suspended", "completed", "failed", "cancelled", "diverged"
]
#: A journal record's status (the ``workflow_steps.status`` check constraint).
StepStatus = Literal["pending", "done"]


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class RunKey:
    """Where a run lives: its actor's routing key and its id."""

    routing_key: int
    run_id: str


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One journal record to write: new, or a pending step that is now done."""

    seq: int
    kind: StepKind
    name: str
    status: str  # "pending" | "done"
    detail: str | None = None
    outcome: str | None = None


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a job step's delivered outcome did.

    ``status``: ``recorded`` (on the pending step, or on the cancel record that took its
    place), ``repeat`` (the step holds it already) or ``unmatched`` (no step takes it);
    ``woke``: the run was woken.
    """

    status: str
    woke: bool = False


@dataclass(frozen=True, slots=True)
class JobStepCancel:
    """What a cancel at a pending job step did (``WorkflowsGateway.cancel_job_step``).

    ``status``: ``cancelled`` (the job was cancelled and the cancel record written),
    ``arrived`` (the step is no longer a pending job step: ``record`` holds what it is now) or
    ``lost`` (the lease was lost; nothing written). ``deleted``: the job never ran and is gone;
    ``running``: an attempt was running when it was marked cancelled.
    """

    status: str
    record: LockedStep | None = None
    deleted: bool = False
    running: bool = False


@dataclass(frozen=True, slots=True)
class StartedRun:
    """The run that holds a start's id or key (``wf_start``); ``created``: this start made it."""

    run_id: str
    input_hash: str
    workflow: str
    created: bool

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StartedRun:
        """The run from ``wf_start``'s row."""
        return cls(
            run_id=str(row["run_id"]),
            input_hash=str(row["input_hash"]),
            workflow=str(row["workflow"]),
            created=bool(row["created"]),
        )


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run leased for one attempt (``wf_claim``, ``citus_wf_claim``).

    ``token`` guards every write of the attempt; ``now`` is the claim statement's clock.
    """

    routing_key: int
    run_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    workflow: str
    input: str
    caller: str
    token: int
    attempts: int
    cancel_requested: bool
    deadline_ms: int | None
    traceparent: str | None
    now: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ClaimedRun:
        """The claimed run from a claim statement's row."""
        return cls(
            routing_key=int(row["routing_key"]),
            run_id=str(row["run_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            workflow=str(row["workflow"]),
            input=str(row["input"]),
            caller=str(row["caller"]),
            token=int(row["token"]),
            attempts=int(row["attempts"]),
            cancel_requested=bool(row["cancel_requested"]),
            deadline_ms=_int_or_none(row["deadline_ms"]),
            traceparent=row["traceparent"],
            now=int(row["now"]),
        )


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One row of ``wf_journal``: a journal record (``what == "step"``) or a pending signal.

    A signal's row carries its id in ``detail``, its payload in ``outcome`` and its arrival
    order in ``signal_seq`` (``seq`` is None).
    """

    what: Literal["step", "signal"]
    seq: int | None
    kind: str
    name: str
    status: StepStatus
    detail: str | None
    outcome: str | None
    signal_seq: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JournalRow:
        """The record or signal from ``wf_journal``'s row."""
        return cls(
            what=row["what"],
            seq=_int_or_none(row["seq"]),
            kind=str(row["kind"]),
            name=str(row["name"]),
            status=row["status"],
            detail=row["detail"],
            outcome=row["outcome"],
            signal_seq=_int_or_none(row["signal_seq"]),
        )


@dataclass(frozen=True, slots=True)
class LockedStep:
    """A journal record as ``wf_lock_job_step`` locked it."""

    kind: str
    status: StepStatus
    outcome: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LockedStep:
        """The record from ``wf_lock_job_step``'s row."""
        return cls(kind=str(row["kind"]), status=row["status"], outcome=row["outcome"])


@dataclass(frozen=True, slots=True)
class StepRow:
    """One journal record for readers (``wf_steps``)."""

    seq: int
    kind: str
    name: str
    status: StepStatus
    detail: str | None
    outcome: str | None
    started_at_ms: int
    recorded_at_ms: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StepRow:
        """The record from ``wf_steps``'s row."""
        return cls(
            seq=int(row["seq"]),
            kind=str(row["kind"]),
            name=str(row["name"]),
            status=row["status"],
            detail=row["detail"],
            outcome=row["outcome"],
            started_at_ms=int(row["started_at_ms"]),
            recorded_at_ms=_int_or_none(row["recorded_at_ms"]),
        )


@dataclass(frozen=True, slots=True)
class SignalRow:
    """One of a run's signals, in arrival order (``wf_signals``); ``payload``: JSON text."""

    signal_id: str
    name: str
    payload: str
    sent_at_ms: int
    consumed_seq: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SignalRow:
        """The signal from ``wf_signals``'s row."""
        return cls(
            signal_id=str(row["signal_id"]),
            name=str(row["name"]),
            payload=str(row["payload"]),
            sent_at_ms=int(row["sent_at_ms"]),
            consumed_seq=_int_or_none(row["consumed_seq"]),
        )


@dataclass(frozen=True, slots=True)
class RunListing:
    """A run as operators list it (``wf_list``, ``wf_actor_runs``).

    ``error``: the stored ``WorkflowError`` as JSON text (None: none).
    """

    run_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    workflow: str
    run_key: str | None
    status: RunStatus
    waiting: str | None
    wake_at_ms: int | None
    deadline_ms: int | None
    cancel_requested: bool
    attempts: int
    started_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None
    error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunListing:
        """The run from a listing statement's row."""
        return cls(
            run_id=str(row["run_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            workflow=str(row["workflow"]),
            run_key=row["run_key"],
            status=row["status"],
            waiting=row["waiting"],
            wake_at_ms=_int_or_none(row["wake_at_ms"]),
            deadline_ms=_int_or_none(row["deadline_ms"]),
            cancel_requested=bool(row["cancel_requested"]),
            attempts=int(row["attempts"]),
            started_at_ms=int(row["started_at_ms"]),
            updated_at_ms=int(row["updated_at_ms"]),
            finished_at_ms=_int_or_none(row["finished_at_ms"]),
            error=row["error"],
        )


@dataclass(frozen=True, slots=True)
class RunRow(RunListing):
    """A run's row (``wf_get``; ``wf_locate`` by id alone, which also finds its routing key).

    ``input`` and ``result``: stored JSON text (``result`` None until it completes).
    """

    routing_key: int
    input: str
    result: str | None
    lease_owner: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], routing_key: int | None = None) -> RunRow:
        """The run from ``wf_locate``'s row, or ``wf_get``'s with the ``routing_key`` it used."""
        listed = RunListing.from_row(row)
        return cls(
            **{f.name: getattr(listed, f.name) for f in fields(RunListing)},
            routing_key=int(row["routing_key"]) if routing_key is None else routing_key,
            input=str(row["input"]),
            result=row["result"],
            lease_owner=row["lease_owner"],
        )


@dataclass(frozen=True, slots=True)
class WorkflowSample:
    """Live runs of one actor type (``sample_workflows``): under a live lease, and waiting."""

    actor_type: str
    running: int
    suspended: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> WorkflowSample:
        """The counts from ``sample_workflows``'s row."""
        return cls(
            actor_type=str(row["actor_type"]),
            running=int(row["running"]),
            suspended=int(row["suspended"]),
        )
