"""The subscriptions spec S1–S3 on a real PostgreSQL: exactly once, in order, only committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import akter
from akter.testing import ActorTest
from tests.integration.subscription_actors import ACTORS, Inbox, Order, User, Warehouse

Make = Callable[..., ActorTest]


async def test_routed_subscription_delivers_each_event_to_the_warehouse_it_names(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").pay("w1", 2)
        await t.get(Order, "o2").pay("w2")
        await t.get(Order, "o1").pay("w2")
        await t.drain()
        assert (await t.get(Warehouse, "w1").seen()).applied == [("o1", 1, 1), ("o1", 2, 2)]
        assert sorted((await t.get(Warehouse, "w2").seen()).applied) == [
            ("o1", 3, 3),
            ("o2", 1, 1),
        ]
        cursors = await t.rows(
            "SELECT actor_id, source_id, applied FROM {schema}.subscription_cursors"
            " ORDER BY actor_id, source_id"
        )
        assert [(r["actor_id"], r["source_id"], r["applied"]) for r in cursors] == [
            ("w1", "o1", 2),
            ("w2", "o1", 3),
            ("w2", "o2", 1),
        ]


async def test_S1_a_redelivery_after_the_subscriber_committed_is_acknowledged_not_run_again(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").pay("w1", 3)
        # The lane crashes after the warehouse's turns committed, before the feed's settle.
        t.crash_next("before_subscription_settle")
        await t.drain()
        feed = await t.rows("SELECT done, head FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"]) for r in feed] == [(0, 3)]  # nothing settled
        # The claim's lease ends; another round reads the three events again.
        await t.advance(61)
        assert (await t.get(Warehouse, "w1").seen()).applied == [
            ("o1", 1, 1),
            ("o1", 2, 2),
            ("o1", 3, 3),
        ]
        feed = await t.rows("SELECT done, head FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"]) for r in feed] == [(3, 3)]


async def test_S1_a_stale_delivery_racing_the_applied_cursor_commits_nothing(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").pay("w1")
        await t.drain()
        # A delivery of cursor 1 made again (a slow round whose lease another runner took over)
        # fails in the commit flight: the handler's effects are not written twice.
        payload = {
            "delivery": {
                "subscription": "Warehouse.on_order",
                "source_type": "Order",
                "source_id": "o1",
                "cursor": 1,
                "tag": "sub.order_paid",
                "payload": {"warehouse": "w1", "n": 1},
                "version": 0,
                "emitted_at_ms": 0,
            }
        }
        result = await t.runtime.deliver(
            t.runtime.ref(Warehouse, "w1"),
            "on_order",
            payload,
            await t.runtime.mint_command_id(),
            akter.System(source="subscription"),
            within=0.5,
        )
        assert result.kind == "error"
        assert (await t.get(Warehouse, "w1").seen()).applied == [("o1", 1, 1)]


async def test_S2_events_are_applied_in_cursor_order_across_batches(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        order = t.get(Order, "o1")
        for _ in range(5):
            await order.pay("w1", 3)
        await t.drain()
        applied = (await t.get(Warehouse, "w1").seen()).applied
        assert [c for _, c, _ in applied] == list(range(1, 16))


async def test_S3_a_rolled_back_source_turn_delivers_nothing(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        order = t.get(Order, "o1")
        with pytest.raises(akter.ActorError):
            await order.pay_then_break("w1")
        await order.pay("w1")
        await t.drain()
        assert (await t.get(Warehouse, "w1").seen()).applied == [("o1", 1, 1)]


async def test_S3_a_source_turn_that_crashes_before_commit_delivers_only_its_retry(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        t.crash_next("before_commit")
        assert await t.get(Order, "o1").pay("w1") == 1  # the crashed attempt, then its retry
        await t.drain()
        feeds = await t.rows("SELECT head FROM {schema}.subscription_feeds")
        assert [r["head"] for r in feeds] == [1]
        assert (await t.get(Warehouse, "w1").seen()).applied == [("o1", 1, 1)]


async def test_dynamic_subscription_follows_from_now_and_stops_on_unsubscribe(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        user, inbox = t.get(User, "u1"), t.get(Inbox, "i1")
        await user.post(2)  # before the follow: not delivered ("now")
        await inbox.follow("u1")
        await user.post(2)
        await t.drain()
        assert (await inbox.seen()).applied == [("u1", 3, 3), ("u1", 4, 4)]
        await inbox.unfollow("u1")
        await user.post()
        await t.drain()
        assert (await inbox.seen()).applied == [("u1", 3, 3), ("u1", 4, 4)]


async def test_dynamic_subscription_from_the_start_and_a_rolled_back_subscribe(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        user = t.get(User, "u1")
        await user.post(2)
        with pytest.raises(akter.ActorError):
            await t.get(Inbox, "i0").follow_then_break("u1")  # rolled back: no follow
        await t.get(Inbox, "i1").follow("u1", "start")
        await t.get(Inbox, "i2").follow("u1", 1)
        await t.drain()
        assert (await t.get(Inbox, "i1").seen()).applied == [("u1", 1, 1), ("u1", 2, 2)]
        assert (await t.get(Inbox, "i2").seen()).applied == [("u1", 2, 2)]
        follows = await t.rows("SELECT subscriber_id FROM {schema}.subscription_follows")
        assert sorted(r["subscriber_id"] for r in follows) == ["i1", "i2"]


async def test_the_subscription_handler_is_internal(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        with pytest.raises(akter.ActorError) as refused:
            await t.runtime.call(Warehouse, "w1", "on_order", {"delivery": {}})
        assert refused.value.code == "unknown_member"


async def test_S2_order_holds_while_the_source_commits_during_a_delivery(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        order = t.get(Order, "o1")
        await order.pay("w1")
        # The round's first delivery waits at a barrier while the sources commit more events.
        pause = t.pause_next("before_subscription_delivery")
        drained = asyncio.create_task(t.drain())
        info = await pause.wait()
        assert info["cursor"] == 1
        await asyncio.gather(order.pay("w1", 2), t.get(Order, "o2").pay("w1"), order.pay("w1"))
        pause.release()
        await drained
        await t.drain()
        applied = (await t.get(Warehouse, "w1").seen()).applied
        assert [c for s, c, _ in applied if s == "o1"] == [1, 2, 3, 4]
        assert [c for s, c, _ in applied if s == "o2"] == [1]
        assert len(applied) == 5


async def test_S3_a_subscriber_that_crashes_after_its_commit_applies_the_event_once(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        t.crash_next("after_commit", lambda info: info["ref"].type == "Warehouse")
        await t.get(Order, "o1").pay("w1", 2)
        await t.drain()  # event 1's turn commits, then crashes: the feed backs off
        feeds = await t.rows("SELECT done, attempts FROM {schema}.subscription_feeds")
        assert [(r["done"], r["attempts"]) for r in feeds] == [(0, 1)]
        await t.advance(61)  # the backoff ends: event 1 is acknowledged, event 2 delivered
        assert (await t.get(Warehouse, "w1").seen()).applied == [("o1", 1, 1), ("o1", 2, 2)]
        feeds = await t.rows("SELECT done, head FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"]) for r in feeds] == [(2, 2)]


async def follow_during_a_round(t: ActorTest, *, crash_settle: bool = False) -> None:
    """i1 follows u1's two events; its round waits before its first delivery; i2 follows from 1.

    The round read the feed's followers already, so its settle must not move the feed's done
    past the start i2's follow rewound it to. ``crash_settle``: the round dies before its settle.
    """
    await t.get(User, "u1").post(2)
    await t.get(Inbox, "i1").follow("u1", "start")
    pause = t.pause_next("before_subscription_delivery")
    if crash_settle:
        t.crash_next("before_subscription_settle")
    drained = asyncio.create_task(t.drain())
    info = await pause.wait()
    assert (info["ref"].id, info["cursor"]) == ("i1", 1)
    await t.get(Inbox, "i2").follow("u1", 1)
    pause.release()
    await drained


async def test_a_follow_committed_during_a_round_is_served_by_the_next_round(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await follow_during_a_round(t)
        await t.drain()
        assert (await t.get(Inbox, "i1").seen()).applied == [("u1", 1, 1), ("u1", 2, 2)]
        assert (await t.get(Inbox, "i2").seen()).applied == [("u1", 2, 2)]
        feeds = await t.rows("SELECT done, head FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"]) for r in feeds] == [(2, 2)]


async def test_a_rewound_round_that_crashes_before_its_settle_still_serves_the_new_follower(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await follow_during_a_round(t, crash_settle=True)  # the rewound round dies unsettled
        feeds = await t.rows("SELECT done, head, rewound FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"], r["rewound"]) for r in feeds] == [(0, 2, True)]
        await t.advance(61)  # the claim's lease ends; the next claim clears the mark
        assert (await t.get(Inbox, "i1").seen()).applied == [("u1", 1, 1), ("u1", 2, 2)]
        assert (await t.get(Inbox, "i2").seen()).applied == [("u1", 2, 2)]
        feeds = await t.rows("SELECT done, head, rewound FROM {schema}.subscription_feeds")
        assert [(r["done"], r["head"], r["rewound"]) for r in feeds] == [(2, 2, False)]
