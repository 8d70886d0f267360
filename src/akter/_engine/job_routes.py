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
from akter.errors import ActorError

if TYPE_CHECKING:
    from akter.jobs import Job

RouteKind = Literal["success", "dead_letter", "cancelled"]


@dataclass(frozen=True)
class Route:
    """A route intent to write: the route command and its payload (canonical JSON)."""

    command: str
    payload: str


class RouteRejected(Exception):
    """The route's parameter type does not accept the value."""


def has_route(job: Job[Any, Any], kind: RouteKind) -> bool:
    """Whether the job declares a route of ``kind``."""
    return kind in job.routes


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


def success(job: Job[Any, Any], value: Any) -> Route | None:
    """The ``on_success`` route for a result."""
    return build(job, "success", value)


def dead_letter(
    job: Job[Any, Any], job_id: str, payload: str, attempts: int, cause: str, ambiguous: bool
) -> Route | None:
    """The ``on_dead_letter`` route; ``None`` without one or when the payload no longer fits."""
    letter = {
        "job_id": job_id,
        "job": stored_payload(payload),
        "attempts": attempts,
        "cause": cause,
        "ambiguous": ambiguous,
    }
    try:
        return build(job, "dead_letter", letter)
    except RouteRejected:
        return None


def cancelled(
    job: Job[Any, Any], job_id: str, payload: str, attempts: int, outcome: dict[str, Any]
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
    return build(job, "cancelled", report)
