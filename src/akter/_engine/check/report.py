"""The check's findings: tallies of rows while the scans run, then one message per finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from akter.actor import ActorDefinition
from akter.check import SEVERITY_ORDER, Finding, Severity

#: Examples kept per finding.
EXAMPLES = 5
#: Longest example text.
_EXAMPLE_CHARS = 300


@dataclass
class Tally:
    """The rows behind one finding while the scans run."""

    count: int = 0
    examples: list[str] = field(default_factory=list)
    #: Rows per source table, for the unknown-type message.
    sources: dict[str, int] = field(default_factory=dict)

    def add(self, example: str | None = None, source: str | None = None) -> None:
        self.count += 1
        if example is not None and len(self.examples) < EXAMPLES:
            self.examples.append(" ".join(example.split())[:_EXAMPLE_CHARS])
        if source is not None:
            self.sources[source] = self.sources.get(source, 0) + 1


#: (kind, actor type, member, version)
Key = tuple[str, str | None, str | None, int | None]


@dataclass
class Findings:
    """Tallies by finding key; turned into :class:`Finding` values at the end."""

    tallies: dict[Key, Tally] = field(default_factory=dict)
    extra: list[Finding] = field(default_factory=list)
    #: States decoded per type (the denominator of state failures).
    decoded: dict[str, int] = field(default_factory=dict)
    #: Actor types in the deployment's placements that no definition claims.
    recorded: set[str] = field(default_factory=set)

    def add(
        self,
        kind: str,
        actor_type: str | None,
        member: str | None = None,
        version: int | None = None,
        *,
        example: str | None = None,
        source: str | None = None,
    ) -> None:
        key: Key = (kind, actor_type, member, version)
        self.tallies.setdefault(key, Tally()).add(example, source)

    def add_many(
        self, kind: str, actor_type: str | None, member: str | None, version: int | None, n: int
    ) -> None:
        """Count ``n`` rows of one finding at once (no examples)."""
        key: Key = (kind, actor_type, member, version)
        self.tallies.setdefault(key, Tally()).count += n


# --- the report ----------------------------------------------------------------------------------

#: Severity and message per kind; ``{t}`` type, ``{m}`` member, ``{n}`` count, ``{v}`` version,
#: ``{code}`` the code's version, ``{of}`` rows examined, ``{where}`` rows per table.
_MESSAGES: dict[str, tuple[Severity, str, str]] = {
    "unknown_type": (
        "error",
        "{n} stored rows of actor type {t!r} ({where}) are claimed by no definition: its "
        "commands, deliveries and jobs would be refused or parked.",
        "Host the class that owns them under its stored name (class ... name={t!r}); a "
        "renamed class keeps its data only that way.",
    ),
    "unknown_command": (
        "error",
        "{n} pending outbox rows call {t}.{m}, which no command or alias of {t} claims: they "
        "would be parked.",
        "Add aliases=({m!r},) to the command that replaced it, or keep the command.",
    ),
    "unknown_job": (
        "error",
        "{n} stored rows ({where}) name the job {t}.{m}, which no job or alias of {t} "
        "claims: pending ones would be parked, dead letters could not be retried.",
        "Add aliases=({m!r},) to the job that replaced it, or keep the job.",
    ),
    "unknown_event": (
        "error",
        "{n} stored events of {t} carry the tag {m!r}, which no event class or alias of {t} "
        "claims: feeds and queries could not decode them.",
        "Add aliases=({m!r},) to the event class that replaced it (or give it tag={m!r}).",
    ),
    "state_too_new": (
        "error",
        "{n} {t} states are stored at a state version above this code's {code}: its commands "
        "and queries would refuse them (StateTooNew), never overwrite them.",
        "Deploy code that declares those state migrations (this code looks like a rollback).",
    ),
    "state_migration": (
        "error",
        "{n} of {of} checked {t} states fail a state migration: their turns would be refused.",
        "Fix the migration named in the examples so it accepts these stored states.",
    ),
    "state_invalid": (
        "error",
        "{n} of {of} checked {t} states fail validation against the state model after their "
        "migrations: their turns would be refused.",
        "Add a state migration (@akter.migrate_state) that produces a valid state, or relax "
        "the model.",
    ),
    "state_lost": (
        "error",
        "{n} of {of} checked {t} states hold keys the state model would drop on the next "
        "write (the loss guard refuses their turns).",
        "Add a state migration (@akter.migrate_state) that moves or removes these keys, or "
        "keep the fields.",
    ),
    "invalid_payload": (
        "error",
        "{n} pending {t}.{m} rows hold a payload that fails validation after its migrations: "
        "they would be parked.",
        "Add a payload migration (@{m}.migrate_payload) or give the new parameters defaults.",
    ),
    "payload_too_new": (
        "warning",
        "{n} pending {t}.{m} rows are at a payload version above this code's {code}: this "
        "code leaves them due for a newer runner.",
        "Keep a runner with the newer code until they are delivered.",
    ),
    "unknown_schedule": (
        "warning",
        "{n} pending schedule ticks of {t} belong to a schedule entry this code does not "
        "declare: they are dropped once older than the type's max_schedule_lag.",
        "Keep the @akter.schedule entry if its ticks matter.",
    ),
    "parked": (
        "warning",
        "{n} outbox rows of {t}.{m} are parked (the code could not deliver them).",
        "Fix the cause, then 'akter outbox retry'; or 'akter outbox discard' them.",
    ),
    "dead_letters": (
        "warning",
        "{n} dead letters of {t}.{m}.",
        "Look at them with 'akter dead-letters list'; retry or discard them.",
    ),
    "dead_letter_invalid": (
        "warning",
        "{n} dead letters of {t}.{m} hold a payload that fails validation under this code: "
        "retrying them would be refused (InvalidInput).",
        "Add a payload migration (@{m}.migrate_payload), or discard them.",
    ),
    "unserved_job": (
        "warning",
        "{n} due {t}.{m} job rows and no live runner executes {t}.{m}.",
        "Start a worker that executes the job (its Runtime(jobs=...) includes it).",
    ),
    "unknown_workflow": (
        "error",
        "{n} unfinished runs of the workflow {t}.{m}, which this code does not declare: "
        "they would be parked as diverged when they next run.",
        "Keep the @akter.workflow (under the same name) until its runs have finished.",
    ),
    "workflow_input": (
        "error",
        "{n} unfinished runs of {t}.{m} hold an input that fails validation under this code: "
        "they would be parked as diverged when they next run.",
        "Give the new parameters defaults, or keep the old signature until the runs finish.",
    ),
    "unknown_subscription": (
        "error",
        "The subscription {t}.{m} is recorded in the database ({n} feeds with work or parked) "
        "and this code does not declare it: its feeds would be parked.",
        "Keep the @akter.subscription handler {t}.{m} until its feeds are delivered.",
    ),
    "parked_feeds": (
        "warning",
        "{n} feeds of the subscription {t}.{m} are parked (the code could not deliver them).",
        "Fix the cause named in subscription_feeds.parked; the feeds stay parked until then.",
    ),
    "state_version": ("info", "{n} {t} states at state version {v} (this code: {code}).", ""),
    "payload_version": (
        "info",
        "{n} pending {t}.{m} rows at payload version {v} (this code: {code}).",
        "",
    ),
}


def _code_version(definition: ActorDefinition | None, kind: str, member: str | None) -> int:
    if definition is None:
        return 0
    if kind in ("state_version", "state_too_new"):
        return definition.state_version
    job = definition.job(member or "")
    if job is not None:
        return int(job.version)
    found = definition.members.get(member or "")
    return found.version if found is not None else 0


def _finding(
    key: Key, tally: Tally, found: Findings, definitions: Mapping[str, ActorDefinition]
) -> Finding:
    kind, actor_type, member, version = key
    severity, text, fix = _MESSAGES[kind]
    where = ", ".join(f"{n} in {table}" for table, n in sorted(tally.sources.items()))
    values = {
        "t": actor_type,
        "m": member,
        "n": tally.count,
        "v": version,
        "code": _code_version(definitions.get(actor_type or ""), kind, member),
        "of": found.decoded.get(actor_type or "", 0),
        "where": where or "none",
    }
    return Finding(
        severity,
        kind,
        actor_type,
        member,
        tally.count,
        text.format(**values),
        tuple(tally.examples),
        version,
        fix.format(**values),
    )


def report(found: Findings, definitions: Mapping[str, ActorDefinition]) -> tuple[Finding, ...]:
    findings = list(found.extra)
    findings += [_finding(k, t, found, definitions) for k, t in found.tallies.items()]
    for actor_type in sorted(found.recorded):
        if ("unknown_type", actor_type, None, None) not in found.tallies:
            findings.append(
                Finding(
                    "warning",
                    "unknown_type",
                    actor_type,
                    None,
                    0,
                    f"The deployment records actor type {actor_type!r}, which no definition "
                    "claims; it has no rows.",
                    fix="Nothing would be lost; host it again under name= if it was renamed.",
                )
            )
    findings.sort(
        key=lambda f: (
            SEVERITY_ORDER[f.severity],
            f.actor_type or "",
            f.member or "",
            f.kind,
            -1 if f.version is None else f.version,
        )
    )
    return tuple(findings)


__all__ = ["EXAMPLES", "Findings", "Key", "Tally", "report"]
