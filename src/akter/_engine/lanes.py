"""What the pass loop and its lanes share: a pass, what a lane claimed in it, and a wake.

A lane (intents, jobs, workflow runs; subscriptions next) is a package under ``_engine`` that
claims its rows of the outbox (or its own table) into free slots, runs them, and settles them.
The pass loop (``akter._engine.loop.passes``) knows lanes only through :class:`Lane`: each pass
asks every lane to ``claim`` with the same :class:`Pass`, side by side. A lane asks for the next
pass through the :class:`Waker` it was handed at construction. No lane imports another lane or
the loop; this module sits below all of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import IntentKey
from akter.callers import ActorRef, Caller


@dataclass(frozen=True)
class Pass:
    """What one pass asks of every lane.

    Attributes:
        drain: A test drain: a lane may fill up to ``pass_limit`` slots at once.
        quiet: An idle poll found no due row at all: claim nothing.
        jobs_only: Every wake since the last pass came from commits that staged only job rows:
            the intent lane skips its claim (the polls still claim everywhere).
        job_keys: The job rows those commits made due (empty: not known); the jobs lane may claim
            them by primary key.
        intent_keys: Every wake since the last pass that asked for intent claims came from local
            commits, which made these intents due (``None``: not known, claim by scan). On
            Citus the intent lane claims them by key, without reading every shard.
    """

    drain: bool = False
    quiet: bool = False
    jobs_only: bool = False
    job_keys: Sequence[JobKey] = ()
    intent_keys: Sequence[IntentKey] | None = None


@dataclass(frozen=True)
class Claimed:
    """What a lane claimed in one pass.

    Attributes:
        rows: How many rows (or runs) it claimed.
        backlogged: Its claim took every row it asked for, so due rows may be left behind (the
            admission gate on the outbox backlog samples while a lane says so).
    """

    rows: int = 0
    backlogged: bool = False


class Lane(Protocol):
    """One lane as the pass loop drives it."""

    async def claim(self, p: Pass) -> Claimed:
        """Claim due rows into free slots and start them; return at once (they run on)."""
        ...


class Waker(Protocol):
    """How a lane (or a commit, or an operator) asks for passes (the pass loop's wakes)."""

    def wake(self) -> None:
        """Ask for a pass here soon (repeated wakes coalesce)."""
        ...

    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None:
        """Ask for a pass here soon that need only claim jobs (``keys``: rows made due)."""
        ...

    def wake_intents(self, keys: Sequence[IntentKey]) -> None:
        """Ask for a pass here soon for the intents ``keys`` (rows a local commit made due)."""
        ...

    def wake_everywhere(self) -> None:
        """Ask for a pass here and, with ``notify=True``, on the other runners."""
        ...

    def poke_others(self) -> None:
        """After a local commit with ``notify=True``: wake the other runners (throttled)."""
        ...

    async def announce(self) -> None:
        """After rows were made due outside a turn: a pass here, every runner woken now."""
        ...


class Delivered(Protocol):
    """A delivery's outcome (``akter._engine.turn.Result``)."""

    @property
    def kind(self) -> str: ...

    @property
    def error(self) -> BaseException | None: ...


class Deliver(Protocol):
    """Delivers a lane's row as an internal command (``Calls.deliver_decoded``).

    The relay's intents and the subscription lane's events go through it.
    """

    def __call__(
        self,
        ref: ActorRef,
        command: str,
        payload: dict[str, Any],
        command_id: str,
        caller: Caller,
        *,
        within: float | None = None,
        first: bool = False,
    ) -> Awaitable[Delivered]: ...
