"""Admission backpressure on the outbox backlog (``max_outbox_backlog``, issue 13).

The relay's lane is one slot and a fault-point pause holds the one claimed delivery, so the
relay is saturated while the other intents wait: its pass counts them, and the gate refuses
external commands with ``RunnerAtCapacity`` (retryable, with ``retry_after``) without touching a
row. Deliveries are internal and still run; once a pass sees fewer due rows than it asked for,
admission resumes with no further count. Ordering comes from the pause and the gate's sample
counter, never from sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import akter
from akter.testing import ActorTest
from tests.integration.relay_actors import ALL, RUNS, Sender, reset

Make = Callable[..., ActorTest]

pytestmark = pytest.mark.timeout(60)

TARGETS = [f"bl-r{i}" for i in range(6)]


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    reset()
    yield
    reset()


async def snapshot(t: ActorTest) -> dict[str, list[dict[str, Any]]]:
    """Every row a refused command could have written."""
    return {
        "actors": await t.rows(
            "SELECT actor_type, actor_id, version FROM {schema}.actors ORDER BY 1, 2"
        ),
        "receipts": await t.rows(
            "SELECT actor_type, actor_id, command_id FROM {schema}.receipts ORDER BY 1, 2, 3"
        ),
        "outbox": await t.rows(
            "SELECT intent_id, due_at_ms, attempts FROM {schema}.outbox ORDER BY intent_id"
        ),
    }


async def test_backlog_bound_refuses_external_commands_and_resumes_after_drain(
    akter_test: Make,
) -> None:
    async with akter_test(
        ALL, relay=False, delivery_concurrency=1, pass_limit=1, max_outbox_backlog=3
    ) as t:
        relay = t.runtime._relay
        gate = t.runtime._loop.backlog
        await t.get(Sender, "bl-s1").send_many(TARGETS, 1)  # 6 due intents

        held = t.pause_next("after_claim")
        assert await relay.run_pass() == 1  # the lane's one slot: the claim took all it asked
        await held.wait()
        await gate.wait_for(1)  # the saturated pass counted the rest
        assert gate.backlog == 4 and gate.refusing  # 5 due, counted up to bound + 1

        before = await snapshot(t)
        with pytest.raises(akter.ActorError) as caught:
            # retry=False: the refusal as an HTTP caller sees it (503 with Retry-After).
            await t.runtime.call(
                Sender, "bl-s2", "send_to", {"target": "bl-r9", "k": 1}, retry=False
            )
        error = caught.value
        assert error.reason == "RunnerAtCapacity" and error.retryable
        assert error.retry_after is not None and 0 < error.retry_after <= 1.0
        assert "max_outbox_backlog=3" in error.message
        assert await snapshot(t) == before  # nothing written, nothing lost
        assert gate.refused >= 1

        # A handle retries the refusal after retry_after, under one command id.
        retrying = asyncio.create_task(t.get(Sender, "bl-s2").send_to("bl-r9", 1))
        # Deliveries are internal: they run while external commands are refused.
        held.release()
        await t.drain()
        assert not gate.refusing and gate.backlog == 0  # a pass saw fewer rows than it asked
        await retrying  # admission resumed: the retry committed
        await t.drain()
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []
        assert sorted(RUNS.values()) == [1] * (len(TARGETS) + 1)
        rows = await t.rows(
            "SELECT actor_id FROM {schema}.actors WHERE actor_type = 'Receiver' ORDER BY 1"
        )
        assert [r["actor_id"] for r in rows] == sorted([*TARGETS, "bl-r9"])
        sender = await t.rows(
            "SELECT count(*) AS n FROM {schema}.receipts WHERE actor_id = 'bl-s2'"
        )
        assert sender == [{"n": 1}]  # one command, however many refusals it met


async def test_no_bound_never_counts(akter_test: Make) -> None:
    async with akter_test(
        ALL, relay=False, delivery_concurrency=1, pass_limit=1, max_outbox_backlog=None
    ) as t:
        await t.get(Sender, "bl-s3").send_many(TARGETS, 1)
        held = t.pause_next("after_claim")
        assert await t.runtime._relay.run_pass() == 1
        await held.wait()
        assert t.runtime._loop.backlog.samples == 0
        await t.get(Sender, "bl-s4").send_to("bl-r9", 1)  # admitted
        held.release()
        await t.drain()
        assert await t.rows("SELECT intent_id FROM {schema}.outbox") == []


def test_max_outbox_backlog_is_validated() -> None:
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(akter.ConfigurationError, match="max_outbox_backlog"):
            akter.Runtime(ALL, max_outbox_backlog=bad)  # type: ignore[arg-type]
