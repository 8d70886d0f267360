"""The subscriptions spec S4–S8 on a real PostgreSQL: tenants, retention, failures, cost, start."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from akter.testing import ActorTest
from tests.integration.subscription_actors import (
    ACTORS,
    FAILING,
    Board,
    Inbox,
    Order,
    Sensor,
    Totals,
    User,
    Warehouse,
)

Make = Callable[..., ActorTest]


@pytest.fixture(autouse=True)
def healthy() -> Iterator[None]:
    FAILING.clear()
    yield
    FAILING.clear()


async def feeds(t: ActorTest) -> list[tuple[str, str, int, int]]:
    rows = await t.rows(
        "SELECT actor_id, subscription, head, done FROM {schema}.subscription_feeds"
        " ORDER BY actor_id, subscription"
    )
    return [(r["actor_id"], r["subscription"], r["head"], r["done"]) for r in rows]


async def test_S4_a_subscription_never_crosses_tenants(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1", tenant="a").pay("w1")
        await t.get(Order, "o1", tenant="b").pay("w1", 2)
        await t.get(Inbox, "i1", tenant="a").follow("u1")
        await t.get(User, "u1", tenant="b").post(3)  # the same id in another tenant
        await t.get(User, "u1", tenant="a").post()
        await t.drain()
        assert (await t.get(Warehouse, "w1", tenant="a").seen()).applied == [("o1", 1, 1)]
        assert (await t.get(Warehouse, "w1", tenant="b").seen()).applied == [
            ("o1", 1, 1),
            ("o1", 2, 2),
        ]
        assert (await t.get(Inbox, "i1", tenant="a").seen()).applied == [("u1", 1, 1)]
        cursors = await t.rows(
            "SELECT tenant_id, actor_id, source_id FROM {schema}.subscription_cursors"
            " ORDER BY tenant_id, actor_id"
        )
        assert [(r["tenant_id"], r["actor_id"]) for r in cursors] == [
            ("a", "i1"),
            ("a", "w1"),
            ("b", "w1"),
        ]


async def test_S5_retention_is_held_for_a_subscription_then_one_gap_is_delivered(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        sensor, board = t.get(Sensor, "s1"), t.get(Board, "b1")
        await sensor.read("b1")
        await t.drain()
        FAILING.add("b1")
        await sensor.read("b1", 2)  # events 2 and 3: not applied while b1 fails
        await t.drain()
        await t.advance(15)  # past keep_events (10 s), within the hold (30 s in all)
        await t.runtime.cleanup()
        events = await t.rows("SELECT seq FROM {schema}.events WHERE actor_type = 'Sensor'")
        assert sorted(r["seq"] for r in events) == [2, 3]  # 1 was applied: pruned
        await t.advance(20)  # past the hold's bound
        await t.runtime.cleanup()
        assert await t.rows("SELECT seq FROM {schema}.events WHERE actor_type = 'Sensor'") == []
        FAILING.discard("b1")
        await sensor.read("b1")
        await t.advance(61)  # past the feed's backoff
        seen = await board.seen()
        assert seen.applied == [("s1", 1, 1), ("s1", 4, 4)]
        assert seen.gaps == [("s1", 1, 3)]  # exactly one gap: events 2–3 were pruned


async def test_S6_a_failing_subscriber_backs_off_without_blocking_others(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        FAILING.add("bad")
        order = t.get(Order, "o1")
        await order.pay("bad")
        await order.pay("good")
        await t.get(Order, "o2").pay("good")
        await t.drain()
        assert sorted((await t.get(Warehouse, "good").seen()).applied) == [
            ("o1", 2, 2),
            ("o2", 1, 1),
        ]
        rows = await t.rows(
            "SELECT actor_id, done, attempts, last_error FROM {schema}.subscription_feeds"
            " ORDER BY actor_id"
        )
        o1 = rows[0]
        # Backed off at least once (a slow drain may outlast the first, 200 ms backoff).
        assert (o1["actor_id"], o1["done"]) == ("o1", 0) and o1["attempts"] >= 1
        assert "warehouse bad is failing" in o1["last_error"]
        FAILING.discard("bad")
        await t.advance(61)
        assert (await t.get(Warehouse, "bad").seen()).applied == [("o1", 1, 1)]
        # The good warehouse's event 2 was read again and acknowledged, not applied twice.
        assert sorted((await t.get(Warehouse, "good").seen()).applied) == [
            ("o1", 2, 2),
            ("o2", 1, 1),
        ]
        assert [(f[0], f[3]) for f in await feeds(t)] == [("o1", 2), ("o2", 1)]


async def test_S6_a_feed_of_a_subscription_the_code_no_longer_declares_is_parked(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").pay("w1")
        await t.drain()
        # A feed written by an older deploy whose Warehouse declared on_refund.
        await t.rows(
            "INSERT INTO {schema}.subscription_feeds (routing_key, tenant_id, actor_type,"
            " actor_id, subscription, head, done, due_at_ms, updated_at_ms)"
            " SELECT routing_key, tenant_id, actor_type, actor_id, 'Warehouse.on_refund', 1, 0,"
            " 0, 0 FROM {schema}.actors WHERE actor_type = 'Order'"
        )
        await t.drain()
        rows = await t.rows(
            "SELECT subscription, parked, done FROM {schema}.subscription_feeds"
            " ORDER BY subscription"
        )
        assert [(r["subscription"], r["done"]) for r in rows] == [
            ("Warehouse.on_order", 1),
            ("Warehouse.on_refund", 0),
        ]
        assert rows[0]["parked"] is None
        assert "Warehouse.on_refund is not a subscription to Order" in rows[1]["parked"]
        report = await t.check()
        found = [(f.kind, f.actor_type, f.member, f.count) for f in report.findings]
        assert ("unknown_subscription", "Warehouse", "on_refund", 1) in found
        assert not any(f[2] == "on_order" for f in found)


async def test_S6_a_feed_of_a_subscriber_type_no_runner_hosts_waits_and_check_reports_it(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").pay("w1")
        await t.drain()
        # A feed of a subscriber type this deploy removed: no runner hosts Ledger any more.
        await t.rows(
            "INSERT INTO {schema}.subscription_feeds (routing_key, tenant_id, actor_type,"
            " actor_id, subscription, head, done, due_at_ms, updated_at_ms)"
            " SELECT routing_key, tenant_id, actor_type, actor_id, 'Ledger.on_order', 1, 0,"
            " 0, 0 FROM {schema}.actors WHERE actor_type = 'Order'"
        )
        await t.drain()
        rows = await t.rows(
            "SELECT done, parked FROM {schema}.subscription_feeds"
            " WHERE subscription = 'Ledger.on_order'"
        )
        assert [(r["done"], r["parked"]) for r in rows] == [(0, None)]  # not claimed here
        report = await t.check()
        found = [(f.kind, f.actor_type, f.member, f.count) for f in report.findings]
        assert ("unknown_subscription", "Ledger", "on_order", 1) in found


async def test_S7_events_no_subscription_follows_write_no_feed(akter_test: Make) -> None:
    async with akter_test(ACTORS) as t:
        await t.get(Order, "o1").note()  # no subscription follows OrderNoted
        await t.get(User, "u1").post(3)  # a dynamic source nobody follows
        await t.drain()
        assert await feeds(t) == []


async def test_S7_one_feed_row_per_source_and_subscription_however_many_subscribers(
    akter_test: Make,
) -> None:
    async with akter_test(ACTORS) as t:
        for i in range(20):
            await t.get(Inbox, f"i{i}").follow("u1")
        await t.get(User, "u1").post(5)
        await t.get(Order, "o1").pay("w1", 4)
        assert await feeds(t) == [
            ("o1", "Warehouse.on_order", 4, 0),
            ("u1", "Inbox.on_post", 5, 0),
        ]
        await t.drain()
        for i in range(20):
            assert len((await t.get(Inbox, f"i{i}").seen()).applied) == 5


async def test_S8_a_routed_subscription_added_to_a_running_system_starts_now_or_at_the_start(
    akter_test: Make,
) -> None:
    async with akter_test([Order]) as t:
        await t.get(Order, "o1").pay("w1", 2)
        await t.get(Order, "o2").pay("w1")
        await t.drain()
        # A deploy adds Warehouse (from "now") and Totals (start="start").
        await t.add_runtime([Order, Warehouse, Totals])
        await t.get(Order, "o1", runner=1).pay("w1")
        await t.drain()
        assert (await t.get(Warehouse, "w1", runner=1).seen()).applied == [("o1", 3, 3)]
        totals = (await t.get(Totals, "", runner=1).seen()).applied
        assert sorted(totals) == [("o1", 1, 1), ("o1", 2, 2), ("o1", 3, 3), ("o2", 1, 1)]
        recorded = await t.rows("SELECT name, start FROM {schema}.subscriptions ORDER BY name")
        assert [(r["name"], r["start"]) for r in recorded] == [
            ("Totals.on_order", "start"),
            ("Warehouse.on_order", "now"),
        ]
