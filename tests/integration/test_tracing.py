"""One trace across the outbox (issue 14, finding 3): each row keeps the span that staged it.

A turn stores the W3C ``traceparent`` of its batch span with every row it stages (intents,
timers, jobs); the relay's delivery and the job attempt continue that trace, and a job's route
continues the attempt's. Rows staged with no tracer configured, and rows written before the
column existed, hold NULL and deliver as before (their spans start new traces).

Spans are captured with an in-memory exporter on a private tracer provider that replaces akter's
tracers (turns and relay in ``akter.telemetry``, attempts in ``akter._engine.jobs.attempt``) for
the test only; nothing global is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from akter.testing import ActorTest
from akter.testing.provider import gate
from tests._support.barriers import until_pending
from tests.integration.telemetry_actors import ACTORS, PROVIDER, Pinger, Pong

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _provider() -> Iterator[None]:
    PROVIDER.reset()
    yield
    PROVIDER.reset()


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def traceparent(span: ReadableSpan) -> str:
    assert span.context is not None
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    """Whether ``span``'s parent is ``parent`` (a stored parent reads back as remote)."""
    assert span.parent is not None and parent.context is not None
    return (span.parent.trace_id, span.parent.span_id) == (
        parent.context.trace_id,
        parent.context.span_id,
    )


async def stored(t: ActorTest) -> list[str | None]:
    rows = await t.rows("SELECT traceparent FROM {schema}.outbox ORDER BY intent_id")
    return [r["traceparent"] for r in rows]


async def test_a_timer_keeps_the_staging_batch_and_its_delivery_continues_it(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Pinger, "a").remind(5)
        staging = one(spans, "akter.Pinger/batch")
        assert await stored(t) == [traceparent(staging)]

        await t.advance(5)
        delivery = one(spans, "akter.relay.intent")
        assert child_of(delivery, staging)  # a child of the span that staged it
        receiving = one(spans, "akter.Pong/batch")
        assert receiving.parent == delivery.context
        assert staging.context is not None and receiving.context is not None
        assert receiving.context.trace_id == staging.context.trace_id


async def test_an_attempt_continues_the_turn_that_enqueued_it(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    # The attempt is held at a gate until the stored row is read: the background relay may
    # claim the job the moment the turn commits, and a settled job's row is gone.
    step = gate(1)
    PROVIDER.script(step)
    async with akter_test(ACTORS) as t:
        await t.get(Pinger, "a").start()
        staging = one(spans, "akter.Pinger/batch")
        assert await stored(t) == [traceparent(staging)]
        step.release()
        await t.drain()
        attempt = one(spans, "akter.job/Pinger/hold")
        assert child_of(attempt, staging)


async def test_rows_staged_without_a_tracer_hold_null_and_deliver(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        # The background relay may deliver the ping's intent the moment the turn commits; the
        # pause keeps its row until the stored columns are read.
        held = t.pause_next("before_outbox_delete")
        await t.get(Pinger, "a").remind(5)
        await t.get(Pinger, "a").ping(1)
        assert await stored(t) == [None, None]
        held.release()
        await t.advance(5)
        assert await t.get(Pong, "t").got(0) == 1
        assert await t.get(Pong, "p0").got(0) == 1


async def test_with_no_tracer_a_row_holds_its_own_callers_trace_or_none(akter_test: Make) -> None:
    # With no tracer provider the batch span only carries the caller's trace, if any. The
    # mailbox task was started by the first caller, inside that caller's span: a batch of a
    # caller with no trace must still stage NULL, not that first caller's trace.
    remote = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    async with akter_test(ACTORS, relay=False) as t:
        pinger = t.get(Pinger, "a")
        held = t.pause_next("before_commit")
        with trace.use_span(NonRecordingSpan(remote)):
            traced = asyncio.create_task(pinger.ping(1))
        await held.wait()
        untraced = asyncio.create_task(pinger.ping(1))
        await until_pending(t.runtime, 2)
        held.release()
        assert await traced == await untraced == 1
        assert await stored(t) == [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            None,
        ]


async def test_a_row_without_a_traceparent_delivers_in_a_new_trace(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    # A row written before migration 0003 (or by code that stores none) has NULL.
    async with akter_test(ACTORS) as t:
        await t.get(Pinger, "a").remind(5)
        await t.rows("UPDATE {schema}.outbox SET traceparent = NULL RETURNING 1")
        await t.advance(5)
        delivery = one(spans, "akter.relay.intent")
        assert delivery.parent is None
        assert one(spans, "akter.Pong/batch").parent == delivery.context
        assert await t.get(Pong, "t").got(0) == 1


async def test_an_unreadable_traceparent_is_ignored(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Pinger, "a").remind(5)
        await t.rows("UPDATE {schema}.outbox SET traceparent = 'garbage' RETURNING 1")
        await t.advance(5)
        assert one(spans, "akter.relay.intent").parent is None
        assert await t.get(Pong, "t").got(0) == 1
