"""Staging enqueued jobs (semantics §5.3): the rows of ``self.enqueue`` and ``enqueue_many``.

The context methods (:mod:`akter.context`) check the call and stage what these build; every row
is written with the turn's other outbox rows, in one statement, only if the turn commits.
"""

from __future__ import annotations

from typing import Any

from akter._contexts import CommandContext
from akter._ids import canonical_json
from akter._kinds import RowKind, job_timer_key
from akter._staging import StagedRow, framework_id
from akter.errors import ActorError, invalid_input
from akter.jobs import Job


def row_priority(priority: Any) -> int:
    """``enqueue(priority=)``: 0-9, or the command is refused as ``InvalidInput``."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise invalid_input(f"enqueue(priority=) must be an integer from 0 to 9, got {priority!r}.")
    return priority


def own_job(ctx: CommandContext, job: Any, what: str) -> None:
    """``enqueue(job)``: a job of the turn's own actor type, or ``InvalidInput``."""
    if not isinstance(job, Job) or job.owner is not ctx.definition:
        raise invalid_input(
            f"{what}() takes a job of {ctx.definition.name!r} (e.g. "
            f"{ctx.definition.name}.<job>), not {job!r}."
        )


def many_payload(job: Job[Any, Any], index: int, payload: Any) -> dict[str, Any]:
    """One payload of ``enqueue_many``, validated; ``InvalidInput`` names its index."""
    try:
        return job.validate_payload(payload)
    except ActorError as exc:
        field = f"[{index}].{exc.field}" if exc.field else f"[{index}]"
        raise invalid_input(
            f"enqueue_many() payload {index} for job {job.name!r}: {exc.message} Nothing was"
            " enqueued.",
            field=field,
        ) from None


def job_row(
    ctx: CommandContext,
    job: Job[Any, Any],
    body: dict[str, Any],
    due: tuple[int | None, int | None],
    rank: int,
    key: str | None,
) -> StagedRow:
    """The staged outbox row of one enqueued job (semantics §5.3), with a new job id."""
    delay_ms, at_ms = due
    # A job without after= or at= is relative: due now, with the execution timeout's slack.
    relative = delay_ms if at_ms is not None else (delay_ms or 0)
    timeout = ctx.definition.policy.execution_timeout
    return StagedRow(
        intent_id=framework_id(ctx.now_ms, relative, at_ms, timeout, ctx.window_ms),
        kind=RowKind.JOB,
        target_type=ctx.definition.name,
        target_id=ctx.ref.id,
        command=job.name,
        payload=canonical_json(body),
        caller=ctx.system_caller("job"),
        delay_ms=delay_ms if at_ms is None else None,
        at_ms=at_ms,
        timer_key=None if key is None else job_timer_key(key),
        payload_version=job.version,
        priority=rank,
        max_wait_ms=job.options.max_wait_ms,
    )
