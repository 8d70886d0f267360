"""One attempt of a workflow run: the function re-run from the top against its journal.

The attempt is the ``wf`` context's :class:`~akter.workflows.StepDriver`. Each durable await
takes the next ``seq``. A journal record at that seq answers the step without doing anything
(its kind and name must match the code's, else the run *diverged*, W5). Past the journal the
step is performed and recorded, each record guarded by the attempt's token:

- a command step writes a ``pending`` record with a fresh command id, its target actor and the
  hash of its arguments first, then runs the turn with that id; its outcome is written with the
  next record (the next step's, or the run's suspension or end), so a command step costs one
  write beside its turn: a crash before that write leaves it pending, and the resumed run
  replays the receipt under the same id, at the same actor. A query step's answer is written the
  same way, with its target and arguments' hash (a crash before it lets the query run again);
- a job step stages the job row with its ``pending`` record in one transaction, then suspends;
  the job's settle routes its outcome to the step (``$workflow.job``) and wakes the run;
- a sleep or a signal wait records its wake time as ``pending`` and suspends until then;
- a local step (``wf.step``) runs, then records (at least once);
- recorded values (``now``, ``uuid4``, ``random``) and ``patched`` markers are buffered and
  written with the next record, before any effect that could depend on them.

A replayed step is the code's step only when its kind and name match the record's and, where
the record holds them, its target actor and arguments' hash (:func:`args_digest`): any difference
parks the run as *diverged* (W5), naming the seq and both sides. Records written by older code
lack the hash (and a query's its target): what the record holds is compared, nothing more. A
pending command step that no longer matches is never sent anywhere: its recorded target's
receipt is looked up first, and the divergence says whether the recorded command was applied.

Control leaves the user's code through ``BaseException`` subclasses (``except Exception`` in a
workflow cannot swallow them): :class:`Suspend`, :class:`Diverged`, :class:`Outage` and
:class:`LeaseLost` (:mod:`akter._engine.workflows.control`). The executor
(:mod:`akter._engine.workflows.engine`) decides what each means.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from akter import telemetry
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
    Suspend,
    durable,
)
from akter._ids import canonical_json, payload_hash
from akter._json import Unstorable, storable_json
from akter._staging import framework_id
from akter._store.gateway.workflows import JournalRow, OutboxRow, StepRecord
from akter.callers import ActorRef, System, caller_to_json
from akter.errors import (
    ActorError,
    DeclaredError,
    JobCancelled,
    JobDeadLettered,
    StepFailed,
    WorkflowCancelled,
    invalid_input,
)
from akter.jobs import Cancelled, DeadLetter, Job
from akter.workflows import signal_name

if TYPE_CHECKING:
    from akter._engine.services import Services
    from akter._store.gateway.workflows import WorkflowsGateway
    from akter.actor import Member
    from akter.workflows import WorkflowMember

log = logging.getLogger("akter.workflows")


@dataclass
class RunAttempt:
    """One attempt of a claimed run (module docstring): the ``wf`` context's driver."""

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
                rec = Record(
                    row.seq,
                    row.kind,
                    row.name,
                    row.status,
                    row.detail,
                    row.outcome,
                )
                self.journal[rec.seq] = rec
                if rec.kind == "cancel":
                    self.cancel_delivered = True
            else:
                self.signals.append(PendingSignal(str(row.detail), row.name, str(row.outcome)))

    # --- sequencing -------------------------------------------------------------------------

    def _next(self, kind: str, name: str, *, durable: bool = True) -> tuple[int, Record | None]:
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
            self.buffered.append(StepRecord(seq, "cancel", "cancel", "done"))
            raise WorkflowCancelled(self._cancel_message())
        if rec is not None:
            if rec.kind == "cancel":
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
            self.buffered.append(StepRecord(seq, "cancel", "cancel", "done"))
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

    @durable
    async def command(
        self, member: Member, ref: ActorRef, body: dict[str, Any], pinned: str | None, fence: Any
    ) -> Any:
        """A command step (the handle transport's entry)."""
        name = f"{ref.type}.{member.name}"
        seq, rec = self._next("command", name)
        args = args_digest(member.args_model, body)
        if rec is not None:
            await self._same_call(seq, rec, name, ref, args)
            if rec.status == "done":
                return self._replay_call(member, rec)
            command_id = str(json.loads(rec.detail or "{}")["command_id"])
        else:
            command_id = self.calls.mint_command_id()
            detail = canonical_json(
                {"command_id": command_id, "actor": ref.to_json(), "args": args}
            )
            await self._record(StepRecord(seq, "command", name, "pending", detail))
        return await self._call(
            seq, "command", name, member, ref, body, command_id, replaying=rec is not None
        )

    @durable
    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """A query step: its answer is recorded, so a replay sees the same value."""
        name = f"{ref.type}.{member.name}"
        seq, rec = self._next("query", name)
        args = args_digest(member.args_model, body)
        if rec is not None:
            await self._same_call(seq, rec, name, ref, args)
            if rec.status == "done":
                return self._replay_call(member, rec)
        detail = canonical_json({"actor": ref.to_json(), "args": args})
        return await self._call(seq, "query", name, member, ref, body, None, detail=detail)

    async def _same_call(self, seq: int, rec: Record, name: str, ref: ActorRef, args: str) -> None:
        """A recorded command or query step must target the same actor with the same arguments.

        Compares what the record holds (older records lack the arguments' hash, and a query's
        its target). A pending command step that differs is resolved against its *recorded*
        target first (a receipt lookup, nothing sent), and the run is parked.

        Raises:
            Diverged: The code's call differs from the record's (W5).
        """
        recorded = _detail(rec)
        was_actor, was_args = recorded.get("actor"), recorded.get("args")
        now_actor = ref.to_json()
        if (was_actor is None or was_actor == now_actor) and (was_args is None or was_args == args):
            return
        was = _describe(rec.kind, name, was_actor, was_args)
        now = _describe(rec.kind, name, now_actor if was_actor is not None else None, args)
        resolution = ""
        if rec.kind == "command" and rec.status == "pending":
            resolution = " " + await self._resolve_pending(rec, was_actor)
        raise Diverged(
            f"Step {seq} of workflow run {self.run_id!r} was recorded as {was}, but the code now "
            f"asks for {now}; the run is parked.{resolution} Restore the call (or guard the "
            f"change with wf.patched()), then 'akter workflows retry {self.run_id}', or cancel "
            "the run."
        )

    async def _resolve_pending(self, rec: Record, actor: Any) -> str:
        """Whether a pending command step's recorded command was applied at its recorded target."""
        recorded = _detail(rec)
        command_id = recorded.get("command_id")
        if not isinstance(actor, dict) or not isinstance(command_id, str):
            return "Nothing was sent."
        where = ActorRef(str(actor["tenant"]), str(actor["type"]), str(actor["id"]))
        try:
            routing_key = self.services.registry.routing_key(where)
        except Exception:
            return (
                f"Nothing was sent; whether command {command_id} was applied to "
                f"{_actor_text(actor)} is unknown (its type is not declared by this code)."
            )
        try:
            found = await self.gateway.step_receipt(routing_key, where, command_id)
        except (psycopg.Error, OSError) as exc:
            raise Outage(f"The receipt of a pending command step could not be read: {exc}") from exc
        if found:
            return (
                f"Nothing was sent; the recorded command {command_id} was applied to "
                f"{_actor_text(actor)} once (its receipt is there)."
            )
        return (
            f"Nothing was sent; the recorded command {command_id} was not applied to "
            f"{_actor_text(actor)} (no receipt yet)."
        )

    def events(self, ref: ActorRef, after: str | None, limit: int) -> Any:
        """Event feeds are not steps."""
        raise invalid_input("A workflow's handles have no event feed; read events in a step.")

    async def _call(
        self,
        seq: int,
        kind: str,
        name: str,
        member: Member,
        ref: ActorRef,
        body: dict[str, Any],
        command_id: str | None,
        *,
        replaying: bool = False,
        detail: str | None = None,
    ) -> Any:
        with telemetry.workflow_step(kind, name, seq):
            try:
                if command_id is not None:
                    value = await _settled(
                        self.calls.command(
                            member, ref, body, command_id, self._caller(), retry=True
                        )
                    )
                else:
                    value = await self.calls.query(member, ref, body, self._caller())
            except DeclaredError as exc:
                outcome = {
                    "declared": {"tag": type(exc).tag, "fields": exc.fields, "message": str(exc)}
                }
                self.buffered.append(
                    StepRecord(seq, kind, name, "done", detail, canonical_json(outcome))
                )
                raise
            except ActorError as exc:
                if exc.retryable:
                    raise Outage(f"{name} is unavailable: {exc}") from exc
                if replaying and exc.reason == "CommandConflict":
                    # A record written before arguments were hashed: the receipt tells.
                    raise Diverged(
                        f"Step {seq} of workflow run {self.run_id!r} was recorded as command "
                        f"{name!r} with other arguments than the code now passes; the run is "
                        "parked. Nothing was applied again. Restore the call (or guard the "
                        f"change with wf.patched()), then 'akter workflows retry {self.run_id}', "
                        "or cancel the run."
                    ) from None
                refused = {"reason": exc.reason, "code": exc.code, "message": exc.message}
                self.buffered.append(
                    StepRecord(
                        seq, kind, name, "done", detail, canonical_json({"refused": refused})
                    )
                )
                raise
            except (psycopg.Error, OSError) as exc:
                raise Outage(f"{name} failed: {exc}") from exc
            stored = self._encode({"ok": member.result.dump_python(value, mode="json")}, name)
            # Written with the next record (the next step's, or the run's suspension or end): until
            # then a crash leaves the step pending, and its command id replays the receipt.
            self.buffered.append(StepRecord(seq, kind, name, "done", detail, stored))
            return member.result.validate_python(json.loads(stored)["ok"])

    def _replay_call(self, member: Member, rec: Record) -> Any:
        outcome = json.loads(rec.outcome or "null")
        if "ok" in outcome:
            return member.result.validate_python(outcome["ok"])
        if "declared" in outcome:
            d = outcome["declared"]
            raise DeclaredError.from_receipt(d["tag"], d["fields"], d.get("message"))
        refused = outcome["refused"]
        raise ActorError(refused["reason"], refused["message"], code=refused.get("code"))

    # --- job steps --------------------------------------------------------------------------

    @durable
    async def job(self, job: Job[Any, Any], payload: BaseModel) -> Any:
        """A job step: staged with its pending record, then a suspension until its outcome."""
        definition = self.services.registry.definition(self.ref.type)
        if not isinstance(job, Job) or job.owner is not definition:
            raise invalid_input(
                f"wf.job() takes a job of {definition.name!r} (the workflow's actor type), "
                f"not {job!r}."
            )
        seq, rec = self._next("job", job.name)
        body = job.validate_payload(payload)
        assert job.payload_model is not None
        args = args_digest(job.payload_model, body)
        if rec is not None:
            was_args = _detail(rec).get("args")
            if was_args is not None and was_args != args:
                raise Diverged(
                    f"Step {seq} of workflow run {self.run_id!r} was recorded as "
                    f"{_describe('job', job.name, None, was_args)}, but the code now asks for "
                    f"{_describe('job', job.name, None, args)}; the run is parked. Restore the "
                    f"call (or guard the change with wf.patched()), then 'akter workflows retry "
                    f"{self.run_id}', or cancel the run."
                )
        if rec is not None and rec.status == "done":
            return _replay_job(job, rec)
        if rec is not None and self._cancelling():
            return await self._cancel_job(seq, job, rec)
        if rec is None:
            policy = definition.policy
            job_id = framework_id(
                self._now(), 0, None, policy.execution_timeout, self.services.config.window_ms
            )
            row = OutboxRow(
                intent_id=job_id,
                kind="job",
                tenant=self.ref.tenant,
                actor_type=self.ref.type,
                actor_id=self.ref.id,
                command=job.name,
                payload=canonical_json(body),
                caller=caller_to_json(self._caller((self.run_id, seq))),
                payload_version=job.version,
                priority=job.options.priority,
                max_wait_ms=job.options.max_wait_ms,
                capped=job.options.per_actor is not None,
            )
            detail = canonical_json({"job_id": job_id, "args": args})
            with telemetry.workflow_step("job", job.name, seq):
                await self._record(
                    StepRecord(seq, "job", job.name, "pending", detail), outbox=(row,)
                )
            self.services.metrics.count("akter.outbox.staged", kind="job")
        else:
            job_id = str(json.loads(rec.detail or "{}").get("job_id", "?"))
        raise Suspend(None, f"job {job.name} {job_id}")

    async def _cancel_job(self, seq: int, job: Job[Any, Any], rec: Record) -> Any:
        """A cancel (or the deadline) reaches a run suspended at a job step: cancel the job.

        As a turn's ``cancel_job`` (semantics §5.8): a job that never ran is deleted (it never
        runs; the cancel record holds its ``Failed`` report at once); an attempted one is
        marked cancelled, a running attempt here interrupted, and its one settle records the
        job's outcome on the cancel record. The job's cancellation and the cancel record are
        one write. When the job's outcome was recorded at the step meanwhile, it is answered
        instead, and the cancel reaches the next durable await.

        Raises:
            WorkflowCancelled: the job was cancelled.
        """
        job_id = str(json.loads(rec.detail or "{}")["job_id"])
        message = self._cancel_message()
        detail = canonical_json({"job_id": job_id, "job": job.name})

        def never_ran(payload: str) -> str:
            report = {
                "job_id": job_id,
                "job": json.loads(payload),
                "attempts": 0,
                "outcome": {"kind": "Failed", "cause": "Cancelled before it ran: " + message},
                "ambiguous": False,
            }
            return canonical_json({"cancelled": report})

        info = {"run_id": self.run_id, "seqs": [r.seq for r in self.buffered] + [seq]}
        await self.services.hooks.at("before_step_record", info)
        try:
            done = await self.gateway.cancel_job_step(
                self.claimed.run,
                self.claimed.token,
                self.services.config.workflow_lease_ms,
                self.buffered,
                StepRecord(seq, "cancel", "cancel", "done", detail),
                job_id,
                never_ran,
            )
        except (psycopg.Error, OSError) as exc:
            raise Outage(f"The cancel of job step {seq} could not be written: {exc}") from exc
        if done.status == "lost":
            raise LeaseLost(self.run_id)
        if done.status == "arrived":
            now = done.record
            if now is None or now.kind != "job" or now.outcome is None:
                raise Outage(f"Job step {seq} changed under this attempt: {now}")
            arrived = Record(seq, "job", job.name, "done", rec.detail, now.outcome)
            return _replay_job(job, arrived)
        self.buffered.clear()
        self.cancel_delivered = True
        await self.services.hooks.at("after_step_record", info)
        if done.running:
            self.cancel_jobs([job_id])  # elsewhere the attempt notices at its next renewal
        if not done.deleted:
            self.wake()  # a cancelled row not running is settled by the next job claim
        log.info(
            "Workflow run cancelled at a job step; its job is cancelled",
            extra={"run_id": self.run_id, "job_id": job_id, "never_ran": done.deleted},
        )
        raise WorkflowCancelled(message)

    # --- sleeps and waits -------------------------------------------------------------------

    @durable
    async def sleep(self, delay_ms: int | None, until_ms: int | None) -> None:
        """A durable timer: its end recorded as pending, then a suspension until it passes."""
        seq, rec = self._next("sleep", "sleep")
        if rec is not None and rec.status == "done":
            return
        if rec is not None:
            until = int(json.loads(rec.detail or "{}")["until"])
        else:
            until = until_ms if until_ms is not None else self._now() + (delay_ms or 0)
            if until > self._now():
                detail = canonical_json({"until": until})
                await self._record(StepRecord(seq, "sleep", "sleep", "pending", detail))
        if self._now() >= until:
            self.buffered.append(
                StepRecord(seq, "sleep", "sleep", "done", canonical_json({"until": until}))
            )
            return
        raise Suspend(until, f"sleep until {until}")

    @durable
    async def wait(self, signal: type[BaseModel], timeout_ms: int | None) -> Any:
        """A signal wait: the oldest unconsumed signal of the class, or a suspension."""
        name = signal_name(signal)
        seq, rec = self._next("wait", name)
        if rec is not None and rec.status == "done":
            payload = json.loads(rec.outcome or "null")["signal"]
            return None if payload is None else signal.model_validate(payload)
        if rec is not None:
            until = json.loads(rec.detail or "{}").get("until")
        else:
            until = None if timeout_ms is None else self._now() + timeout_ms
        rejected: list[tuple[str, int]] = []
        for found in [s for s in self.signals if s.name == name]:
            self.signals.remove(found)
            try:
                value = signal.model_validate_json(found.payload)
            except ValidationError as exc:
                # Set aside (consumed at seq -1), never fatal: a sender's bad payload must not
                # end the run. The journal keeps it for operators.
                log.warning(
                    "Workflow signal does not validate; set aside",
                    extra={"run_id": self.run_id, "signal_id": found.signal_id, "error": str(exc)},
                )
                rejected.append((found.signal_id, -1))
                continue
            outcome = canonical_json({"signal": json.loads(found.payload)})
            await self._record(
                StepRecord(seq, "wait", name, "done", None, outcome),
                consumed=(*rejected, (found.signal_id, seq)),
            )
            return value
        if until is not None and self._now() >= until:
            await self._record(
                StepRecord(seq, "wait", name, "done", None, canonical_json({"signal": None})),
                consumed=tuple(rejected),
            )
            return None
        if rec is None or rejected:
            await self._record(
                StepRecord(seq, "wait", name, "pending", canonical_json({"until": until})),
                consumed=tuple(rejected),
            )
        raise Suspend(until, f"signal {name}")

    # --- local steps, values, markers -------------------------------------------------------

    @durable
    async def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        attempts: int,
        backoff: tuple[float, float],
    ) -> Any:
        """A local function step: run, then record (at least once)."""
        name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        adapter = _result_adapter(fn)
        seq, rec = self._next("step", name)
        if rec is not None:
            outcome = json.loads(rec.outcome or "null")
            if "failed" in outcome:
                failed = outcome["failed"]
                raise StepFailed(name, int(failed["attempts"]), str(failed["cause"]))
            return adapter.validate_python(outcome["ok"])
        await self.flush()  # values its arguments came from are recorded before the call
        with telemetry.workflow_step("step", name, seq):
            return await self._run_step(seq, name, fn, args, attempts, backoff, adapter)

    async def _run_step(
        self,
        seq: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        attempts: int,
        backoff: tuple[float, float],
        adapter: TypeAdapter[Any],
    ) -> Any:
        started = time.monotonic()
        delay, cause = backoff[0], ""
        for attempt in range(1, attempts + 1):
            try:
                if inspect.iscoroutinefunction(fn):
                    value = await fn(*args)
                else:
                    value = await asyncio.to_thread(fn, *args)
                    if inspect.isawaitable(value):
                        value = await value
                break
            except Exception as exc:
                cause = f"{type(exc).__name__}: {exc}"
                log.info(
                    "Workflow step attempt failed",
                    extra={"run_id": self.run_id, "step": name, "attempt": attempt},
                )
                if attempt < attempts:
                    await asyncio.sleep(delay)
                    delay = min(backoff[1], max(delay * 2, 0.001))
        else:
            failed = {"failed": {"attempts": attempts, "cause": cause}}
            await self._record(StepRecord(seq, "step", name, "done", None, canonical_json(failed)))
            raise StepFailed(name, attempts, cause)
        self.services.metrics.observe(
            "akter.workflow.step.duration_ms", (time.monotonic() - started) * 1000
        )
        try:
            dumped = adapter.dump_python(value, mode="json")
        except Exception as exc:
            raise Fatal(f"The result of step {name!r} is not JSON: {exc}") from None
        stored = self._encode({"ok": dumped}, f"step {name!r}")
        await self._record(StepRecord(seq, "step", name, "done", None, stored))
        return adapter.validate_python(json.loads(stored)["ok"])

    def value(self, kind: str, make: Callable[[], Any], adapter: TypeAdapter[Any]) -> Any:
        """A recorded value: the journal's on replay, else made now and buffered."""
        seq, rec = self._next("value", kind, durable=False)
        if rec is not None:
            return adapter.validate_python(json.loads(rec.outcome or "null")["ok"])
        value = make()
        stored = canonical_json({"ok": adapter.dump_python(value, mode="json")})
        self.buffered.append(StepRecord(seq, "value", kind, "done", None, stored))
        return adapter.validate_python(json.loads(stored)["ok"])

    def patched(self, marker: str) -> bool:
        """A version marker (W5): recorded where new code first meets it."""
        rec = self.journal.get(self.seq)
        if rec is None:
            self.buffered.append(StepRecord(self.seq, "patch", marker, "done"))
            self.seq += 1
            return True
        if rec.kind == "patch" and rec.name == marker:
            self.seq += 1
            return True
        return False


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


