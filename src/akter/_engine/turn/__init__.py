"""The turn: one batch of one actor's commands in one fenced transaction (``engine``).

``types`` holds the values a turn works with, ``admission`` the first flight (lock, clock,
receipts, fences), ``rules`` the pure decisions, ``invoke`` the handler run, ``writes`` the
commit flight and ``flights`` the pipeline both share.
"""

from akter._engine.turn.engine import TurnEngine
from akter._engine.turn.subscribed import Followed
from akter._engine.turn.types import (
    BATCH_LIMIT,
    EVENT_BYTES_LIMIT,
    SERVER_BOUND_GRACE_MS,
    Activation,
    BatchDefect,
    BatchWrites,
    Request,
    Result,
)

__all__ = [
    "BATCH_LIMIT",
    "EVENT_BYTES_LIMIT",
    "SERVER_BOUND_GRACE_MS",
    "Activation",
    "BatchDefect",
    "BatchWrites",
    "Followed",
    "Request",
    "Result",
    "TurnEngine",
]
