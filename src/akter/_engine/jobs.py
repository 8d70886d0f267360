"""The job executor: claims job rows, runs attempts under a lease, settles them (semantics §5).

Interface used by the rest of the runtime (keep it stable):

- ``JobExecutor(runtime)``; ``await start()`` / ``await stop()`` (stop interrupts running
  attempts *without* settling: their rows stay running and ambiguous, taken over after the lease);
- ``await run_pass() -> int``: claim due job rows of the job types this runner executes
  (``runtime.executes``), up to free executor slots, start their attempts as tasks; returns how
  many rows it claimed. Called by the relay loop on every pass and by ``ActorTest`` drains;
- ``await wait_idle()``: await every attempt task started so far;
- ``running -> int``: attempts in flight on this runner;
- ``cancel_signal(job_ids)``: a turn on this runner committed the cancellation of these running
  jobs (semantics §5.8.3): their attempts notice at once;
- ``shift(ms)``: ``ActorTest.advance`` moved the clock: push the leases of attempts this runner is
  executing by ``ms`` so a clock jump never steals a live lease.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from akter.runtime import Runtime


class JobExecutor:
    """Runs the job attempts of one runner."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def start(self) -> None:
        """Start background work (none yet)."""

    async def stop(self) -> None:
        """Interrupt running attempts without settling them."""

    async def run_pass(self) -> int:
        """Claim and start due attempts; returns how many rows were claimed."""
        return 0

    async def wait_idle(self) -> None:
        """Await every attempt started so far."""

    @property
    def running(self) -> int:
        """Attempts in flight on this runner."""
        return 0

    def cancel_signal(self, job_ids: Iterable[str]) -> None:
        """Cancellations committed on this runner for running jobs."""

    async def shift(self, ms: int) -> None:
        """Push the leases of this runner's running attempts by ``ms``."""
