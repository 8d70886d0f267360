"""A stored state newer than this code (evolution E1, E4): the refusal and its warning.

During a rolling deploy, or after a rollback, a runner may lock a row written by newer code. It
never overwrites it: every command of the batch is refused with ``StateTooNew`` (retryable, so
the caller's retry with the same id can reach a newer runner) and the turn writes nothing. The
runner says so once per actor type per minute, not once per command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from akter._engine.turn.types import Request, Result
from akter._evolution import StateDecodeError
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
            "Stored state is newer than this code; refusing its commands with StateTooNew",
            extra={"actor": actor_type, "id": actor_id, "detail": problem.message},
        )
        return True
