"""How a workflow attempt's end is told: its error record, and the log lines naming the run.

A run's end (failed, cancelled, completed) and its other notable moments are logged with the
run's subject in the message (``workflow checkout of Order/'o-1' (run id '…')``) and its
identities in ``extra=`` (module :mod:`akter._engine.subjects`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from akter._engine.subjects import run_label
from akter._engine.workflows.control import Claimed
from akter.errors import DeclaredError
from akter.workflows import WorkflowFailure

if TYPE_CHECKING:
    from akter._engine.workflows.run import RunAttempt

log = logging.getLogger("akter.workflows")


async def halting(attempt: RunAttempt, body: Coroutine[Any, Any, Any]) -> Any:
    """Await the workflow's code; a control exception it swallowed still ends the attempt."""
    try:
        value = await body
    except Exception:
        if attempt.halted is not None:
            raise attempt.halted from None
        raise
    if attempt.halted is not None:
        raise attempt.halted
    return value


def error_of(exc: BaseException) -> WorkflowFailure:
    """The record of what escaped a run (a declared error keeps its tag and fields)."""
    if isinstance(exc, DeclaredError):
        return WorkflowFailure(
            type=type(exc).__name__, message=str(exc), tag=type(exc).tag, fields=exc.fields
        )
    return WorkflowFailure(type=type(exc).__name__, message=str(exc)[:4000])


def subject(claimed: Claimed) -> str:
    """How a log line names the run."""
    ref = claimed.ref
    return run_label(ref.tenant, ref.type, ref.id, claimed.workflow, claimed.run.run_id)


def log_fields(claimed: Claimed) -> dict[str, Any]:
    """The run's identities, for ``extra=``."""
    ref = claimed.ref
    return {
        "actor": ref.type,
        "id": ref.id,
        "tenant": ref.tenant,
        "workflow": claimed.workflow,
        "run_id": claimed.run.run_id,
    }


def log_end(claimed: Claimed, status: str, error: WorkflowFailure | None) -> None:
    """A failed run warns with its error; a cancelled one is told at INFO, a completed at DEBUG."""
    fields = log_fields(claimed) | {"status": status}
    if status == "failed" and error is not None:
        log.warning(
            "Workflow run failed: %s: %s: %s",
            subject(claimed),
            error.type,
            error.message,
            extra=fields | {"error_type": error.type, "error": error.message},
        )
    elif status == "cancelled":
        log.info("Workflow run cancelled: %s", subject(claimed), extra=fields)
    else:
        log.debug("Workflow run %s: %s", status, subject(claimed), extra=fields)
