"""A workflow run attempt's journal: its claim, the next seq, and the writes of its records.

:class:`Journal` is what every kind of step stands on (:mod:`akter._engine.workflows.run`): each
durable await takes the next seq (:meth:`Journal._next`), which answers from the record there,
parks the run as *diverged* when that record is another step (W5), or raises
``WorkflowCancelled`` where a cancellation (or the run's deadline) reaches the code. Records
are written under the attempt's token (:meth:`Journal._record`); recorded values and markers are
buffered and go with the next write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from akter._engine.workflows.control import (
    MAX_OUTCOME_BYTES,
    MAX_STEPS,
    SUSPENDING,
    Claimed,
    Control,
    Diverged,
    Fatal,
    HandleFactory,
    LeaseLost,
    Outage,
    PendingSignal,
    Record,
    StepsCalls,
)
from akter._ids import payload_hash
from akter._json import Unstorable, storable_json
from akter._kinds import StepKind
from akter._store.gateway.workflows import JournalRow, OutboxRow, StepRecord
from akter.callers import ActorRef, System
from akter.errors import WorkflowCancelled

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter._store.gateway.workflows import WorkflowsGateway
    from akter.workflows import WorkflowMember


@dataclass
class Journal:
    """The state of one attempt of a claimed run and its journal (module docstring)."""

    calls_internal = True  # its handles' calls are steps, made by a System caller

    services: Services
    gateway: WorkflowsGateway
    calls: StepsCalls
    make_handle: HandleFactory
    claimed: Claimed
    member: WorkflowMember[Any, Any]
    journal: dict[int, Record] = field(default_factory=dict)
    signals: list[PendingSignal] = field(default_factory=list)
    seq: int = 0
    buffered: list[StepRecord] = field(default_factory=list)
    #: Set once WorkflowCancelled was raised into the code (recorded as a ``cancel`` step).
    cancel_delivered: bool = False
    #: Set when the attempt raised WorkflowCancelled at a cancellation recorded earlier.
    replayed_cancel: bool = False
    #: The control exception that ended the attempt, raised again by any later step.
    halted: Control | None = None
    #: A durable step is under way (steps run one at a time).
    in_step: bool = False
    #: This runner's cancellation signal for running job attempts (a job step's cancel).
    cancel_jobs: Callable[[list[str]], None] = lambda job_ids: None
    #: Asks the relay for a pass soon (a cancelled job row to settle).
    wake: Callable[[], None] = lambda: None

    # --- the StepDriver's identity ----------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.claimed.run.run_id

    @property
    def ref(self) -> ActorRef:
        """The workflow's actor."""
        return self.claimed.ref

    @property
    def workflow(self) -> str:
        """The workflow's name."""
        return self.claimed.workflow

    def load(self, rows: list[JournalRow]) -> None:
        """Take the journal and pending signals from ``wf_journal``'s rows."""
        for row in rows:
            if row.what == "step":
                assert row.seq is not None  # a journal record always has its seq
                rec = Record(row.seq, row.kind, row.name, row.status, row.detail, row.outcome)
                self.journal[rec.seq] = rec
                if rec.kind == StepKind.CANCEL:
                    self.cancel_delivered = True
            else:
                self.signals.append(PendingSignal(str(row.detail), row.name, str(row.outcome)))

    # --- sequencing -------------------------------------------------------------------------

    def _next(
        self, kind: StepKind, name: str, *, durable: bool = True
    ) -> tuple[int, Record | None]:
        """Take the next seq; the record there, if any, after the divergence and cancel checks.

        Raises:
            WorkflowCancelled: a cancellation recorded at this seq (replay), or a requested one
                reached past the journal (recorded now); only for ``durable`` steps.
            Diverged: the journal's record here is another step.
        """
        seq = self.seq
        self.seq += 1
        rec = self.journal.get(seq)
        if (
            rec is not None
            and durable
            and rec.status == "pending"
            and rec.kind in SUSPENDING
            and self._cancelling()
        ):
            # A cancel reaches a run suspended here: the pending record becomes the cancel.
            self.cancel_delivered = True
            self.buffered.append(StepRecord(seq, StepKind.CANCEL, "cancel", "done"))
            raise WorkflowCancelled(self._cancel_message())
        if rec is not None:
            if rec.kind == StepKind.CANCEL:
                self.replayed_cancel = True
                raise WorkflowCancelled(self._cancel_message())
            if (rec.kind, rec.name) != (kind, name):
                raise Diverged(
                    f"Step {seq} of workflow run {self.run_id!r} was recorded as {rec.kind} "
                    f"{rec.name!r}, but the code now asks for {kind} {name!r}; the run is "
                    "parked. Restore the code's order (or guard the change with wf.patched()), "
                    f"then 'akter workflows retry {self.run_id}', or cancel the run."
                )
            return seq, rec
        if seq >= MAX_STEPS:
            raise Fatal(f"The run reached the limit of {MAX_STEPS} steps.")
        if durable and self._cancelling():
            self.cancel_delivered = True
            self.buffered.append(StepRecord(seq, StepKind.CANCEL, "cancel", "done"))
            raise WorkflowCancelled(self._cancel_message())
        return seq, None

    def _cancelling(self) -> bool:
        if self.cancel_delivered:
            return False
        deadline = self.claimed.deadline_ms
        timed_out = deadline is not None and self._now() >= deadline
        return self.claimed.cancel_requested or timed_out

    def _cancel_message(self) -> str:
        deadline = self.claimed.deadline_ms
        if not self.claimed.cancel_requested and deadline is not None and self._now() >= deadline:
            return f"Workflow run {self.run_id!r} timed out (timeout= of {self.workflow})."
        return f"Workflow run {self.run_id!r} was cancelled."

    def _now(self) -> int:
        return self.services.clock.estimate()

    # --- writing ----------------------------------------------------------------------------

    async def _record(
        self,
        *records: StepRecord,
        consumed: tuple[tuple[str, int], ...] = (),
        outbox: tuple[OutboxRow, ...] = (),
    ) -> None:
        """Write the buffered records and ``records`` under the attempt's token."""
        batch = [*self.buffered, *records]
        info = {"run_id": self.run_id, "seqs": [r.seq for r in batch]}
        await self.services.hooks.at("before_step_record", info)
        try:
            held = await self.gateway.record(
                self.claimed.run,
                self.claimed.token,
                self.services.config.workflow_lease_ms,
                batch,
                consumed=consumed,
                outbox=outbox,
            )
        except (psycopg.Error, OSError) as exc:
            raise Outage(f"A step record failed: {exc}") from exc
        if not held:
            raise LeaseLost(self.run_id)
        self.buffered.clear()
        await self.services.hooks.at("after_step_record", info)

    async def flush(self) -> None:
        """Write buffered records now (before a local step runs)."""
        if self.buffered:
            await self._record()

    async def handover(self) -> list[StepRecord]:
        """Take the buffered records for the suspension or end that writes them.

        The ``before_step_record`` fault point fires here, as before any record write.
        """
        if not self.buffered:
            return []
        batch = list(self.buffered)
        info = {"run_id": self.run_id, "seqs": [r.seq for r in batch]}
        await self.services.hooks.at("before_step_record", info)
        self.buffered.clear()
        return batch

    def _encode(self, value: Any, what: str) -> str:
        try:
            text = storable_json(value, what)
        except Unstorable as exc:
            raise Fatal(f"The outcome of {what} cannot be stored: {exc}") from None
        if len(text.encode()) > MAX_OUTCOME_BYTES:
            raise Fatal(f"The outcome of {what} is larger than 1 MiB ({len(text.encode())} bytes).")
        return text

    # --- command and query steps ------------------------------------------------------------

    def handle(self, actor: type[Any], id: str, tenant: str | None) -> Any:
        """``wf.get(X, id)``: a handle whose calls are steps."""
        registry = self.services.registry
        ref = registry.ref(actor, id, tenant=tenant or self.ref.tenant)
        return self.make_handle(self, registry.definition(ref.type), ref)

    def _caller(self, workflow: tuple[str, int] | None = None) -> System:
        from akter.callers import caller_from_json, principal_of

        starter = caller_from_json(self.claimed.caller)
        return System(
            source="workflow",
            ref=self.ref,
            on_behalf_of=principal_of(starter),
            workflow=workflow,
        )


