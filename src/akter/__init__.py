"""akter: durable actors on PostgreSQL.

An actor is ``(tenant, type, id)`` with durable state; every command runs as one fenced turn
(one PostgreSQL transaction) that commits state, receipt, events, intents and jobs together.
"""

import logging

from akter import jobs as _jobs
from akter._drain import DrainReport
from akter._evolution import migrate_state
from akter._policy import Policy
from akter._tables import OwnedTableError, RowScopeError, owned, owner_columns, state_index
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
from akter.job_streams import JobStreamError
from akter.jobs import DeadLetter, Job, JobCall, Rate, job
from akter.operators.outbox import ParkedRow
from akter.resources import MissingResource, Resource, Resources
from akter.runtime import Runtime
from akter.schedules import schedule
from akter.staging import StagedCommand, astage, stage, stage_many, staged
from akter.subscriptions import Delivery, RetentionGap, subscription
from akter.sync import SyncRuntime, SyncRuntimeError
from akter.workflows import (
    Workflow,
    WorkflowFailure,
    WorkflowOutcome,
    WorkflowRun,
    WorkflowStatus,
    workflow,
)

# Exported errors print under the name users import them by (``akter.ActorError`` in a
# traceback, not ``akter.errors.ActorError``).
for _error in (
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
    JobStreamError,
    OwnedTableError,
    ReadOnlyError,
    RowScopeError,
    StepFailed,
    SyncRuntimeError,
    WorkflowCancelled,
    WorkflowDiverged,
    WorkflowFailed,
):
    _error.__module__ = "akter"
del _error

# Former spellings, kept importable for code written against them and left out of ``__all__``:
# the job outcome types live in ``akter.jobs`` (``akter.jobs.Cancelled``, ``Succeeded``,
# ``Failed``, ``Unknown``), and ``WorkflowError`` is now ``WorkflowFailure`` (a record).
Cancelled = _jobs.Cancelled
Succeeded = _jobs.Succeeded
Failed = _jobs.Failed
Unknown = _jobs.Unknown
WorkflowError = WorkflowFailure

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
    "CapabilityEscaped",
    "CheckReport",
    "ConfigurationError",
    "DeadLetter",
    "DeclaredError",
    "DefinitionError",
    "Delivery",
    "DrainError",
    "DrainReport",
    "EmptyState",
    "Event",
    "EventRecord",
    "EventStream",
    "Finding",
    "Job",
    "JobCall",
    "JobCancelled",
    "JobDeadLettered",
    "JobFailure",
    "JobStreamError",
    "MissingResource",
    "OwnedTableError",
    "ParkedRow",
    "Policy",
    "QueryView",
    "Rate",
    "ReadOnlyError",
    "Resource",
    "Resources",
    "RetentionGap",
    "RowScopeError",
    "Runtime",
    "StagedCommand",
    "StepFailed",
    "SyncRuntime",
    "SyncRuntimeError",
    "System",
    "User",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowDiverged",
    "WorkflowFailed",
    "WorkflowFailure",
    "WorkflowOutcome",
    "WorkflowRun",
    "WorkflowStatus",
    "__version__",
    "as_caller",
    "astage",
    "command",
    "current_caller",
    "job",
    "migrate_state",
    "owned",
    "owner_columns",
    "public",
    "query",
    "schedule",
    "stage",
    "stage_many",
    "staged",
    "state_index",
    "subscription",
    "workflow",
]
