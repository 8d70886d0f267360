"""The workflow engine's statements: runs, their journal and their signals.

Every statement runs on the framework pool, like job claims and settles: a runner whose turns
hold every pooled connection still records its workflow steps. A write of a running attempt is
guarded by the run's ``token`` (bumped by every claim): when it returns nothing, the attempt
lost its lease and wrote nothing. Statements raise the driver's errors; the engine hands the run
back and tries again later.
"""

from akter._store.gateway.workflows.attempts import WorkflowAttempts
from akter._store.gateway.workflows.in_turn import (
    live_key_taken,
    live_keyed_runs,
    live_keys_answer,
    start_in_turn,
)
from akter._store.gateway.workflows.operators import WorkflowOperations
from akter._store.gateway.workflows.rows import (
    ClaimedRun,
    JobOutcome,
    JobStepCancel,
    JournalRow,
    LockedStep,
    OutboxRow,
    RunKey,
    RunListing,
    RunRow,
    RunStatus,
    SignalRow,
    StartedRun,
    StepRecord,
    StepRow,
    StepStatus,
    WorkflowSample,
)

__all__ = [
    "ClaimedRun",
    "JobOutcome",
    "JobStepCancel",
    "JournalRow",
    "LockedStep",
    "OutboxRow",
    "RunKey",
    "RunListing",
    "RunRow",
    "RunStatus",
    "SignalRow",
    "StartedRun",
    "StepRecord",
    "StepRow",
    "StepStatus",
    "WorkflowSample",
    "WorkflowsGateway",
    "live_key_taken",
    "live_keyed_runs",
    "live_keys_answer",
    "start_in_turn",
]


class WorkflowsGateway(WorkflowAttempts, WorkflowOperations):
    """The workflow statements (module docstring), on the framework clock's offset."""
