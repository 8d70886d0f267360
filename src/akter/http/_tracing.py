"""The server span of an HTTP request: it continues the caller's W3C trace.

No third-party middleware is needed: the request's ``traceparent`` and ``tracestate`` (or what
the globally configured propagators read) become the parent of the request's span, and the
batch span of its turn becomes that span's child.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import propagate, trace

from akter import telemetry


@contextmanager
def http_span(method: str, route: str, headers: Mapping[str, str]) -> Iterator[trace.Span]:
    """The server span of one request, current while it is handled; yields it.

    When a span is already current (the application's own ASGI instrumentation traced the
    request) that span is yielded and no other is started. Without a tracer provider the span
    is a no-op that still carries the caller's context on to the rows the turn stages.
    """
    current = trace.get_current_span()
    if current.get_span_context().is_valid:
        yield current
        return
    with telemetry.tracer.start_as_current_span(
        f"{method} {route}",
        context=propagate.extract(headers),
        kind=trace.SpanKind.SERVER,
    ) as span:  # an exception escaping the handler (a 5xx) is recorded on the span
        if span.is_recording():
            span.set_attributes({"http.request.method": method, "http.route": route})
        yield span


def http_status(span: trace.Span, status: int) -> None:
    """Record the response status on the request's span (a 5xx marks it failed)."""
    if span.is_recording():
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(trace.StatusCode.ERROR)
