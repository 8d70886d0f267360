"""The turn's decision rules: pure functions of plain values, no database, no handler.

In order (semantics §2.3): a future id is refused, a stored receipt is replayed (or refused as
another caller's or a conflict), an expired first execution is refused, an internal command
from a non-System caller is a defect, a gated actor refuses everything but its creating
commands, and a minted child runs its first command only with its parent's proof. After the
transaction, :func:`release` hides an outcome whose id expired meanwhile.
"""

from __future__ import annotations

import logging
from typing import Any

from akter._engine.turn.types import BatchDefect, Request, Result
from akter._ids import child_id, is_uuid8
from akter.actor import ActorDefinition, Member
from akter.callers import ActorRef, System
from akter.errors import ActorError, DeclaredError, Reason

log = logging.getLogger("akter.turn")


def decide(
    request: Request,
    definition: ActorDefinition,
    ref: ActorRef,
    now_ms: int,
    receipts: dict[str, Any],
    created: bool,
    index: int,
) -> Result | None:
    """The result a command gets without running its handler, or ``None`` to run it.

    Args:
        request: The command.
        definition: The actor's type.
        ref: The actor.
        now_ms: The turn's pinned database clock.
        receipts: The batch's stored receipts by command id.
        created: Whether the actor is created at this point of the batch.
        index: The command's place in the batch (for a defect).

    Raises:
        BatchDefect: An internal command from a caller other than ``System``.
    """
    cid = request.command_id
    if request.external and cid.issued_ms > now_ms:
        return _error(
            "InvalidCommandId",
            f"Command id {cid.raw!r} was issued in the future of the database clock; retry "
            "shortly.",
            request,
            code="future",
            retryable=True,
            retry_after=(cid.issued_ms - now_ms) / 1000,
        )
    stored = receipts.get(cid.raw)
    if stored is not None:
        return replay(request, stored)
    if request.external and now_ms >= cid.expires_ms:
        return Result("error", error=expired(request))
    member = request.member
    if member.internal and not isinstance(request.caller, System):
        raise BatchDefect(
            index,
            f"Internal command {definition.name}.{member.name} was called by "
            f"{type(request.caller).__name__}; only the framework may send it.",
        )
    if definition.gated and not created and not member.spec.creates:
        return _error(
            "NotCreated",
            f"{definition.name}/{ref.id!r} has not been created; call one of its creating "
            "commands first.",
            request,
        )
    if not created and is_uuid8(ref.id) and not valid_mint(request, ref):
        return _error(
            "Unauthorized",
            f"{definition.name}/{ref.id!r} is a minted child; only its parent's creating intent "
            "may run the first command.",
            request,
            code="access_denied",
        )
    return None


def replay(request: Request, stored: dict[str, Any]) -> Result:
    """A stored receipt's answer to a command with its id: its outcome, or a refusal.

    Names: the receipt's command is compared by its canonical name, so a receipt written under
    a command's earlier name (one of its ``aliases=``) replays for the renamed command, and a
    receipt of another command is a conflict whichever names either carries (evolution E2).

    Payloads: an external call's payload hash must equal the receipt's (same id, other
    arguments: ``CommandConflict``). An internal delivery (an intent, timer, cron tick or job
    route from the relay) is different: its command id is its outbox row's own id, minted once,
    and the row's stored payload never changes. Its hash is of the payload *as the delivering
    code decodes it*; when a deploy adds a payload migration (or a defaulted parameter) between
    a delivery that committed and its redelivery (the row's delete was lost), the same stored
    row hashes differently under the new code. Comparing it would turn that redelivery into a
    conflict the relay retries forever, so an internal delivery replays on the command alone.
    """
    cid = request.command_id.raw
    if stored["caller_key"] != request.caller_key:
        return _error(
            "Unauthorized",
            f"Command id {cid!r} belongs to another caller.",
            request,
            code="receipt_access_denied",
        )
    if not same_command(request.member, str(stored["command"])) or (
        request.external and stored["payload_hash"] != request.digest()
    ):
        return _error(
            "CommandConflict",
            f"Command id {cid!r} was already used for a different command or payload; mint a "
            "new id for a new call.",
            request,
        )
    return receipt_result(request.member, stored["outcome"], replayed=True)


def same_command(member: Member, stored: str) -> bool:
    """Whether a receipt's stored command name is ``member`` (by its name or an alias)."""
    return member.owner.canonical(stored) == member.name


