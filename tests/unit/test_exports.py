"""The public export lists are pinned: adding or removing a public name is a visible decision."""

from __future__ import annotations

import importlib.metadata

import akter
import akter.testing

AKTER_ALL = [
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
    "MissingResource",
    "ParkedRow",
    "Policy",
    "QueryView",
    "Rate",
    "ReadOnlyError",
    "Resource",
    "Resources",
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

TESTING_ALL = ["ActorTest", "Hooks", "Inspection", "ManualClock", "POINTS", "Pause"]


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
        assert value.__module__.startswith("akter."), (name, value.__module__)
        assert not value.__module__.startswith("akter._engine"), name


def test_every_error_derives_from_the_root() -> None:
    suffixes = ("Error", "Escaped", "Failure", "Failed", "Cancelled", "Diverged", "DeadLettered")
    # WorkflowError is a model (what escaped a run); Cancelled and Failed are job route models.
    models = {"WorkflowError", "Cancelled", "Failed"}
    errors = [getattr(akter, n) for n in AKTER_ALL if n.endswith(suffixes) and n not in models]
    assert len(errors) == 15
    for error in errors:
        assert issubclass(error, akter.AkterError), error


def test_testing_exports_are_pinned() -> None:
    assert TESTING_ALL == sorted(TESTING_ALL)
    assert sorted(akter.testing.__all__) == TESTING_ALL
    for name in TESTING_ALL:
        assert getattr(akter.testing, name, None) is not None, name
    namespace: dict[str, object] = {}
    exec("from akter.testing import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == TESTING_ALL
