"""The pass loop: when this runner's lanes look for work, and one pass over all of them.

Correctness rests on polling: a pass runs at least every ``poll`` (``idle``). Wakes only cut
latency (``wake_channel``: in-process after a local commit, ``NOTIFY`` from other runners); a
missed wake delays work by at most one poll (with ``notify=True``, an idle runner sleeps until
the next due row, at most ``IDLE_POLLS`` polls).

Per runner, passes are serialized. A pass first starts the skew check (``skew``, at most every
few seconds, beside the pass; a test's drain waits for it), then, after a pass that claimed
nothing, an idle poll's probe (``any_due`` or
``next_due``); then it asks every lane to claim, side by side (own connection, framework pool:
in series, an intent committed while the job claims ran waited for them before its own claim).
After the pass, the admission gate on the outbox backlog (``backlog``) learns whether a lane's
claim came back full, and the lean watch (``vacuum``) may vacuum the outbox, off the pass.

The loop knows lanes only as :class:`akter._engine.lanes.Lane`; it is built first, and each lane
gets it as its :class:`akter._engine.lanes.Waker`, then :meth:`PassLoop.drive` names the lanes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import psycopg

from akter._engine.lanes import Claimed, Lane, Pass
from akter._engine.loop.backlog import BacklogGate
from akter._engine.loop.idle import IdleWait
from akter._engine.loop.skew import SkewWatch
from akter._engine.loop.vacuum import VacuumWatch
from akter._engine.loop.wake_channel import WakeChannel
from akter._store.gateway.jobs import JobKey
from akter._store.gateway.outbox import IntentKey
from akter._store.gateway.vacuum import VacuumGateway
from akter._waits import wait_event

if TYPE_CHECKING:
    from collections.abc import Callable

    from akter._engine.services import Services

log = logging.getLogger("akter.relay")


class OutboxProbe(Protocol):
    """The outbox statements the loop runs itself (the relay's gateway, its claim connection)."""

    @property
    def probes_cheaply(self) -> bool: ...
    @property
    def claims_by_key(self) -> bool: ...
    async def any_due(self) -> bool: ...
    async def next_due(self) -> int | None: ...
    async def count_backlog(self, types: Sequence[str], limit: int) -> int: ...


class PassLoop:
    """One runner's pass loop (module docstring); the :class:`Waker` of its lanes.

    Args:
        services: The runner's services.
        outbox: The outbox gateway the idle probes and backlog counts run on.
        heard: Called for every wake heard from the channel (the event bus wakes its live feeds).
        runner_id: This runner's id (for the skew watch's warnings).
    """

    def __init__(
        self,
        services: Services,
        *,
        outbox: OutboxProbe,
        heard: Callable[[], None],
        runner_id: str,
    ) -> None:
        self._services = services
        self._outbox = outbox
        config = services.config
        self._idle = IdleWait(outbox, poll_ms=config.poll_ms, notify=config.notify)
        self._channel = WakeChannel(services, heard=heard, other=self._idle.heard_other)
        self._lanes: list[Lane] = []
        # Per lane: whether its last claim came back full (kept when a claim fails).
        self._backlogged: list[bool] = []
        self._pass_lock = asyncio.Lock()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.skew = SkewWatch(services, executed_jobs=services.executed_jobs, runner_id=runner_id)
        #: Admission backpressure on the backlog this runner's passes see (``max_outbox_backlog``).
        self.backlog = BacklogGate(lambda: services.config.max_outbox_backlog, self._count_backlog)
        #: Vacuums the outbox and the actors when their dead tuples pile up (``vacuum``, plain PG).
        self.vacuum = VacuumWatch(VacuumGateway(services.store))

    def drive(self, *lanes: Lane) -> None:
        """Name the lanes each pass asks to claim, in this order (once, before ``start``)."""
        self._lanes = list(lanes)
        self._backlogged = [False] * len(lanes)

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the pass loop and, with ``notify=True``, the listener."""
        supervise = self._services.supervisor.supervise
        self._tasks.append(supervise(asyncio.create_task(self._loop(), name="akter.relay")))
        await self.listen()

    async def listen(self) -> None:
        """With ``notify=True``: LISTEN for other runners' wakes (passes, event feeds)."""
        await self._channel.listen()

    async def stop(self) -> None:
        """Stop passing: the loop, a backlog count under way, the listener. Lanes stop next."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.backlog.stop()
        await self.skew.stop()
        await self.vacuum.stop()
        await self._channel.stop()

    # --- wakes (the lanes' Waker) ------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a pass soon (capacity one: repeated wakes coalesce)."""
        self._channel.wake()

    def wake_jobs(self, keys: Sequence[JobKey] = ()) -> None:
        """Ask for a pass soon that need only claim jobs (``keys``: the rows a commit made due).

        Unless another wake wants more, the pass skips the other lanes' claims: a job's start
        latency is then one claim, not two side by side; and the jobs lane may claim ``keys`` by
        primary key instead of probing every bucket.
        """
        self._channel.wake_jobs(keys)

    def wake_intents(self, keys: Sequence[IntentKey]) -> None:
        """Ask for a pass soon after a local commit made the intents ``keys`` due.

        Where a claim by key spares a scan (Citus), the pass's intent claim names them; else
        this is :meth:`wake`.
        """
        if self._outbox.claims_by_key:
            self._channel.wake_intents(keys)
        else:
            self._channel.wake()

    def wake_everywhere(self) -> None:
        """A pass here soon and, with ``notify=True``, on the other runners (a runnable run)."""
        self._channel.wake()
        self._channel.poke_others()

    async def announce(self) -> None:
        """After an operator made rows due now: a pass here, and every runner woken."""
        await self._channel.announce()

    def poke_others(self) -> None:
        """After a local commit with ``notify=True``: NOTIFY other runners, at most every 50 ms."""
        self._channel.poke_others()

    # --- passes -----------------------------------------------------------------------------

    async def _loop(self) -> None:
        idle = False
        # Jobs-only passes never stand in for a poll: a stream of them (a runner that keeps
        # staging jobs) still leaves a full pass at least every poll interval.
        full_by = 0.0
        while True:
            woken = await wait_event(self._channel.event, self._idle.next_wait())
            keys = self._channel.take()
            jobs_only = keys is not None and woken and time.monotonic() < full_by
            # Intents named by local commits (Citus): claimed by key, no scan; not a poll either.
            intents = self._channel.taken_intents if woken and time.monotonic() < full_by else None
            if not jobs_only and intents is None:
                full_by = time.monotonic() + self._services.config.poll_ms / 1000
            # A poll after a pass that claimed nothing, or one following another runner's wake,
            # asks first (``any_due`` or ``next_due``): idle cost.
            probe = (idle or self._idle.following) and not woken
            try:
                claimed = await self.run_pass(
                    idle_poll=probe,
                    jobs_only=jobs_only,
                    keys=keys if jobs_only else None,
                    intent_keys=None if jobs_only else intents,
                )
                # A jobs-only pass says nothing of intents: idle only if the last one was.
                idle = claimed == 0 and (idle or not jobs_only)
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "Relay pass failed; retrying at the next poll", extra={"error": str(exc)}
                )
            except Exception:
                # A bug, not an outage: say so loudly, keep the correctness path (polling) alive.
                log.exception("Relay pass raised unexpectedly; retrying at the next poll")

    async def run_pass(
        self,
        *,
        drain: bool = False,
        idle_poll: bool = False,
        jobs_only: bool = False,
        keys: Sequence[JobKey] | None = None,
        intent_keys: Sequence[IntentKey] | None = None,
    ) -> int:
        """One pass: every lane claims into its free slots; returns how many rows they claimed.

        A test drain (``drain=True``) may fill up to ``pass_limit`` slots at once, so a backlog
        of thousands settles within the drain's round limit. An ``idle_poll`` (the loop's poll
        after a pass that claimed nothing) first asks whether any row is due at all and claims
        nothing when none is: every claim needs a due, unparked row. A ``jobs_only`` pass (woken
        only by commits that staged job rows) skips the other lanes' claims; the polls claim
        everywhere. ``keys``: the job rows those commits made due (claimed by key when they can);
        ``intent_keys``: the intents local commits made due (on Citus, claimed by key).
        """
        if self._stopping:
            return 0
        async with self._pass_lock:
            # Rows left ahead by a backward clock move (skew.py): a live pass does not wait.
            if drain:
                await self.skew.check()
            else:
                self.skew.observe()
            self._idle.passed()
            quiet = idle_poll and not await self._idle.anything_due()
            p = Pass(
                drain=drain,
                quiet=quiet,
                jobs_only=jobs_only,
                job_keys=tuple(keys or ()),
                intent_keys=None if intent_keys is None else tuple(intent_keys),
            )
            outcomes = await asyncio.gather(
                *(lane.claim(p) for lane in self._lanes), return_exceptions=True
            )
            for i, outcome in enumerate(outcomes):
                if isinstance(outcome, Claimed):
                    self._backlogged[i] = outcome.backlogged
            self.backlog.observe(any(self._backlogged))
            self.vacuum.observe()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # every lane's claim has ended: the pass ran to completion
        return sum(o.rows for o in outcomes if isinstance(o, Claimed))

    async def _count_backlog(self, limit: int) -> int:
        """Due intents of the hosted types, counted up to ``limit`` (the backlog gate's view)."""
        types = sorted(self._services.registry.definitions)
        return await self._outbox.count_backlog(types, limit)
