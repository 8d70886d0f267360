"""Subscriptions' pure rules: declarations refused, feed bumps, backoff (the subscriptions spec)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import akter
from akter._engine.subscriptions.lane import BACKOFF_MAX_MS, backoff_ms
from akter._engine.turn.subscribed import Followed, bumps
from akter._staging import StagedEvent
from akter.subscriptions import delivery_of, delivery_payload, spec_of


class Rang(akter.Event, tag="unit.sub.rang", aliases=["unit.sub.rung"]):
    n: int


class Other(akter.Event, tag="unit.sub.other"):
    n: int


class Count(BaseModel):
    n: int = 0


class Bell(akter.Actor[Count], events=[Rang, Other]):
    @akter.command
    async def ring(self) -> None:
        self.emit(Rang(n=1))


class Ear(akter.Actor[Count]):
    @akter.subscription(Bell, events=[Rang], route=lambda event, source: source.id)
    async def heard(self, delivery: akter.Delivery[Rang]) -> None:
        self.state.n = delivery.cursor


class Fan(akter.Actor[Count]):
    @akter.subscription(Bell, events=[Rang], start="start")
    async def follows(self, delivery: akter.Delivery[Rang]) -> None:
        self.state.n = delivery.cursor


def test_a_subscription_handler_is_an_internal_command_taking_a_delivery() -> None:
    member = Ear.__akter_definition__.members["heard"]
    assert member.internal and member.kind == "command"
    assert list(member.args_model.model_fields) == ["delivery"]
    spec = spec_of(member.fn)
    assert spec is not None and spec.source_type == "Bell" and spec.start == "now"


def test_declarations_are_refused_with_a_reason() -> None:
    with pytest.raises(akter.DefinitionError, match=r"akter\.Actor class"):
        akter.subscription(int, events=[Rang])
    with pytest.raises(akter.DefinitionError, match=r"akter\.Event classes"):
        akter.subscription(Bell, events=[])
    with pytest.raises(akter.DefinitionError, match="'now' or 'start'"):
        akter.subscription(Bell, events=[Rang], start="later")  # type: ignore[arg-type]
    with pytest.raises(akter.DefinitionError, match="callable"):
        akter.subscription(Bell, events=[Rang], route="ear")  # type: ignore[arg-type]


def test_subscribe_outside_a_turn_is_refused() -> None:
    with pytest.raises(akter.CapabilityEscaped):
        Fan().subscribe(Fan.follows, source_id="b")


def test_the_index_by_source_and_the_feed_bumps_of_a_batch() -> None:
    followed = Followed.of(
        [Bell.__akter_definition__, Ear.__akter_definition__, Fan.__akter_definition__]
    )
    watches = followed.by_source["Bell"]
    assert {w.name for w in watches} == {"Ear.heard", "Fan.follows"}
    events = [
        (StagedEvent("unit.sub.other", "{}"), "c1"),
        (StagedEvent("unit.sub.rang", "{}"), "c1"),
        (StagedEvent("unit.sub.other", "{}"), "c2"),
    ]
    found = {b.subscription: b for b in bumps(watches, events, first_seq=8)}
    # One row per subscription: the newest matching cursor; "now" floors at the batch's start.
    assert (found["Ear.heard"].head, found["Ear.heard"].floor, found["Ear.heard"].routed) == (
        9,
        7,
        True,
    )
    assert (found["Fan.follows"].floor, found["Fan.follows"].routed) == (0, False)
    assert bumps(watches, [(StagedEvent("unit.sub.other", "{}"), "c")], 1) == []


def test_a_delivery_decodes_aliases_and_a_gap() -> None:
    spec = spec_of(Ear.__akter_definition__.members["heard"].fn)
    assert spec is not None
    body = delivery_payload(
        "Ear.heard", "Bell", "b1", 3, tag="unit.sub.rung", payload={"n": 4}, emitted_at_ms=1000
    )["delivery"]
    delivery = delivery_of(spec, "t", body)
    assert delivery.event == Rang(n=4) and delivery.cursor == 3
    assert delivery.source == akter.ActorRef("t", "Bell", "b1")
    gap = delivery_of(
        spec, "t", delivery_payload("Ear.heard", "Bell", "b1", 9, gap_after=2)["delivery"]
    )
    assert isinstance(gap, akter.RetentionGap) and (gap.after, gap.resume_after) == (2, 9)


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    assert 150 <= backoff_ms(0) <= 200
    assert 300 <= backoff_ms(1) <= 400
    assert backoff_ms(50) <= BACKOFF_MAX_MS
