"""Fixtures shared by every suite (each defined in ``tests/_support``)."""

from tests._support.logs import logging_as_found
from tests._support.tracing import spans
from tests._support.turn_mode import turn_mode

__all__ = ["logging_as_found", "spans", "turn_mode"]
