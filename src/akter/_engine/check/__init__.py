"""``akter check`` (spec evolution.md E5): what the evolution rules would refuse, park or lose.

The check reads every durable table through :class:`~akter._store.gateway.check.CheckGateway`
(read-only, bounded, paged) and judges each stored row with the shared decode rules — the same
functions a turn, a delivery and a dead-letter retry use, so the check cannot disagree with them:

- ``ActorDefinition.decode_state`` for stored states (all rows, or the first ``sample`` rows
  of each type);
- ``Member.decode_payload`` / ``Job.decode_payload`` for pending outbox rows;
- the definitions' names and aliases (``ActorDefinition.member`` / ``.job``, the events'
  tags and aliases) for stored actor types, commands, jobs and event tags;
- the declared subscriptions (``@akter.subscription``) for the recorded ones and their feeds
  (the subscriptions spec S6).

It writes nothing and starts nothing: no runner row, no relay, no migration.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from akter._engine import tables
from akter._engine.check.report import EXAMPLES, Findings, report
from akter._engine.runners import LIVE_MS
from akter._evolution import PayloadTooNew, StateDecodeError
from akter._ids import ms_from_duration
from akter._kinds import CronTick, WorkflowCommand, WorkflowIntent, decode_intent
from akter._store.gateway.check import ActorRow, CheckedEvent, CheckGateway, OutboxEntry
from akter._store.migrate import known_migrations
from akter._store.pool import SKEW_MARGIN_MS
from akter._store.queries import Queries
from akter.actor import ActorDefinition, Event
from akter.check import CheckReport, CheckUnavailable, Finding
from akter.errors import ActorError, ConfigurationError
from akter.subscriptions import spec_of

#: Called as a scan advances: (what is scanned, rows so far, expected total or None).
Progress = Callable[[str, int, int | None], None]

#: How far ahead of the clock a live heartbeat may lie (written at "now": the skew margin).
SKEW_MS = SKEW_MARGIN_MS


@dataclass(frozen=True)
class CheckOptions:
    """How a check runs.

    Attributes:
        sample: Decode the first ``sample`` states of each type (``None``: every state).
        offset_ms: The runtime's clock offset (due times and heartbeats are on that clock).
    """

    sample: int | None = None
    offset_ms: int = 0


def check_url(url: str | None, data_dir: str | Path | None) -> str:
    """The database a check reads: ``url``, else the running embedded server's.

    Raises:
        CheckUnavailable: Neither is there.
    """
    if url:
        return url
    from akter._store.embedded import default_data_dir, running_url

    found = running_url(Path(data_dir or default_data_dir()))
    if found is None:
        raise CheckUnavailable(
            "No database URL and no running embedded server to check; set "
            "AKTER_DATABASE_URL (or database_url=) or run 'akter db start'."
        )
    return found


async def check_database(
    url: str,
    queries: Queries,
    definitions: Mapping[str, ActorDefinition],
    *,
    offset_ms: int,
    sample: int | None,
    statement_timeout: float = 30.0,
    batch_size: int = 1_000,
    progress: Progress | None = None,
) -> CheckReport:
    """``Runtime.check``: the options validated, then :func:`run_check` over its own gateway.

    Raises:
        ConfigurationError: An option is out of its bounds.
        CheckUnavailable: As :func:`run_check`.
    """
    if sample is not None and (
        isinstance(sample, bool) or not isinstance(sample, int) or not 1 <= sample <= 1_000_000
    ):
        raise ConfigurationError(f"sample must be from 1 to 1,000,000, not {sample!r}.")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 1 <= batch_size <= 100_000
    ):
        raise ConfigurationError(f"batch_size must be from 1 to 100,000, not {batch_size!r}.")
    timeout_ms = ms_from_duration(statement_timeout, "statement_timeout")
    if timeout_ms < 1:
        raise ConfigurationError("statement_timeout must be at least 1 ms.")
    gateway = CheckGateway(url, queries, timeout_ms=timeout_ms, batch_size=batch_size)
    options = CheckOptions(sample=sample, offset_ms=offset_ms)
    return await run_check(gateway, definitions, options, progress)


async def run_check(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    options: CheckOptions,
    progress: Progress | None = None,
) -> CheckReport:
    """Check the database behind ``gateway`` against ``definitions`` (module docstring).

    Raises:
        CheckUnavailable: The schema is missing or older than this code, or a read failed.
    """
    tell: Progress = (lambda *_: None) if progress is None else progress
    found = Findings()
    async with gateway:
        await _check_schema(gateway, found)
        found.extra += await tables.check_findings(gateway, definitions.values())
        placements = await gateway.placements()
        found.recorded = {t for t in placements if t not in definitions}
        now = await gateway.now_ms(options.offset_ms)
        live = await gateway.live_job_types(options.offset_ms, LIVE_MS, SKEW_MS)
        tell = _with_totals(tell, await gateway.estimates())
        await _scan_actors(gateway, definitions, options, found, tell)
        await _scan_outbox(gateway, definitions, found, now, live, tell)
        await _scan_dead_letters(gateway, definitions, found, tell)
        await _scan_events(gateway, definitions, found, tell)
        await _scan_workflows(gateway, definitions, found, tell)
        await _check_subscriptions(gateway, definitions, options, found)
    return CheckReport(report(found, definitions))


def _with_totals(progress: Progress, estimates: Mapping[str, int]) -> Progress:
    """``progress`` with each scan's total taken from the planner's estimate, when known."""

    def tell(what: str, done: int, total: int | None) -> None:
        estimate = estimates.get(what.replace(" ", "_"))  # "dead letters": dead_letters
        if total is None and estimate is not None:
            total = max(estimate, done)
        progress(what, done, total)

    return tell


async def _check_schema(gateway: CheckGateway, found: Findings) -> None:
    has_schema, has_ledger = await gateway.schema_state()
    schema = gateway.schema
    if not has_schema or not has_ledger:
        raise CheckUnavailable(
            f"The schema {schema!r} does not exist (or holds no akter tables) in this "
            "database; check the runtime's schema= and database_url, or run 'akter migrate'."
        )
    applied = await gateway.applied_migrations()
    known = [m.id for m in known_migrations()]
    missing = [m for m in known if m not in applied]
    if missing:
        raise CheckUnavailable(
            f"The schema {schema!r} is older than this code: migrations {missing!r} are not "
            "applied. The check never migrates; run 'akter migrate' (or deploy, which "
            "migrates) first, then check again."
        )
    unknown = [m for m in applied if m not in known]
    if unknown:
        found.extra.append(
            Finding(
                "error",
                "schema_newer",
                None,
                None,
                len(unknown),
                f"The schema {schema!r} has migrations this code does not know ({unknown!r}): "
                "a runner with this code would refuse to start.",
                tuple(unknown[:EXAMPLES]),
                fix="Deploy an akter version that knows these migrations.",
            )
        )


# --- states ------------------------------------------------------------------------------------


async def _scan_actors(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    options: CheckOptions,
    found: Findings,
    progress: Progress,
) -> None:
    full = options.sample is None
    seen = 0
    # Counted per (type, version) here and tallied once: the scan visits every row.
    versions: Counter[tuple[str, int]] = Counter()
    async for page in gateway.actors(with_state=full):
        for row in page:
            actor_type = row.actor_type
            definition = definitions.get(actor_type)
            if definition is None:
                found.add("unknown_type", actor_type, example=_name(row), source="actors")
                continue
            version = row.state_version
            versions[actor_type, version] += 1
            if full or version > definition.state_version:
                # A row above the code's version is refused before its state is read.
                _judge_state(definition, row, found)
        seen += len(page)
        progress("actors", seen, None)
    for (actor_type, version), count in versions.items():
        found.add_many("state_version", actor_type, None, version, count)
    if full:
        return
    assert options.sample is not None
    for actor_type, definition in definitions.items():
        rows = await gateway.sample_states(actor_type, options.sample)
        for row in rows:
            if row.state_version <= definition.state_version:
                _judge_state(definition, row, found)  # too-new rows were counted in the scan
        progress(f"sampled states of {actor_type}", len(rows), options.sample)


def _judge_state(definition: ActorDefinition, row: ActorRow, found: Findings) -> None:
    actor_type = definition.name
    found.decoded[actor_type] = found.decoded.get(actor_type, 0) + 1
    try:
        definition.decode_state(row.state, row.state_version, _name(row))
    except StateDecodeError as exc:
        found.add(f"state_{exc.kind}", actor_type, example=f"{_name(row)}: {exc.message}")


# --- the outbox --------------------------------------------------------------------------------


async def _scan_outbox(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    found: Findings,
    now: int,
    live: set[str],
    progress: Progress,
) -> None:
    seen = 0
    async for page in gateway.outbox():
        for row in page:
            if row.kind == "job":
                _judge_job_row(definitions, row, found, now, live)
            else:
                _judge_intent_row(definitions, row, found)
        seen += len(page)
        progress("outbox", seen, None)


def _judge_intent_row(
    definitions: Mapping[str, ActorDefinition], row: OutboxEntry, found: Findings
) -> None:
    actor_type, command = row.target_type, row.command
    definition = definitions.get(actor_type)
    example = f"{row.intent_id} to {actor_type}/{row.target_id!r}"
    if definition is None:
        found.add("unknown_type", actor_type, example=example, source="outbox")
        return
    if row.parked_at_ms is not None:
        found.add("parked", actor_type, command, example=f"{example}: {row.last_error}")
        return
    target = decode_intent(command, row.timer_key or "")
    if isinstance(target, WorkflowIntent):
        # The workflow engine takes these; a start names a workflow this code must declare.
        if command == WorkflowCommand.START:
            name = str(json.loads(row.payload).get("workflow"))
            if name not in definition.workflows:
                found.add("unknown_command", actor_type, f"{command}:{name}", example=example)
        return
    if isinstance(target, CronTick):
        entry = next((e for e in definition.schedules if e.key == target.key), None)
        if entry is None:
            found.add("unknown_schedule", actor_type, command, example=f"{example}: {target.key}")
            return
        command = str(entry.command)
    try:
        member = definition.member(command, "command")
    except ActorError:
        found.add("unknown_command", actor_type, command, example=example)
        return
    _judge_payload(member, member.name, actor_type, row, example, found)


def _judge_job_row(
    definitions: Mapping[str, ActorDefinition],
    row: OutboxEntry,
    found: Findings,
    now: int,
    live: set[str],
) -> None:
    actor_type, name = row.actor_type, row.command
    definition = definitions.get(actor_type)
    example = f"job {row.intent_id} of {actor_type}/{row.actor_id!r}"
    if definition is None:
        found.add("unknown_type", actor_type, example=example, source="outbox")
        return
    if row.parked_at_ms is not None:
        found.add("parked", actor_type, name, example=f"{example}: {row.last_error}")
        return
    job = definition.job(name)
    if job is None:
        found.add("unknown_job", actor_type, name, example=example, source="outbox")
        return
    _judge_payload(job, job.name, actor_type, row, example, found)
    due = not row.running and row.due_at_ms <= now
    if due and f"{actor_type}.{job.name}" not in live:
        found.add("unserved_job", actor_type, job.name, example=example)


def _judge_payload(
    decoder: Any, member: str, actor_type: str, row: OutboxEntry, example: str, found: Findings
) -> None:
    """Decode a pending row's payload with the member's (or job's) own rule."""
    version = row.payload_version
    found.add("payload_version", actor_type, member, version)
    try:
        stored = json.loads(row.payload)
        decoder.decode_payload(stored, version)
    except PayloadTooNew as exc:
        found.add("payload_too_new", actor_type, member, example=f"{example}: {exc}")
    except ActorError as exc:
        found.add("invalid_payload", actor_type, member, example=f"{example}: {exc}")
    except (ValueError, RecursionError) as exc:  # not JSON, or nested past the parser's depth
        reason = "nested too deeply" if isinstance(exc, RecursionError) else f"not JSON ({exc})"
        found.add("invalid_payload", actor_type, member, example=f"{example}: {reason}")


# --- dead letters and events ---------------------------------------------------------------------


async def _scan_dead_letters(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    found: Findings,
    progress: Progress,
) -> None:
    seen = 0
    async for page in gateway.dead_letters():
        for row in page:
            actor_type, name = row.actor_type, row.job
            definition = definitions.get(actor_type)
            example = f"dead letter {row.job_id} of {actor_type}/{row.actor_id!r}"
            if definition is None:
                found.add("unknown_type", actor_type, example=example, source="dead_letters")
                continue
            job = definition.job(name)
            if job is None:
                found.add("unknown_job", actor_type, name, example=example, source="dead_letters")
                continue
            found.add("dead_letters", actor_type, job.name, example=f"{example}: {row.cause}")
            try:
                job.decode_payload(json.loads(row.payload), row.payload_version)
            except (PayloadTooNew, ActorError, ValueError, RecursionError) as exc:
                found.add("dead_letter_invalid", actor_type, job.name, example=f"{example}: {exc}")
        seen += len(page)
        progress("dead letters", seen, None)


async def _scan_events(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    found: Findings,
    progress: Progress,
) -> None:
    claimed = _claimed_tags(definitions)
    seen = 0
    async for page in gateway.events():
        for row in page:
            actor_type, tag = row.actor_type, row.tag
            example = f"{_name(row)} event {row.seq}"
            if actor_type not in definitions:
                found.add("unknown_type", actor_type, example=example, source="events")
            elif tag not in claimed[actor_type]:
                found.add("unknown_event", actor_type, tag, example=example)
        seen += len(page)
        progress("events", seen, None)


async def _check_subscriptions(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    options: CheckOptions,
    found: Findings,
) -> None:
    """Subscriptions recorded or fed that this code does not declare; parked feeds (S6)."""
    for name, pending, parked in await gateway.subscriptions(options.offset_ms):
        subscriber, _, member = name.partition(".")
        definition = definitions.get(subscriber)
        handler = definition.members.get(member) if definition is not None else None
        if handler is None or spec_of(handler.fn) is None:
            found.add_many("unknown_subscription", subscriber, member, None, pending + parked)
        elif parked:
            found.add_many("parked_feeds", subscriber, member, None, parked)


def _claimed_tags(definitions: Mapping[str, ActorDefinition]) -> dict[str, set[str]]:
    """The event tags each type's stored events may carry, as the runtime decodes them.

    A type that declares its events (``events=[...]``) can only have emitted those, under
    their tags or aliases. One that declares none may emit any event: its tags are claimed by
    any event class the process knows (the fallback the event reader uses, too).
    """
    known = set(Event.registry())
    claimed: dict[str, set[str]] = {}
    for name, definition in definitions.items():
        tags = {t for e in definition.events for t in (e.event_tag, *e.event_aliases)}
        claimed[name] = tags if definition.events else known
    return claimed


def _name(row: ActorRow | CheckedEvent) -> str:
    tenant = "" if row.tenant_id == "default" else f"{row.tenant_id}:"
    return f"{tenant}{row.actor_type}/{row.actor_id!r}"


__all__ = ["CheckOptions", "Progress", "check_database", "check_url", "run_check"]


async def _scan_workflows(
    gateway: CheckGateway,
    definitions: Mapping[str, ActorDefinition],
    found: Findings,
    progress: Progress,
) -> None:
    """Unfinished runs: their workflow must be declared and their input must still validate.

    (A reordered step cannot be found without running the code: a replay parks such a run.)
    """
    seen = 0
    async for page in gateway.workflows():
        for row in page:
            actor_type, name = row.actor_type, row.workflow
            example = f"run {row.run_id} of {actor_type}/{row.actor_id!r} ({row.status})"
            definition = definitions.get(actor_type)
            if definition is None:
                found.add("unknown_type", actor_type, example=example, source="workflows")
                continue
            flow = definition.workflows.get(name)
            if flow is None:
                found.add("unknown_workflow", actor_type, name, example=example)
                continue
            try:
                flow.arguments(json.loads(row.input))
            except Exception as exc:
                found.add("workflow_input", actor_type, name, example=f"{example}: {exc}")
        seen += len(page)
        progress("workflows", seen, None)