def _detail(rec: Record) -> dict[str, Any]:
    try:
        detail = json.loads(rec.detail or "{}")
    except ValueError:
        return {}
    return detail if isinstance(detail, dict) else {}


def _actor_text(actor: Any) -> str:
    if not isinstance(actor, dict):
        return "?"
    return f"{actor.get('type')}({actor.get('id')!r}, tenant {actor.get('tenant')!r})"


def _describe(kind: str, name: str, actor: Any, args: Any) -> str:
    text = f"{kind} {name!r}"
    if actor is not None:
        text += f" to {_actor_text(actor)}"
    if args is not None:
        text += f" with arguments #{args}"
    return text


def _result_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    return TypeAdapter(hints.get("return", Any))


def _replay_job(job: Job[Any, Any], rec: Record) -> Any:
    outcome = json.loads(rec.outcome or "null")
    if "ok" in outcome:
        return _job_result(job).validate_python(outcome["ok"])
    if "dead_letter" in outcome:
        raise JobDeadLettered(DeadLetter[Any].model_validate(outcome["dead_letter"]))
    raise JobCancelled(Cancelled[Any, Any].model_validate(outcome["cancelled"]))


def _job_result(job: Job[Any, Any]) -> TypeAdapter[Any]:
    return job.result


__all__ = ["RunAttempt", "args_digest"]


async def _settled(call: typing.Coroutine[Any, Any, Any]) -> Any:
    """Await a command step's call to its end, even when the attempt is cancelled meanwhile.

    A runner that stops cancels its attempts and releases their runs at once, so that another
    runner resumes them. A command already on its way (queued in the mailbox, or in its turn)
    would still commit after that release, and the resumed run would find no receipt for it:
    with changed code, the run is parked saying the command was not applied while it was. So a
    cancelled attempt first waits for the command's answer (bounded by the call's own retry
    deadline; the lease is still renewed meanwhile), then lets the cancellation go on. A second
    cancellation is not held back.
    """
    task = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the attempt is cancelled whatever the command answered
        raise
