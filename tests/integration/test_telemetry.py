"""Telemetry (semantics §10): turn metrics (TE-01), histograms, spans (TE-02), /metrics.

Spans are captured with an in-memory exporter on a private tracer provider that replaces akter's
tracer for the test only (the process-wide provider can be set once; nothing global is set here).
OpenTelemetry metrics go to an ``InMemoryMetricReader`` through ``use_meter_provider``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

import akter
import akter.http
from akter import telemetry
from akter.testing import ActorTest
from tests.integration.actors import ALL, Counter, TooBig
from tests.integration.telemetry_actors import ACTORS, Pinger

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "tracer", provider.get_tracer("akter"))
    yield exporter
    provider.shutdown()


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    found = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[found])
    telemetry.use_meter_provider(provider)
    yield found
    telemetry.use_meter_provider(None)
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def scrape(t: ActorTest) -> str:
    app = akter.http.app(t.runtime)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


def series(text: str, prefix: str) -> list[tuple[str, float]]:
    """``(labels, value)`` of every sample line starting with ``prefix``."""
    found = []
    for line in text.splitlines():
        if line.startswith(prefix):
            head, value = line.rsplit(" ", 1)
            found.append((head[len(prefix) :], float(value)))
    return found


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
        with pytest.raises(ValueError, match="not allowed"):
            metrics.observe("akter.turn.duration_ms", 1, actor_id="x")
        scraped = await scrape(t)
        assert "akter_turns_total" in scraped and "akter_receipts_written_total" in scraped


async def test_TE01_histograms_after_turns_and_in_metrics_text(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "h")
        for _ in range(3):
            await counter.add(1)
        # Four commands queue behind a held turn and run as one batch.
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(counter.add(1))
        await pause.wait()
        queued = [asyncio.create_task(counter.add(1)) for _ in range(4)]
        await asyncio.sleep(0)  # one loop turn: each call reaches the mailbox without waiting
        assert t.runtime._dispatcher.pending == 5
        ready = time.monotonic()  # the four are queued: each one's mailbox age is at least ...
        await asyncio.sleep(0)
        held_ms = (time.monotonic() - ready) * 1000  # ... this, and the held turn lasts longer
        pause.release()
        assert await first == 4
        assert sorted(await asyncio.gather(*queued)) == [5, 6, 7, 8]

        metrics = t.runtime.metrics
        size = metrics.histogram("akter.turn.batch_size", actor_type="Counter")
        assert size.bounds == (1, 2, 4, 8, 16, 32)
        assert (size.count, size.sum) == (5, 8)  # batches 1, 1, 1, 1, 4
        assert size.buckets == (4, 4, 5, 5, 5, 5, 5)  # cumulative; the last is +Inf
        duration = metrics.histogram("akter.turn.duration_ms", actor_type="Counter")
        assert duration.bounds == telemetry.DURATION_BUCKETS_MS
        assert duration.count == 8 and duration.buckets[-1] == 8  # one per command
        assert list(duration.buckets) == sorted(duration.buckets) and duration.sum > 0
        # The held turn lasted at least as long as the four waited.
        assert duration.sum >= held_ms
        age = metrics.histogram("akter.mailbox.age_ms", actor_type="Counter")
        assert age.count == 8 and age.sum >= 4 * held_ms
        pool = metrics.histogram("akter.pool.wait_ms")
        # Once per acquisition: the first batch's at least (a mailbox worker's consecutive
        # batches may keep their connection, TurnEngine.HOLD_MAX_S).
        assert pool.count >= 1
        assert metrics.value("akter.activations", actor_type="Counter") == 1
        assert metrics.value("akter.activations.started", actor_type="Counter") == 1

        text = await scrape(t)
        assert "# TYPE akter_turn_batch_size histogram" in text
        assert series(text, "akter_turn_batch_size_bucket") == [
            ('{actor_type="Counter",le="1"}', 4),
            ('{actor_type="Counter",le="2"}', 4),
            ('{actor_type="Counter",le="4"}', 5),
            ('{actor_type="Counter",le="8"}', 5),
            ('{actor_type="Counter",le="16"}', 5),
            ('{actor_type="Counter",le="32"}', 5),
            ('{actor_type="Counter",le="+Inf"}', 5),
        ]
        assert 'akter_turn_batch_size_sum{actor_type="Counter"} 8.0\n' in text
        assert 'akter_turn_batch_size_count{actor_type="Counter"} 5.0\n' in text
        buckets = series(text, "akter_turn_duration_ms_bucket")
        assert [labels for labels, _ in buckets] == [
            f'{{actor_type="Counter",le="{le}"}}'
            for le in (*(str(b) for b in telemetry.DURATION_BUCKETS_MS), "+Inf")
        ]
        assert [n for _, n in buckets] == list(duration.buckets)
        assert series(text, "akter_turn_duration_ms_count") == [('{actor_type="Counter"}', 8)]
        [(labels, total)] = series(text, "akter_turn_duration_ms_sum")
        assert labels == '{actor_type="Counter"}' and total == pytest.approx(duration.sum)
        assert series(text, "akter_mailbox_age_ms_count") == [('{actor_type="Counter"}', 8)]
        [(labels, scraped)] = series(text, "akter_pool_wait_ms_count")
        assert labels == "" and scraped >= pool.count  # background work keeps acquiring
        assert "# TYPE akter_activations gauge" in text
        assert 'akter_activations{actor_type="Counter"} 1.0\n' in text
        assert 'akter_activations_started_total{actor_type="Counter"} 1.0\n' in text
        # Hibernation drops the activation from the gauge.
        assert t.runtime._dispatcher.hibernate(force=True) == 1
        assert metrics.value("akter.activations", actor_type="Counter") == 0


async def test_TE02_spans_per_command(akter_test: Make, spans: InMemorySpanExporter) -> None:
    async with akter_test(ALL) as t:
        await t.get(Counter, "c").add(2)
        [span] = named(spans, "akter.Counter/add")
        assert span.kind == trace.SpanKind.SERVER
        attributes = attrs(span)
        assert attributes["actor.type"] == "Counter" and attributes["actor.id"] == "c"
        assert attributes["command.name"] == "add" and attributes["turn.outcome"] == "success"
        assert attributes["caller.kind"] == "System" and attributes["turn.trigger"] == "command"
        assert str(attributes["command.id"]).startswith("v1.")


async def test_TE02_batch_admission_commit_and_turn_spans_nest(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ALL) as t:
        counter = t.get(Counter, "n")
        await counter.add(1)
        pause = t.pause_next("before_commit")
        first = asyncio.create_task(counter.add(1))
        await pause.wait()
        queued = [asyncio.create_task(counter.add(1)) for _ in range(3)]
        await asyncio.sleep(0)  # one loop turn: each call reaches the mailbox without waiting
        assert t.runtime._dispatcher.pending == 4
        pause.release()
        await asyncio.gather(first, *queued)

        batches = named(spans, "akter.Counter/batch")
        assert sorted(attrs(b)["batch.size"] for b in batches) == [1, 1, 3]
        [big] = [b for b in batches if attrs(b)["batch.size"] == 3]
        assert big.parent is None  # the caller had no span: the batch is a root
        assert attrs(big)["actor.type"] == "Counter" and attrs(big)["actor.id"] == "n"
        assert big.context is not None
        children = [s for s in spans.get_finished_spans() if s.parent and s.parent == big.context]
        names = sorted(s.name for s in children)
        assert names == ["akter.Counter/add"] * 3 + ["akter.admission", "akter.commit"]
        [admission] = [s for s in children if s.name == "akter.admission"]
        [commit] = [s for s in children if s.name == "akter.commit"]
        assert admission.start_time is not None and admission.end_time is not None
        assert commit.start_time is not None and commit.end_time is not None
        assert big.start_time is not None and big.end_time is not None
        assert big.start_time <= admission.start_time <= admission.end_time
        assert admission.end_time <= commit.start_time <= commit.end_time <= big.end_time
        for turn in (s for s in children if s.name == "akter.Counter/add"):
            assert turn.kind == trace.SpanKind.SERVER
            assert attrs(turn)["batch.size"] == 3 and attrs(turn)["turn.outcome"] == "success"
        # Every batch has exactly one admission and one commit of its own.
        for batch in batches:
            own = [s.name for s in spans.get_finished_spans() if s.parent == batch.context]
            assert own.count("akter.admission") == 1 and own.count("akter.commit") == 1


async def test_TE02_relay_intent_span(akter_test: Make, spans: InMemorySpanExporter) -> None:
    async with akter_test(ACTORS) as t:
        # The first delivery is abandoned like a process death; the second is attempt 2.
        t.crash_next("after_claim")
        await t.get(Pinger, "a").ping(1)
        await t.drain()
        [crashed] = named(spans, "akter.relay.intent")
        assert attrs(crashed)["relay.attempt"] == 1 and not named(spans, "akter.Pong/got")
        await t.advance(t.runtime.config.claim_lease_ms / 1000 + 1)
        [_, delivered] = sorted(named(spans, "akter.relay.intent"), key=lambda s: s.start_time or 0)
        assert delivered.kind == trace.SpanKind.PRODUCER
        assert attrs(delivered) == {
            "actor.type": "Pong",
            "actor.tenant": "default",
            "actor.id": "p0",
            "command.name": "got",
            "command.id": attrs(crashed)["command.id"],
            "caller.kind": "System",
            "turn.trigger": "actor",
            "relay.attempt": 2,
            "relay.timer": False,
        }
        assert str(attrs(delivered)["command.id"]).startswith("v1.")
        # The receiving batch is a child of the delivery, its turn a child of the batch.
        [batch] = named(spans, "akter.Pong/batch")
        assert batch.parent == delivered.context
        [turn] = named(spans, "akter.Pong/got")
        assert turn.parent == batch.context
        assert attrs(turn)["turn.trigger"] == "actor"

        spans.clear()
        await t.get(Pinger, "b").remind(5)
        await t.advance(5)
        [timer] = named(spans, "akter.relay.intent")
        assert attrs(timer)["relay.timer"] is True and attrs(timer)["relay.attempt"] == 1
        assert attrs(timer)["turn.trigger"] == "timer" and attrs(timer)["actor.id"] == "t"


class Reading(BaseModel):
    n: int = 0


class Observed(akter.Actor[Reading], access=akter.public):
    """A type no other test uses: its series in the process-wide OpenTelemetry view are ours."""

    @akter.command
    async def bump(self) -> int:
        self.state.n += 1
        return self.state.n


async def test_TE01_metrics_through_opentelemetry(
    akter_test: Make, reader: InMemoryMetricReader
) -> None:
    async with akter_test([Observed]) as t:
        observed = t.get(Observed, "o")
        assert await observed.bump() == 1
        assert await observed.bump() == 2
        gc.collect()  # runtimes of earlier tests must not add to the activation gauge
        data = reader.get_metrics_data()
        assert data is not None
        found = {
            m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }

        def point(name: str, **attributes: str) -> Any:
            [match] = [
                p for p in found[name].data.data_points if dict(p.attributes or {}) == attributes
            ]
            return match

        assert point("akter.turns", actor_type="Observed", outcome="success").value == 2
        duration = point("akter.turn.duration_ms", actor_type="Observed")
        assert duration.count == 2 and duration.sum > 0
        assert tuple(duration.explicit_bounds) == telemetry.DURATION_BUCKETS_MS
        size = point("akter.turn.batch_size", actor_type="Observed")
        assert tuple(size.explicit_bounds) == telemetry.BATCH_SIZE_BUCKETS and size.sum == 2
        assert point("akter.activations", actor_type="Observed").value == 1
        assert point("akter.activations.started", actor_type="Observed").value == 1
        assert found["akter.pool.wait_ms"].data.data_points