def receipt_result(
    member: Member, outcome: dict[str, Any], *, replayed: bool = False, message: str | None = None
) -> Result:
    """The caller's result from a receipt's decoded outcome: first reply and replay alike.

    A value the command's annotation no longer reads (a changed model; a validator that fails,
    however it fails) is returned as stored: the outcome committed, so the caller gets it.
    """
    if "ok" in outcome:
        try:
            value = member.result.validate_python(outcome["ok"])
        except Exception:  # ValidationError, or whatever a user's validator raised
            value = outcome["ok"]
        return Result("ok", value=value, replayed=replayed)
    error = DeclaredError.from_receipt(
        outcome["error"], outcome.get("fields", {}), message or outcome.get("message")
    )
    return Result("declared", error=error, replayed=replayed)


def valid_mint(request: Request, ref: ActorRef) -> bool:
    """Whether a command to the minted child ``ref`` carries its parent's mint proof."""
    caller = request.caller
    if request.external or not isinstance(caller, System) or caller.mint is None:
        return False
    if caller.source != "actor" or caller.ref is None:
        return False
    parent_command_id, ordinal = caller.mint
    expected = child_id(
        tenant=ref.tenant,
        parent_type=caller.ref.type,
        parent_id=caller.ref.id,
        parent_command_id=parent_command_id,
        ordinal=ordinal,
        child_type=ref.type,
    )
    return expected == ref.id and caller.ref.tenant == ref.tenant


def release(result: Result, request: Request, released_at: int) -> Result:
    """The result the caller gets, checked on a clock read taken after the transaction ended.

    An external caller gets an outcome only while its id is unexpired (semantics §2.3).
    """
    if (
        request.external
        and result.kind in ("ok", "declared")
        and released_at >= request.command_id.expires_ms
    ):
        return Result("error", error=expired(request))
    return result


def expired(request: Request) -> ActorError:
    """The refusal of a command whose id expired."""
    return ActorError(
        "CommandExpired",
        f"Command id {request.command_id.raw!r} has expired; whether an earlier attempt "
        "committed is unknown here. Query the actor, then mint a new id if needed.",
        command_id=request.command_id.raw,
    )


def lease_lost(request: Request) -> ActorError:
    """The refusal of a singleton loop's command whose lease is no longer current."""
    fence = request.fence
    assert fence is not None
    return ActorError(
        "LeaseLost",
        f"The lease of the {fence.actor_type!r} loop (runner {fence.owner!r}, epoch "
        f"{fence.epoch}) is no longer current, so {request.ref.type}.{request.member.name} was "
        f"not run and its id {request.command_id.raw!r} stays unused; end this loop step, the "
        "loop runs again wherever the lease is held.",
        command_id=request.command_id.raw,
    )


def unavailable(request: Request, why: str, in_doubt: bool) -> Result:
    """``ActorUnavailable`` for a failed turn, honest about its outcome (hardening 9).

    Unknown (coded ``outcome_unknown``) only when the commit flight was sent and its answer
    lost; before that (lock wait, handler, admission) nothing committed.
    """
    turn = f"The turn for {request.ref.type}/{request.ref.id!r}"
    if in_doubt:
        message = (
            f"{turn} was not confirmed ({why}); it may or may not have committed: retry "
            "with the same command id."
        )
    else:
        message = f"{turn} failed ({why}); it was not committed: retry with the same command id."
    return Result(
        "error",
        error=ActorError(
            "ActorUnavailable",
            message,
            code="outcome_unknown" if in_doubt else None,
            command_id=request.command_id.raw,
        ),
    )


def _error(reason: Reason, message: str, request: Request, **details: Any) -> Result:
    return Result(
        "error", error=ActorError(reason, message, command_id=request.command_id.raw, **details)
    )


def defect(ref: ActorRef, request: Request, message: str) -> Result:
    """The answer to a command that hit a deterministic defect (logged at ERROR)."""
    log.error(
        "Deterministic actor defect: %s/%r command %s (command id %r): %s",
        ref.type,
        ref.id,
        request.member.name,
        request.command_id.raw,
        message,
        extra={
            "actor": ref.type,
            "id": ref.id,
            "tenant": ref.tenant,
            "command": request.member.name,
            "command_id": request.command_id.raw,
            "defect": message,
        },
    )
    return Result(
        "error",
        error=ActorError("Defect", message, command_id=request.command_id.raw),
    )
