"""The workflow engine: starts runs, claims runnable ones, runs attempts, takes their wakes.

A run is claimed with a lease (``workflow_lease``) by any runner hosting its actor type, in the
relay's pass beside intents and jobs, and run from the top against its journal
(:mod:`akter._engine.workflow_run`). While the function runs the lease is renewed every third of
it. When the function awaits what is not there yet, the run is suspended: its wake time (a sleep
or a timeout; none for a signal or a job outcome) is written, the lease is released and the
coroutine is dropped, so **a suspended run holds no runner, task or connection**. A signal, a
job outcome or a cancel makes it runnable; a runner that dies mid-run loses its lease, and the
next claim after the lease end resumes the run.

Work staged by turns reaches the engine as outbox intents to the run's (or the sender's) actor,
delivered by the relay instead of a command: ``$workflow.start`` (``self.start``),
``$workflow.signal`` (``self.signal``), ``$workflow.cancel`` (``self.cancel_workflow``) and
``$workflow.job`` (a job step's outcome, written by the job's settle).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from pydantic import BaseModel

from akter._engine.calls import check_access
from akter._engine.workflow_run import (
    Claimed,
    Diverged,
    Fatal,
    HandleFactory,
    LeaseLost,
    Outage,
    RunAttempt,
    StepsCalls,
    Suspend,
)
from akter._ids import canonical_json, parse_command_id, payload_hash, uuid7
from akter._json import Unstorable, storable_json
from akter._members import storable_payload
from akter._staging import framework_id
from akter._store.gateway.workflows import OutboxRow, RunKey, WorkflowsGateway
from akter.callers import ActorRef, Caller, System, caller_from_json, caller_to_json, current_caller
from akter.errors import ActorError, DeclaredError, InjectedCrash, WorkflowCancelled, invalid_input
from akter.workflows import (
    StepRecordView,
    Workflow,
    WorkflowError,
    WorkflowMember,
    WorkflowRun,
    WorkflowStatus,
    signal_name,
)

if TYPE_CHECKING:
    from akter._engine.services import Services

log = logging.getLogger("akter.workflows")

#: The commands of outbox intents the engine takes instead of an actor (module docstring).
START, SIGNAL, CANCEL, JOB = (
    "$workflow.start",
    "$workflow.signal",
    "$workflow.cancel",
    "$workflow.job",
)
#: The first and the longest wait before a run handed back after an outage is claimed again.
_RETRY_FIRST_MS, _RETRY_MAX_MS = 1_000, 60_000


def is_workflow_command(command: str) -> bool:
    """Whether an outbox intent's command is one the engine takes."""
    return command.startswith("$workflow.")


