"""What a caller holds of a workflow run: its handle, its status and how it ended.

:class:`WorkflowRun` is the handle ``start`` returns (in-process or over HTTP, through
:class:`RunOps`); :class:`WorkflowStatus` and :class:`WorkflowOutcome` are a run as it stands and
as it ended. The declarations (``@akter.workflow``, the ``wf`` context) are
:mod:`akter.workflows`', which re-exports these names.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Generic, Literal, Protocol

from pydantic import BaseModel, ConfigDict, TypeAdapter
from typing_extensions import TypeVar

from akter._ids import ms_from_duration
from akter.callers import ActorRef
from akter.errors import DeclaredError, WorkflowCancelled, WorkflowDiverged, WorkflowFailed

T = TypeVar("T", default=Any)

RunStatus = Literal[
    "runnable", "running", "suspended", "completed", "failed", "cancelled", "diverged"
]
#: A finished run's status (what ``on_complete`` receives).
FinalStatus = Literal["completed", "failed", "cancelled"]


class WorkflowFailure(BaseModel):
    """The record of what escaped a failed (or cancelled) run: the exception's class and message.

    ``tag`` and ``fields`` are set for a declared error (``akter.DeclaredError``). A record, not
    an exception: ``await run.result()`` raises :class:`akter.WorkflowFailed` built from it.
    """

    type: str
    message: str
    tag: str | None = None
    fields: dict[str, Any] | None = None


class WorkflowOutcome(BaseModel, Generic[T]):
    """How a run ended: what ``on_complete`` receives, once."""

    run_id: str
    workflow: str
    status: FinalStatus
    result: T | None = None
    error: WorkflowFailure | None = None


class StepRecordView(BaseModel):
    """One journal record, as ``run.status()`` and the operators' views show it."""

    seq: int
    kind: str
    name: str
    status: Literal["pending", "done"]
    detail: str | None = None
    outcome: Any = None
    started_at_ms: int
    recorded_at_ms: int | None = None


class WorkflowStatus(BaseModel):
    """A run as it stands: status, what it waits for, result or error, and its journal."""

    run_id: str
    workflow: str
    actor: ActorRef
    key: str | None = None
    status: RunStatus
    waiting: str | None = None
    cancel_requested: bool = False
    attempts: int
    result: Any = None
    error: WorkflowFailure | None = None
    started_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None = None
    steps: list[StepRecordView] = []

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @property
    def finished(self) -> bool:
        """Whether the run has ended (completed, failed or cancelled)."""
        return self.status in ("completed", "failed", "cancelled")


def signal_name(signal: type[BaseModel] | BaseModel) -> str:
    """The name a signal class is sent and waited for under (its class name)."""
    cls = signal if isinstance(signal, type) else type(signal)
    return cls.__name__


class RunOps(Protocol):
    """What a :class:`WorkflowRun` asks of the runtime (in-process or over HTTP)."""

    async def status(self, run_id: str, *, steps: bool = True) -> WorkflowStatus:
        """The run's status and (with ``steps``) its journal."""
        ...

    async def settled(self, run_id: str, within: float) -> None:
        """Return once the run may have ended, at the latest after ``within`` seconds."""
        ...

    async def signal(self, run_id: str, signal: BaseModel) -> None:
        """Send a signal to the run."""
        ...

    async def cancel(self, run_id: str) -> None:
        """Ask the run to cancel."""
        ...


class WorkflowRun(Generic[T]):
    """A handle to one workflow run: its result, status, signals and cancellation.

    Attributes:
        id: The run id (stable; ``runtime.workflow_run(id)`` finds the run again).
    """

    def __init__(self, run_id: str, ops: RunOps, result: TypeAdapter[Any] | None = None) -> None:
        self.id = run_id
        self._ops = ops
        self._result = result

    def __repr__(self) -> str:
        return f"<akter workflow run {self.id!r}>"

    async def status(self) -> WorkflowStatus:
        """The run's status and step journal."""
        return await self._ops.status(self.id)

    async def signal(self, signal: BaseModel) -> None:
        """Send ``signal`` (a pydantic model) to the run; a ``wf.wait`` of its class takes it.

        Raises:
            ActorError: ``InvalidInput`` when the run has ended (code ``workflow_finished``)
                or does not exist (code ``unknown_workflow_run``).
        """
        await self._ops.signal(self.id, signal)

    async def cancel(self) -> None:
        """Ask the run to cancel: its next durable await raises ``akter.WorkflowCancelled``."""
        await self._ops.cancel(self.id)

    async def result(
        self,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the spec's name)
    ) -> T:
        """Wait for the run to end and return its result.

        Raises:
            TimeoutError: ``timeout`` (seconds) passed first.
            akter.DeclaredError: The workflow raised a declared error (its class and fields).
            akter.WorkflowFailed: The workflow raised another exception.
            akter.WorkflowCancelled: The run was cancelled (or its ``timeout=`` passed).
            akter.WorkflowDiverged: The run is parked as diverged (its code changed).
        """
        limit = None if timeout is None else ms_from_duration(timeout, "timeout") / 1000
        deadline = None if limit is None else time.monotonic() + limit
        wait = 0.005
        while True:
            status = await self._ops.status(self.id, steps=False)
            if status.finished or status.status == "diverged":
                return self._outcome(status)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Workflow run {self.id!r} is still {status.status}.")
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            # Woken at once when the run ends on this runner; else the backoff polls again.
            await self._ops.settled(status.run_id, pause)
            wait = min(wait * 2, 0.5)

    def _outcome(self, status: WorkflowStatus) -> T:
        error = status.error
        if status.status == "completed":
            value = status.result
            return self._result.validate_python(value) if self._result else value  # type: ignore[no-any-return]
        if status.status == "diverged":
            raise WorkflowDiverged(
                f"Workflow run {self.id!r} is parked as diverged: "
                f"{error.message if error else 'its code changed'}"
            )
        if status.status == "cancelled":
            raise WorkflowCancelled(
                error.message if error else f"Workflow run {self.id!r} was cancelled."
            )
        assert error is not None
        if error.tag is not None:
            raise DeclaredError.from_receipt(error.tag, error.fields or {}, error.message)
        raise WorkflowFailed(self.id, error.type, error.message)
