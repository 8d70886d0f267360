"""What a workflow run attempt is made of: its claim, journal records, limits and control flow.

Control leaves a workflow's code through ``BaseException`` subclasses, so ``except Exception``
in a workflow cannot swallow them: :class:`Suspend` (it waits for what is not there yet),
:class:`Diverged` (the code asked for another step than the journal holds), :class:`Outage` (a
step could not be performed or recorded) and :class:`LeaseLost`. :func:`durable` makes a step
run one at a time and raise the control exception again once one ended the attempt.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from akter._kinds import StepKind
from akter._store.gateway.workflows import RunKey
from akter.callers import ActorRef

if TYPE_CHECKING:
    from akter.actor import Member

#: Limits of the workflows spec, W3: steps per run and bytes per recorded outcome.
MAX_STEPS = 10_000
MAX_OUTCOME_BYTES = 1 << 20
#: Steps whose pending record is a suspension: a cancel replaces it (a pending command step
#: is finished first: its turn may have committed). A pending job step is replaced by
#: ``RunAttempt.job``, which cancels its job in the same write.
SUSPENDING = frozenset({StepKind.SLEEP, StepKind.WAIT})


class Suspend(BaseException):
    """The run waits for something not yet there: hand it back until ``wake_at``."""

    def __init__(self, wake_at: int | None, waiting: str) -> None:
        super().__init__(waiting)
        self.wake_at = wake_at
        self.waiting = waiting


class Diverged(BaseException):
    """The code asked for a step the journal does not hold at that seq (W5)."""


class Outage(BaseException):
    """A step could not be performed or recorded for a reason outside the workflow's code."""


class LeaseLost(BaseException):
    """Another attempt holds the run now: this one writes nothing more."""


class Fatal(Exception):
    """The run cannot go on (a limit, an outcome that cannot be stored): it fails."""


@dataclass
class Record:
    """A journal record as loaded."""

    seq: int
    #: A :class:`~akter._kinds.StepKind` value (or one a newer code wrote), as stored.
    kind: str
    name: str
    status: str
    detail: str | None
    outcome: str | None


@dataclass
class PendingSignal:
    """An unconsumed signal as loaded (arrival order)."""

    signal_id: str
    name: str
    payload: str


@dataclass
class Claimed:
    """A claimed run, as the claim returned it."""

    run: RunKey
    ref: ActorRef
    workflow: str
    input: str
    caller: str
    token: int
    attempts: int
    cancel_requested: bool
    deadline_ms: int | None
    now: int
    #: The W3C traceparent of the span that started the run (attempts link to it).
    traceparent: str | None = None


class StepsCalls(typing.Protocol):
    """The runtime's call paths a command or query step uses (``akter._engine.calls.Calls``)."""

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        payload: dict[str, Any],
        pinned: str | None,
        caller: Any = None,
        *,
        retry: bool = True,
    ) -> Any:
        """A command with retries under one id."""
        ...

    async def query(
        self, member: Member, ref: ActorRef, payload: dict[str, Any], caller: Any = None
    ) -> Any:
        """A query."""
        ...

    def mint_command_id(self) -> str:
        """A fresh command id."""
        ...


HandleFactory = Callable[[Any, Any, ActorRef], Any]

_P = ParamSpec("_P")
_R = TypeVar("_R")
Control = Suspend | Diverged | Outage | LeaseLost


class Halting(typing.Protocol):
    """What :func:`durable` keeps on an attempt: how it ended, and whether a step runs."""

    halted: Control | None
    in_step: bool


_A = TypeVar("_A", bound=Halting)


def durable(
    method: Callable[Concatenate[_A, _P], Awaitable[_R]],
) -> Callable[Concatenate[_A, _P], Coroutine[Any, Any, _R]]:
    """A durable step: one at a time, and none after the attempt was halted.

    Once a step raised a control exception (a suspension, a divergence, an outage, a lost
    lease), every later step raises it again: code that swallowed it (``except
    BaseException``) cannot run steps past the point where the attempt ended.
    """

    async def run(self: _A, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self.halted is not None:
            raise self.halted
        if self.in_step:
            raise Fatal(
                "Steps of one workflow run one at a time: await each step before starting the "
                "next (asyncio.gather over steps is not supported)."
            )
        self.in_step = True
        try:
            return await method(self, *args, **kwargs)
        except (Suspend, Diverged, Outage, LeaseLost) as exc:
            self.halted = exc
            raise
        finally:
            self.in_step = False

    return run


__all__ = [
    "MAX_OUTCOME_BYTES",
    "MAX_STEPS",
    "SUSPENDING",
    "Claimed",
    "Control",
    "Diverged",
    "Fatal",
    "HandleFactory",
    "LeaseLost",
    "Outage",
    "PendingSignal",
    "Record",
    "StepsCalls",
    "Suspend",
    "durable",
]
