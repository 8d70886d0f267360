"""The client's learned database clock (issue 43, scope 8): the ids it mints, without a server."""

from __future__ import annotations

import httpx
import pytest

from akter._client_clock import CLOCK_MARGIN_MS, READING_TTL_S, LearnedClock, clock_reading
from akter._ids import CLOCK_HEADER, WINDOW_HEADER, parse_command_id

WINDOW = 86_400_000
NOW = 1_767_225_600_000


def issued(command_id: str | None) -> int:
    assert command_id is not None
    return parse_command_id(command_id, WINDOW).issued_ms


def test_no_reading_no_id() -> None:
    assert LearnedClock().mint(10.0) is None


def test_ids_are_issued_the_margin_behind_the_reading_plus_the_time_since() -> None:
    clock = LearnedClock()
    clock.learn(NOW, WINDOW, at=100.0)
    assert issued(clock.mint(100.0)) == NOW - CLOCK_MARGIN_MS
    assert issued(clock.mint(102.5)) == NOW + 2_500 - CLOCK_MARGIN_MS
    first, second = clock.mint(101.0), clock.mint(101.0)
    assert first != second and issued(first) == issued(second)  # a fresh uuid4 each


def test_the_newest_reading_wins_even_when_the_clock_stepped_back() -> None:
    clock = LearnedClock()
    clock.learn(NOW, WINDOW, at=100.0)
    clock.learn(NOW - 600_000, WINDOW, at=101.0)
    assert issued(clock.mint(101.0)) == NOW - 600_000 - CLOCK_MARGIN_MS


def test_a_stale_or_forgotten_reading_mints_nothing() -> None:
    clock = LearnedClock()
    clock.learn(NOW, WINDOW, at=100.0)
    assert clock.mint(100.0 + READING_TTL_S) is not None
    assert clock.mint(100.0 + READING_TTL_S + 0.001) is None
    assert clock.mint(99.0) is None  # heard in the "future" of the monotonic clock: not used
    clock.forget()
    assert clock.mint(100.0) is None


def test_a_reading_out_of_any_ids_range_mints_nothing() -> None:
    clock = LearnedClock()
    clock.learn(10**15 - 10, WINDOW, at=0.0)
    assert clock.mint(0.0) is None
    clock.learn(500, WINDOW, at=0.0)  # behind the margin: issued at 0, not negative
    assert issued(clock.mint(0.0)) == 0


@pytest.mark.parametrize(
    ("now", "window", "expected"),
    [
        ("1767225600000", "86400000", (1_767_225_600_000, 86_400_000)),
        (None, "86400000", None),
        ("1767225600000", None, None),
        ("-5", "86400000", None),
        ("17e3", "86400000", None),
        ("1" * 16, "86400000", None),
        ("1767225600000", "", None),
    ],
)
def test_clock_headers_are_read_only_when_both_are_sane(
    now: str | None, window: str | None, expected: tuple[int, int] | None
) -> None:
    headers = httpx.Headers(
        {k: v for k, v in ((CLOCK_HEADER, now), (WINDOW_HEADER, window)) if v is not None}
    )
    assert clock_reading(headers) == expected
