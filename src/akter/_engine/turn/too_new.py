"""A stored state newer than this code (evolution E1, E4): the refusal and its warning.

During a rolling deploy, or after a rollback, a runner may lock a row written by newer code. It
never overwrites it: every command of the batch is refused with ``StateTooNew`` (retryable, so
the caller's retry with the same id can reach a newer runner) and the turn writes nothing. The
runner says so once per actor type per minute, not once per command.

Newer code is known by the row's state version, or — when the newer code only added defaulted
fields (EVO-01: the same state version) — by its model: the loss guard finds keys this code's
model would drop, and a live runner at the row's version runs a newer model (first recorded after
this code's) that declares every one of them (``Runners.state_paths``, migration 0014). That row
is newer, not lossy: :func:`newer_writer` answers it like a newer version while the two deploys
run together. A key no such runner declares keeps the loss guard's ``Defect``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from akter._engine.turn.types import Request, Result
from akter._evolution import StateDecodeError, newer_writer_declares
from akter.callers import ActorRef
from akter.errors import ActorError

log = logging.getLogger("akter.evolution")

#: The least time between two warnings about one actor type, in seconds.
WARN_EVERY_S = 60.0


def refusal(request: Request, problem: StateDecodeError) -> Result:
    """The ``StateTooNew`` refusal of one command (``retry_after`` comes from its reason)."""
    return Result(
        "error",
        error=ActorError("StateTooNew", problem.message, command_id=request.command_id.raw),
    )


#: The key paths live runners' models of a type declare at a state version (``Runners``).
StatePaths = Callable[[str, int], Awaitable[list[list[str]]]]


async def newer_writer(
    problem: StateDecodeError, actor: ActorRef, version: int, state_paths: StatePaths
) -> StateDecodeError:
    """The loss guard's ``problem`` as ``too_new`` when a live, newer model declares its keys.

    ``version`` is the row's state version, which must be this code's (an older row's extra
    keys are this code's to migrate). One registry read, on the refusal path only.
    """
    if problem.kind != "lost" or not problem.lost:
        return problem
    if not newer_writer_declares(problem.lost, await state_paths(actor.type, version)):
        return problem
    keys = ", ".join(repr(k) for k in problem.lost)
    return StateDecodeError(
        "too_new",
        f"The stored state of {actor.type}/{actor.id!r} (version {version}) holds {keys}, which "
        f"this code's model of {actor.type} does not declare and a live runner's newer model "
        "does (a newer deploy wrote it); a runner with that code can serve it (retry), and "
        "this one never overwrites it.",
        problem.lost,
    )


class TooNewWarnings:
    """Logs a warning per actor type at most once per ``WARN_EVERY_S`` (in memory, per runner)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._last: dict[str, float] = {}

    def seen(self, actor_type: str, actor_id: str, problem: StateDecodeError) -> bool:
        """Note a refusal; logs (and returns ``True``) unless the type was warned about lately."""
        now = self._monotonic()
        last = self._last.get(actor_type)
        if last is not None and now - last < WARN_EVERY_S:
            return False
        self._last[actor_type] = now
        log.warning(
            "Stored state is newer than this code; refusing its commands with StateTooNew: "
            "%s/%r (and other %s actors like it until a newer runner serves them): %s",
            actor_type,
            actor_id,
            actor_type,
            problem.message,
            extra={"actor": actor_type, "id": actor_id, "detail": problem.message},
        )
        return True
