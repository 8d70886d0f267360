"""Operating workflow runs: status, journals, signals, cancels and retries, by run id.

What runs and operators ask of a run that is not running here: :class:`WorkflowOps` is the
``RunOps`` behind every in-process :class:`~akter.workflows.WorkflowRun`, and what the HTTP
routes, the CLI (``akter workflows``) and the console call. It finds a run by its id alone
(``wf_locate``, following the alias a deduplicated keyed start left) and writes through the
workflow gateway; every write that makes a run runnable wakes the relay (``wake``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from akter._ids import uuid7
from akter._json import Unstorable, storable_json
from akter._members import storable_payload
from akter._store.gateway.workflows import (
    RunKey,
    RunListing,
    RunRow,
    StepRow,
    WorkflowsGateway,
)
from akter.callers import ActorRef
from akter.errors import ActorError, invalid_input
from akter.workflows import (
    StepRecordView,
    WorkflowFailure,
    WorkflowRun,
    WorkflowStatus,
    signal_name,
)

if TYPE_CHECKING:
    from akter._engine.services import Registry

#: The error of a diverged run an operator cancelled.
_ABANDONED = WorkflowFailure(
    type="WorkflowCancelled", message="Cancelled while parked as diverged."
).model_dump_json()
#: A run's statuses that have ended (no more steps, signals or cancels).
ENDED = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class RunSummary:
    """One run as operators list it (``akter workflows list``, the console).

    Attributes:
        wake_at_ms: For a suspended run, when it wakes by itself: the end of its sleep or
            wait timeout, capped at its deadline (a run waiting for a signal, a job outcome or
            a cancel alone wakes at the deadline). For a runnable run, since when it is due;
            for a running one, its lease end.
    """

    run_id: str
    actor: ActorRef
    workflow: str
    key: str | None
    status: str
    waiting: str | None
    wake_at_ms: int | None
    deadline_ms: int | None
    cancel_requested: bool
    attempts: int
    started_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None
    error: WorkflowFailure | None

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``--json``, the console)."""
        return {
            "run_id": self.run_id,
            "actor": self.actor.to_json(),
            "workflow": self.workflow,
            "key": self.key,
            "status": self.status,
            "waiting": self.waiting,
            "wake_at_ms": self.wake_at_ms,
            "deadline_ms": self.deadline_ms,
            "cancel_requested": self.cancel_requested,
            "attempts": self.attempts,
            "started_at_ms": self.started_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "finished_at_ms": self.finished_at_ms,
            "error": None if self.error is None else self.error.model_dump(mode="json"),
        }


