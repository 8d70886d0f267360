"""Metrics with the names of semantics §10.1, kept in-process and rendered for Prometheus.

No metric carries a tenant, actor id or command id: attributes are limited to ``actor_type``,
``outcome``, ``kind`` and ``job``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

if TYPE_CHECKING:
    from akter._engine.turn import Request, Result
    from akter.callers import ActorRef

tracer = trace.get_tracer("akter")

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


def turn_outcome(result: Result) -> str:
    """The ``outcome`` attribute of ``akter.turns`` for one command's result."""
    if result.replayed:
        return "replay"
    if result.kind == "ok":
        return "success"
    if result.kind == "declared":
        return "failure"
    reason = getattr(result.error, "reason", "")
    return (
        "defect" if reason == "Defect" else "retry" if reason == "ActorUnavailable" else "refused"
    )


def record_turns(
    metrics: Metrics,
    ref: ActorRef,
    batch: Sequence[Request],
    results: Sequence[Result],
    started_ns: int,
) -> None:
    """Count one batch's turns and emit one server span per command (semantics §10.2)."""
    ended = time.time_ns()
    metrics.count("akter.turn.batches", actor_type=ref.type)
    for request, result in zip(batch, results, strict=True):
        outcome = turn_outcome(result)
        metrics.count("akter.turns", actor_type=ref.type, outcome=outcome)
        if result.replayed:
            metrics.count("akter.receipts.replayed", actor_type=ref.type)
        caller = request.caller
        attributes: dict[str, Any] = {
            "actor.type": ref.type,
            "actor.tenant": ref.tenant,
            "actor.id": ref.id,
            "command.name": request.member.name,
            "command.id": request.command_id.raw,
            "caller.kind": type(caller).__name__,
            "turn.trigger": getattr(caller, "source", "command")
            if not request.external
            else "command",
            "turn.outcome": outcome,
            "batch.size": len(batch),
        }
        span = tracer.start_span(
            f"akter.{ref.type}/{request.member.name}",
            kind=trace.SpanKind.SERVER,
            start_time=started_ns,
            attributes=attributes,
        )
        span.end(end_time=ended)
