"""How long an idle relay waits before its next pass (semantics §3.5.2).

A pass runs at least every ``poll`` × uniform[0.9, 1.1]. After a pass that claimed nothing the
next one is an *idle poll*: it first asks whether any row is due at all and claims nothing when
none is (every claim needs a due, unparked intent or job row).

With ``notify=True`` the question is "how long until the first row is due" (``next_due``), and
the loop may sleep that long, at most ``IDLE_POLLS`` polls: every commit on any runner sends a
wake (this runner's own listener hears its own), so a row that becomes due sooner wakes the
relay. Lease ends, backoffs, timers and debounce windows are due times in the outbox, so they
are covered by the probe itself. The bound catches what neither covers: a write made outside a
turn without a NOTIFY (an operator's script) and a NOTIFY lost while the listener reconnected.
Without ``notify`` nothing tells this runner of another's commits, so it polls every ``poll``.

Following another runner: a runner sends at most one ``NOTIFY`` per 50 ms
(semantics §2.7), so under a steady stream its commits wait 25 ms on average for the next one.
After a wake from another runner the relay therefore runs a pass every ``FOLLOW_EVERY_S`` until
``FOLLOW_FOR_S`` have passed since that wake, each asking first whether anything is due (one
cheap statement; the claims run only when something is). At most 100 such probes a second, and
only while other runners are committing; the runner's own wakes start none (its commits wake it
in-process). Not on Citus, where the probe is no cheaper than the claims it would spare.
"""

from __future__ import annotations

import math
import random
import time
from typing import Protocol

#: With ``notify=True``, the longest an idle relay sleeps, in polls, when no row is due sooner.
IDLE_POLLS = 10
#: With ``notify=True``: after another runner's wake, a probing pass this often ...
FOLLOW_EVERY_S = 0.01
#: ... for this long (the other runner's NOTIFY window, semantics §2.7).
FOLLOW_FOR_S = 0.05


class _Outbox(Protocol):
    @property
    def probes_cheaply(self) -> bool: ...
    async def any_due(self) -> bool: ...
    async def next_due(self) -> int | None: ...


class IdleWait:
    """The pass loop's wait between passes and its idle probe (module docstring).

    Args:
        outbox: The outbox gateway (the relay's claim connection).
        poll_ms: The configured ``poll``.
        notify: Whether this runner hears other runners' commits (``notify=True``).
    """

    def __init__(self, outbox: _Outbox, *, poll_ms: int, notify: bool) -> None:
        self._outbox = outbox
        self._poll = poll_ms / 1000
        self._notify = notify
        # After an idle probe with notify: seconds until the first row is due; else None.
        self._quiet_s: float | None = None
        # ``time.monotonic()`` until which passes follow another runner's wake.
        self._follow_until = 0.0

    def heard_other(self) -> None:
        """Another runner's wake arrived: follow it with probing passes (module docstring)."""
        if self._outbox.probes_cheaply:
            self._follow_until = time.monotonic() + FOLLOW_FOR_S

    @property
    def following(self) -> bool:
        """Whether passes now follow another runner's wake (each probes before it claims)."""
        return time.monotonic() < self._follow_until

    def next_wait(self) -> float:
        """Seconds until the next pass unless woken."""
        if self.following:
            return FOLLOW_EVERY_S
        wait = self._poll * random.uniform(0.9, 1.1)
        if self._quiet_s is None:
            return wait
        return min(max(wait, self._quiet_s), self._poll * IDLE_POLLS)

    def passed(self) -> None:
        """A pass began: the next wait is a poll again unless its probe says otherwise."""
        self._quiet_s = None

    async def anything_due(self) -> bool:
        """An idle poll's probe: whether any unparked intent or job row is due now."""
        if not self._notify:
            return await self._outbox.any_due()
        wait_ms = await self._outbox.next_due()
        if wait_ms is not None and wait_ms <= 0:
            return True
        self._quiet_s = math.inf if wait_ms is None else wait_ms / 1000
        return False