@dataclass(frozen=True)
class SignalView:
    """A signal sent to a run, as operators see it.

    It is ``pending`` until a wait takes it (``consumed_seq`` is then that wait's step), and
    ``set_aside`` (``consumed_seq`` -1) when it did not validate against the wait of its name.
    """

    signal_id: str
    name: str
    payload: Any
    sent_at_ms: int
    consumed_seq: int | None

    @property
    def state(self) -> str:
        """``pending``, ``consumed`` or ``set_aside``."""
        if self.consumed_seq is None:
            return "pending"
        return "set_aside" if self.consumed_seq < 0 else "consumed"

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``--json``, the console)."""
        return {
            "signal_id": self.signal_id,
            "name": self.name,
            "payload": self.payload,
            "sent_at_ms": self.sent_at_ms,
            "consumed_seq": self.consumed_seq,
            "state": self.state,
        }


@dataclass(frozen=True)
class RunDetail:
    """One run for operators (``akter workflows show``, the console).

    Its status and journal, when it wakes by itself (:attr:`RunSummary.wake_at_ms`) and its
    deadline, and its signals in arrival order.
    """

    status: WorkflowStatus
    wake_at_ms: int | None
    deadline_ms: int | None
    signals: list[SignalView]

    def to_json(self) -> dict[str, Any]:
        """The JSON form (``--json``, the console)."""
        return {
            **self.status.model_dump(mode="json"),
            "actor": self.status.actor.to_json(),
            "wake_at_ms": self.wake_at_ms,
            "deadline_ms": self.deadline_ms,
            "signals": [s.to_json() for s in self.signals],
        }


@dataclass(frozen=True)
class RunLocation:
    """Where a run lives, found by its id alone (:meth:`WorkflowOps.locate`).

    ``run_id`` is the run's own id, also when it was found through the alias a deduplicated
    keyed start left.
    """

    run_id: str
    actor: ActorRef
    workflow: str
    routing_key: int


class WorkflowOps:
    """Runs by id, for their handles, the HTTP routes, the CLI and the console (module docstring).

    Args:
        gateway: The workflow statements.
        registry: The hosted types (an actor's routing key).
        wake: Asks for a relay pass soon (a run became runnable).
    """

    def __init__(
        self, gateway: WorkflowsGateway, registry: Registry, wake: Callable[[], None]
    ) -> None:
        self.gateway = gateway
        self._registry = registry
        self._wake = wake
        # run id -> the event its result() waiters wait on, and how many wait
        self._ends: dict[str, asyncio.Event] = {}
        self._waiting: dict[str, int] = {}

    def run(self, run_id: str) -> WorkflowRun[Any]:
        """A handle to a run by id (``runtime.workflow_run``)."""
        return WorkflowRun(run_id, self)

    async def _locate(self, run_id: str) -> tuple[RunKey, RunRow]:
        row = await self.gateway.locate(run_id)
        if row is None:
            raise ActorError(
                "InvalidInput", f"No workflow run {run_id!r}.", code="unknown_workflow_run"
            )
        return RunKey(row.routing_key, row.run_id), row

    async def locate(self, run_id: str) -> RunLocation | None:
        """Where the run ``run_id`` names lives; ``None`` when there is no such run."""
        row = await self.gateway.locate(run_id)
        if row is None:
            return None
        actor = ActorRef(row.tenant_id, row.actor_type, row.actor_id)
        return RunLocation(row.run_id, actor, row.workflow, row.routing_key)

    async def journal(self, run: RunLocation, after: int = -1) -> WorkflowStatus | None:
        """The run's status with the journal records after ``after``; ``None`` once pruned.

        The run's row is read before its journal: a status that shows the run ended comes with
        every record it wrote.
        """
        key = RunKey(run.routing_key, run.run_id)
        row = await self.gateway.get(key)
        if row is None:
            return None
        return status_of(row, await self.gateway.steps(key, after))

    async def status(self, run_id: str, *, steps: bool = True) -> WorkflowStatus:
        """The run's status and (with ``steps``) its journal (``run.status()``)."""
        run, row = await self._locate(run_id)
        return status_of(row, await self.gateway.steps(run) if steps else [])

    async def settled(self, run_id: str, within: float) -> None:
        """Return once the run may have ended: when it ends on this runner, or after ``within``.

        ``run.result()`` waits here between its reads, so a run that ends on this runner is
        answered at once, and one that ends elsewhere within its polling backoff.
        """
        event = self._ends.setdefault(run_id, asyncio.Event())
        self._waiting[run_id] = self._waiting.get(run_id, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), within)
        except TimeoutError:
            pass
        finally:
            self._waiting[run_id] -= 1
            if not self._waiting[run_id]:
                del self._waiting[run_id]
                self._ends.pop(run_id, None)

    def ended(self, run_id: str) -> None:
        """A run ended on this runner: wake its ``result()`` waiters here."""
        event = self._ends.get(run_id)
        if event is not None:
            event.set()

    async def detail(self, run_id: str) -> RunDetail:
        """The run for operators: status, journal, wake time and signals (RunDetail).

        Raises:
            ActorError: ``InvalidInput`` (``unknown_workflow_run``) when there is no such run.
        """
        run, _ = await self._locate(run_id)
        row = await self.gateway.get(run)
        if row is None:
            raise ActorError(
                "InvalidInput", f"No workflow run {run_id!r}.", code="unknown_workflow_run"
            )
        steps = await self.gateway.steps(run)
        signals = await self.gateway.signals(run)
        return RunDetail(
            status=status_of(row, steps),
            wake_at_ms=row.wake_at_ms,
            deadline_ms=row.deadline_ms,
            signals=[
                SignalView(
                    signal_id=g.signal_id,
                    name=g.name,
                    payload=json.loads(g.payload),
                    sent_at_ms=g.sent_at_ms,
                    consumed_seq=g.consumed_seq,
                )
                for g in signals
            ],
        )

    async def runs(
        self,
        *,
        status: str | None = None,
        actor_type: str | None = None,
        workflow: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
    ) -> list[RunSummary]:
        """Runs across actors for operators, newest first (``akter workflows list``, console)."""
        rows = await self.gateway.list(
            status=status, actor_type=actor_type, workflow=workflow, tenant=tenant, limit=limit
        )
        return [summary_of(r) for r in rows]

    async def actor_runs(self, ref: ActorRef, limit: int = 100) -> list[RunSummary]:
        """One actor's runs for operators, newest first (the console)."""
        rk = self._registry.routing_key(ref)
        rows = await self.gateway.actor_runs(rk, (ref.tenant, ref.type, ref.id), limit)
        return [summary_of(r) for r in rows]

    async def signal(self, run_id: str, signal: BaseModel, signal_id: str | None = None) -> None:
        """Keep ``signal`` for the run (``run.signal``); refused for a finished run."""
        if not isinstance(signal, BaseModel):
            raise invalid_input(f"A signal is a pydantic model instance, not {signal!r}.")
        body = storable_payload(signal, f"signal {signal_name(signal)}")
        await self.signal_json(run_id, signal_name(signal), body, signal_id)

    async def signal_json(
        self, run_id: str, name: str, payload: dict[str, Any], signal_id: str | None = None
    ) -> None:
        """Keep a signal given as JSON (HTTP, the CLI): validated by the wait that takes it.

        Raises:
            ActorError: ``InvalidInput``: the name is not an identifier, the payload is not a
                storable JSON object (``invalid_signal``), the run is unknown
                (``unknown_workflow_run``) or has ended (``workflow_finished``).
        """
        if not isinstance(name, str) or not name.isidentifier() or len(name) > 200:
            raise invalid_input(
                f"A signal name is a class name, not {name!r}.", code="invalid_signal"
            )
        if not isinstance(payload, dict):
            raise invalid_input("A signal's payload is a JSON object.", code="invalid_signal")
        try:
            text = storable_json(payload, "signal")
        except Unstorable as exc:
            raise invalid_input(str(exc), code="invalid_signal") from None
        run, _ = await self._locate(run_id)
        live, _kept = await self.gateway.signal(run, signal_id or uuid7(), name, text)
        if not live:
            raise ActorError(
                "InvalidInput",
                f"Workflow run {run_id!r} has ended; it takes no more signals.",
                code="workflow_finished",
            )
        self._wake()

    async def cancel(self, run_id: str) -> None:
        """Ask the run to cancel (``run.cancel``); a diverged run ends cancelled at once."""
        run, row = await self._locate(run_id)
        if row.status == "diverged":
            await self.gateway.abandon_diverged(run, _ABANDONED)
            return
        if await self.gateway.cancel(run):
            self._wake()

    async def operator_cancel(self, run_id: str) -> str:
        """Cancel for operators (``akter workflows cancel``): refused for an ended run.

        Returns:
            ``"requested"`` (the run's next durable await raises ``WorkflowCancelled``) or
            ``"cancelled"`` (a diverged run ended at once, without running again).

        Raises:
            ActorError: ``InvalidInput``: no such run (``unknown_workflow_run``), or it has
                ended (``workflow_finished``).
        """
        run, row = await self._locate(run_id)
        if row.status == "diverged":
            if await self.gateway.abandon_diverged(run, _ABANDONED):
                return "cancelled"
        elif await self.gateway.cancel(run):
            self._wake()
            return "requested"
        current = await self.gateway.get(run)
        status = current.status if current else "gone"
        raise ActorError(
            "InvalidInput",
            f"Workflow run {run_id!r} has ended ({status}); there is nothing to cancel.",
            code="workflow_finished",
        )

    async def retry(self, run_id: str) -> bool:
        """Make a diverged run runnable again (``akter workflows retry``)."""
        run, _ = await self._locate(run_id)
        retried = await self.gateway.retry(run)
        if retried:
            self._wake()
        return retried

    # --- deliveries from the relay ----------------------------------------------------------


