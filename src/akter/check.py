"""What ``akter check`` reports (evolution E5): a :class:`CheckReport` of :class:`Finding` values.

``await runtime.check(sample=None)`` (and ``akter check app:runtime``, and
``ActorTest.check``) compares the code with the live database and says, before a deploy, what
the evolution rules would refuse, park or lose. It writes nothing and starts no runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypedDict

from akter.errors import AkterError

Severity = Literal["error", "warning", "info"]

#: The order findings are reported in: errors first.
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One thing the check found, for one actor type and member.

    Attributes:
        severity: ``error`` (something would be refused, parked or lost), ``warning`` (rows an
            operator should look at: parked rows, dead letters, unserved jobs, payloads only a
            newer runner can deliver) or ``info`` (counts per version).
        kind: A stable name of the finding (``unknown_type``, ``unknown_command``,
            ``unknown_job``, ``unknown_event``, ``state_too_new``, ``state_migration``,
            ``state_invalid``, ``state_lost``, ``invalid_payload``, ``payload_too_new``,
            ``parked``, ``dead_letters``, ``dead_letter_invalid``, ``unserved_job``,
            ``unknown_schedule``, ``schema_newer``, ``state_version``, ``payload_version``,
            ``unknown_workflow``, ``workflow_input``, ``owned_table``, ``unknown_subscription``,
            ``parked_feeds``).
        actor_type: The stored actor type it concerns, if any.
        member: The stored command, job or event tag it concerns, if any.
        count: How many rows it concerns.
        message: One sentence saying what was found and what to do.
        examples: The first rows concerned (``Account/'a-1': ...``), at most a few.
        version: The state or payload version it counts, for version findings.
        fix: What to change, when there is something to change.
    """

    severity: Severity
    kind: str
    actor_type: str | None
    member: str | None
    count: int
    message: str
    examples: tuple[str, ...] = ()
    version: int | None = None
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON object (``akter check --json``)."""
        data = asdict(self)
        data["examples"] = list(self.examples)
        return data


class CheckOptions(TypedDict, total=False):
    """``Runtime.check``'s options besides ``sample``."""

    #: The longest one read may take, in seconds (default 30 s).
    statement_timeout: float
    #: Rows per page of each scan (1 to 100,000; default 1,000).
    batch_size: int
    #: Called as scans advance with (what, rows so far, total or ``None``).
    progress: Callable[[str, int, int | None], None] | None


@dataclass(frozen=True)
class CheckReport:
    """The findings of one check, errors first.

    Attributes:
        findings: Every finding, ordered by severity, then actor type, member and kind.
        ok: No error finding: nothing would be refused, parked or lost.
    """

    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """Whether no finding is an error."""
        return not self.errors

    @property
    def errors(self) -> tuple[Finding, ...]:
        """The error findings."""
        return tuple(f for f in self.findings if f.severity == "error")

    def of(self, kind: str) -> list[Finding]:
        """The findings of one kind."""
        return [f for f in self.findings if f.kind == kind]

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object (``akter check --json``)."""
        return {"ok": self.ok, "findings": [f.to_json() for f in self.findings]}


class CheckUnavailable(AkterError):
    """The check could not run (``akter check`` exits 2).

    The database is unreachable, the schema is missing or older than the code, or a read took
    longer than the statement timeout.
    """


__all__ = ["CheckReport", "CheckUnavailable", "Finding", "Severity"]
