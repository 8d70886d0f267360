"""The pure rules of rate tokens and keys (akter._engine.job_rates; flow-control F3.3, F3.4)."""

from __future__ import annotations

from akter._engine.job_rates import MAX_KEY_BYTES, key_problem, waits_ms

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


def test_a_key_is_usable_up_to_1024_bytes_of_utf8_without_nul_or_surrogates() -> None:
    assert key_problem("") is None
    assert key_problem("k" * MAX_KEY_BYTES) is None
    assert key_problem("\u00e9" * (MAX_KEY_BYTES // 2)) is None  # two bytes each
    assert key_problem("k" * (MAX_KEY_BYTES + 1)) == "is 1025 bytes long (at most 1024)"
    assert key_problem("\u00e9" * 513) == "is 1026 bytes long (at most 1024)"
    assert key_problem("a\x00") == "contains a NUL character"
    assert key_problem("\udc80") == "is not valid UTF-8 (a lone surrogate)"
