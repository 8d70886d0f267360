"""Telemetry: turn outcomes as metrics (TE-01), per-command spans (TE-02), /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import akter
import akter.http
from akter.testing import ActorTest
from tests.integration.actors import ALL, Counter, TooBig

Make = Callable[..., ActorTest]

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    yield _EXPORTER


async def test_TE01_turn_outcomes_and_metric_attributes(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "secret-id", tenant="tenant-x")
        cid = await t.runtime.mint_command_id()
        await counter.with_command_id(cid).add(1)
        await counter.with_command_id(cid).add(1)
        with pytest.raises(TooBig):
            await counter.take(100)
        with pytest.raises(akter.ActorError):
            await counter.defect("boom")
        metrics = t.runtime.metrics
        for outcome in ("success", "replay", "failure", "defect"):
            assert metrics.value("akter.turns", actor_type="Counter", outcome=outcome) == 1
        text = metrics.render()
        assert 'akter_turns_total{actor_type="Counter",outcome="success"} 1' in text
        # No metric carries a tenant, actor id or command id.
        assert "tenant-x" not in text and "secret-id" not in text and cid not in text
        with pytest.raises(ValueError, match="not allowed"):
            metrics.count("akter.turns", tenant="x")
        app = akter.http.app(t.runtime)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://test"
        ) as client:
            scraped = await client.get("/metrics")
        assert scraped.status_code == 200
        assert (
            "akter_turns_total" in scraped.text and "akter_receipts_written_total" in scraped.text
        )


async def test_TE02_spans_per_command(akter_test: Make, spans: InMemorySpanExporter) -> None:
    spans.clear()
    async with akter_test(ALL) as t:
        await t.get(Counter, "c").add(2)
        [span] = [s for s in spans.get_finished_spans() if s.name == "akter.Counter/add"]
        assert span.kind == trace.SpanKind.SERVER
        attributes = dict(span.attributes or {})
        assert attributes["actor.type"] == "Counter" and attributes["actor.id"] == "c"
        assert attributes["command.name"] == "add" and attributes["turn.outcome"] == "success"
        assert attributes["caller.kind"] == "System" and attributes["turn.trigger"] == "command"
        assert str(attributes["command.id"]).startswith("v1.")
