"""The public export lists are pinned: adding or removing a public name is a visible decision."""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

import pytest

import akter
import akter.job_streams
import akter.jobs
import akter.testing
import akter.workflows

AKTER_ALL = [
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

JOBS_ALL = [
    "Cancelled",
    "DeadLetter",
    "Duration",
    "Failed",
    "Job",
    "JobCall",
    "JobDecorator",
    "JobOptions",
    "Rate",
    "Succeeded",
    "Unknown",
    "job",
]

JOB_STREAMS_ALL = [
    "AttemptStarted",
    "Chunk",
    "Closed",
    "JobStreamError",
    "MAX_BUFFERED_BYTES",
    "MAX_CHUNK_BYTES",
    "StreamItem",
    "StreamOutcome",
    "StreamReader",
    "encode_chunk",
    "item_from_json",
    "item_to_json",
]

WORKFLOWS_ALL = [
    "FinalStatus",
    "RunOps",
    "RunStatus",
    "StepDriver",
    "StepRecordView",
    "Workflow",
    "WorkflowContext",
    "WorkflowFailure",
    "WorkflowMember",
    "WorkflowOutcome",
    "WorkflowRun",
    "WorkflowStarter",
    "WorkflowStatus",
    "signal_name",
    "workflow",
]

#: Former top-level spellings, still importable, out of ``__all__``: name -> where it lives now.
FORMER = {
    "Cancelled": akter.jobs.Cancelled,
    "Failed": akter.jobs.Failed,
    "Succeeded": akter.jobs.Succeeded,
    "Unknown": akter.jobs.Unknown,
    "WorkflowError": akter.workflows.WorkflowFailure,
}

#: The exported errors: each prints as ``akter.<Name>``.
ERRORS = [
    "ActorError",
    "AkterError",
    "CapabilityEscaped",
    "ConfigurationError",
    "DeclaredError",
    "DefinitionError",
    "DrainError",
    "JobCancelled",
    "JobDeadLettered",
    "JobFailure",
    "JobStreamError",
    "OwnedTableError",
    "ReadOnlyError",
    "RowScopeError",
    "StepFailed",
    "SyncRuntimeError",
    "WorkflowCancelled",
    "WorkflowDiverged",
    "WorkflowFailed",
]

TESTING_ALL = [
    "ActorTest",
    "Hooks",
    "Inspection",
    "ManualClock",
    "POINTS",
    "Pause",
    "Watching",
    "watching",
]


def test_akter_exports_are_pinned() -> None:
    assert AKTER_ALL == sorted(AKTER_ALL)
    assert sorted(akter.__all__) == AKTER_ALL
    assert len(set(akter.__all__)) == len(akter.__all__)


def test_every_akter_export_resolves() -> None:
    for name in AKTER_ALL:
        assert getattr(akter, name, None) is not None, name
    namespace: dict[str, object] = {}
    exec("from akter import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == AKTER_ALL


def test_akter_exports_are_documented_public_objects() -> None:
    for name in AKTER_ALL:
        value = getattr(akter, name)
        if name == "__version__":
            assert value == importlib.metadata.version("akter")
            continue
        if name == "Caller":  # a type alias: User | Anonymous | System
            continue
        assert (value.__doc__ or "").strip(), f"akter.{name} has no docstring"
        if name in ERRORS:
            assert value.__module__ == "akter", (name, value.__module__)
            continue
        assert value.__module__.startswith("akter."), (name, value.__module__)
        assert not value.__module__.startswith("akter._engine"), name


def test_every_error_derives_from_the_root() -> None:
    suffixes = ("Error", "Escaped", "Failure", "Failed", "Cancelled", "Diverged", "DeadLettered")
    # WorkflowFailure is a model: the record of what escaped a run.
    errors = [n for n in AKTER_ALL if n.endswith(suffixes) and n != "WorkflowFailure"]
    assert errors == ERRORS
    for name in errors:
        error = getattr(akter, name)
        assert issubclass(error, akter.AkterError), error
        assert f"{error.__module__}.{error.__qualname__}" == f"akter.{name}"


@pytest.mark.parametrize(
    ("module", "pinned"),
    [
        (akter.jobs, JOBS_ALL),
        (akter.workflows, WORKFLOWS_ALL),
        (akter.job_streams, JOB_STREAMS_ALL),
    ],
)
def test_submodule_exports_are_pinned(module: ModuleType, pinned: list[str]) -> None:
    assert pinned == sorted(pinned)
    exported: list[str] = module.__all__
    assert sorted(exported) == pinned
    for name in pinned:
        assert getattr(module, name, None) is not None, name


def test_former_names_are_aliases_outside_all() -> None:
    for name, now in FORMER.items():
        assert getattr(akter, name) is now, name
        assert name not in akter.__all__, name
    assert akter.WorkflowFailure is akter.workflows.WorkflowError


def test_testing_exports_are_pinned() -> None:
    assert TESTING_ALL == sorted(TESTING_ALL)
    assert sorted(akter.testing.__all__) == TESTING_ALL
    for name in TESTING_ALL:
        assert getattr(akter.testing, name, None) is not None, name
    namespace: dict[str, object] = {}
    exec("from akter.testing import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == TESTING_ALL