class WorkflowEngine:
    """Runs workflows on one runner (module docstring).

    Args:
        services: The runner's services.
        calls: The runtime's call paths (command and query steps).
        make_handle: Builds a handle over a transport (``wf.get``).
        wake: Asks the relay for a pass soon (a run became runnable here).
        runner_id: This runner's id (the lease owner).
    """

    def __init__(
        self,
        services: Services,
        *,
        calls: StepsCalls,
        make_handle: HandleFactory,
        wake: Callable[[], None],
        runner_id: str,
    ) -> None:
        self._services = services
        self._calls = calls
        self._make_handle = make_handle
        self._wake = wake
        self._runner_id = runner_id
        self.gateway = WorkflowsGateway(services.store, services.clock)
        self._attempts: dict[tuple[int, str], asyncio.Task[None]] = {}
        self._stopping = False
        #: Attempts that have ended on this runner (the test kit's drain watches it).
        self.attempted = 0

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

    async def run_pass(self) -> int:
        """Claim runnable runs into free slots and start their attempts (the relay's pass)."""
        types = self._hosted()
        free = self._services.config.delivery_concurrency - len(self._attempts)
        if self._stopping or not types or free <= 0:
            return 0
        rows = await self.gateway.claim(
            self._runner_id, types, free, self._services.config.workflow_lease_ms
        )
        for row in rows:
            self._services.clock.observe(int(row["now"]))
            claimed = Claimed(
                run=RunKey(int(row["routing_key"]), str(row["run_id"])),
                ref=ActorRef(str(row["tenant_id"]), str(row["actor_type"]), str(row["actor_id"])),
                workflow=str(row["workflow"]),
                input=str(row["input"]),
                caller=str(row["caller"]),
                token=int(row["token"]),
                attempts=int(row["attempts"]),
                cancel_requested=bool(row["cancel_requested"]),
                deadline_ms=None if row["deadline_ms"] is None else int(row["deadline_ms"]),
                now=int(row["now"]),
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
        try:
            await self._run(claimed, renewal)
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
                "Workflow attempt raised unexpectedly; the run is claimed again after its lease",
                extra={"run_id": claimed.run.run_id},
            )
        finally:
            renewal.cancel()
            self._attempts.pop(key, None)
            self.attempted += 1

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

    async def _run(self, claimed: Claimed, renewal: asyncio.Task[None]) -> None:
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
            return
        try:
            rows = await self.gateway.journal(run)
        except (psycopg.Error, OSError) as exc:
            await self._release(claimed, f"journal read failed: {exc}")
            return
        attempt = RunAttempt(
            services, self.gateway, self._calls, self._make_handle, claimed, member
        )
        attempt.load(rows)
        try:
            try:
                kwargs = member.arguments(json.loads(claimed.input))
            except Exception as exc:
                raise Fatal(f"The stored input no longer validates: {exc}") from None
            value = await member.fn(Workflow(attempt), **kwargs)
        except Suspend as suspend:
            await attempt.flush()
            status = await self.gateway.suspend(
                run, claimed.token, suspend.wake_at, suspend.waiting
            )
            if status == "runnable":
                self._wake()
            return
        except Diverged as exc:
            log.warning("Workflow run diverged; parked", extra={"run_id": run.run_id})
            await self._end_diverged(claimed, str(exc))
            return
        except Outage as exc:
            await self._release(claimed, str(exc))
            return
        except LeaseLost:
            return
        except Exception as exc:  # the workflow's code raised: the run ends
            cancelled = attempt.cancel_delivered or attempt.replayed_cancel
            status = "cancelled" if cancelled and isinstance(exc, WorkflowCancelled) else "failed"
            await self._end(attempt, member, status, error=_error_of(exc))
            return
        cancelled = attempt.cancel_delivered or attempt.replayed_cancel
        try:
            result = member.result.dump_python(value, mode="json")
            canonical_json(result)
        except Exception as exc:
            await self._end(
                attempt,
                member,
                "failed",
                error=WorkflowError(
                    type="InvalidResult",
                    message=f"The workflow's return value cannot be stored: {exc}",
                ),
            )
            return
        await self._end(attempt, member, "cancelled" if cancelled else "completed", result=result)

    async def _release(self, claimed: Claimed, why: str) -> None:
        delay = min(_RETRY_MAX_MS, _RETRY_FIRST_MS * 2 ** min(claimed.attempts - 1, 10))
        log.warning(
            "Workflow attempt handed back after an outage",
            extra={"run_id": claimed.run.run_id, "error": why, "delay_ms": delay},
        )
        with contextlib.suppress(psycopg.Error, OSError):
            await self.gateway.release(claimed.run, claimed.token, delay, why[:500])

    async def _end_diverged(self, claimed: Claimed, message: str) -> None:
        error = WorkflowError(type="Diverged", message=message).model_dump_json()
        with contextlib.suppress(psycopg.Error, OSError):
            await self.gateway.finish(claimed.run, claimed.token, "diverged", error=error)

    async def _end(
        self,
        attempt: RunAttempt,
        member: WorkflowMember[Any, Any],
        status: str,
        *,
        result: Any = None,
        error: WorkflowError | None = None,
    ) -> None:
        claimed = attempt.claimed
        try:
            await attempt.flush()
        except (LeaseLost, Outage):
            return
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
            )
        except (psycopg.Error, OSError) as exc:
            await self._release(claimed, f"the run's end could not be written: {exc}")
            return
        if not ended:
            return
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
                "on_complete cannot accept the run's outcome; it is not delivered",
                extra={"run_id": claimed.run.run_id, "error": str(exc)},
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
                kind="intent",
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
            actor={"state": canonical_json(state), "state_version": definition.state_version},
        )
        found = str(row["run_id"])
        if row["created"]:
            self._services.metrics.count("akter.workflows.started", actor_type=ref.type)
            self._wake()
        elif found == run_id and (
            row["input_hash"] != payload_hash(input) or row["workflow"] != member.name
        ):
            raise ActorError(
                "CommandConflict",
                f"Run id {run_id!r} was used to start {row['workflow']} with other input; "
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
        await check_access(definition, ref, caller, "command", member.name)
        window_ms = self._services.config.window_ms
        run_id = (
            parse_command_id(pinned, window_ms).raw
            if pinned is not None
            else self._calls.mint_command_id()
        )
        held = await self.gateway.locate(run_id)
        if held is not None and (
            (held["tenant_id"], held["actor_type"], held["actor_id"], held["workflow"])
            != (ref.tenant, ref.type, ref.id, member.name)
        ):
            # The run id is the command id: one used for another actor's (or workflow's) run
            # would answer that run, or (another routing key) make a second run of the same id.
            raise ActorError(
                "CommandConflict",
                f"Command id {run_id!r} started a run of another actor or workflow; use a new "
                "command id.",
                code="workflow_input",
                command_id=run_id,
            )
        found = await self.start(member, ref, input, run_id=run_id, key=None, caller=caller)
        return WorkflowRun(found, self, member.result)

    def run(self, run_id: str) -> WorkflowRun[Any]:
        """A handle to a run by id (``runtime.workflow_run``)."""
        return WorkflowRun(run_id, self)

    async def _locate(self, run_id: str) -> tuple[RunKey, dict[str, Any]]:
        row = await self.gateway.locate(run_id)
        if row is None:
            raise ActorError(
                "InvalidInput", f"No workflow run {run_id!r}.", code="unknown_workflow_run"
            )
        return RunKey(int(row["routing_key"]), str(row["run_id"])), row

    async def status(self, run_id: str) -> WorkflowStatus:
        """The run's status and journal (``run.status()``)."""
        run, _ = await self._locate(run_id)
        row = await self.gateway.get(run)
        if row is None:
            raise ActorError(
                "InvalidInput", f"No workflow run {run_id!r}.", code="unknown_workflow_run"
            )
        steps = await self.gateway.steps(run)
        return status_of(row, steps)

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
        if row["status"] == "diverged":
            await self.gateway.abandon_diverged(
                run,
                WorkflowError(
                    type="WorkflowCancelled", message="Cancelled while parked as diverged."
                ).model_dump_json(),
            )
            return
        if await self.gateway.cancel(run):
            self._wake()

    async def retry(self, run_id: str) -> bool:
        """Make a diverged run runnable again (``akter workflows retry``)."""
        run, _ = await self._locate(run_id)
        retried = await self.gateway.retry(run)
        if retried:
            self._wake()
        return retried

    # --- deliveries from the relay ----------------------------------------------------------

    async def deliver(
        self, ref: ActorRef, command: str, payload: str, intent_id: str, caller: str
    ) -> None:
        """Take one ``$workflow.*`` intent (module docstring); raising leaves it to a retry."""
        data = json.loads(payload)
        registry = self._services.registry
        if command == JOB:
            run = RunKey(registry.routing_key(ref), str(data["run_id"]))
            if await self.gateway.job_outcome(
                run, int(data["seq"]), canonical_json(data["outcome"])
            ):
                self._wake()
            return
        if command == START:
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
        if command == SIGNAL:
            located = await self.gateway.locate(str(data["run_id"]))
            if located is None:
                log.warning(
                    "Signal for an unknown workflow run dropped", extra={"run_id": data["run_id"]}
                )
                return
            run = RunKey(int(located["routing_key"]), str(located["run_id"]))
            live, _ = await self.gateway.signal(
                run, intent_id, str(data["name"]), str(data["payload"])
            )
            if not live:
                log.info("Signal for an ended workflow run dropped", extra={"run_id": run.run_id})
            self._wake()
            return
        if command == CANCEL:
            with contextlib.suppress(ActorError):
                await self.cancel(str(data["run_id"]))
            return
        raise ValueError(f"Unknown workflow intent {command!r}")


def _error_of(exc: BaseException) -> WorkflowError:
    if isinstance(exc, DeclaredError):
        return WorkflowError(
            type=type(exc).__name__, message=str(exc), tag=type(exc).tag, fields=exc.fields
        )
    return WorkflowError(type=type(exc).__name__, message=str(exc)[:4000])


def status_of(row: dict[str, Any], steps: list[dict[str, Any]]) -> WorkflowStatus:
    """A run's row and journal as a :class:`WorkflowStatus`."""
    error = WorkflowError.model_validate_json(row["error"]) if row["error"] else None
    return WorkflowStatus(
        run_id=str(row["run_id"]),
        workflow=str(row["workflow"]),
        actor=ActorRef(str(row["tenant_id"]), str(row["actor_type"]), str(row["actor_id"])),
        key=row["run_key"],
        status=row["status"],
        waiting=row["waiting"],
        cancel_requested=bool(row["cancel_requested"]),
        attempts=int(row["attempts"]),
        result=None if row["result"] is None else json.loads(row["result"]),
        error=error,
        started_at_ms=int(row["started_at_ms"]),
        updated_at_ms=int(row["updated_at_ms"]),
        finished_at_ms=row["finished_at_ms"],
        steps=[
            StepRecordView(
                seq=int(s["seq"]),
                kind=str(s["kind"]),
                name=str(s["name"]),
                status=s["status"],
                detail=s["detail"],
                outcome=None if s["outcome"] is None else json.loads(s["outcome"]),
                started_at_ms=int(s["started_at_ms"]),
                recorded_at_ms=s["recorded_at_ms"],
            )
            for s in steps
        ],
    )


__all__ = ["WorkflowEngine", "is_workflow_command", "status_of"]
