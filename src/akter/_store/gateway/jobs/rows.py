"""The job lane's typed rows and statement parameters (``akter._store.gateway.jobs``).

``ClaimedJob`` is a claimed row as every claim statement returns it, built by its one
``from_row``; the other types name what the claim and settle statements take.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from akter.callers import ActorRef


class JobRow(Protocol):
    """What the settle statements need of a claimed job row."""

    @property
    def routing_key(self) -> int: ...
    @property
    def intent_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def actor_type(self) -> str: ...
    @property
    def actor_id(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def payload(self) -> str: ...
    @property
    def payload_version(self) -> int: ...


@dataclass(frozen=True, slots=True)
class JobType:
    """One executed job type as the claim statements take it."""

    actor_type: str
    job: str
    max_attempts: int


@dataclass(frozen=True, slots=True)
class JobKey:
    """A job row this runner just committed, as a keyed claim names it."""

    routing_key: int
    intent_id: str
    actor_type: str
    job: str


@dataclass(frozen=True, slots=True)
class Group:
    """One job type of one actor whose attempts run under a per-actor cap."""

    routing_key: int
    tenant_id: str
    actor_type: str
    actor_id: str
    command: str

    def params(self) -> dict[str, object]:
        """The parameters naming the group."""
        return {
            "rk": self.routing_key,
            "tenant": self.tenant_id,
            "type": self.actor_type,
            "id": self.actor_id,
            "job": self.command,
        }


@dataclass(frozen=True, slots=True)
class GroupClaim:
    """One group of a batched claim (``JobsGateway.claim_groups``) and what it may take."""

    group: Group
    #: At most this many rows (the executor's free slots given to the group).
    free: int
    #: The job's ``per_actor`` cap.
    cap: int
    max_attempts: int


def group_arrays(groups: Sequence[Group]) -> dict[str, list[Any]]:
    """A batch of groups as the array parameters of ``job_groups_lock_*``."""
    return {
        "rks": [g.routing_key for g in groups],
        "tenants": [g.tenant_id for g in groups],
        "types": [g.actor_type for g in groups],
        "ids": [g.actor_id for g in groups],
        "jobs": [g.command for g in groups],
    }


@dataclass(frozen=True, slots=True)
class Ended:
    """What a settle's guarded end of a row did (``JobsGateway.end``)."""

    #: The row was ended (deleted or rewritten into its route).
    changed: bool
    #: When it was not and the write waits for newer attempts, ``job_newer_live``'s answer:
    #: whether a newer attempt holds a live lease (None: the row has ended).
    held: bool | None
    #: With a group wake: whether a waiting row woke; None when the wake was not done (no
    #: group asked for, or its lock was busy): the executor wakes the group on its own then.
    woke: bool | None


@dataclass(frozen=True, slots=True)
class RouteWrite:
    """A settle that rewrites the job row into a route intent (command and canonical payload).

    ``traceparent``: the attempt's span, which the route's delivery continues (``None`` keeps
    the row's own).
    """

    command: str
    payload: str
    traceparent: str | None = None
    #: The route command's payload version (evolution E3).
    payload_version: int = 0


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What an operator's cancellation by id did: ``deleted``, ``cancelled`` or ``unknown``."""

    outcome: Literal["deleted", "cancelled", "unknown"]
    #: An attempt of the job was running (its runner should be signalled).
    running: bool = False


def key(row: JobRow) -> dict[str, object]:
    """The parameters naming a job row."""
    return {"rk": row.routing_key, "job_id": row.intent_id}


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job row as a claim statement returned it (``claim_jobs``, ``claim_capped_group``, ...).

    Attributes:
        attempts: ``N``: the attempt this claim runs (unchanged for a settle-only claim).
        claimed_until: The lease end the claim wrote.
        cancelled: Cancelled by a turn: settled with what is known, never attempted again.
        exhausted: Its attempts ran out, or a failure was final, before this claim.
        sent_at: Local monotonic time just before the claim was sent.
        traceparent: The W3C traceparent of the span that staged the job (``None``: none).
        candidates: How many due rows the claim's probe found (``claim_jobs``; else 0).
    """

    routing_key: int
    intent_id: str
    tenant_id: str
    actor_type: str
    actor_id: str
    command: str
    payload: str
    payload_version: int
    caller: str
    attempts: int
    last_error: str | None
    ambiguous: bool
    maybe_applied: bool
    claimed_until: int
    cancelled: bool
    exhausted: bool
    sent_at: float
    traceparent: str | None = None
    #: What the claim replaced (undone when the code cannot run the row, evolution E3).
    prior_attempts: int = 0
    prior_ambiguous: bool = False
    prior_maybe_applied: bool = False
    #: The row's error before this claim wrote its own (restored when it waits for a token).
    prior_error: str | None = None
    #: ``"rate"``: the row was handed back to wait for a rate token (it holds none, job_rates).
    prior_waiting_for: str | None = None
    candidates: int = 0

    @classmethod
    def from_row(cls, row: Mapping[str, Any], sent_at: float) -> ClaimedJob:
        """The claim from a claim statement's result row, sent at ``sent_at`` (monotonic)."""
        return cls(
            routing_key=int(row["routing_key"]),
            intent_id=str(row["intent_id"]),
            tenant_id=str(row["tenant_id"]),
            actor_type=str(row["actor_type"]),
            actor_id=str(row["actor_id"]),
            command=str(row["command"]),
            payload=str(row["payload"]),
            payload_version=int(row["payload_version"]),
            caller=str(row["caller"]),
            attempts=int(row["attempts"]),
            last_error=row["last_error"],
            ambiguous=bool(row["ambiguous"]),
            maybe_applied=bool(row["maybe_applied"]),
            claimed_until=int(row["claimed_until"]),
            cancelled=bool(row["cancelled"]),
            exhausted=bool(row["exhausted"]),
            sent_at=sent_at,
            traceparent=row.get("traceparent"),
            prior_attempts=int(row.get("prior_attempts", row["attempts"])),
            prior_ambiguous=bool(row.get("prior_ambiguous", row["ambiguous"])),
            prior_maybe_applied=bool(row.get("prior_maybe_applied", row["maybe_applied"])),
            prior_error=row.get("prior_error"),
            prior_waiting_for=row.get("prior_waiting_for"),
            candidates=int(row.get("candidates", 0)),
        )

    @property
    def ref(self) -> ActorRef:
        """The actor that owns the job."""
        return ActorRef(self.tenant_id, self.actor_type, self.actor_id)

    @property
    def group(self) -> Group:
        """The (actor, job) group of the row."""
        return Group(self.routing_key, self.tenant_id, self.actor_type, self.actor_id, self.command)

    def log_fields(self) -> dict[str, Any]:
        """The structured fields of every job log line (semantics §10.3)."""
        return {
            "actor": self.actor_type,
            "id": self.actor_id,
            "tenant": self.tenant_id,
            "job": self.command,
            "job_id": self.intent_id,
            "attempt": self.attempts,
        }
