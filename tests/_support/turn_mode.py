"""The turn's modes: a warm turn in one flight, shared or not, and the two-flight turn.

A turn suite runs in each with ``pytestmark = pytest.mark.usefixtures("turn_mode")``
(docs/internals/one-flight-turn.md, rule 7; docs/internals/shared-flights.md, rule 6):

- ``shared``: every warm turn's one flight goes in a shared write (no mailbox keeps a
  connection, so none takes its own);
- ``one_flight``: a warm turn's one flight on a connection of its own (no shared writes);
- ``two_flights``: every turn in two flights.

The runtime's default is between the first two: a warm turn shares a write unless its mailbox
kept a connection from its last batch (a sequential caller's).
"""

from __future__ import annotations

import pytest

from akter._engine.turn.engine import TurnEngine


@pytest.fixture(params=["shared", "one_flight", "two_flights"])
def turn_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Sets every runtime's turn engine to the mode the test's parameter names."""
    mode = str(request.param)
    monkeypatch.setattr(TurnEngine, "one_flight", mode != "two_flights")
    monkeypatch.setattr(TurnEngine, "shared_writes", mode == "shared")
    monkeypatch.setattr(TurnEngine, "hold_connections", mode != "shared")
    return mode
