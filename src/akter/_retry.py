"""Waiting between attempts: ``Backoff`` (doubling, capped) and a command's retry budget.

A command is retried with one command id until its delivery timeout (semantics §1.3); the
receipt turns a retry of a committed attempt into a replay. ``CommandRetry`` is that loop's
bookkeeping, shared by in-process handles and the HTTP client: how long to wait after each
retryable error, when to give up, and whether the final ``Timeout`` must say "it may have
committed" (some attempt's commit went unanswered, ``code="outcome_unknown"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from akter._ids import FUTURE_WAIT_MS
from akter.errors import ActorError


class Backoff:
    """Doubling waits in seconds: ``first``, ``2 × first``, … at most ``cap``."""

    __slots__ = ("_current", "cap", "first")

    def __init__(self, first: float, cap: float) -> None:
        self.first = first
        self.cap = cap
        self._current = 0.0

    def next(self) -> float:
        """The next wait."""
        self._current = self.first if self._current == 0 else min(self._current * 2, self.cap)
        return self._current

    @property
    def current(self) -> float:
        """The last wait given (``0`` before the first and after a reset)."""
        return self._current

    def reset(self) -> None:
        """Start again from ``first`` (after a success)."""
        self._current = 0.0

    @staticmethod
    def nth(base: float, cap: float, attempt: int) -> float:
        """The wait before retry ``attempt`` (1-based) without state: ``base × 2^(attempt-1)``."""
        return float(min(base * 2 ** max(attempt - 1, 0), cap))


class CommandRetry:
    """One command's retries with one id until ``deadline`` (``time.monotonic()`` seconds).

    Args:
        what: The call for messages (``"Order/'o-1'.place"``).
        command_id: The id every attempt carries.
        deadline: When the delivery timeout ends.
        first_wait: The first wait when an error carries no ``retry_after``.
        floor: The shortest first wait.
        fixed_first: Keep the first error's wait as the base (in-process) rather than each
            error's own ``retry_after`` (HTTP, where the server paces each refusal).
        expiry_guard: Seconds until the command id is about to expire, if known; retries stop
            before it.
    """

    def __init__(
        self,
        what: str,
        command_id: str,
        deadline: float,
        *,
        first_wait: float,
        floor: float,
        fixed_first: bool,
        expiry_guard: Callable[[], float] | None = None,
    ) -> None:
        self.what = what
        self.command_id = command_id
        self.deadline = deadline
        self._first_wait = first_wait
        self._floor = floor
        self._fixed_first = fixed_first
        self._expiry_guard = expiry_guard
        self._backoff: Backoff | None = None
        #: Some attempt's commit was sent and not answered.
        self.in_doubt = False

    def wait_after(self, error: ActorError) -> float:
        """The wait before the next attempt after a retryable ``error``, or raise to give up."""
        self.in_doubt = self.in_doubt or error.code == "outcome_unknown"
        retry_after = error.retry_after or 0
        if error.reason == "InvalidCommandId" and (
            retry_after * 1000 > FUTURE_WAIT_MS or time.monotonic() + retry_after >= self.deadline
        ):
            raise error  # a pinned id far in the future: refused, not a Timeout (akter._ids)
        first = max(error.retry_after or self._first_wait, self._floor)
        if self._backoff is None:
            self._backoff = Backoff(first, max(0.5, first))
        elif not self._fixed_first:
            self._backoff.first, self._backoff.cap = first, max(0.5, first)
        wait = self._backoff.next()
        guard = self._expiry_guard() if self._expiry_guard is not None else float("inf")
        if time.monotonic() + wait >= self.deadline or wait >= guard:
            raise self.timeout(error)
        return wait

    def timeout(self, error: ActorError) -> ActorError:
        """The final refusal: nothing of this command is in flight now."""
        outcome = "it may have committed" if self.in_doubt else "it was not committed"
        return ActorError(
            "Timeout",
            f"{self.what} did not complete within the delivery timeout (last error: "
            f"{error.reason}); {outcome} — retry with command id {self.command_id!r}.",
            code="outcome_unknown" if self.in_doubt else None,
            command_id=self.command_id,
        )
