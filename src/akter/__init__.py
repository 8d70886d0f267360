"""akter: durable actors on PostgreSQL.

An actor is ``(tenant, type, id)`` with durable state; every command runs as one fenced turn
(one PostgreSQL transaction) that commits state, receipt, events, intents and jobs together.
"""

import logging

from akter._drain import DrainReport
from akter._evolution import migrate_state
from akter._policy import Policy
from akter._version import __version__
from akter.actor import Actor, ActorDefinition, EmptyState, Event, command, public, query
from akter.callers import ActorRef, Anonymous, Caller, System, User, as_caller, current_caller
from akter.check import CheckReport, Finding
from akter.context import QueryView
from akter.errors import (
    ActorError,
    AkterError,
    CapabilityEscaped,
    ConfigurationError,
    DeclaredError,
    DefinitionError,
    DrainError,
    JobCancelled,
    JobDeadLettered,
    JobFailure,
    ReadOnlyError,
    StepFailed,
    WorkflowCancelled,
    WorkflowDiverged,
    WorkflowFailed,
)
from akter.events import EventRecord, EventStream
from akter.jobs import (
    Cancelled,
    DeadLetter,
    Failed,
    Job,
    JobCall,
    Rate,
    Succeeded,
    Unknown,
    job,
)
from akter.operators.outbox import ParkedRow
from akter.runtime import Runtime
from akter.schedules import schedule
from akter.workflows import (
    Workflow,
    WorkflowError,
    WorkflowOutcome,
    WorkflowRun,
    WorkflowStatus,
    workflow,
)

# A library never configures logging; without a handler set up by the application, records are
# dropped rather than printed (the application decides).
logging.getLogger("akter").addHandler(logging.NullHandler())

__all__ = [
    "Actor",
    "ActorDefinition",
    "ActorError",
    "ActorRef",
    "AkterError",
    "Anonymous",
    "Caller",
    "Cancelled",
    "CapabilityEscaped",
    "CheckReport",
    "ConfigurationError",
    "DeadLetter",
    "DeclaredError",
    "DefinitionError",
    "DrainError",
    "DrainReport",
    "EmptyState",
    "Event",
    "EventRecord",
    "EventStream",
    "Failed",
    "Finding",
    "Job",
    "JobCall",
    "JobCancelled",
    "JobDeadLettered",
    "JobFailure",
    "ParkedRow",
    "Policy",
    "QueryView",
    "Rate",
    "ReadOnlyError",
    "Runtime",
    "StepFailed",
    "Succeeded",
    "System",
    "Unknown",
    "User",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowDiverged",
    "WorkflowError",
    "WorkflowFailed",
    "WorkflowOutcome",
    "WorkflowRun",
    "WorkflowStatus",
    "__version__",
    "as_caller",
    "command",
    "current_caller",
    "job",
    "migrate_state",
    "public",
    "query",
    "schedule",
    "workflow",
]
