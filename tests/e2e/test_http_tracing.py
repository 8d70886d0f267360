"""One trace from an HTTP caller across the outbox (issue 14, finding 3), on a live uvicorn server.

The caller sends a W3C ``traceparent`` (and ``tracestate``) on a command whose turn sends an
intent to another actor, whose turn enqueues a job whose route ends in a command. Every span of
that work shares the caller's trace id and hangs off the one before it: HTTP span → batch of
the turn → relay delivery → receiver's batch → job attempt → route delivery → route's batch.

Spans are captured with an in-memory exporter on a private tracer provider that replaces akter's
tracers for the test only (nothing global is set).
"""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, Field

import akter
from tests.e2e.conftest import Serve

pytestmark = pytest.mark.timeout(60)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


class Notes(BaseModel):
    memos: list[str] = Field(default_factory=list)


class Letter(BaseModel):
    to: str


class Back(akter.Actor[Notes], access=akter.public):
    @akter.command
    async def post(self, to: str) -> str:
        return self.enqueue(Back.mail, Letter(to=to))

    @akter.job(attempts=1, timeout=5)
    async def mail(call: akter.JobCall, payload: Letter) -> str:
        return f"sent to {payload.to}"

    @mail.on_success
    async def mailed(self, result: str) -> None:
        self.state.memos.append(result)

    @akter.query
    async def memos(self) -> list[str]:
        return self.state.memos


class Front(akter.Actor[Notes], access=akter.public):
    @akter.command
    async def forward(self, to: str) -> None:
        self.send(Back.post, "b-1", to)


def ids(span: ReadableSpan | None) -> tuple[int, int]:
    assert span is not None and span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.parent is not None, span.name
    return span.parent.trace_id, span.parent.span_id


async def test_one_trace_from_the_caller_to_the_jobs_route(
    served: Serve, spans: InMemorySpanExporter
) -> None:
    async with served([Front, Back], auth=None) as s:
        response = await s.http().post(
            "/actors/Front/f-1/forward",
            json={"to": "bob"},
            headers={
                "Idempotency-Key": await s.mint(),
                "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
                "tracestate": "vendor=x",
            },
        )
        assert response.status_code == 200, response.text
        await s.t.drain()
        assert await s.t.get(Back, "b-1").memos() == ["sent to bob"]

    finished = spans.get_finished_spans()
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in sorted(finished, key=lambda s: s.start_time or 0):
        by_name.setdefault(span.name, []).append(span)
    [http] = by_name["POST /actors/{type}/{id}/{member}"]
    [front] = by_name["akter.Front/batch"]
    intent, route = by_name["akter.relay.intent"]
    post, mailed = by_name["akter.Back/batch"]
    [attempt] = by_name["akter.job/Back/mail"]

    # The HTTP span continues the caller's span, with its tracestate.
    assert http.kind == trace.SpanKind.SERVER
    assert parent_ids(http) == (int(TRACE_ID, 16), int(CALLER_SPAN, 16))
    assert http.context is not None and http.context.trace_state.get("vendor") == "x"
    assert dict(http.attributes or {})["http.response.status_code"] == 200
    # caller → HTTP → turn → intent → receiver's turn → job attempt → route → route's turn
    chain = [http, front, intent, post, attempt, route, mailed]
    for child, parent in zip(chain[1:], chain, strict=False):
        assert parent_ids(child) == ids(parent), (child.name, parent.name)
    assert dict(route.attributes or {})["command.name"] == "mailed"
    # Every span of the work, turns and their flights included, is in the caller's trace.
    assert {s.context.trace_id for s in finished if s.context is not None} == {int(TRACE_ID, 16)}


async def test_a_command_without_trace_headers_starts_a_trace_at_the_http_span(
    served: Serve, spans: InMemorySpanExporter
) -> None:
    async with served([Front, Back], auth=None) as s:
        response = await s.http().post(
            "/actors/Front/f-2/forward",
            json={"to": "carol"},
            headers={"Idempotency-Key": await s.mint()},
        )
        assert response.status_code == 200, response.text
    [http] = [x for x in spans.get_finished_spans() if x.name.startswith("POST ")]
    [front] = [x for x in spans.get_finished_spans() if x.name == "akter.Front/batch"]
    assert http.parent is None
    assert parent_ids(front) == ids(http)


async def test_a_query_span_continues_the_caller(
    served: Serve, spans: InMemorySpanExporter
) -> None:
    async with served([Front, Back], auth=None) as s:
        response = await s.http().post(
            "/actors/Back/b-9/queries/memos",
            json={},
            headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"},
        )
        assert response.status_code == 200, response.text
    [http] = [x for x in spans.get_finished_spans() if x.name.startswith("POST ")]
    assert http.name == "POST /actors/{type}/{id}/queries/{member}"
    assert parent_ids(http) == (int(TRACE_ID, 16), int(CALLER_SPAN, 16))


async def test_without_a_tracer_the_callers_traceparent_rides_with_the_rows(
    served: Serve,
) -> None:
    # No tracer provider: no span records, but the caller's context is carried on (W3C
    # pass-through), so a traced service downstream of the outbox still joins the trace.
    async with served([Front, Back], auth=None) as s:
        held = s.t.pause_next("after_claim")  # the relay holds the intent: its row stays
        response = await s.http().post(
            "/actors/Front/f-3/forward",
            json={"to": "dan"},
            headers={
                "Idempotency-Key": await s.mint(),
                "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
            },
        )
        assert response.status_code == 200, response.text
        # Unheld, a busy relay could deliver it first and its job row would sit beside it.
        [row] = await s.t.rows("SELECT traceparent FROM {schema}.outbox")
        assert row["traceparent"] == f"00-{TRACE_ID}-{CALLER_SPAN}-01"
        held.release()
        await s.t.drain()
        assert await s.t.get(Back, "b-1").memos() == ["sent to dan"]
