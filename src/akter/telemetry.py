"""Metrics with the names of semantics §10.1, kept in-process and rendered for Prometheus.

No metric carries a tenant, actor id or command id: attributes are limited to ``actor_type``,
``outcome``, ``kind`` and ``job``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

ALLOWED_ATTRIBUTES = frozenset({"actor_type", "outcome", "kind", "job"})


class Metrics:
    """Counters by name and attributes; ``render()`` gives the Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)

    def count(self, name: str, value: float = 1, **attributes: str) -> None:
        """Add ``value`` to a counter."""
        bad = set(attributes) - ALLOWED_ATTRIBUTES
        if bad:
            raise ValueError(f"Metric attributes {sorted(bad)} are not allowed on {name!r}.")
        key = tuple(sorted(attributes.items()))
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0) + value

    def value(self, name: str, **attributes: str) -> float:
        """The current value of one series (0 if never counted)."""
        key = tuple(sorted(attributes.items()))
        with self._lock:
            return self._counters.get(name, {}).get(key, 0)

    def render(self) -> str:
        """Every counter in the Prometheus text exposition format (``.`` becomes ``_``)."""
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._counters):
                prom = name.replace(".", "_") + "_total"
                lines.append(f"# TYPE {prom} counter")
                for key, value in sorted(self._counters[name].items()):
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(f"{prom}{{{labels}}} {value:g}" if labels else f"{prom} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
