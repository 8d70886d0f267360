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


def test_each_input_is_made_once_and_used_once() -> None:
    member = _Member()
    state = State(items=[1])
    act: Any = SimpleNamespace(state=state, state_json=state.model_dump_json())
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
    copy = prepared.state(state)
    assert copy == state and copy is not state and copy.items is not state.items
    again = prepared.state(state)
    assert again == state and again is not copy


def test_a_copy_of_a_state_the_admission_replaced_is_not_used() -> None:
    cached = State(items=[1])
    act: Any = SimpleNamespace(state=cached, state_json=cached.model_dump_json())
    prepared = Prepared()
    prepared.fill(act, [])
    refreshed = State(items=[1, 2])  # the locked row's newer version
    copy = prepared.state(refreshed)
    assert copy == refreshed and copy is not refreshed


def test_an_input_that_fails_is_made_again_where_the_handler_runs() -> None:
    member = _Member(fail_on=2)
    batch = [_request(member, 1), _request(member, 2)]
    prepared = Prepared()
    prepared.fill(SimpleNamespace(state=None, state_json=None), batch)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot bind"):
        prepared.arguments(1, batch[1])
    assert prepared.arguments(0, batch[0]) == {"k": 1}
    assert prepared.state(State()) == State()


def test_a_large_state_is_not_copied_ahead() -> None:
    # Where the admission replaces the cache (other runners write the actor), a copy made
    # ahead is wasted: only small states are copied before the answers are in.
    large = State(items=list(range(PREPARED_STATE_CHARS // 2)))
    stored = large.model_dump_json()
    assert len(stored) > PREPARED_STATE_CHARS
    prepared = Prepared()
    copies: list[object] = []

    class Watched(State):
        def model_copy(self, *args: Any, **kwargs: Any) -> Any:
            copies.append(self)
            return super().model_copy(*args, **kwargs)

    watched = Watched(items=large.items)
    prepared.fill(SimpleNamespace(state=watched, state_json=stored), [])  # type: ignore[arg-type]
    assert copies == []
    copy = prepared.state(watched)
    assert copies == [watched] and copy == watched and copy is not watched
