"""The workflow lane's statement parameters and answers (``akter._store.gateway.workflows``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: A result row as the driver returns it (run, journal, signal and listing rows).
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
    kind: str
    name: str
    status: str  # "pending" | "done"
    detail: str | None = None
    outcome: str | None = None


@dataclass(frozen=True)
class OutboxRow:
    """An outbox row a workflow write stages with it (a job step's job, an on_complete intent).

    The row belongs to the run's actor; ``kind`` is ``"job"`` or ``"intent"``.
    """

    intent_id: str
    kind: str
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
