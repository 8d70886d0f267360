"""The turn's two modes: a warm turn in one flight (the default) and the two-flight turn.

A turn suite runs in both with ``pytestmark = pytest.mark.usefixtures("turn_mode")``
(docs/internals/one-flight-turn.md, rule 7).
"""

from __future__ import annotations

import pytest

from akter._engine.turn.engine import TurnEngine


@pytest.fixture(params=["one_flight", "two_flights"])
def turn_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Sets every runtime's turn engine to the mode the test's parameter names."""
    mode = str(request.param)
    monkeypatch.setattr(TurnEngine, "one_flight", mode == "one_flight")
    return mode
