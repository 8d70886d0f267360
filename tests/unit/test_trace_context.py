"""The W3C text stored with outbox rows (issue 14, finding 3): written, read back, refused."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from akter import telemetry

TEXT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_no_current_span_stores_nothing() -> None:
    assert telemetry.traceparent() is None
    assert telemetry.traceparent_of(trace.INVALID_SPAN) is None


def test_a_span_is_stored_as_its_w3c_traceparent() -> None:
    span = TracerProvider().get_tracer("t").start_span("s")
    c = span.get_span_context()
    flags = f"{c.trace_flags:02x}"  # sampled, and random under W3C trace context level 2
    assert telemetry.traceparent_of(span) == f"00-{c.trace_id:032x}-{c.span_id:016x}-{flags}"
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        assert telemetry.traceparent() == telemetry.traceparent_of(span)
    finally:
        otel_context.detach(token)
        span.end()


def test_a_stored_traceparent_reads_back_as_the_remote_parent() -> None:
    parent = telemetry.stored_context(TEXT)
    assert parent is not None
    c = trace.get_current_span(parent).get_span_context()
    assert (c.trace_id, c.span_id, c.is_remote) == (
        int("4bf92f3577b34da6a3ce929d0e0e4736", 16),
        int("00f067aa0ba902b7", 16),
        True,
    )
    assert telemetry.traceparent_of(trace.get_current_span(parent)) == TEXT


def test_absent_or_unreadable_text_makes_a_root() -> None:
    for text in (None, "", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"):
        assert telemetry.stored_context(text) is None, text


def test_unreadable_text_does_not_fall_back_to_the_current_span() -> None:
    span = TracerProvider().get_tracer("t").start_span("s")
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        assert telemetry.stored_context("garbage") is None
    finally:
        otel_context.detach(token)
        span.end()
