"""Metrics and spans with the names of semantics §10, kept in-process and rendered for Prometheus.

No metric carries a tenant, actor id or command id: attributes are limited to ``actor_type``,
``outcome``, ``kind`` and ``job``. Prometheus names replace ``.`` with ``_`` (counters get
``_total``). Every runtime keeps its own :class:`Metrics`, the source of ``GET /metrics`` and of
the ``prometheus_client`` collector an application registers in its own registry
(``Metrics.collector()``, :class:`PrometheusCollector`); the same instruments are also recorded
through the OpenTelemetry metrics API (the global meter provider, or the one given to
:func:`use_meter_provider`), which costs a no-op call when none is configured.

Metrics (semantics §10.1):

- counters: ``akter.turns`` (``actor_type``, ``outcome`` = success, failure, defect, replay,
  retry, refused), ``akter.turn.batches``, ``akter.receipts.written`` / ``.replayed`` /
  ``.pruned``, ``akter.events.appended`` / ``.pruned``, ``akter.activations.started``
  (``actor_type``); ``akter.outbox.staged``, ``akter.relay.delivered``, ``akter.relay.retried``
  (``kind``); ``akter.job.dead_letters`` (``actor_type``, ``job``);
- histograms: ``akter.turn.duration_ms`` (one observation per command: the duration of the batch
  transaction it ran in), ``akter.turn.batch_size`` (per batch), ``akter.mailbox.age_ms`` (per
  command: time from enqueue to the start of its batch), all by ``actor_type``;
  ``akter.pool.wait_ms`` (connection acquisition, no attributes). Durations use
  :data:`DURATION_BUCKETS_MS`, batch sizes :data:`BATCH_SIZE_BUCKETS`;
- gauges: ``akter.activations`` (resident actors on this runner, ``actor_type``); sampled by the
  ``$maintenance`` lease owner only, every ``sample_every`` (``akter._engine.sampling``):
  ``akter.outbox.rows``, ``akter.relay.lag_ms`` (age of the oldest due unclaimed row, 0 if none),
  ``akter.relay.stuck_rows`` (``attempts ≥ 8``), by ``kind``; and, extending §10.1,
  ``akter.jobs.running`` (attempts running under a live lease, by ``actor_type`` and ``job``);
  ``akter.jobs.waiting_slot`` and ``akter.jobs.waiting_rate`` (rows held back by a concurrency
  cap or waiting for a rate token, by ``actor_type`` and ``job``; docs/flow-control.md).

Spans (semantics §10.2): ``akter.<Actor>/batch`` (+ ``batch.size``) is the parent of
``akter.admission`` (the admission flight and fence), ``akter.commit`` (the commit flight) and one
``akter.<Actor>/<command>`` server span per command (+ ``turn.outcome``); ``akter.relay.intent``
(producer, + ``relay.attempt``, ``relay.timer``) wraps each intent or timer delivery, so the
receiving batch becomes its child; ``akter.job/<Actor>/<job>`` wraps each job attempt. Without a
configured tracer provider the batch span is a non-recording no-op and no child span or attribute
is built.

One trace across the outbox: every row a turn stages (intent, timer, job) keeps the W3C
``traceparent`` of the batch span (:func:`traceparent`; NULL when no span is current), each
delivery and attempt is a child of it (:func:`stored_context`), and a job's route keeps the
attempt's. An HTTP request's server span (``akter.http._tracing``) continues the caller's
``traceparent``, so one trace shows caller → turn → intent → receiver turn → attempt → route.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextvars import Token
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Declared in _metric_families and kept in _metrics; the "as" names stay re-exported here (the
# runtime, sampling and tests use them).
from akter._metric_families import BATCH_SIZE_BUCKETS as BATCH_SIZE_BUCKETS
from akter._metric_families import DURATION_BUCKETS_MS as DURATION_BUCKETS_MS
from akter._metric_families import GAUGES as GAUGES
from akter._metric_families import HISTOGRAMS as HISTOGRAMS
from akter._metric_families import SAMPLED_GAUGES as SAMPLED_GAUGES
from akter._metrics import ALLOWED_ATTRIBUTES as ALLOWED_ATTRIBUTES
from akter._metrics import HistogramValue as HistogramValue
from akter._metrics import Metrics as Metrics
from akter._metrics import use_meter_provider as use_meter_provider
from akter._prometheus import PrometheusCollector as PrometheusCollector

if TYPE_CHECKING:
    from akter.callers import ActorRef

tracer = trace.get_tracer("akter")
_W3C = TraceContextTextMapPropagator()

_Token = Token[otel_context.Context]


# --- spans ----------------------------------------------------------------------------------------


def current_context() -> otel_context.Context:
    """The OpenTelemetry context of the caller (a request's batch span becomes its child)."""
    return otel_context.get_current()


def start_batch(ref: ActorRef, parent: Any, size: int) -> tuple[trace.Span, _Token | None]:
    """Start ``akter.<Actor>/batch`` and make it current; returns the span and a detach token.

    ``parent`` is the first request's caller context (:func:`current_context`), ``size`` the
    number of commands in the batch. With no tracer provider and no trace from the caller the
    span is invalid: where the task's current span is invalid too, nothing is made current
    (the token is ``None``), as nothing would change for what reads it (:func:`traceparent`).
    """
    span = tracer.start_span(f"akter.{ref.type}/batch", context=parent)
    if span.is_recording():
        span.set_attributes(
            {
                "actor.type": ref.type,
                "actor.tenant": ref.tenant,
                "actor.id": ref.id,
                "batch.size": size,
            }
        )
    elif (
        not span.get_span_context().is_valid
        and not trace.get_current_span().get_span_context().is_valid
    ):
        return span, None
    return span, otel_context.attach(trace.set_span_in_context(span))


def end_batch(span: trace.Span, token: _Token | None) -> None:
    """End the batch span and restore the context it replaced (if it replaced one)."""
    if token is not None:
        otel_context.detach(token)
    span.end()


def child_span(name: str, ref: ActorRef, started_ns: int) -> None:
    """Record a finished child of the current batch span (``akter.admission``, ``akter.commit``).

    Called only while the batch span records (``Flights.recording``): with no tracer provider
    configured, nothing is built, and the turn does not even look for the current span.
    """
    span = tracer.start_span(
        name,
        start_time=started_ns,
        attributes={"actor.type": ref.type, "actor.tenant": ref.tenant, "actor.id": ref.id},
    )
    span.end()


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, stored with the rows a turn stages.

    ``None`` (and nothing built) when no span is current: no tracer provider is configured and
    the caller sent no trace context.
    """
    return traceparent_of(trace.get_current_span())


def traceparent_of(span: trace.Span) -> str | None:
    """The W3C ``traceparent`` text of ``span``, or ``None`` for an invalid (no-op) span."""
    c = span.get_span_context()
    if not c.is_valid:
        return None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def stored_context(text: str | None) -> otel_context.Context | None:
    """The parent context of a stored ``traceparent`` (``None`` if absent or unreadable).

    ``None`` makes the span a root of a new trace, as before the column existed. Rows are
    always stored in the W3C format, whatever propagators the application configured.
    """
    if not text:
        return None
    parent = _W3C.extract({"traceparent": text}, context=otel_context.Context())
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return parent


class _ClaimedDelivery(Protocol):
    """What a delivery span reads of a claimed outbox row (the store's ``ClaimedIntent``)."""

    @property
    def intent_id(self) -> str: ...
    @property
    def tenant_id(self) -> str: ...
    @property
    def target_type(self) -> str: ...
    @property
    def target_id(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def caller(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def traceparent(self) -> str | None: ...


def start_delivery(row: _ClaimedDelivery) -> tuple[trace.Span, _Token]:
    """Start ``akter.relay.intent`` (producer) for one claimed intent or timer; make it current.

    It is a child of the span that staged the row (its stored ``traceparent``), and the
    receiving batch span becomes its child. Attributes are built only when it records.
    """
    span = tracer.start_span(
        "akter.relay.intent",
        context=stored_context(row.traceparent),
        kind=trace.SpanKind.PRODUCER,
    )
    if span.is_recording():
        from akter.callers import caller_from_json

        try:
            caller: Any = caller_from_json(row.caller)
        except (ValueError, TypeError, KeyError):
            caller = None  # the delivery backs off as undecodable; the span still shows it
        source = getattr(caller, "source", None)
        span.set_attributes(
            {
                "actor.type": row.target_type,
                "actor.tenant": row.tenant_id,
                "actor.id": row.target_id,
                "command.name": row.command,
                "command.id": row.intent_id,
                "caller.kind": type(caller).__name__ if caller is not None else "unknown",
                "turn.trigger": source or "unknown",
                "relay.attempt": row.attempts,
                "relay.timer": source in ("timer", "cron"),
            }
        )
    return span, otel_context.attach(trace.set_span_in_context(span))


def delivery_failed(error: str) -> None:
    """Mark the current delivery span failed (the intent backs off)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_status(trace.Status(trace.StatusCode.ERROR, error[:200]))


def end_delivery(span: trace.Span, token: _Token) -> None:
    """End a delivery span and restore the context it replaced."""
    otel_context.detach(token)
    span.end()


# --- workflows ------------------------------------------------------------------------------------


def start_workflow_attempt(
    ref: ActorRef, workflow: str, run_id: str, attempt: int, started_by: str | None
) -> tuple[trace.Span, _Token]:
    """Start ``akter.workflow/<Type>.<workflow>`` for one attempt of a run; make it current.

    Each attempt is a root span *linked* to the span that started the run (its stored
    ``traceparent``): a run that sleeps for days is many traces, one per attempt, all
    reachable from the start. Its steps' spans and the turns they run are its children.
    """
    links: list[trace.Link] = []
    parent = stored_context(started_by)
    if parent is not None:
        links.append(trace.Link(trace.get_current_span(parent).get_span_context()))
    span = tracer.start_span(
        f"akter.workflow/{ref.type}.{workflow}", context=otel_context.Context(), links=links
    )
    if span.is_recording():
        span.set_attributes(
            {
                "actor.type": ref.type,
                "actor.tenant": ref.tenant,
                "actor.id": ref.id,
                "workflow.name": workflow,
                "workflow.run_id": run_id,
                "workflow.attempt": attempt,
            }
        )
    return span, otel_context.attach(trace.set_span_in_context(span))


def end_workflow_attempt(span: trace.Span, token: _Token, outcome: str) -> None:
    """End an attempt's span with how it ended (``suspended``, ``completed``, ...)."""
    if span.is_recording():
        span.set_attribute("workflow.outcome", outcome)
        if outcome in ("failed", "diverged"):
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome))
    otel_context.detach(token)
    span.end()


@contextlib.contextmanager
def workflow_step(kind: str, name: str, seq: int) -> Iterator[None]:
    """A span ``akter.workflow.step`` around a step the attempt performs (not a replayed one).

    An exception that leaves the step marks the span failed and propagates.
    """
    if not trace.get_current_span().is_recording():
        yield
        return
    with tracer.start_as_current_span(
        "akter.workflow.step",
        attributes={
            "workflow.step.kind": kind,
            "workflow.step.name": name,
            "workflow.step.seq": seq,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            span.set_attribute("workflow.step.error", type(exc).__name__)
            raise


# --- turns ----------------------------------------------------------------------------------------


def turn_outcome(kind: str, replayed: bool, reason: str | None) -> str:
    """The ``outcome`` attribute of ``akter.turns`` for one command's result.

    Args:
        kind: The result's kind (``"ok"``, ``"declared"`` or ``"error"``).
        replayed: Whether the result replays a receipt.
        reason: An error result's ``ActorError.reason``, if any.
    """
    if replayed:
        return "replay"
    if kind == "ok":
        return "success"
    if kind == "declared":
        return "failure"
    return (
        "defect" if reason == "Defect" else "retry" if reason == "ActorUnavailable" else "refused"
    )


@dataclass(frozen=True, slots=True)
class CommandSpan:
    """What one command's server span shows (built only while the batch span records)."""

    name: str
    command_id: str
    caller_kind: str
    trigger: str


def record_turns(
    metrics: Metrics,
    ref: ActorRef,
    outcomes: Sequence[str],
    started_ns: int,
    commands: Sequence[CommandSpan] | None = None,
) -> None:
    """Count one batch's turns and emit one server span per command (semantics §10.2).

    ``outcomes`` holds each command's :func:`turn_outcome`. The command spans are children of
    the current span (the batch span); pass ``commands`` (in batch order) only when
    that span records (the engine asks it once per batch).
    """
    ended = time.time_ns()
    duration_ms = (ended - started_ns) / 1e6
    actor_type = ref.type
    size = len(outcomes)
    metrics.turns(actor_type, outcomes, duration_ms)
    if commands is None:
        return
    for command, outcome in zip(commands, outcomes, strict=True):
        attributes: dict[str, Any] = {
            "actor.type": ref.type,
            "actor.tenant": ref.tenant,
            "actor.id": ref.id,
            "command.name": command.name,
            "command.id": command.command_id,
            "caller.kind": command.caller_kind,
            "turn.trigger": command.trigger,
            "turn.outcome": outcome,
            "batch.size": size,
        }
        span = tracer.start_span(
            f"akter.{ref.type}/{command.name}",
            kind=trace.SpanKind.SERVER,
            start_time=started_ns,
            attributes=attributes,
        )
        span.end(end_time=ended)
