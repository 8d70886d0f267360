"""An in-memory span exporter in place of akter's tracer, for the tracing tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from akter import telemetry
from akter._engine.jobs import attempt as job_attempt


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every span akter finishes during the test (turns, deliveries, attempts, HTTP)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("akter")
    monkeypatch.setattr(telemetry, "tracer", tracer)
    monkeypatch.setattr(job_attempt, "tracer", tracer)
    yield exporter
    provider.shutdown()
