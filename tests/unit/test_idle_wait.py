"""The relay's wait between passes (``akter._engine.loop.idle.IdleWait``): following other runners.

The integration tests (tests/integration/test_relay_idle.py) run it against PostgreSQL; here the
rule alone, on a stub outbox: after another runner's wake the next waits are the follow-up
interval until the window ends, and only where the probe is cheap.
"""

from __future__ import annotations

import time

import pytest

from akter._engine.loop import idle
from akter._engine.loop.idle import FOLLOW_EVERY_S, IdleWait


class Outbox:
    def __init__(self, cheap: bool) -> None:
        self.probes_cheaply = cheap

    async def any_due(self) -> bool:
        return False

    async def next_due(self) -> int | None:
        return None


def test_another_runners_wake_shortens_the_waits_for_the_window_then_polls_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    wait = IdleWait(Outbox(cheap=True), poll_ms=1000, notify=True)
    assert 0.9 <= wait.next_wait() <= 1.1 and not wait.following
    wait.heard_other()
    assert wait.following and wait.next_wait() == FOLLOW_EVERY_S
    now[0] += idle.FOLLOW_FOR_S - 0.001
    assert wait.next_wait() == FOLLOW_EVERY_S
    now[0] += 0.002
    assert not wait.following and 0.9 <= wait.next_wait() <= 1.1
    wait.heard_other()  # each wake opens a window from its own arrival
    assert wait.following


def test_where_the_probe_is_not_cheap_no_wake_is_followed() -> None:
    wait = IdleWait(Outbox(cheap=False), poll_ms=1000, notify=True)
    wait.heard_other()
    assert not wait.following and 0.9 <= wait.next_wait() <= 1.1
