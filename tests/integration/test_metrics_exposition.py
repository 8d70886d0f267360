"""``GET /metrics`` as Prometheus reads it (semantics §10.1): HELP on every family, counters at 0.

The text is parsed with ``prometheus_client``'s parser, not by string matching: a family without
HELP, a malformed sample or a counter that appears only after its first increment fails here.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import akter
import akter.http
from akter._metric_families import COUNTERS, FAMILIES, ROW_KINDS
from akter.testing import ActorTest
from tests.integration.test_jobs_actors import ALL, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)


async def scrape(t: ActorTest) -> str:
    app = akter.http.app(t.runtime)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


async def test_a_fresh_runtime_exposes_every_counter_at_zero_with_help(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        parsed = {f.name: f for f in text_string_to_metric_families(await scrape(t))}
        help_of = {f.prometheus.removesuffix("_total"): f.help for f in FAMILIES}
        for name, family in parsed.items():
            assert family.documentation == help_of[name], name
        for counter in COUNTERS.values():
            family = parsed[counter.prometheus.removesuffix("_total")]
            assert family.type == "counter" and family.samples, counter.name
            assert {s.value for s in family.samples} == {0.0}, counter.name
        retried = parsed["akter_relay_retried"].samples
        assert {s.labels["kind"] for s in retried} == set(ROW_KINDS)
        letters = {
            (s.labels["actor_type"], s.labels["job"])
            for s in parsed["akter_job_dead_letters"].samples
        }
        assert ("Shop", "charge") in letters and ("Hot", "two") in letters
        turns = {s.labels["actor_type"] for s in parsed["akter_turns"].samples}
        assert turns == {"Shop", "Hot", "Rejecting"}


async def test_counted_series_keep_their_help_after_increments(akter_test: Make) -> None:
    async with akter_test(ALL) as t:
        await t.get(Shop, "m").buy(100, key="k-1")
        parsed = {f.name: f for f in text_string_to_metric_families(await scrape(t))}
        assert all(f.documentation for f in parsed.values())
        ok = [
            s.value
            for s in parsed["akter_turns"].samples
            if s.labels == {"actor_type": "Shop", "outcome": "success"}
            and s.name.endswith("_total")
        ]
        assert ok == [1.0]
        assert parsed["akter_turn_duration_ms"].type == "histogram"
        assert parsed["akter_activations"].type == "gauge"
