"""The pure rule of rate tokens (akter._engine.job_rates.waits_ms; docs/flow-control.md F3.3)."""

from __future__ import annotations

from akter._engine.job_rates import waits_ms

A = ("T", "job", 0, "acme")
B = ("T", "job", 0, "beta")
ALL = ("T", "job", 1, "")


def test_takers_within_the_level_start_now_the_rest_are_booked_a_refill_apart() -> None:
    # 2.5 tokens, one per 10 ms (0.1 per ms): the third taker waits for 0.5 token, then 1 each.
    asked = [[(A, 0.1)] for _ in range(5)]
    assert waits_ms(asked, {A: 2.5}) == [0, 0, 5, 15, 25]


def test_an_empty_bucket_books_every_taker_ahead() -> None:
    assert waits_ms([[(A, 0.05)], [(A, 0.05)]], {A: -3.0}) == [80, 100]


def test_stacked_limits_wait_for_the_later_token() -> None:
    asked = [[(A, 0.1), (ALL, 1.0)], [(B, 0.1), (ALL, 1.0)], [(A, 0.1), (ALL, 1.0)]]
    # acme has one token, beta none (its first in 10 ms), the shared bucket two (third in 1 ms)
    assert waits_ms(asked, {A: 1.0, B: 0.0, ALL: 2.0}) == [0, 10, 10]
