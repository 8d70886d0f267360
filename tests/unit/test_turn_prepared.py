"""A batch's handler inputs made while its admission flight is out (``invoke.Prepared``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from akter._engine.turn.invoke import PREPARED_STATE_CHARS, Prepared


class State(BaseModel):
    items: list[int] = []


class _Member:
    def __init__(self, fail_on: object = None) -> None:
        self.calls = 0
        self.fail_on = fail_on

    def arguments(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if payload.get("k") == self.fail_on:
            raise ValueError("cannot bind")
        return {"k": payload["k"]}


class _Request:
    def __init__(self, member: _Member, k: object) -> None:
        self.member = member
        self.payload = {"k": k}
        self.hashed_after: int | None = None  # the member's calls when the hash was made

    def digest(self) -> str:
        if self.hashed_after is None:
            self.hashed_after = self.member.calls
        return f"hash of {self.payload}"


def _request(member: _Member, k: object) -> Any:
    return _Request(member, k)


def _act(stored: str | None, loaded: BaseModel | None = None) -> Any:
    return SimpleNamespace(
        definition=SimpleNamespace(state_model=State), loaded=loaded, state_json=stored
    )


def test_each_input_is_made_once_and_used_once() -> None:
    member = _Member()
    stored = State(items=[1]).model_dump_json()
    act = _act(stored)
    batch = [_request(member, 1), _request(member, 2)]
    prepared = Prepared()
    prepared.fill(act, batch)
    assert member.calls == 2
    # Every payload hash first: a handler given its arguments could change the payload.
    assert [r.hashed_after for r in batch] == [0, 0]
    assert prepared.arguments(1, batch[1]) == {"k": 2}
    assert prepared.arguments(0, batch[0]) == {"k": 1}
    assert member.calls == 2
    # A second use makes a new one (a batch re-run one command per transaction does).
    assert prepared.arguments(0, batch[0]) == {"k": 1} and member.calls == 3
    first = prepared.state(act, stored)
    assert first == State(items=[1])
    again = prepared.state(act, stored)  # decoded anew: each handler's model is its own
    assert again == first and again is not first and again.items is not first.items


def test_a_decode_of_text_the_admission_replaced_is_not_used() -> None:
    act = _act(State(items=[1]).model_dump_json())
    prepared = Prepared()
    prepared.fill(act, [])
    refreshed = State(items=[1, 2]).model_dump_json()  # the locked row's newer version
    act.state_json = refreshed
    assert prepared.state(act, refreshed) == State(items=[1, 2])


def test_a_loaded_model_is_taken_by_the_first_handler_only() -> None:
    stored = State(items=[5]).model_dump_json()
    loaded = State(items=[5])
    act = _act(stored, loaded)
    prepared = Prepared()
    prepared.fill(act, [])  # nothing decoded ahead: the load left a model
    assert prepared.state(act, stored) is loaded and act.loaded is None
    loaded.items.append(6)  # the first handler changes it, then fails
    second = prepared.state(act, stored)
    assert second == State(items=[5]) and second is not loaded
    # A batch's later command runs on the text its predecessor made, never the loaded model.
    act.loaded = State(items=[5])
    later = State(items=[5, 7]).model_dump_json()
    assert prepared.state(act, later) == State(items=[5, 7]) and act.loaded is not None


def test_an_input_that_fails_is_made_again_where_the_handler_runs() -> None:
    member = _Member(fail_on=2)
    batch = [_request(member, 1), _request(member, 2)]
    prepared = Prepared()
    prepared.fill(_act(None), batch)
    with pytest.raises(ValueError, match="cannot bind"):
        prepared.arguments(1, batch[1])
    assert prepared.arguments(0, batch[0]) == {"k": 1}
    stored = State().model_dump_json()
    assert prepared.state(_act(stored), stored) == State()


def test_a_large_state_is_not_decoded_ahead() -> None:
    # Where the admission replaces the cache (other runners write the actor), a decode made
    # ahead is wasted: only small states are decoded before the answers are in.
    decodes: list[object] = []

    class Watched(State):
        @classmethod
        def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
            decodes.append(obj)
            return super().model_validate(obj, *args, **kwargs)

    stored = State(items=list(range(PREPARED_STATE_CHARS // 2))).model_dump_json()
    assert len(stored) > PREPARED_STATE_CHARS
    act = _act(stored)
    act.definition.state_model = Watched
    prepared = Prepared()
    prepared.fill(act, [])
    assert decodes == []
    made = prepared.state(act, stored)
    assert isinstance(made, State) and made.items == list(range(PREPARED_STATE_CHARS // 2))
    assert len(decodes) == 1
    small = State(items=[1]).model_dump_json()
    act.state_json = small
    prepared.fill(act, [])
    assert len(decodes) == 2
    prepared.state(act, small)
    assert len(decodes) == 2  # the one made ahead
