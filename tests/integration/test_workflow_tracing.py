"""Workflow spans (the workflows spec, W4): one per run attempt, linked to the start; one per step.

An attempt's span is a root linked to the span that started the run (a run that sleeps for a
day is several traces); the steps it performs are its children, and the turns a command step
runs are children of that step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from akter import telemetry
from akter.testing import ActorTest
from tests.integration.workflow_actors import ALL, Order

Make = Callable[..., ActorTest]


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


async def test_an_attempt_links_to_its_start_and_parents_its_steps_and_their_turns(
    akter_test: Make, spans: InMemorySpanExporter
) -> None:
    async with akter_test(ALL) as t:
        with telemetry.tracer.start_as_current_span("caller") as caller:
            run = await t.get(Order, "o-1").sleeper.start(1)
        await t.drain()
        await t.advance(3601)
        assert await run.result(timeout=10) == "woke"
        attempts = named(spans, "akter.workflow/Order.sleeper")
        assert len(attempts) == 2  # one that suspended on the sleep, one that completed
        for attempt in attempts:
            assert attempt.parent is None
            assert [link.context.span_id for link in attempt.links] == [
                caller.get_span_context().span_id
            ]
        assert [(a.attributes or {})["workflow.outcome"] for a in attempts] == [
            "suspended",
            "completed",
        ]

        run = await t.get(Order, "o-2").three.start("sku-2")
        await t.drain()
        await run.result(timeout=10)
        attempt = named(spans, "akter.workflow/Order.three")[-1]
        steps = named(spans, "akter.workflow.step")
        assert attempt.context is not None
        mine = [
            s for s in steps if s.parent is not None and s.parent.span_id == attempt.context.span_id
        ]
        assert [(s.attributes or {})["workflow.step.name"] for s in mine] == [
            "Order.mark",
            "Stock.reserve",
            "Order.mark",
        ]
        batches: list[Any] = named(spans, "akter.Stock/batch")
        reserve = mine[1]
        assert reserve.context is not None
        assert [b.parent.span_id for b in batches] == [reserve.context.span_id]
