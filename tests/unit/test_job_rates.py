"""The pure rules of rate tokens and keys (akter._engine.jobs.rates; flow-control F3.3, F3.4)."""

from __future__ import annotations

from akter._engine.jobs.rates import (
    MAX_KEY_BYTES,
    MIN_HORIZON_MS,
    Slot,
    horizon_ms,
    key_problem,
    slots,
)
from akter._store.gateway.job_flow import Take

A = ("T", "job", 0, "acme")
B = ("T", "job", 0, "beta")
ALL = ("T", "job", 1, "")


def test_takers_within_the_level_start_now_the_granted_rest_a_refill_apart() -> None:
    # 2.5 tokens, one per 10 ms (0.1 per ms): the third taker waits for 0.5 token, then 1 each.
    asked = [[(A, 0.1)] for _ in range(5)]
    assert slots(asked, {A: Take(2.5, 5)}, 1000) == [
        Slot(True, 0),
        Slot(True, 0),
        Slot(True, 5),
        Slot(True, 15),
        Slot(True, 25),
    ]


def test_takers_beyond_the_grant_hold_nothing_and_come_back_near_their_turn() -> None:
    # Empty, one token per 200 ms, a 1 s horizon: the take granted 5 (due at 200 … 1000 ms).
    asked = [[(A, 0.005)] for _ in range(8)]
    got = slots(asked, {A: Take(0.0, 5)}, 1000)
    assert got[:5] == [Slot(True, w) for w in (200, 400, 600, 800, 1000)]
    # The sixth token would be due at 1,200 ms: claimed again 200 ms on, it is within reach.
    assert got[5:] == [Slot(False, 200), Slot(False, 400), Slot(False, 600)]


def test_a_booked_start_is_never_earlier_than_its_token() -> None:
    # (1 − 0.3) / 0.003 = 233.3 ms: rounded up, never down.
    assert slots([[(A, 0.003)]], {A: Take(0.3, 1)}, 1000) == [Slot(True, 234)]


def test_stacked_limits_wait_for_the_later_token() -> None:
    asked = [[(A, 0.1), (ALL, 1.0)], [(B, 0.1), (ALL, 1.0)], [(A, 0.1), (ALL, 1.0)]]
    # acme has one token, beta none (its first in 10 ms), the shared bucket two (third in 1 ms)
    takes = {A: Take(1.0, 2), B: Take(0.0, 1), ALL: Take(2.0, 3)}
    assert slots(asked, takes, 1000) == [Slot(True, 0), Slot(True, 10), Slot(True, 10)]


def test_a_stacked_limit_without_a_grant_hands_the_attempt_back() -> None:
    # The shared bucket granted one token: the second attempt holds acme's but not the shared
    # one, and goes back (acme's token is lost, never used twice).
    asked = [[(A, 0.1), (ALL, 0.001)], [(A, 0.1), (ALL, 0.001)]]
    takes = {A: Take(2.0, 2), ALL: Take(1.0, 1)}
    assert slots(asked, takes, 500) == [Slot(True, 0), Slot(False, 500)]


def test_the_horizon_is_a_poll_at_least_a_second_at_most_the_cancel_check() -> None:
    assert horizon_ms(poll_ms=1000, cancel_check_ms=20_000) == 1000
    assert horizon_ms(poll_ms=50, cancel_check_ms=20_000) == MIN_HORIZON_MS
    assert horizon_ms(poll_ms=5000, cancel_check_ms=20_000) == 5000
    assert horizon_ms(poll_ms=60_000, cancel_check_ms=20_000) == 20_000


def test_a_key_is_usable_up_to_1024_bytes_of_utf8_without_nul_or_surrogates() -> None:
    assert key_problem("") is None
    assert key_problem("k" * MAX_KEY_BYTES) is None
    assert key_problem("\u00e9" * (MAX_KEY_BYTES // 2)) is None  # two bytes each
    assert key_problem("k" * (MAX_KEY_BYTES + 1)) == "is 1025 bytes long (at most 1024)"
    assert key_problem("\u00e9" * 513) == "is 1026 bytes long (at most 1024)"
    assert key_problem("a\x00") == "contains a NUL character"
    assert key_problem("\udc80") == "is not valid UTF-8 (a lone surrogate)"