def summary_of(row: RunListing) -> RunSummary:
    """A listed run's row as a :class:`RunSummary`."""
    return RunSummary(
        run_id=row.run_id,
        actor=ActorRef(row.tenant_id, row.actor_type, row.actor_id),
        workflow=row.workflow,
        key=row.run_key,
        status=row.status,
        waiting=row.waiting,
        wake_at_ms=row.wake_at_ms,
        deadline_ms=row.deadline_ms,
        cancel_requested=row.cancel_requested,
        attempts=row.attempts,
        started_at_ms=row.started_at_ms,
        updated_at_ms=row.updated_at_ms,
        finished_at_ms=row.finished_at_ms,
        error=WorkflowFailure.model_validate_json(row.error) if row.error else None,
    )


def status_of(row: RunRow, steps: list[StepRow]) -> WorkflowStatus:
    """A run's row and journal as a :class:`WorkflowStatus`."""
    error = WorkflowFailure.model_validate_json(row.error) if row.error else None
    return WorkflowStatus(
        run_id=row.run_id,
        workflow=row.workflow,
        actor=ActorRef(row.tenant_id, row.actor_type, row.actor_id),
        key=row.run_key,
        status=row.status,
        waiting=row.waiting,
        cancel_requested=row.cancel_requested,
        attempts=row.attempts,
        result=None if row.result is None else json.loads(row.result),
        error=error,
        started_at_ms=row.started_at_ms,
        updated_at_ms=row.updated_at_ms,
        finished_at_ms=row.finished_at_ms,
        steps=[
            StepRecordView(
                seq=s.seq,
                kind=s.kind,
                name=s.name,
                status=s.status,
                detail=s.detail,
                outcome=None if s.outcome is None else json.loads(s.outcome),
                started_at_ms=s.started_at_ms,
                recorded_at_ms=s.recorded_at_ms,
            )
            for s in steps
        ],
    )


__all__ = [
    "ENDED",
    "RunDetail",
    "RunLocation",
    "RunSummary",
    "SignalView",
    "WorkflowOps",
    "status_of",
    "summary_of",
]
