"""Job telemetry (semantics §10): counters (TE-01), attempt spans and log texts (TE-02).

Dead-letter and relay counters with their attributes, the client span of each attempt and the
exact log texts of §10.3 with their structured fields, on a real PostgreSQL.

Spans are captured with an in-memory exporter. The process-wide tracer provider can be set only
once and another module may set (or later try to set) its own: when the global provider is an
SDK one, the exporter is added to it; otherwise the executor's tracer is replaced for the test
only, so no global provider is installed here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from akter._engine.jobs import attempt as job_attempt
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, fail, gate, succeed
from tests._support.providers import fresh_provider
from tests.integration.test_jobs_actors import ALL, PROVIDER, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

_EXPORTER = InMemorySpanExporter()
_SHARED: list[TracerProvider] = []


provider = fresh_provider(PROVIDER)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        if current not in _SHARED:  # processors cannot be removed: add ours once
            current.add_span_processor(SimpleSpanProcessor(_EXPORTER))
            _SHARED.append(current)
    else:
        own = TracerProvider()
        own.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        monkeypatch.setattr(job_attempt, "tracer", own.get_tracer("akter"))
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def job_spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    return sorted(found, key=lambda s: dict(s.attributes or {})["job.attempt"])  # type: ignore[arg-type,return-value]


async def settle_all(t: ActorTest) -> None:
    """Advance in small steps (the test jobs back off by 10-40 ms) until the outbox is empty."""
    for _ in range(400):
        if not await t.rows("SELECT 1 FROM {schema}.outbox"):
            return
        await t.advance(0.05)
    pytest.fail("the outbox did not settle")


def records(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().partition(": ")[0] == message]


def fields(record: logging.LogRecord) -> tuple[Any, ...]:
    names = ("actor", "id", "tenant", "job", "job_id", "attempt")
    return tuple(getattr(record, name) for name in names)


# --- TE-01 ------------------------------------------------------------------------------------


async def test_TE01_job_counters_and_their_attributes(
    akter_test: Make, provider: FakeProvider
) -> None:
    async with akter_test(ALL, relay=False) as t:
        metrics = t.runtime.metrics
        provider.script(fail("declined"), fail("declined again"), succeed(3))
        shop = t.get(Shop, "secret-shop", tenant="tenant-x")
        dead = await shop.buy(1)
        await settle_all(t)
        assert metrics.value("akter.job.dead_letters", actor_type="Shop", job="charge") == 1
        assert metrics.value("akter.relay.retried", kind="job") == 1
        assert metrics.value("akter.relay.delivered", kind="job") == 0
        (letter,) = await t.rows("SELECT job_id FROM {schema}.dead_letters")
        assert letter["job_id"] == dead

        done = await shop.buy(2)
        await settle_all(t)
        assert metrics.value("akter.relay.delivered", kind="job") == 1
        assert metrics.value("akter.job.dead_letters", actor_type="Shop", job="charge") == 1
        assert [
            r["command"]
            for r in await t.rows(
                "SELECT command FROM {schema}.receipts WHERE command_id = %(id)s", {"id": done}
            )
        ] == ["charged"]

        text = metrics.render()
        assert 'akter_job_dead_letters_total{actor_type="Shop",job="charge"} 1' in text
        assert 'akter_relay_retried_total{kind="job"} 1' in text
        assert 'akter_relay_delivered_total{kind="job"} 1' in text
        # No metric carries a tenant, actor id or job (command) id.
        for secret in ("tenant-x", "secret-shop", dead, done):
            assert secret not in text


# --- TE-02 ------------------------------------------------------------------------------------


async def test_TE02_each_attempt_has_a_client_span_with_the_job_attributes(
    akter_test: Make, provider: FakeProvider, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("declined"), succeed(8))
        job_id = await t.get(Shop, "s1", tenant="t1").buy(1)
        await settle_all(t)
        first, second = job_spans(spans, "akter.job/Shop/charge")
        for span, attempt in ((first, 1), (second, 2)):
            assert span.kind == trace.SpanKind.CLIENT
            assert dict(span.attributes or {}) == {
                "actor.type": "Shop",
                "actor.tenant": "t1",
                "actor.id": "s1",
                "job.name": "charge",
                "job.id": job_id,
                "job.attempt": attempt,
            }
        assert first.status.status_code == trace.StatusCode.ERROR
        assert first.status.description == "JobFailure: declined"
        assert second.status.status_code == trace.StatusCode.UNSET
        assert first.end_time is not None and second.start_time is not None
        assert first.end_time <= second.start_time


async def test_TE02_backoff_and_dead_letter_log_texts(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        provider.script(fail("declined"), fail("declined again"))
        job_id = await t.get(Shop, "s1").buy(1)
        with caplog.at_level(logging.INFO, logger="akter.jobs"):
            await settle_all(t)
        (backoff,) = records(caplog, "Job attempt failed; retrying with backoff")
        assert backoff.levelno == logging.WARNING and backoff.name == "akter.jobs"
        assert fields(backoff) == ("Shop", "s1", "default", "charge", job_id, 1)
        (dead,) = records(caplog, "Job dead-lettered after its last attempt")
        assert dead.levelno == logging.WARNING and dead.name == "akter.jobs"
        assert fields(dead) == ("Shop", "s1", "default", "charge", job_id, 2)


async def _lose_lease(t: ActorTest) -> None:
    """Give runtime 1 a clock past runtime 0's lease (a takeover without waiting)."""
    t.runtimes[1]._clock.offset_ms += t.runtime.config.job_lease_ms + 1000