def args_digest(model: type[BaseModel], body: dict[str, Any]) -> str:
    """The hash a step's record keeps of its arguments: those that differ from their default.

    A parameter left at its default is left out, so code that adds a parameter with a default
    (and passes nothing for it) calls with the same arguments as the record's.
    """
    explicit: dict[str, Any] = {}
    for key, value in body.items():
        info = model.model_fields.get(key)
        if info is not None and not info.is_required():
            try:
                default = to_jsonable_python(info.get_default(call_default_factory=True))
            except Exception:
                default = _NO_DEFAULT
            if default == value:
                continue
        explicit[key] = value
    return payload_hash(explicit)[:16]


_NO_DEFAULT = object()


def record_detail(rec: Record) -> dict[str, Any]:
    try:
        detail = json.loads(rec.detail or "{}")
    except ValueError:
        return {}
    return detail if isinstance(detail, dict) else {}


def actor_text(actor: Any) -> str:
    if not isinstance(actor, dict):
        return "?"
    return f"{actor.get('type')}({actor.get('id')!r}, tenant {actor.get('tenant')!r})"


def describe_call(kind: str, name: str, actor: Any, args: Any) -> str:
    text = f"{kind} {name!r}"
    if actor is not None:
        text += f" to {actor_text(actor)}"
    if args is not None:
        text += f" with arguments #{args}"
    return text
