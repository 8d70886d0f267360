"""Count calls to a component's methods without changing what they do."""

from __future__ import annotations

from collections import Counter
from typing import Any


def count_calls(target: Any, names: list[str]) -> Counter[str]:
    """Wrap ``names`` of ``target`` so that each call is counted (then run as before)."""
    calls: Counter[str] = Counter()
    for name in names:
        original = getattr(target, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        setattr(target, name, counted)
    return calls
