"""Read-only views of committed state: what a query's ``self.state`` returns.

Models become proxies whose attribute writes raise :class:`~akter.errors.ReadOnlyError`, lists
and tuples become tuples, dicts become mapping proxies and sets frozensets, all the way down.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from akter.errors import ReadOnlyError


class _ReadOnly:
    """A read-only proxy of committed state handed to queries."""

    __slots__ = ("_target",)

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __getattr__(self, name: str) -> Any:
        return read_only(getattr(self._target, name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise ReadOnlyError(f"Cannot set {name!r}: query views are read-only.")

    def __delattr__(self, name: str) -> None:
        raise ReadOnlyError(f"Cannot delete {name!r}: query views are read-only.")

    def __eq__(self, other: object) -> bool:
        return bool(self._target == (other._target if isinstance(other, _ReadOnly) else other))

    def __hash__(self) -> int:
        return id(self._target)

    def __repr__(self) -> str:
        return f"ReadOnly({self._target!r})"


def read_only(value: Any) -> Any:
    """``value`` as a query sees it: models proxied, containers frozen, recursively."""
    if isinstance(value, BaseModel):
        return _ReadOnly(value)
    if isinstance(value, list | tuple):
        return tuple(read_only(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: read_only(v) for k, v in value.items()})
    if isinstance(value, set):
        return frozenset(value)
    return value


def unwrap_read_only(value: Any) -> Any:
    """Turn a query's read-only views back into plain values (for result validation)."""
    if isinstance(value, _ReadOnly):
        return object.__getattribute__(value, "_target").model_copy(deep=True)
    if isinstance(value, tuple):
        return tuple(unwrap_read_only(v) for v in value)
    if isinstance(value, MappingProxyType):
        return {k: unwrap_read_only(v) for k, v in value.items()}
    return value
