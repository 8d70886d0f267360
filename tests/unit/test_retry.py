"""Backoff and CommandRetry: the wait and give-up rules of a command's retries (no database)."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from akter._ids import FUTURE_WAIT_MS
from akter._retry import Backoff, CommandRetry
from akter.errors import ActorError


def unavailable(retry_after: float | None = None, code: str | None = None) -> ActorError:
    error = ActorError("ActorUnavailable", "busy", retry_after=retry_after, code=code)
    error.retry_after = retry_after  # no jittered default: the rules, not the jitter
    return error


def retries(seconds: float = 60.0, **options: object) -> CommandRetry:
    kwargs: dict[str, object] = {"first_wait": 0.05, "floor": 0.001, "fixed_first": True}
    kwargs.update(options)
    return CommandRetry("T/'a'.go", "cid", time.monotonic() + seconds, **kwargs)  # type: ignore[arg-type]


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1


@given(
    st.floats(0.001, 10, allow_nan=False),
    st.floats(0.001, 100, allow_nan=False),
    st.integers(1, 60),
)
def test_backoff_nth_is_the_stateful_sequence(base: float, cap: float, attempt: int) -> None:
    backoff = Backoff(base, max(cap, base))
    waits = [backoff.next() for _ in range(attempt)]
    assert Backoff.nth(base, max(cap, base), attempt) == pytest.approx(waits[-1])
    assert all(a <= b for a, b in itertools.pairwise(waits))


def test_in_process_waits_keep_the_first_errors_pace() -> None:
    budget = retries()
    assert budget.wait_after(unavailable(0.2)) == 0.2
    assert budget.wait_after(unavailable(0.01)) == 0.4  # fixed: not re-paced by later errors
    assert budget.wait_after(unavailable()) == 0.5  # capped at max(0.5, first)


def test_remote_waits_follow_each_errors_retry_after() -> None:
    budget = retries(first_wait=0.25, floor=0.05, fixed_first=False)
    assert budget.wait_after(unavailable()) == 0.25
    # Each refusal's retry_after raises the cap: 0.5, 1.0, 2.0, then held at 2.0.
    assert [budget.wait_after(unavailable(2.0)) for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    assert budget.wait_after(unavailable(0.01)) == 0.5  # and a short one lowers it again


def test_giving_up_says_whether_the_command_may_have_committed() -> None:
    budget = retries(seconds=0.15)
    budget.wait_after(unavailable(0.1, code="outcome_unknown"))
    with pytest.raises(ActorError) as raised:
        budget.wait_after(unavailable(0.4))
    assert raised.value.reason == "Timeout" and raised.value.code == "outcome_unknown"
    assert "it may have committed" in str(raised.value) and raised.value.command_id == "cid"
    clean = retries(seconds=0.1)
    with pytest.raises(ActorError) as raised:
        clean.wait_after(unavailable(0.2))
    assert raised.value.code is None and "it was not committed" in str(raised.value)


def test_a_command_id_far_in_the_future_is_refused_as_itself() -> None:
    future = ActorError("InvalidCommandId", "future", retry_after=FUTURE_WAIT_MS / 1000 + 1)
    with pytest.raises(ActorError) as raised:
        retries().wait_after(future)
    assert raised.value is future


def test_the_expiry_guard_stops_retries_before_the_id_expires() -> None:
    budget = retries(expiry_guard=lambda: 0.1)
    with pytest.raises(ActorError, match="did not complete"):
        budget.wait_after(unavailable(0.2))