async def test_TE02_lease_loss_log_text(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False, lease=3, cancel_check=1) as t:
        await t.add_runtime()
        first, second = gate(1), gate(2)
        provider.script(first, second)
        job_id = await t.get(Shop, "s1").buy(1)
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await t.runtimes[1]._jobs.run_pass() == 1  # attempt 2 takes the row
        await asyncio.wait_for(second.entered.wait(), 10)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            await asyncio.wait_for(t.wait_idle(), 10)  # the next renewal finds none
        (lost,) = records(caplog, "Job attempt lost its lease")
        assert lost.levelno == logging.WARNING and lost.name == "akter.jobs"
        assert fields(lost) == ("Shop", "s1", "default", "charge", job_id, 1)
        assert provider.calls[0].outcome == "interrupted"
        second.release()
        await t.wait_idle(runner=1)
        await t.advance(0)
        assert [r["value"] for r in await t.get(Shop, "s1").reports()] == [2]


async def test_TE02_late_success_log_texts(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    async with akter_test(ALL, relay=False) as t:
        await t.add_runtime()
        # After the dead letter: a late success only flips it ambiguous.
        first = gate(5)
        provider.script(first, fail("declined", final=True))
        dead_id = await t.get(Shop, "s1").buy(1)
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(first.entered.wait(), 10)
        await _lose_lease(t)
        assert await t.runtimes[1]._jobs.run_pass() == 1
        await t.wait_idle(runner=1)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            first.release()
            await t.wait_idle()
        (late,) = records(caplog, "Job succeeded after it was dead-lettered")
        assert late.levelno == logging.WARNING and late.name == "akter.jobs"
        assert fields(late) == ("Shop", "s1", "default", "charge", dead_id, 1)

        # After the cancellation settled (reported Unknown): recorded as an ambiguous letter.
        caplog.clear()
        step = gate(7)
        provider.script(step)
        cancelled_id = await t.get(Shop, "s2").buy(1, key="k")
        t.runtimes[1]._clock.offset_ms = t.runtime._clock.offset_ms  # undo the first takeover
        assert await t.runtime._jobs.run_pass() == 1
        await asyncio.wait_for(step.entered.wait(), 10)
        await t.runtimes[1].get(Shop, "s2").cancel("k")  # no signal reaches runtime 0
        await _lose_lease(t)
        assert await t.runtimes[1]._jobs.run_pass() == 1  # settle-only: reported Unknown
        await t.wait_idle(runner=1)
        with caplog.at_level(logging.WARNING, logger="akter.jobs"):
            step.release()
            await t.wait_idle()
        (settled,) = records(caplog, "Job succeeded after its cancellation settled")
        assert settled.levelno == logging.WARNING and settled.name == "akter.jobs"
        assert fields(settled) == ("Shop", "s2", "default", "charge", cancelled_id, 1)
