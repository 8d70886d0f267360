"""Schedule declarations, canonical keys and fire times (semantics §4, conformance SC-04, SC-05).

Fire times in zones with DST are checked twice: against hand-computed instants for the
conformance cases, and against a brute-force oracle that walks the clock minute by minute and
fires each local wall time the first time the clock reaches or jumps past it (§4.7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

import akter
from akter.errors import DefinitionError
from akter.schedules import (
    CronFields,
    ScheduleEntry,
    check_unique,
    check_zero_arg,
    entries_of,
    next_fire,
    parse_cron,
    schedule,
)

PARIS = ZoneInfo("Europe/Paris")
MINUTE_MS = 60_000


def at(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    *,
    tz: ZoneInfo | None = None,
    fold: int = 0,
) -> int:
    """Epoch ms of a wall time (UTC unless ``tz``)."""
    wall = datetime(year, month, day, hour, minute, second, tzinfo=tz or UTC, fold=fold)
    return int(wall.timestamp() * 1000)


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def entry(cron: str | None = None, **options: Any) -> ScheduleEntry:
    """The single entry of a freshly decorated command."""

    @schedule(cron, **options)
    @akter.command
    async def tick(self: Any) -> None:
        return None

    (only,) = entries_of(tick)
    return only


def key(cron: str, tz: str = "UTC") -> str:
    return entry(cron, tz=tz).key


def fires(e: ScheduleEntry, start_ms: int, end_ms: int) -> list[int]:
    """Every fire time in ``(start_ms, end_ms]`` by repeated ``next_fire``."""
    out: list[int] = []
    t = next_fire(e, start_ms)
    while t <= end_ms:
        out.append(t)
        t = next_fire(e, t)
    return out


# --- SC-05: canonical keys and duplicates ---------------------------------------------------


def test_ranges_and_lists_share_one_key() -> None:
    assert key("0 9 * * 1-5") == key("0 9 * * 1,2,3,4,5") == "$cron:UTC 0 9 * * 1,2,3,4,5"
    assert key("0 9 * * 5,1,3,2,4,3") == key("0 9 * * 1-5")
    assert key("0 9 * * mon-fri") == key("0 9 * * 1-5")


def test_day_of_week_seven_is_sunday() -> None:
    assert key("0 9 * * 7") == key("0 9 * * 0") == key("0 9 * * Sun") == "$cron:UTC 0 9 * * 0"
    assert key("0 9 * * 5-7") == key("0 9 * * fri-sun") == "$cron:UTC 0 9 * * 0,5,6"
    assert key("0 9 * * 0-7") == key("0 9 * * 1-7") == "$cron:UTC 0 9 * * *"


def test_steps_expand_and_full_ranges_are_stars() -> None:
    assert key("*/15 * * * *") == "$cron:UTC 0,15,30,45 * * * *"
    assert key("10-40/10 */6 * * *") == "$cron:UTC 10,20,30,40 0,6,12,18 * * *"
    assert key("50/5 * * * *") == "$cron:UTC 50,55 * * * *"
    assert key("0-59 0-23 1-31 1-12 0-6") == "$cron:UTC * * * * *"
    assert key("*/1 * * jan-dec *") == key("* * * * *")
    assert key("0 0 1 jan,JUL *") == "$cron:UTC 0 0 1 1,7 *"


def test_macros_expand_to_their_expressions() -> None:
    assert key("@daily") == key("@midnight") == key("0 0 * * *")
    assert key("@hourly") == "$cron:UTC 0 * * * *"
    assert key("@weekly") == "$cron:UTC 0 0 * * 0"
    assert key("@yearly") == key("@annually") == "$cron:UTC 0 0 1 1 *"


def test_key_names_the_zone() -> None:
    assert key("30 2 * * *", tz="Europe/Paris") == "$cron:Europe/Paris 30 2 * * *"
    assert key("30 2 * * *", tz="Europe/Paris") != key("30 2 * * *")


def test_six_field_expressions_put_seconds_first() -> None:
    assert key("*/20 * * * * *") == "$cron:UTC 0,20,40 * * * * *"
    assert key("5 30 2 * * *", tz="Europe/Paris") == "$cron:Europe/Paris 5 30 2 * * *"
    # Firing on the whole minute is the five-field schedule, so both spellings share a key.
    assert key("0 30 2 * * *") == key("30 2 * * *") == "$cron:UTC 30 2 * * *"


def test_two_spellings_of_one_schedule_on_a_type_are_refused() -> None:
    @schedule("0 9 * * 1-5")
    @akter.command
    async def first(self: Any) -> None:
        return None

    @schedule("0 9 * * 1,2,3,4,5")
    @akter.command
    async def second(self: Any) -> None:
        return None

    entries = [*entries_of(first), *entries_of(second)]
    with pytest.raises(DefinitionError, match=r"'Billing' declares the schedule .*twice"):
        check_unique(entries, "Billing")
    check_unique(entries_of(first), "Billing")


def test_stacked_duplicates_on_one_command_are_refused() -> None:
    with pytest.raises(DefinitionError, match="twice"):

        @schedule("0 9 * * 7")
        @schedule("0 9 * * 0")
        @akter.command
        async def tick(self: Any) -> None:
            return None


def test_stacked_schedules_are_kept_in_source_order() -> None:
    @schedule("0 9 * * *")
    @schedule(every=timedelta(minutes=5))
    @schedule("0 18 * * *", tz="Europe/Paris")
    @akter.command
    async def tick(self: Any) -> None:
        return None

    assert [e.key for e in entries_of(tick)] == [
        "$cron:UTC 0 9 * * *",
        "$cron:@every 300000ms",
        "$cron:Europe/Paris 0 18 * * *",
    ]
    assert {e.command for e in entries_of(tick)} == {"tick"}
    assert vars(tick)["__akter_member__"].kind == "command"
    assert entries_of(lambda: None) == []


def test_every_fires_at_epoch_multiples_of_its_period() -> None:
    e = entry(every=timedelta(minutes=5))
    assert (e.key, e.every_ms, e.zone) == ("$cron:@every 300000ms", 300_000, "UTC")
    start = at(2026, 5, 4, 10, 2, 17) + 123
    times = fires(e, start, start + 3_600_000)
    assert len(times) == 12
    assert all(t % 300_000 == 0 for t in times)
    assert times[0] == at(2026, 5, 4, 10, 5)
    assert next_fire(e, times[0]) == times[0] + 300_000  # strictly after an exact fire time
    assert next_fire(e, times[0] - 1) == times[0]
    assert entry(every=90).key == "$cron:@every 90000ms"
    assert entry(every=1.5).every_ms == 1500
    assert entry(every=timedelta(seconds=1)).key == "$cron:@every 1000ms"


# --- SC-04: local times across DST transitions ------------------------------------------------


def test_spring_forward_fires_once_at_the_end_of_the_gap() -> None:
    e = entry("30 2 * * *", tz="Europe/Paris")
    # 2026-03-29: at 01:00Z Paris jumps from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    times = fires(e, at(2026, 3, 27, 12), at(2026, 3, 31, 12))
    assert times == [
        at(2026, 3, 28, 1, 30),  # 02:30 CET
        at(2026, 3, 29, 1, 0),  # 03:00 CEST, the first instant after the gap
        at(2026, 3, 30, 0, 30),  # 02:30 CEST
        at(2026, 3, 31, 0, 30),
    ]
    assert utc(times[1]).astimezone(PARIS).strftime("%H:%M %Z") == "03:00 CEST"


def test_fall_back_fires_once_at_the_first_occurrence() -> None:
    e = entry("30 2 * * *", tz="Europe/Paris")
    # 2026-10-25: at 01:00Z Paris falls back from 03:00 CEST to 02:00 CET; 02:30 happens twice.
    times = fires(e, at(2026, 10, 23, 12), at(2026, 10, 27, 12))
    assert times == [
        at(2026, 10, 24, 0, 30),
        at(2026, 10, 25, 0, 30),  # the first 02:30 (CEST) ...
        at(2026, 10, 26, 1, 30),  # ... and not the second one at 01:30Z
        at(2026, 10, 27, 1, 30),
    ]
    assert times[1] == at(2026, 10, 25, 2, 30, tz=PARIS, fold=0)
    # Asked from inside the repeated hour, the next fire is the next day's.
    assert next_fire(e, at(2026, 10, 25, 1, 15)) == at(2026, 10, 26, 1, 30)
    assert next_fire(e, at(2026, 10, 25, 0, 30)) == at(2026, 10, 26, 1, 30)


def test_every_ignores_dst() -> None:
    e = entry(every=timedelta(hours=1))
    times = fires(e, at(2026, 10, 24, 23, 30), at(2026, 10, 25, 3, 30))
    assert times == [at(2026, 10, 25, h) for h in range(4)]


def test_six_field_times_across_dst() -> None:
    e = entry("15 30 2 * * *", tz="Europe/Paris")
    assert next_fire(e, at(2026, 3, 28, 12)) == at(2026, 3, 29, 1, 0)
    assert next_fire(e, at(2026, 10, 24, 12)) == at(2026, 10, 25, 0, 30, 15)
    assert next_fire(e, at(2026, 10, 25, 0, 30, 15)) == at(2026, 10, 26, 1, 30, 15)


def test_half_hour_dst_shift() -> None:
    # Lord Howe Island moves its clocks by 30 minutes: 02:00 → 02:30 on 2026-10-04 (15:00Z).
    e = entry("15 2 * * *", tz="Australia/Lord_Howe")
    assert next_fire(e, at(2026, 10, 3, 0)) == at(2026, 10, 3, 15, 30)
    assert utc(at(2026, 10, 3, 15, 30)).astimezone(ZoneInfo("Australia/Lord_Howe")).hour == 2


def test_new_york_spring_forward() -> None:
    # 2026-03-08: 02:00 EST → 03:00 EDT at 07:00Z.
    e = entry("30 2 * * *", tz="America/New_York")
    assert next_fire(e, at(2026, 3, 7, 12)) == at(2026, 3, 8, 7, 0)
    assert next_fire(e, at(2026, 3, 8, 7, 0)) == at(2026, 3, 9, 6, 30)


def _oracle(e: ScheduleEntry, start_ms: int, end_ms: int) -> list[int]:
    """Fire times in ``(start_ms, end_ms]`` by walking the clock a minute at a time.

    A wall time fires at the first instant whose wall time reaches or passes it: once, at its
    first occurrence when repeated, and at the end of the gap when skipped.
    """
    assert e.cron is not None
    cron, zone = e.cron, ZoneInfo(e.zone)

    def wall(ms: int) -> datetime:
        return utc(ms).astimezone(zone).replace(tzinfo=None)

    def matches(w: datetime) -> bool:
        return w.minute in cron.minutes and w.hour in cron.hours and cron.matches_day(w.date())

    out: list[int] = []
    seen = wall(start_ms)
    for t in range(start_ms + MINUTE_MS, end_ms + 1, MINUTE_MS):
        now = wall(t)
        w = seen + timedelta(minutes=1)
        while w <= now:
            if matches(w):
                out.append(t)
                break
            w += timedelta(minutes=1)
        seen = max(seen, now)
    return out


@pytest.mark.parametrize("cron", ["30 2 * * *", "*/15 * * * *", "0,59 1-3 * * *", "45 2 25 * *"])
@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("Europe/Paris", (2026, 3, 29)),
        ("Europe/Paris", (2026, 10, 25)),
        ("America/New_York", (2026, 3, 8)),
        ("America/New_York", (2026, 11, 1)),
        ("Australia/Lord_Howe", (2026, 10, 4)),
        ("Australia/Lord_Howe", (2026, 4, 5)),
    ],
)
def test_fire_times_match_the_clock_walking_oracle(
    cron: str, tz: str, day: tuple[int, int, int]
) -> None:
    e = entry(cron, tz=tz)
    start = at(*day) - 36 * 3_600_000
    end = start + 72 * 3_600_000
    assert fires(e, start, end) == _oracle(e, start, end)


_UTC_EXPRESSIONS = [
    "* * * * *",
    "*/7 3-5 * * 1-5",
    "0 9 1,15 * 1-5",
    "30 2 29 2 *",
    "0 0 31 * *",
    "5 4 * * sun",
    "0 12 * feb,aug 3",
    "59 23 31 12 *",
]


@settings(max_examples=300, deadline=None)
@given(
    cron=st.sampled_from(_UTC_EXPRESSIONS),
    after=st.integers(min_value=at(2000, 1, 1), max_value=at(2090, 1, 1)),
)
def test_utc_fire_times_agree_with_croniter(cron: str, after: int) -> None:
    expected = croniter(cron, utc(after)).get_next(datetime)
    assert next_fire(entry(cron), after) == int(expected.timestamp() * 1000)


# --- seconds and strictness ---------------------------------------------------------------------


def test_six_field_fires_on_its_seconds() -> None:
    e = entry("*/20 * * * * *")
    start = at(2026, 1, 1, 12, 0, 0)
    assert fires(e, start, start + 60_000) == [start + s * 1000 for s in (20, 40, 60)]
    assert next_fire(e, start + 19_999) == start + 20_000
    assert next_fire(e, start + 20_000) == start + 40_000


@pytest.mark.parametrize(
    ("cron", "tz", "after"),
    [
        ("30 2 * * *", "Europe/Paris", at(2026, 3, 29, 1, 0)),
        ("*/15 * * * *", "UTC", at(2026, 1, 1, 0, 15)),
        ("0 0 29 2 *", "UTC", at(2028, 2, 29)),
        ("10 0 0 * * *", "Asia/Tokyo", at(2026, 6, 30, 15, 0, 10)),
    ],
)
def test_next_fire_is_strictly_after(cron: str, tz: str, after: int) -> None:
    e = entry(cron, tz=tz)
    assert next_fire(e, after - 1) == after
    following = next_fire(e, after)
    assert following > after
    assert next_fire(e, following - 1) == following


def test_leap_day_fires_every_leap_year_and_skips_2100() -> None:
    e = entry("0 0 29 2 *")
    assert next_fire(e, at(2026, 1, 1)) == at(2028, 2, 29)
    assert next_fire(e, at(2096, 2, 29)) == at(2104, 2, 29)


def test_day_of_month_or_day_of_week_when_both_are_restricted() -> None:
    e = entry("0 0 13 * 5")  # the 13th, and every Friday
    times = [utc(t).date().isoformat() for t in fires(e, at(2026, 2, 1), at(2026, 3, 1))]
    assert times == ["2026-02-06", "2026-02-13", "2026-02-20", "2026-02-27"]
    e = entry("0 0 14 * 5")
    times = [utc(t).date().isoformat() for t in fires(e, at(2026, 2, 1), at(2026, 3, 1))]
    assert times == ["2026-02-06", "2026-02-13", "2026-02-14", "2026-02-20", "2026-02-27"]


def test_parse_cron_exposes_the_sets() -> None:
    assert parse_cron("*/30 9-10 * * mon") == CronFields(
        seconds=(0,),
        minutes=(0, 30),
        hours=(9, 10),
        days=tuple(range(1, 32)),
        months=tuple(range(1, 13)),
        weekdays=(1,),
    )


# --- declaration errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("", "has 0 fields"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("60 * * * *", "out of range 0-59"),
        ("* 24 * * *", "out of range 0-23"),
        ("* * 0 * *", "out of range 1-31"),
        ("* * * 13 *", "out of range 1-12"),
        ("* * * * 8", "out of range 0-7"),
        ("60 * * * * *", "second field"),
        ("5-1 * * * *", "reversed range"),
        ("*/0 * * * *", "step"),
        ("*/x * * * *", "step"),
        ("1,,2 * * * *", "must be a number"),
        ("L * * * *", "must be a number"),
        ("* * L * *", "day-of-month"),
        ("* * * * 1#2", "day-of-week"),
        ("* * * * mon-funday", "day-of-week"),
        ("* * * foo *", "month"),
        ("? * * * *", "must be a number"),
        ("@reboot", "Unknown cron macro"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_bad_expressions_are_refused(cron: str, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        schedule(cron)


def test_a_non_string_expression_is_refused() -> None:
    with pytest.raises(DefinitionError, match="must be a string"):
        schedule(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "Europe", "../etc/passwd", "/etc/localtime"])
def test_unknown_zones_are_refused(tz: str) -> None:
    with pytest.raises(DefinitionError, match="Unknown time zone"):
        schedule("0 9 * * *", tz=tz)


@pytest.mark.parametrize(
    "every", [0, 0.5, 0.9999, timedelta(milliseconds=999), timedelta(seconds=-5), -1]
)
def test_periods_under_a_second_are_refused(every: float | timedelta) -> None:
    with pytest.raises(DefinitionError, match="at least 1 second"):
        schedule(every=every)


@pytest.mark.parametrize("every", [True, float("nan"), float("inf"), "5"])
def test_periods_that_are_not_durations_are_refused(every: Any) -> None:
    with pytest.raises(DefinitionError, match="every"):
        schedule(every=every)


def test_exactly_one_of_cron_and_every() -> None:
    with pytest.raises(DefinitionError, match="exactly one"):
        schedule()
    with pytest.raises(DefinitionError, match="exactly one"):
        schedule("* * * * *", every=60)


def test_every_with_a_zone_is_refused() -> None:
    with pytest.raises(DefinitionError, match="epoch multiples"):
        schedule(every=60, tz="Europe/Paris")


def _decorate(decorator: Callable[[Any], Any], fn: Any) -> Any:
    return decorator(fn)


def test_decorating_a_non_command_is_refused() -> None:
    async def plain(self: Any) -> None:
        return None

    @akter.query
    async def view(self: Any) -> int:
        return 1

    for fn in (plain, view):
        with pytest.raises(
            DefinitionError, match=r"stack @akter\.schedule on top of @akter\.command"
        ):
            _decorate(schedule("* * * * *"), fn)


def test_schedule_below_command_is_refused() -> None:
    with pytest.raises(DefinitionError, match="not a command"):

        @akter.command
        @schedule("* * * * *")
        async def tick(self: Any) -> None:
            return None


def test_commands_with_parameters_are_refused() -> None:
    with pytest.raises(DefinitionError, match=r"takes parameters \('by'\)"):

        @schedule("* * * * *")
        @akter.command
        async def add(self: Any, by: int = 1) -> None:
            return None


def _signatures() -> Iterator[Callable[..., Any]]:
    async def keyword(self: Any, *, n: int) -> None: ...
    async def star(self: Any, *args: Any) -> None: ...
    async def keywords(self: Any, **kwargs: Any) -> None: ...
    async def only_star(*args: Any) -> None: ...

    yield from (keyword, star, keywords, only_star)


@pytest.mark.parametrize("fn", list(_signatures()))
def test_check_zero_arg_refuses_any_parameter(fn: Callable[..., Any]) -> None:
    with pytest.raises(DefinitionError, match="takes parameters"):
        check_zero_arg(fn)


def test_check_zero_arg_accepts_self_only() -> None:
    async def tick(self: Any) -> None: ...

    check_zero_arg(tick)
