"""Fixtures shared by every suite (each defined in ``tests/_support``)."""

from tests._support.tracing import spans

__all__ = ["spans"]
