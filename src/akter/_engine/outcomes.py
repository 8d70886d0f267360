"""A command's outcome read by its id, waiting for its receipt (``runtime.outcome``, issue 41).

A command staged in the application's transaction (``akter.stage``) returns only its id; the
outcome is its receipt, written when the relay delivers it. :func:`wait` polls for that receipt
(50 ms, doubling to 1 s) until it is there or the timeout passes:

- found: the success value (decoded as the command's return annotation reads it), or its
  declared error raised, as the handle call would have returned or raised it;
- not yet: ``ActorError("Timeout", code="no_outcome")`` (retryable): the intent is pending, the
  application's transaction has not committed, or it rolled back (nothing here tells them apart);
- gone: once the id has expired (its ``expires`` part is behind the database clock) and neither
  a receipt nor a pending intent holds it, ``ActorError("CommandExpired", code="receipt_gone")``:
  receipts are kept until their id expires and pruned after, so whether it ran is unknown here.

Without the actor (``ref=None``) the id is located through the outbox (pending) or the receipts
of transaction callers (migration 0015); a command staged for a ``User`` caller, or sent by a
handle, is read with its actor (``ref=``). With ``ref`` the actor type's access policy is asked
first (kind ``events``, the current caller): the HTTP route's read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from akter._engine.calls import check_access
from akter._engine.dispatcher import routing_key_of
from akter._engine.services import Services
from akter._engine.turn.rules import receipt_result
from akter._ids import parse_framework_id
from akter._store.gateway.outcomes import Found, OutcomesGateway
from akter.callers import ActorRef, current_caller
from akter.errors import ActorError

#: The first and the longest wait between two probes, in seconds.
FIRST_WAIT = 0.05
LONGEST_WAIT = 1.0


async def wait(
    services: Services,
    command_id: str,
    *,
    ref: ActorRef | None,
    timeout: float,  # noqa: ASYNC109 (a durable wait's bound, as WorkflowRun.result's)
) -> Any:
    """The outcome of ``command_id`` (module docstring): its value, or its error raised."""
    parsed = parse_framework_id(command_id)
    if ref is not None:
        # A read of what the actor committed: its type's policy, as for its event feed.
        await check_access(services.registry.definition(ref.type), ref, current_caller(), "events")
    gateway = OutcomesGateway(services.store, services.clock)
    deadline = time.monotonic() + timeout
    pause = FIRST_WAIT
    while True:
        found = await _probe(services, gateway, command_id, ref)
        if found.outcome is not None:
            assert found.where is not None and found.command is not None
            definition = services.registry.definition(found.where[1])
            member = definition.member(found.command, "command")
            result = receipt_result(member, found.outcome)
            if result.kind == "ok":
                return result.value
            assert result.error is not None
            raise result.error
        if not found.pending and found.now >= parsed.expires_ms:
            raise ActorError(
                "CommandExpired",
                f"Command id {command_id!r} has expired and no receipt or pending intent holds "
                "it: receipts are kept until their id expires, so whether it ran is unknown "
                "here. Query the actor.",
                code="receipt_gone",
                command_id=command_id,
            )
        left = deadline - time.monotonic()
        if left <= 0:
            state = "its intent is pending" if found.pending else "no receipt yet"
            raise ActorError(
                "Timeout",
                f"No outcome for command id {command_id!r} within {timeout} s ({state}; an "
                "uncommitted or rolled-back staging leaves none).",
                code="no_outcome",
                retry_after=1.0,
                command_id=command_id,
            )
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, LONGEST_WAIT)


async def _probe(
    services: Services, gateway: OutcomesGateway, command_id: str, ref: ActorRef | None
) -> Found:
    if ref is None:
        return await gateway.locate(command_id)
    definition = services.registry.definition(ref.type)
    where = (ref.tenant, ref.type, ref.id)
    return await gateway.probe(routing_key_of(definition, ref), where, command_id)
