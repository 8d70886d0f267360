"""``FakeProvider``: a scripted stand-in for the external service a job calls.

Use it inside an executor to script what each call does and to check afterwards how often, by
which attempts and how concurrently the provider was called::

    provider = FakeProvider()

    class Order(akter.Actor[State]):
        @akter.job(attempts=3)
        async def charge(call: akter.JobCall, req: Charge) -> str:
            return await provider(call)

    provider.script(fail("card declined"), succeed("ch_1"))
    ...
    assert provider.count == 2 and provider.calls[1].attempt == 2

Each call takes the next step scripted for its key (``provider(call, key=...)``), else the next
step of the shared script, else the default step (``succeed(None)`` unless given).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from akter.errors import JobFailure
from akter.jobs import JobCall

StepKind = Literal["succeed", "fail", "raise", "hang", "gate"]


@dataclass
class Step:
    """What one provider call does. Build steps with the functions of this module."""

    kind: StepKind
    value: Any = None
    cause: str = ""
    final: bool = False
    error: BaseException | None = None
    delay: float = 0.0
    then: Step | None = None
    _opened: asyncio.Event | None = field(default=None, repr=False)
    _entered: asyncio.Event | None = field(default=None, repr=False)

    @property
    def opened(self) -> asyncio.Event:
        """Set to let a ``gate`` step return."""
        if self._opened is None:
            self._opened = asyncio.Event()
        return self._opened

    @property
    def entered(self) -> asyncio.Event:
        """Set once a call reached this step."""
        if self._entered is None:
            self._entered = asyncio.Event()
        return self._entered

    def release(self) -> None:
        """Let a ``gate`` step return its value."""
        self.opened.set()


def succeed(value: Any = None, *, after: float = 0.0) -> Step:
    """Return ``value``, optionally after ``after`` seconds."""
    return Step("succeed", value=value, delay=after)


def fail(cause: str = "declined by the provider", *, final: bool = False) -> Step:
    """Raise ``akter.JobFailure(cause, final=final)``: known not applied."""
    return Step("fail", cause=cause, final=final)


def raises(error: BaseException | None = None) -> Step:
    """Raise ``error`` (default ``ConnectionError``): the outcome is ambiguous."""
    return Step("raise", error=error or ConnectionError("provider connection reset"))


def hang() -> Step:
    """Never return (until the attempt is interrupted or times out)."""
    return Step("hang")


def gate(value: Any = None, *, then: Step | None = None) -> Step:
    """Wait until ``step.release()``, then return ``value`` or do what ``then`` says."""
    return Step("gate", value=value, then=then)


@dataclass
class ProviderCall:
    """One recorded call.

    Attributes:
        job_id: The job id (the idempotency key the executor passed).
        attempt: The attempt number.
        key: The script key the call used, if any.
        principal: The principal of the turn that enqueued the job.
        started: Monotonic time the call started.
        ended: Monotonic time it returned, raised or was interrupted; ``None`` while running.
        outcome: ``running``, ``succeeded``, ``failed``, ``raised`` or ``interrupted``.
    """

    job_id: str
    attempt: int
    key: str | None
    principal: str | None
    started: float
    ended: float | None = None
    outcome: str = "running"


class FakeProvider:
    """A scripted provider that records every call.

    Args:
        steps: The shared script, consumed one step per call.
        default: The step used once the scripts are exhausted.
    """

    def __init__(self, *steps: Step, default: Step | None = None) -> None:
        self._shared: deque[Step] = deque(steps)
        self._keyed: dict[str, deque[Step]] = {}
        self.default = default or succeed()
        self._initial_default = self.default
        self.calls: list[ProviderCall] = []
        self._changed = asyncio.Condition()

    def script(self, *steps: Step, key: str | None = None) -> None:
        """Append steps to the shared script, or to the script of ``key``."""
        if key is None:
            self._shared.extend(steps)
        else:
            self._keyed.setdefault(key, deque()).extend(steps)

    def reset(self) -> None:
        """Forget the scripts, the recorded calls and a changed default step."""
        self.default = self._initial_default
        self._shared.clear()
        self._keyed.clear()
        self.calls.clear()
        self._changed = asyncio.Condition()

    def _next(self, key: str | None) -> Step:
        keyed = self._keyed.get(key) if key is not None else None
        if keyed:
            return keyed.popleft()
        if self._shared:
            return self._shared.popleft()
        return self.default

    async def __call__(self, call: JobCall, key: str | None = None) -> Any:
        """Make one call: record it, then do what its step says."""
        step = self._next(key)
        record = ProviderCall(call.job_id, call.attempt, key, call.principal, time.monotonic())
        self.calls.append(record)
        await self._notify()
        step.entered.set()
        try:
            value = await self._perform(step)
        except JobFailure:
            record.outcome = "failed"
            raise
        except asyncio.CancelledError:
            record.outcome = "interrupted"
            raise
        except BaseException:
            record.outcome = "raised"
            raise
        finally:
            record.ended = time.monotonic()
            await self._notify()
        record.outcome = "succeeded"
        return value

    async def _perform(self, step: Step) -> Any:
        if step.delay:
            await asyncio.sleep(step.delay)
        match step.kind:
            case "succeed":
                return step.value
            case "fail":
                raise JobFailure(step.cause, final=step.final)
            case "raise":
                assert step.error is not None
                raise step.error
            case "hang":
                await asyncio.Event().wait()
            case "gate":
                await step.opened.wait()
                if step.then is not None:
                    return await self._perform(step.then)
                return step.value
        raise AssertionError(step.kind)  # pragma: no cover

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- checks -------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """How many calls were made."""
        return len(self.calls)

    def calls_for(self, job_id: str) -> list[ProviderCall]:
        """The calls made for one job."""
        return [c for c in self.calls if c.job_id == job_id]

    @property
    def in_flight(self) -> int:
        """Calls started and not yet ended."""
        return sum(1 for c in self.calls if c.outcome == "running")

    def max_concurrency(self, key: str | None = None) -> int:
        """The most calls (of ``key``, or all) that overlapped in time."""
        chosen = [c for c in self.calls if key is None or c.key == key]
        edges: list[tuple[float, int]] = []
        for c in chosen:
            edges.append((c.started, 1))
            edges.append((c.ended if c.ended is not None else float("inf"), -1))
        # An end at the same instant as a start is counted first: they do not overlap.
        edges.sort(key=lambda e: (e[0], e[1]))
        most = level = 0
        for _, delta in edges:
            level += delta
            most = max(most, level)
        return most

    async def wait_calls(self, n: int, within: float = 10.0) -> list[ProviderCall]:
        """Wait until at least ``n`` calls were made; returns the calls."""

        async def reached() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: len(self.calls) >= n)

        await asyncio.wait_for(reached(), within)
        return list(self.calls)
