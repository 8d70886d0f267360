"""Route payloads of a job (semantics §5.9, §5.12).

A settle rewrites the job row into an intent for one of the actor's route commands: the
command is the route method's name, the payload the canonical JSON of its single parameter.
Building a route validates the value through the route member, so a value the route cannot
accept is known before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from akter._ids import canonical_json
from akter._json import Unstorable, storable_json
from akter._kinds import WorkflowCommand
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter.jobs import Job

RouteKind = Literal["success", "dead_letter", "cancelled"]
#: A workflow step's job (its caller names the step): every outcome goes to the step, through
#: the workflow engine's ``$workflow.job`` intent, instead of the job's routes.
Workflow = tuple[str, int] | None


@dataclass(frozen=True)
class Route:
    """A route intent to write: the route command and its payload (canonical JSON)."""

    command: str
    payload: str


class RouteRejected(Exception):
    """The route's parameter type does not accept the value."""


def workflow_of(caller: str) -> Workflow:
    """The workflow step a job row's caller names (``System.workflow``), if any."""
    if '"workflow"' not in caller:
        return None
    step = json.loads(caller).get("workflow")
    return (str(step[0]), int(step[1])) if step else None


def has_route(job: Job[Any, Any], kind: RouteKind, workflow: Workflow = None) -> bool:
    """Whether the job's outcome of ``kind`` is routed (a workflow step's always is)."""
    return workflow is not None or kind in job.routes


def _to_step(workflow: tuple[str, int], outcome: dict[str, Any]) -> Route:
    """The ``$workflow.job`` intent that records ``outcome`` at the step."""
    run_id, seq = workflow
    try:
        payload = storable_json({"run_id": run_id, "seq": seq, "outcome": outcome}, "outcome")
    except Unstorable as exc:
        raise RouteRejected(str(exc)) from None
    return Route(WorkflowCommand.JOB, payload)


def _result_json(job: Job[Any, Any], value: Any) -> Any:
    try:
        return job.result.dump_python(value, mode="json")
    except Exception as exc:  # pydantic serialization errors
        raise RouteRejected(f"the result does not fit {job.name}'s return type: {exc}") from None


def build(job: Job[Any, Any], kind: RouteKind, value: Any) -> Route | None:
    """The route of ``kind`` carrying ``value``; ``None`` without such a route.

    Raises:
        RouteRejected: The route's parameter type does not accept ``value``.
    """
    fn = job.routes.get(kind)
    if fn is None:
        return None
    assert job.owner is not None
    job.owner.resolve()
    member = job.owner.members[fn.__name__]
    try:
        body = member.validate_payload({member.params[0].name: value})
    except ActorError as exc:
        raise RouteRejected(exc.message) from None
    except (TypeError, ValueError) as exc:
        raise RouteRejected(str(exc)) from None
    return Route(member.name, canonical_json(body))


def stored_payload(payload: str) -> Any:
    """The job's stored payload as JSON data (what routes carry as ``job``)."""
    return json.loads(payload)


def success(job: Job[Any, Any], value: Any, workflow: Workflow = None) -> Route | None:
    """The ``on_success`` route for a result (a workflow step's: the step's record)."""
    if workflow is not None:
        return _to_step(workflow, {"ok": _result_json(job, value)})
    return build(job, "success", value)


def dead_letter(
    job: Job[Any, Any],
    job_id: str,
    payload: str,
    attempts: int,
    cause: str,
    ambiguous: bool,
    workflow: Workflow = None,
) -> Route | None:
    """The ``on_dead_letter`` route; ``None`` without one or when the payload no longer fits."""
    letter = {
        "job_id": job_id,
        "job": stored_payload(payload),
        "attempts": attempts,
        "cause": cause,
        "ambiguous": ambiguous,
    }
    if workflow is not None:
        return _to_step(workflow, {"dead_letter": letter})
    try:
        return build(job, "dead_letter", letter)
    except RouteRejected:
        return None


def cancelled(
    job: Job[Any, Any],
    job_id: str,
    payload: str,
    attempts: int,
    outcome: dict[str, Any],
    workflow: Workflow = None,
) -> Route | None:
    """The ``on_cancelled`` route for an outcome (``Succeeded`` / ``Failed`` / ``Unknown``).

    Raises:
        RouteRejected: The route cannot accept it (a result of the wrong type, a payload that
            no longer validates).
    """
    report = {
        "job_id": job_id,
        "job": stored_payload(payload),
        "attempts": attempts,
        "outcome": outcome,
        "ambiguous": outcome["kind"] == "Unknown",
    }
    if workflow is not None:
        if outcome["kind"] == "Succeeded":
            report["outcome"] = {**outcome, "value": _result_json(job, outcome["value"])}
        return _to_step(workflow, {"cancelled": report})
    return build(job, "cancelled", report)
