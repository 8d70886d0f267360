"""What a drain reports: ``await runtime.stop()`` returns a :class:`DrainReport`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DrainReport:
    """How a drain ended (semantics §8.3).

    Attributes:
        status: ``clean``, or ``deadline_expired`` when turns had to be cancelled.
        interrupted_turns: Mailboxes cancelled (rolled back) at the deadline.
        interrupted_attempts: Job attempts interrupted without settling (taken over after lease).
        released_claims: Intent claims handed back for another runner.
    """

    status: Literal["clean", "deadline_expired"]
    interrupted_turns: int = 0
    interrupted_attempts: int = 0
    released_claims: int = 0
