"""Hardening 8: rows written before the database clock moved back (semantics §1.7).

Time travel: a runtime with ``clock_offset=+10 min`` writes leases, claims and heartbeats, then
dies (or stops); another runtime on the same schema with offset 0 sees the clock 10 minutes
earlier — as after an NTP step back or a failover to a host with a slower clock. Every lease-like
row is further ahead than its writer could have made it on a correct clock, so it is taken over
within the normal bound (a lease, a poll), not after the 10 minutes, with a warning naming the
skew.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

import akter
from akter._store.gateway.skew import Released, SkewSession
from akter.testing import ActorTest
from akter.testing.provider import FakeProvider, succeed
from tests._support.polling import until
from tests.integration.relay_actors import Receiver, Sender
from tests.integration.relay_actors import reset as reset_relay_actors
from tests.integration.test_jobs_actors import ALL, PROVIDER, Shop

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

#: How far ahead the first runtime's clock runs: far beyond any lease, claim or backoff.
AHEAD = timedelta(minutes=10)
AHEAD_MS = 600_000


class Nothing(BaseModel):
    pass


class Beacon(akter.Actor[Nothing], singleton=True):
    """A singleton whose loop records which runner started it."""

    async def run(self) -> None:
        STARTS.append(str(self.runtime._runners.runner_id))
        STARTED.set()
        await asyncio.Event().wait()


STARTS: list[str] = []
STARTED = asyncio.Event()


@pytest.fixture(autouse=True)
def provider() -> Iterator[FakeProvider]:
    PROVIDER.reset()
    reset_relay_actors()
    yield PROVIDER
    PROVIDER.reset()


async def wait_started(within: float) -> None:
    STARTED.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(STARTED.wait(), within)


def skew_warnings(caplog: pytest.LogCaptureFixture, message: str) -> list[Any]:
    """The records whose message is ``message`` (before the subject the line names after it)."""
    return [r for r in caplog.records if r.getMessage().partition(": ")[0] == message]


async def test_h8_singleton_lease_and_heartbeat_written_ahead_are_taken_over(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    STARTS.clear()
    STARTED.clear()
    options: dict[str, Any] = {"singleton_lease": 2, "maintenance": False}
    ahead = akter_test([Beacon], clock_offset=AHEAD, keep_schema=True, **options)
    async with ahead:
        old = ahead.runtime._runners.runner_id
        while old not in STARTS:
            await wait_started(10)
        await ahead.kill(0)
    caplog.set_level(logging.WARNING, logger="akter.runners")
    async with akter_test([Beacon], schema=ahead.schema, **options) as t:
        new = t.runtime._runners.runner_id
        started = time.monotonic()
        while new not in STARTS:
            assert time.monotonic() - started < 10, "the lease written ahead was not taken over"
            await wait_started(1)
        # Within the normal bound (one lease + refresh), not after the 10 minutes.
        assert time.monotonic() - started < 2 + 1
        [row] = await t.rows(
            "SELECT owner::text AS owner, lease_until_ms FROM {schema}.singletons"
            " WHERE actor_type = 'Beacon'"
        )
        assert row["owner"] == new
        assert row["lease_until_ms"] <= await t.now_ms() + 2_000
        [warning] = skew_warnings(
            caplog,
            "Took over a singleton lease ahead of the database clock (the clock moved back)",
        )
        assert warning.actor_type == "Beacon"
        assert AHEAD_MS <= warning.skew_ms <= AHEAD_MS + 2_000 + 5_000
        # The dead runner's heartbeat, 10 minutes ahead, does not make it live; pruning
        # forgets it at once (a live runner would register again at its next heartbeat).
        assert [r.runner_id for r in await t.runtime._runners.live()] == [new]
        await t.runtime._runners.prune()
        runners = await t.rows("SELECT runner_id::text AS runner_id FROM {schema}.runners")
        assert [r["runner_id"] for r in runners] == [new]
        [pruned] = skew_warnings(
            caplog,
            "Pruned a runner whose heartbeat is ahead of the database clock (the clock moved back)",
        )
        assert pruned.pruned_runner_id == old and pruned.skew_ms >= AHEAD_MS - 60_000


async def test_h8_job_lease_written_ahead_is_taken_over(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    ahead = akter_test(ALL, relay=False, clock_offset=AHEAD, keep_schema=True)
    async with ahead:
        ahead.crash_next("before_execute")  # attempt 1 dies holding its lease
        job_id = await ahead.get(Shop, "s1").buy(1)
        await ahead.advance(0)
        [row] = await ahead.rows("SELECT running, attempts, due_at_ms FROM {schema}.outbox")
        assert (row["running"], row["attempts"]) == (True, 1)
    assert provider.count == 0
    provider.script(succeed(5))
    caplog.set_level(logging.WARNING, logger="akter.clock")
    async with akter_test(ALL, relay=False, schema=ahead.schema) as t:
        # One drain (no clock movement): the lease 10 minutes ahead is taken over now.
        await t.advance(0)
        assert [(c.job_id, c.attempt) for c in provider.calls] == [(job_id, 2)]
        assert [r["value"] for r in await t.get(Shop, "s1").reports()] == [5]
        assert await t.rows("SELECT * FROM {schema}.outbox") == []
        [warning] = skew_warnings(
            caplog, "Released job leases ahead of the database clock (it moved back)"
        )
        assert warning.released == 1 and warning.rows == [f"Shop.charge {job_id}"]
        lease = t.runtime.config.job_lease_ms
        assert AHEAD_MS <= warning.skew_ms <= AHEAD_MS + lease + 5_000


async def test_h8_intent_claim_written_ahead_is_delivered(
    akter_test: Make, caplog: pytest.LogCaptureFixture
) -> None:
    actors = [Sender, Receiver]
    ahead = akter_test(actors, clock_offset=AHEAD, keep_schema=True, maintenance=False)
    async with ahead:
        ahead.crash_next("after_claim")  # the delivery dies holding its claim
        await ahead.get(Sender, "s").send_to("r", 7)
        await ahead.drain()
        [row] = await ahead.rows("SELECT attempts, due_at_ms FROM {schema}.outbox")
        assert row["attempts"] == 1
        await ahead.kill(0)
    caplog.set_level(logging.WARNING, logger="akter.clock")
    async with akter_test(actors, schema=ahead.schema, maintenance=False) as t:
        await t.drain()  # no clock movement: the claim 10 minutes ahead is released now
        assert await t.rows("SELECT * FROM {schema}.outbox") == []
        assert len(await t.rows("SELECT * FROM {schema}.receipts WHERE command = 'take'")) == 1
        [warning] = skew_warnings(
            caplog, "Released intent claims ahead of the database clock (it moved back)"
        )
        assert warning.released == 1
        assert AHEAD_MS <= warning.skew_ms <= AHEAD_MS + 300_000


async def test_h8_a_live_runner_sees_the_clock_move_back(
    akter_test: Make, provider: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter.clock")
    async with akter_test(ALL, relay=False, clock_offset=AHEAD) as t:
        skew = t.runtime._loop.skew
        await skew.check(force=True)
        assert not skew.suspected
        t.runtime._clock.offset_ms = 0  # the database clock steps back 10 minutes
        await skew.check(force=True)
        [warning] = skew_warnings(caplog, "The database clock moved back")
        assert AHEAD_MS - 5_000 <= warning.skew_ms <= AHEAD_MS + 1_000  # round-trip blur
        assert warning.runner_id == t.runtime._runners.runner_id


async def test_h8_the_job_release_is_sent_only_when_the_probe_sees_a_lease_ahead(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Idle cost (issue 13, goal 5): the probe reads the newest running lease end; the release
    # statement runs only when that lies further ahead than a lease can.
    sent: list[dict[str, Any]] = []
    release = SkewSession.release_jobs

    async def counted(self: SkewSession, **kw: Any) -> list[Released]:
        sent.append(kw)
        return await release(self, **kw)

    monkeypatch.setattr(SkewSession, "release_jobs", counted)
    async with akter_test(ALL, relay=False) as t:
        skew = t.runtime._loop.skew
        await skew.check(force=True)
        assert sent == []  # no running attempt at all

        t.crash_next("before_execute")  # attempt 1 dies holding a live lease
        await t.get(Shop, "s1").buy(1)
        await t.advance(0)
        [live] = await t.rows("SELECT running, due_at_ms FROM {schema}.outbox")
        assert live["running"]
        await skew.check(force=True)
        assert sent == []  # a live lease within its bound: nothing to release, nothing sent

        # The same lease as if written before the clock moved back 10 minutes.
        await t.rows("UPDATE {schema}.outbox SET due_at_ms = due_at_ms + %(ms)s", {"ms": AHEAD_MS})
        await skew.check(force=True)
        assert len(sent) == 1
        [released] = await t.rows("SELECT running, due_at_ms FROM {schema}.outbox")
        assert released["due_at_ms"] < live["due_at_ms"]  # due now: the claims take it over


async def test_a_pass_does_not_wait_for_the_skew_check(
    akter_test: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On Citus the probe reads across the shards (430-520 ms measured under load): run inside
    # the pass lock, it held back every claim behind it once per check. A live runner's check
    # runs beside its passes; here its probe waits at a gate while an intent is delivered.
    entered, gate = asyncio.Event(), asyncio.Event()
    probe = SkewSession.probe

    async def held(self: SkewSession) -> Any:
        entered.set()
        await gate.wait()
        return await probe(self)

    monkeypatch.setattr(SkewSession, "probe", held)
    async with akter_test([Sender, Receiver], poll=0.05) as t:
        try:
            await asyncio.wait_for(entered.wait(), 10)  # the first pass started a check
            await t.get(Sender, "s").send_to("r", 7)
            await until(
                lambda: t.rows("SELECT 1 FROM {schema}.outbox"),
                holds=lambda rows: rows == [],
                what="the intent delivered while the skew check waits",
            )
            [receiver] = await t.rows(
                "SELECT state FROM {schema}.actors WHERE actor_type = 'Receiver'"
            )
            assert receiver["state"]["total"] == 7
            assert not gate.is_set() and entered.is_set()  # the check is still at its gate
        finally:
            gate.set()
