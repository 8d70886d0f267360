"""The argument rule without a database: what ``Member.bind`` refuses and how it names it."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

import akter
from akter import _storable
from akter.actor import MAX_ARGUMENT_DEPTH, definition_of, unstorable_text


class Mood(enum.Enum):
    ODD = "a\x00b"  # only the JSON dump turns it into (unstorable) text


class Item(BaseModel):
    sku: str
    price: float


class State(BaseModel):
    n: int = 0


class Shop(akter.Actor[State]):
    @akter.command
    async def anything(self, v: Any) -> None:
        return None

    @akter.command
    async def buy(self, items: list[Item], at: datetime, mood: Mood | None = None) -> None:
        return None

    @akter.command
    async def table(self, rows: dict[int, str]) -> None:
        return None


def bind(command: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return definition_of(Shop).members[command].bind(args, kwargs)


def refusal(command: str, *args: Any, **kwargs: Any) -> tuple[str, str | None, str]:
    with pytest.raises(akter.ActorError) as exc:
        bind(command, *args, **kwargs)
    return exc.value.reason, exc.value.field, exc.value.message


def test_h4_nested_models_name_the_path_to_the_bad_value() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    items = [Item(sku="a", price=1.0), Item(sku="b", price=float("nan"))]
    reason, field, message = refusal("buy", items, at)
    assert (reason, field) == ("InvalidInput", "items.1.price") and "Shop.buy" in message
    assert bind("buy", items[:1], at) == {
        "items": [{"sku": "a", "price": 1.0}],
        "at": "2026-01-01T00:00:00Z",
        "mood": None,
    }


def test_h4_text_made_by_the_json_dump_is_checked_too() -> None:
    reason, field, message = refusal("buy", [], datetime.now(UTC), Mood.ODD)
    assert (reason, field) == ("InvalidInput", "mood") and "NUL" in message


def test_h4_integer_keys_follow_the_integer_rule() -> None:
    assert bind("table", {1: "x"}) == {"rows": {"1": "x"}}
    assert refusal("table", {2**63: "x"})[:2] == ("InvalidInput", "rows")


def test_h4_depth_counts_levels_inside_the_argument() -> None:
    value: Any = "leaf"
    for _ in range(MAX_ARGUMENT_DEPTH):
        value = {"k": value}
    assert bind("anything", value)["v"] == value
    reason, field, message = refusal("anything", [value])
    assert (reason, field) == ("InvalidInput", "v") and "deeper than 64" in message


def test_unstorable_text_keeps_its_paths() -> None:
    assert unstorable_text({"a": [{"b": "x\x00"}]}) == (
        "a.0.b",
        "contains a NUL character, which PostgreSQL cannot store",
    )
    assert unstorable_text({"k\ud800": 1}, "state") == (
        "state",
        "is not valid Unicode (a lone surrogate)",
    )
    assert unstorable_text(float("nan")) is None  # numbers are not its business


# The flat-payload shortcut (``_plain_flat``) must answer exactly as the walk does: differential,
# over flat dicts of every scalar a payload holds, the refused ones included.
_ODD_TEXT = st.sampled_from(["a\x00b", "\udfff", "\x00", "é", ""]) | st.text(max_size=8)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1])
    | st.floats(allow_nan=True, allow_infinity=True)
    | _ODD_TEXT
    | st.binary(max_size=4)
    | st.sampled_from([Mood.ODD, datetime(2026, 1, 1, tzinfo=UTC), [1, "a\x00"], {"k": 1.5}])
)


@given(st.dictionaries(_ODD_TEXT, _SCALARS, max_size=6), st.booleans())
def test_the_flat_payload_shortcut_answers_as_the_walk(
    payload: dict[str, Any], arguments: bool
) -> None:
    shortcut = _storable._first_problem(payload, "", arguments=arguments)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_storable, "_plain_flat", lambda value: False)
        walked = _storable._first_problem(payload, "", arguments=arguments)
    assert shortcut == walked


def test_the_flat_payload_shortcut_takes_only_what_it_can_vouch_for() -> None:
    assert _storable._plain_flat({"n": 1, "x": 1.5, "s": "é", "b": True, "z": None})
    for refused in ({"s": "a\x00"}, {"s\x00": 1}, {"n": 2**63}, {"x": float("nan")}):
        assert not _storable._plain_flat(refused)
        assert _storable._first_problem(refused, "", arguments=True)[0] is not None
    for walked in ({"v": [1]}, {"e": Mood.ODD}, {"b": b"x"}, {1: 2}, [1]):
        assert not _storable._plain_flat(walked)
