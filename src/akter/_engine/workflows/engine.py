"""The workflow engine: starts runs, claims runnable ones, runs attempts, takes their wakes.

A run is claimed with a lease (``workflow_lease``) by any runner hosting its actor type, in each
pass of the pass loop beside intents and jobs, and run from the top against its journal
(:mod:`akter._engine.workflows.run`). While the function runs the lease is renewed every third of
it. When the function awaits what is not there yet, the run is suspended: its wake time (a sleep
or a timeout; none for a signal or a job outcome) is written, the lease is released and the
coroutine is dropped, so **a suspended run holds no runner, task or connection**. A signal, a
job outcome or a cancel makes it runnable; a runner that dies mid-run loses its lease, and the
next claim after the lease end resumes the run.

A turn's ``self.start_workflow`` writes its run in the turn's own commit flight
(``wf_start_in_turn``). Other work staged by turns reaches the engine as outbox intents to the
run's (or the sender's) actor, delivered by the relay instead of a command:
``$workflow.signal`` (``self.signal``), ``$workflow.cancel`` (``self.cancel_workflow``) and
``$workflow.job`` (a job step's outcome, written by the job's settle); ``$workflow.start`` is
still taken, from intents staged by older code.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from akter import telemetry
from akter._engine import lanes
from akter._engine.calls import check_access
from akter._engine.workflows import endings
from akter._engine.workflows.control import (
    Claimed,
    Diverged,
    HandleFactory,
    LeaseLost,
    Outage,
    StepsCalls,
    Suspend,
)
from akter._engine.workflows.ops import WorkflowOps
from akter._engine.workflows.run import RunAttempt
from akter._ids import canonical_json, parse_command_id, payload_hash
from akter._json import storable_json
from akter._kinds import RowKind, WorkflowCommand
from akter._members import refuse_internal
from akter._staging import framework_id
from akter._store.gateway.workflows import OutboxRow, RunKey, WorkflowsGateway
from akter.callers import ActorRef, Caller, System, caller_from_json, caller_to_json, current_caller
from akter.errors import ActorError, InjectedCrash, WorkflowCancelled
from akter.workflows import (
    WorkflowContext,
    WorkflowFailure,
    WorkflowMember,
    WorkflowRun,
)

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.workflows")

#: The first and the longest wait before a run handed back after an outage is claimed again.
_RETRY_FIRST_MS, _RETRY_MAX_MS = 1_000, 60_000


class WorkflowEngine:
    """Runs workflows on one runner (module docstring).

    Args:
        services: The runner's services.
        calls: The runtime's call paths (command and query steps).
        make_handle: Builds a handle over a transport (``wf.get``).
        wake: Asks the pass loop for a pass soon, here and on other runners (a run became
            runnable).
        runner_id: This runner's id (the lease owner).
        cancel_jobs: This runner's cancellation signal for running job attempts (a run
            cancelled at a job step cancels its job).
    """

    def __init__(
        self,
        services: Services,
        *,
        calls: StepsCalls,
        make_handle: HandleFactory,
        wake: Callable[[], None],
        runner_id: str,
        cancel_jobs: Callable[[list[str]], None] | None = None,
    ) -> None:
        self._services = services
        self._cancel_jobs = cancel_jobs or (lambda job_ids: None)
        self._calls = calls
        self._make_handle = make_handle
        self._wake = wake
        self._runner_id = runner_id
        self.gateway = WorkflowsGateway(services.store, services.clock)
        #: Runs by id: status, signals, cancels, retries (their handles' ``RunOps``).
        self.ops = WorkflowOps(self.gateway, services.registry, wake)
        self._attempts: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._stopping = False
        #: Attempts that have ended on this runner (the test kit's drain watches it).
        self.attempted = 0
        # The last claim took every free slot: more runs may be runnable (a backlog).
        self._full = False

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Run attempts executing on this runner."""
        return len(self._attempts)

    async def stop(self) -> None:
        """Stop claiming; hand running attempts back (their runs are runnable again at once)."""
        self._stopping = True
        tasks = list(self._attempts.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_idle(self) -> None:
        """Await every attempt started so far (tests)."""
        while self._attempts:
            await asyncio.gather(*list(self._attempts.values()), return_exceptions=True)

    def _hosted(self) -> list[str]:
        if not self._services.config.host_actors:
            return []
        return sorted(n for n, d in self._services.definitions.items() if d.workflows)

    # --- claims -----------------------------------------------------------------------------

    async def claim(self, p: lanes.Pass) -> lanes.Claimed:
        """A pass's claim (``akter._engine.lanes.Lane``): runnable runs, unless it is quiet."""
        if p.quiet:
            return lanes.Claimed()
        return lanes.Claimed(await self.run_pass())

    async def run_pass(self) -> int:
        """Claim runnable runs into free slots and start their attempts (a pass's claim)."""
        types = self._hosted()
        free = self._services.config.delivery_concurrency - len(self._attempts)
        if self._stopping or not types or free <= 0:
            return 0
        rows = await self.gateway.claim(
            self._runner_id, types, free, self._services.config.workflow_lease_ms
        )
        self._full = len(rows) == free
        for row in rows:
            self._services.clock.observe(row.now)
            claimed = Claimed(
                run=RunKey(row.routing_key, row.run_id),
                ref=ActorRef(row.tenant_id, row.actor_type, row.actor_id),
                workflow=row.workflow,
                input=row.input,
                caller=row.caller,
                token=row.token,
                attempts=row.attempts,
                cancel_requested=row.cancel_requested,
                deadline_ms=row.deadline_ms,
                now=row.now,
                traceparent=row.traceparent,
            )
            key = (claimed.run.routing_key, claimed.run.run_id)
            self._attempts[key] = asyncio.create_task(
                self._attempt(claimed), name=f"akter.workflow {claimed.run.run_id}"
            )
        return len(rows)

    # --- one attempt ------------------------------------------------------------------------

    async def _attempt(self, claimed: Claimed) -> None:
        key = (claimed.run.routing_key, claimed.run.run_id)
        renewal = asyncio.create_task(self._renew(claimed), name=f"akter.workflow.renew {key[1]}")
        span, token = telemetry.start_workflow_attempt(
            claimed.ref, claimed.workflow, claimed.run.run_id, claimed.attempts, claimed.traceparent
        )
        outcome = "abandoned"
        try:
            outcome = await self._run(claimed)
        except InjectedCrash:
            return  # abandoned like a process death: the lease ends, another claim resumes
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    self.gateway.release(claimed.run, claimed.token, 0, "runner stopped")
                )
            raise
        except Exception:
            log.exception(
                "Workflow attempt raised unexpectedly; the run is claimed again after its "
                "lease: %s",
                endings.subject(claimed),
                extra=endings.log_fields(claimed),
            )
        finally:
            telemetry.end_workflow_attempt(span, token, outcome)
            renewal.cancel()
            self._attempts.pop(key, None)
            self.attempted += 1
            if self._full:
                # A slot is free and the last claim left runnable runs: claim again now, not at
                # the next poll (a backlog of due timers or starts drains at once).
                self._wake()

    async def _renew(self, claimed: Claimed) -> None:
        """Extend the lease every third of it; cancel the attempt if it was lost."""
        lease_ms = self._services.config.workflow_lease_ms
        while True:
            await asyncio.sleep(lease_ms / 3000)
            try:
                held = await self.gateway.renew(claimed.run, claimed.token, lease_ms)
            except (psycopg.Error, OSError):
                continue  # an outage: the next round tries again; the lease may still hold
            if not held:
                task = self._attempts.get((claimed.run.routing_key, claimed.run.run_id))
                if task is not None:
                    task.cancel()
                return

    async def _run(self, claimed: Claimed) -> str:
        """Run one attempt; how it ended (``suspended``, ``completed``, ``released`` ...)."""
        services = self._services
        definition = services.registry.definition(claimed.ref.type)
        member: WorkflowMember[Any, Any] | None = definition.workflows.get(claimed.workflow)
        run = claimed.run
        if member is None:
            await self._end_diverged(
                claimed,
                f"Workflow {claimed.ref.type}.{claimed.workflow} is not declared by this code; "
                "deploy code that declares it, then retry the run.",
            )
            return "diverged"
        try:
            rows = await self.gateway.journal(run)
        except (psycopg.Error, OSError) as exc:
            await self._release(claimed, f"journal read failed: {exc}")
            return "released"
        attempt = RunAttempt(
            services, self.gateway, self._calls, self._make_handle, claimed, member
        )
        attempt.cancel_jobs = self._cancel_jobs
        attempt.wake = self._wake
        attempt.load(rows)
        try:
            kwargs = member.arguments(json.loads(claimed.input))
        except Exception as exc:
            # New code that cannot read a stored input parks the run; it never fails it.
            await self._end_diverged(
                claimed,
                f"The stored input of workflow run {run.run_id!r} does not validate against "
                f"{claimed.ref.type}.{claimed.workflow} any more: {exc}",
            )
            return "diverged"
        try:
            value = await endings.halting(attempt, member.fn(WorkflowContext(attempt), **kwargs))
        except Suspend as suspend:
            return await self._suspend(attempt, suspend)
        except Diverged as exc:
            await self._end_diverged(claimed, str(exc))
            return "diverged"
        except Outage as exc:
            await self._release(claimed, str(exc))
            return "released"
        except LeaseLost:
            return "lease_lost"
        except Exception as exc:  # the workflow's code raised: the run ends
            cancelled = attempt.cancel_delivered or attempt.replayed_cancel
            status = "cancelled" if cancelled and isinstance(exc, WorkflowCancelled) else "failed"
            await self._end(attempt, member, status, error=endings.error_of(exc))
            return status
        return await self._complete(attempt, member, value)

    async def _suspend(self, attempt: RunAttempt, suspend: Suspend) -> str:
        """Write the attempt's suspension: ``suspended``, ``released`` or ``lease_lost``."""
        claimed = attempt.claimed
        try:
            status = await self.gateway.suspend(
                claimed.run,
                claimed.token,
                suspend.wake_at,
                suspend.waiting,
                records=await attempt.handover(),
                lease_ms=self._services.config.workflow_lease_ms,
                # The deadline bounds the wait until the cancel has reached the code; a
                # compensation may then suspend past it.
                by_deadline=not (attempt.cancel_delivered or attempt.replayed_cancel),
            )
        except (psycopg.Error, OSError) as exc:
            await self._release(claimed, f"the suspension could not be written: {exc}")
            return "released"
        if status is None:
            return "lease_lost"
        if status == "runnable":
            self._wake()
        return "suspended"

    async def _complete(
        self, attempt: RunAttempt, member: WorkflowMember[Any, Any], value: Any
    ) -> str:
        """End a run whose code returned ``value``: ``completed``, ``cancelled`` or ``failed``."""
        cancelled = attempt.cancel_delivered or attempt.replayed_cancel
        try:
            result = member.result.dump_python(value, mode="json")
            storable_json(result, "result")
        except Exception as exc:
            await self._end(
                attempt,
                member,
                "failed",
                error=WorkflowFailure(
                    type="InvalidResult",
                    message=f"The workflow's return value cannot be stored: {exc}",
                ),
            )
            return "failed"
        status = "cancelled" if cancelled else "completed"
        await self._end(attempt, member, status, result=result)
        return status

    async def _release(self, claimed: Claimed, why: str) -> None:
        delay = min(_RETRY_MAX_MS, _RETRY_FIRST_MS * 2 ** min(claimed.attempts - 1, 10))
        log.warning(
            "Workflow attempt handed back after an outage: %s, retried in %d ms: %s",
            endings.subject(claimed),
            delay,
            why,
            extra={"run_id": claimed.run.run_id, "error": why, "delay_ms": delay},
        )
        with contextlib.suppress(psycopg.Error, OSError):
            await self.gateway.release(claimed.run, claimed.token, delay, why[:500])

    async def _end_diverged(self, claimed: Claimed, message: str) -> None:
        error = WorkflowFailure(type="Diverged", message=message).model_dump_json()
        with contextlib.suppress(psycopg.Error, OSError):
            if await self.gateway.finish(claimed.run, claimed.token, "diverged", error=error):
                log.warning(
                    "Workflow run diverged and is parked until an operator retries or cancels "
                    "it: %s: %s",
                    endings.subject(claimed),
                    message,
                    extra={**endings.log_fields(claimed), "error": message},
                )

    async def _end(
        self,
        attempt: RunAttempt,
        member: WorkflowMember[Any, Any],
        status: str,
        *,
        result: Any = None,
        error: WorkflowFailure | None = None,
    ) -> None:
        claimed = attempt.claimed
        records = await attempt.handover()
        outcome = {
            "run_id": claimed.run.run_id,
            "workflow": member.name,
            "status": status,
            "result": result,
            "error": None if error is None else error.model_dump(mode="json"),
        }
        outbox = self._on_complete(claimed, member, outcome)
        await self._services.hooks.at(
            "before_workflow_complete", {"run_id": claimed.run.run_id, "status": status}
        )
        result_text = None if result is None and status != "completed" else canonical_json(result)
        try:
            ended = await self.gateway.finish(
                claimed.run,
                claimed.token,
                status,
                result=result_text,
                error=None if error is None else error.model_dump_json(),
                outbox=outbox,
                records=records,
                lease_ms=self._services.config.workflow_lease_ms,
            )
        except (psycopg.Error, OSError) as exc:
            await self._release(claimed, f"the run's end could not be written: {exc}")
            return
        if not ended:
            return
        endings.log_end(claimed, status, error)
        self.ops.ended(claimed.run.run_id)
        self._services.metrics.count(f"akter.workflows.{status}", actor_type=claimed.ref.type)
        if outbox:
            self._wake()

    def _on_complete(
        self, claimed: Claimed, member: WorkflowMember[Any, Any], outcome: dict[str, Any]
    ) -> tuple[OutboxRow, ...]:
        """The ``on_complete`` intent of a run's end, if the workflow declares one."""
        if member.on_complete_name is None:
            return ()
        definition = self._services.registry.definition(claimed.ref.type)
        route = definition.members[member.on_complete_name]
        try:
            body = route.validate_payload({route.params[0].name: outcome})
        except Exception as exc:
            log.error(
                "on_complete cannot accept the run's outcome; it is not delivered: %s: %s",
                endings.subject(claimed),
                exc,
                extra={**endings.log_fields(claimed), "error": str(exc)},
            )
            return ()
        config = self._services.config
        now = self._services.clock.estimate()
        intent_id = framework_id(
            now, None, None, definition.policy.execution_timeout, config.window_ms
        )
        caller = System(source="workflow", ref=claimed.ref)
        return (
            OutboxRow(
                intent_id=intent_id,
                kind=RowKind.INTENT,
                tenant=claimed.ref.tenant,
                actor_type=claimed.ref.type,
                actor_id=claimed.ref.id,
                command=route.name,
                payload=canonical_json(body),
                caller=caller_to_json(caller),
                payload_version=route.version,
            ),
        )

    # --- starting, signals, cancels ---------------------------------------------------------

    async def start(
        self,
        member: WorkflowMember[Any, Any],
        ref: ActorRef,
        input: dict[str, Any],
        *,
        run_id: str,
        key: str | None,
        caller: Caller,
    ) -> str:
        """Create the run ``run_id`` unless it (or a live run of ``key``) exists; its id.

        Raises:
            ActorError: ``CommandConflict`` when ``run_id`` names a run of other input.
        """
        registry = self._services.registry
        definition = registry.definition(ref.type)
        run = RunKey(registry.routing_key(ref), run_id)
        state = definition.default_state().model_dump(mode="json")
        row = await self.gateway.start(
            run,
            ref=(ref.tenant, ref.type, ref.id),
            workflow=member.name,
            key=key,
            input=canonical_json(input),
            input_hash=payload_hash(input),
            caller=caller_to_json(caller),
            timeout_ms=member.timeout_ms,
            traceparent=telemetry.traceparent(),
            actor={"state": canonical_json(state), "state_version": definition.state_version},
        )
        found = row.run_id
        if row.created:
            self._services.metrics.count("akter.workflows.started", actor_type=ref.type)
            self._wake()
        elif found == run_id and (
            row.input_hash != payload_hash(input) or row.workflow != member.name
        ):
            raise ActorError(
                "CommandConflict",
                f"Run id {run_id!r} was used to start {row.workflow} with other input; "
                "use a new command id.",
                code="workflow_input",
            )
        return found

    async def start_from_handle(
        self,
        member: WorkflowMember[Any, Any],
        ref: ActorRef,
        input: dict[str, Any],
        pinned: str | None,
        caller: Caller | None = None,
    ) -> WorkflowRun[Any]:
        """``handle.<workflow>.start(...)``: the run id derives from the command id."""
        self._services.supervisor.require_started()
        caller = caller or current_caller()
        definition = self._services.registry.definition(ref.type)
        if member.internal and not isinstance(caller, System):
            by = f"{type(caller).__name__} callers"
            raise refuse_internal(definition.name, member.name, "workflow", by)
        await check_access(definition, ref, caller, "command", member.name)
        window_ms = self._services.config.window_ms
        command_id = (
            parse_command_id(pinned, window_ms).raw
            if pinned is not None
            else self._calls.mint_command_id()
        )
        run_id = run_id_of(ref, command_id)
        found = await self.start(member, ref, input, run_id=run_id, key=None, caller=caller)
        return WorkflowRun(found, self.ops, member.result)

    async def deliver(
        self, ref: ActorRef, command: str, payload: str, intent_id: str, caller: str
    ) -> None:
        """Take one ``$workflow.*`` intent (module docstring); raising leaves it to a retry."""
        data = json.loads(payload)
        registry = self._services.registry
        if command == WorkflowCommand.JOB:
            run = RunKey(registry.routing_key(ref), str(data["run_id"]))
            took = await self.gateway.job_outcome(
                run, int(data["seq"]), canonical_json(data["outcome"])
            )
            if took.woke:
                self._wake()
            if took.status == "unmatched":
                # Never silently: the step that should hold this outcome is not there.
                log.warning(
                    "Job outcome for a workflow step matches no pending job step or cancel "
                    "record; not recorded: run id %r, step %s, job id %r",
                    run.run_id,
                    data["seq"],
                    intent_id,
                    extra={
                        "run_id": run.run_id,
                        "seq": data["seq"],
                        "job_id": intent_id,
                        "outcome": canonical_json(data["outcome"])[:2000],
                    },
                )
            return
        if command == WorkflowCommand.START:
            definition = registry.definition(ref.type)
            member = definition.workflows.get(str(data["workflow"]))
            if member is None:
                raise ValueError(f"{ref.type} declares no workflow {data['workflow']!r}")
            await self.start(
                member,
                ref,
                member.validate_input(data["input"]),
                run_id=intent_id,
                key=data.get("key"),
                caller=caller_from_json(caller),
            )
            return
        if command == WorkflowCommand.SIGNAL:
            located = await self.gateway.locate(str(data["run_id"]))
            if located is None:
                log.warning(
                    "Signal for an unknown workflow run dropped: run id %r",
                    data["run_id"],
                    extra={"run_id": data["run_id"]},
                )
                return
            run = RunKey(located.routing_key, located.run_id)
            live, _ = await self.gateway.signal(
                run, intent_id, str(data["name"]), str(data["payload"])
            )
            if not live:
                log.info(
                    "Signal for an ended workflow run dropped: run id %r",
                    run.run_id,
                    extra={"run_id": run.run_id},
                )
            self._wake()
            return
        if command == WorkflowCommand.CANCEL:
            with contextlib.suppress(ActorError):
                await self.ops.cancel(str(data["run_id"]))
            return
        raise ValueError(f"Unknown workflow intent {command!r}")


def run_id_of(ref: ActorRef, command_id: str) -> str:
    """The id of the run a command id starts on ``ref``: ``<command id>~<actor digest>``.

    Like a command's receipt, a start is idempotent per actor: the same command id on another
    actor starts another run (its id differs), and on the same actor it names one run, whose
    workflow and input must match (else ``CommandConflict``). The digest keeps run ids unique
    across actors without a cross-shard unique index.
    """
    digest = hashlib.sha256(f"{ref.tenant}\0{ref.type}\0{ref.id}".encode()).hexdigest()[:12]
    return f"{command_id}~{digest}"


__all__ = ["WorkflowEngine", "run_id_of"]
