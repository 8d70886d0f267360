"""The testing toolkit: ``ActorTest``, fault points and a pytest plugin (``akter_db``)."""

from akter.operators.runner import POINTS, Hooks, Pause
from akter.testing.clocks import ManualClock
from akter.testing.harness import ActorTest, Inspection
from akter.testing.live import Watching, watching

__all__ = [
    "POINTS",
    "ActorTest",
    "Hooks",
    "Inspection",
    "ManualClock",
    "Pause",
    "Watching",
    "watching",
]
