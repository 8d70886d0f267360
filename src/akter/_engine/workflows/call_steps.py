"""A workflow's command and query steps (``wf.get(X, id).cmd(...)``).

A command step writes a ``pending`` record with a fresh command id, its target actor and the
hash of its arguments first, then runs the turn with that id; its outcome is written with the
next record (the next step's, or the run's suspension or end), so a command step costs one
write beside its turn: a crash before that write leaves it pending, and the resumed run replays
the receipt under the same id, at the same actor. A query step's answer is written the same
way, with its target and arguments' hash (a crash before it lets the query run again).

A replayed call is the code's call only when the record's target actor and arguments' hash
(where it holds them) match: any difference parks the run as *diverged* (W5). A pending command
step that no longer matches is never sent anywhere: its recorded target's receipt is looked up
first, and the divergence says whether the recorded command was applied.
"""

from __future__ import annotations

import asyncio
import json
import typing
from typing import TYPE_CHECKING, Any

import psycopg

from akter import telemetry
from akter._engine.workflows.control import Diverged, Outage, Record, durable
from akter._engine.workflows.journal import (
    Journal,
    actor_text,
    args_digest,
    describe_call,
    record_detail,
)
from akter._ids import canonical_json
from akter._kinds import StepKind
from akter._store.gateway.workflows import StepRecord
from akter.callers import ActorRef
from akter.errors import ActorError, DeclaredError, invalid_input

if TYPE_CHECKING:
    from akter.actor import Member


class CallSteps(Journal):
    """Command and query steps of a run attempt (module docstring)."""

    def handle(self, actor: type[Any], id: str, tenant: str | None) -> Any:
        """``wf.get(X, id)``: a handle whose calls are steps."""
        registry = self.services.registry
        ref = registry.ref(actor, id, tenant=tenant or self.ref.tenant)
        return self.make_handle(self, registry.definition(ref.type), ref)

    @durable
    async def command(
        self, member: Member, ref: ActorRef, body: dict[str, Any], pinned: str | None, fence: Any
    ) -> Any:
        """A command step (the handle transport's entry)."""
        name = f"{ref.type}.{member.name}"
        seq, rec = self._next(StepKind.COMMAND, name)
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
            await self._record(StepRecord(seq, StepKind.COMMAND, name, "pending", detail))
        return await self._call(
            seq, StepKind.COMMAND, name, member, ref, body, command_id, replaying=rec is not None
        )

    @durable
    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """A query step: its answer is recorded, so a replay sees the same value."""
        name = f"{ref.type}.{member.name}"
        seq, rec = self._next(StepKind.QUERY, name)
        args = args_digest(member.args_model, body)
        if rec is not None:
            await self._same_call(seq, rec, name, ref, args)
            if rec.status == "done":
                return self._replay_call(member, rec)
        detail = canonical_json({"actor": ref.to_json(), "args": args})
        return await self._call(seq, StepKind.QUERY, name, member, ref, body, None, detail=detail)

    async def _same_call(self, seq: int, rec: Record, name: str, ref: ActorRef, args: str) -> None:
        """A recorded command or query step must target the same actor with the same arguments.

        Compares what the record holds (older records lack the arguments' hash, and a query's
        its target). A pending command step that differs is resolved against its *recorded*
        target first (a receipt lookup, nothing sent), and the run is parked.

        Raises:
            Diverged: The code's call differs from the record's (W5).
        """
        recorded = record_detail(rec)
        was_actor, was_args = recorded.get("actor"), recorded.get("args")
        now_actor = ref.to_json()
        if (was_actor is None or was_actor == now_actor) and (was_args is None or was_args == args):
            return
        was = describe_call(rec.kind, name, was_actor, was_args)
        now = describe_call(rec.kind, name, now_actor if was_actor is not None else None, args)
        resolution = ""
        if rec.kind == StepKind.COMMAND and rec.status == "pending":
            resolution = " " + await self._resolve_pending(rec, was_actor)
        raise Diverged(
            f"Step {seq} of workflow run {self.run_id!r} was recorded as {was}, but the code now "
            f"asks for {now}; the run is parked.{resolution} Restore the call (or guard the "
            f"change with wf.patched()), then 'akter workflows retry {self.run_id}', or cancel "
            "the run."
        )

    async def _resolve_pending(self, rec: Record, actor: Any) -> str:
        """Whether a pending command step's recorded command was applied at its recorded target."""
        recorded = record_detail(rec)
        command_id = recorded.get("command_id")
        if not isinstance(actor, dict) or not isinstance(command_id, str):
            return "Nothing was sent."
        where = ActorRef(str(actor["tenant"]), str(actor["type"]), str(actor["id"]))
        try:
            routing_key = self.services.registry.routing_key(where)
        except Exception:
            return (
                f"Nothing was sent; whether command {command_id} was applied to "
                f"{actor_text(actor)} is unknown (its type is not declared by this code)."
            )
        try:
            found = await self.gateway.step_receipt(routing_key, where, command_id)
        except (psycopg.Error, OSError) as exc:
            raise Outage(f"The receipt of a pending command step could not be read: {exc}") from exc
        if found:
            return (
                f"Nothing was sent; the recorded command {command_id} was applied to "
                f"{actor_text(actor)} once (its receipt is there)."
            )
        return (
            f"Nothing was sent; the recorded command {command_id} was not applied to "
            f"{actor_text(actor)} (no receipt yet)."
        )

    def events(self, ref: ActorRef, after: str | None, limit: int) -> Any:
        """Event feeds are not steps."""
        raise invalid_input("A workflow's handles have no event feed; read events in a step.")

    async def _call(
        self,
        seq: int,
        kind: StepKind,
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
