"""The schedule tick rules (semantics §4.5), without a database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import akter
from akter._engine import ticks
from akter._ids import parse_framework_id
from akter.callers import ActorRef


class Nightly(akter.Actor, singleton=True):
    @akter.schedule(every=60)
    @akter.command
    async def sweep(self) -> None:
        return None

    @akter.schedule(every=3600)
    @akter.command
    async def report(self) -> None:
        return None


@given(st.integers(-(10**9), 10**9), st.integers(0, 10**9))
def test_a_declared_tick_fires_until_it_is_older_than_the_lag(age: int, lag: int) -> None:
    assert ticks.decide(age, lag, declared=True) == ("skip" if age > lag else "fire")


@given(st.integers(-(10**9), 10**9), st.integers(0, 10**9))
def test_an_undeclared_entry_is_deferred_while_young_then_dropped(age: int, lag: int) -> None:
    assert ticks.decide(age, lag, declared=False) == ("drop" if age > lag else "defer")


def test_the_lag_itself_still_fires() -> None:
    assert ticks.decide(5_000, 5_000, declared=True) == "fire"
    assert ticks.decide(5_001, 5_000, declared=True) == "skip"


def test_the_next_tick_is_the_first_fire_strictly_after_now_with_a_fresh_id() -> None:
    definition = akter.Runtime([Nightly]).definition(Nightly)
    entry = definition.schedules[0]
    now = 1_800_000_000_000
    new_id, due = ticks.next_tick(entry, now, window_ms=86_400_000)
    assert now < due <= now + 60_000
    parsed = parse_framework_id(new_id)
    assert parsed.expires_ms == due + 86_400_000  # absolute time: no slack
    again, due_again = ticks.next_tick(entry, due, window_ms=86_400_000)
    assert due_again == due + 60_000 and again != new_id


def test_first_ticks_are_one_row_per_entry_addressed_to_the_actor() -> None:
    definition = akter.Runtime([Nightly]).definition(Nightly)
    ref = ActorRef("default", "Nightly", "")
    params = ticks.first_ticks(definition, ref, routing_key=42, now_ms=0, window_ms=1_000)
    assert params["commands"] == ["sweep", "report"]
    assert (params["rk"], params["tenant"], params["type"], params["id"]) == (
        42,
        "default",
        "Nightly",
        "",
    )
    assert params["dues"] == [60_000, 3_600_000]
    assert len(set(params["intent_ids"])) == 2
