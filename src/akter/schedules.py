"""Schedules: ``@akter.schedule`` entries, their canonical keys and their fire times (semantics §4).

A schedule is declared on top of the ``@akter.command`` of a command without parameters::

    @akter.schedule("30 2 * * *", tz="Europe/Paris")
    @akter.schedule(every=timedelta(minutes=5))
    @akter.command
    async def tick(self) -> None: ...

Each declaration becomes a :class:`ScheduleEntry` whose ``key`` is the tick's timer key. Keys are
canonical: every cron field is expanded to its sorted value set, so two spellings of one schedule
(``1-5`` and ``1,2,3,4,5``) share one key and cannot both be declared on a type.

Cron syntax: five fields (minute, hour, day of month, month, day of week) or six with seconds
first. A field is ``*`` or a comma list of ``N``, ``N-M``, ``*/S``, ``N-M/S`` and ``N/S`` (``N``
to the field's maximum, step ``S``); months and days of week also take English names (``jan``,
``mon``), day of week 7 is Sunday like 0. ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``,
``@daily``, ``@midnight`` and ``@hourly`` stand for their usual five-field expressions. As in
Vixie cron, when both the day of month and the day of week are restricted a day matches either;
"restricted" is decided on the expanded sets (a field covering its whole range is ``*``).

Fire times follow §4.7: a local time skipped by a forward DST jump fires once, at the first
instant after the gap; a local time repeated by a backward jump fires once, at its first
occurrence; ``every`` fires at whole multiples of its period since the Unix epoch.
"""

from __future__ import annotations

import calendar
import inspect
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from akter._ids import ms_from_duration
from akter._kinds import cron_timer_key
from akter.errors import DefinitionError

__all__ = [
    "ScheduleEntry",
    "check_unique",
    "check_zero_arg",
    "entries_of",
    "next_fire",
    "schedule",
]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

SCHEDULES_ATTR: Final = "__akter_schedules__"
# Read by name rather than imported: ``akter.actor`` calls into this module at definition time.
_MEMBER_ATTR: Final = "__akter_member__"

_MIN_EVERY_MS: Final = 1_000
# A valid expression fires at least once every eight years (a leap day skips 2100); searching
# further means the expression cannot fire in the remaining calendar.
_SEARCH_YEARS: Final = 9
_EPOCH: Final = datetime(1970, 1, 1)
_ONE_SECOND: Final = timedelta(seconds=1)

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_WEEKDAY_NAMES: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


@dataclass(frozen=True)
class _Field:
    """How one cron field is parsed: its name, bounds and accepted names."""

    name: str
    low: int
    high: int
    names: dict[str, int]


_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DAY = _Field("day-of-month", 1, 31, {})
_MONTH = _Field("month", 1, 12, _MONTH_NAMES)
# 7 is accepted as Sunday and folded onto 0 after parsing.
_WEEKDAY = _Field("day-of-week", 0, 7, _WEEKDAY_NAMES)
_WEEKDAY_SHOWN = _Field("day-of-week", 0, 6, _WEEKDAY_NAMES)


@dataclass(frozen=True)
class CronFields:
    """The expanded value sets of a cron expression, each sorted ascending.

    Attributes:
        seconds: Seconds of the minute; ``(0,)`` for five-field expressions.
        minutes: Minutes of the hour.
        hours: Hours of the day.
        days: Days of the month.
        months: Months of the year.
        weekdays: Days of the week, Sunday = 0.
    """

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]

    @property
    def canonical(self) -> str:
        """The canonical expression: five fields, or six when it fires off the whole minute."""
        parts = [
            _show(self.minutes, _MINUTE),
            _show(self.hours, _HOUR),
            _show(self.days, _DAY),
            _show(self.months, _MONTH),
            _show(self.weekdays, _WEEKDAY_SHOWN),
        ]
        if self.seconds != (0,):
            parts.insert(0, _show(self.seconds, _SECOND))
        return " ".join(parts)

    def matches_day(self, day: date) -> bool:
        """Whether ``day`` is a firing day (Vixie cron's day-of-month / day-of-week rule)."""
        if day.month not in self.months:
            return False
        in_days = day.day in self.days
        in_weekdays = day.isoweekday() % 7 in self.weekdays
        if len(self.days) == 31 or len(self.weekdays) == 7:
            return in_days and in_weekdays
        return in_days or in_weekdays


@dataclass(frozen=True)
class ScheduleEntry:
    """One ``@akter.schedule`` declaration.

    Attributes:
        key: The tick's timer key: ``$cron:<zone> <canonical expression>`` or
            ``$cron:@every <ms>ms``.
        command: The name of the decorated function (the command the tick delivers).
        source: The declaration as written, for messages (``"30 2 * * *"``, ``"every=0:05:00"``).
        zone: The IANA zone cron fields are read in; ``"UTC"`` for ``every``.
        cron: The expanded cron fields, or ``None`` for ``every``.
        every_ms: The period of ``every`` in milliseconds, or ``None`` for cron.
    """

    key: str
    command: str
    source: str
    zone: str = "UTC"
    cron: CronFields | None = field(default=None, repr=False)
    every_ms: int | None = None


def schedule(
    cron: str | None = None,
    /,
    *,
    tz: str = "UTC",
    every: float | timedelta | None = None,
) -> Callable[[F], F]:
    """Run a command without parameters on a schedule: a cron expression or a fixed period.

    Stack it on top of ``@akter.command``; several schedules may be stacked on one command.

    Args:
        cron: A five-field (minute first) or six-field (seconds first) cron expression.
        tz: The IANA zone the cron expression is read in (default ``"UTC"``).
        every: A period (seconds or ``timedelta``) of at least 1 s instead of ``cron``; it fires
            at whole multiples of the period since the Unix epoch.

    Returns:
        A decorator that records the entry on the command and returns the command unchanged.

    Raises:
        DefinitionError: If the expression, zone or period is invalid, if both or neither of
            ``cron`` and ``every`` are given, or (when applied) if the function is not an
            ``@akter.command`` without parameters.
    """
    if (cron is None) == (every is None):
        raise DefinitionError(
            "@akter.schedule takes exactly one of a cron expression and every=; "
            'write @akter.schedule("*/5 * * * *") or @akter.schedule(every=timedelta(minutes=5)).'
        )
    if cron is not None:
        zone = _check_zone(tz, cron)
        fields = parse_cron(cron)
        key, source, every_ms = cron_timer_key(f"{zone} {fields.canonical}"), cron, None
    else:
        assert every is not None
        if tz != "UTC":
            raise DefinitionError(
                f"@akter.schedule(every=...) fires at epoch multiples, so tz={tz!r} has no "
                "effect; remove it, or use a cron expression for local wall-clock times."
            )
        every_ms = _every_ms(every)
        fields, zone = None, "UTC"
        key, source = cron_timer_key(f"@every {every_ms}ms"), f"every={every}"

    def mark(fn: F) -> F:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        spec = getattr(fn, _MEMBER_ATTR, None)
        if getattr(spec, "kind", None) != "command":
            raise DefinitionError(
                f"@akter.schedule({source!r}) on {name!r}: the function is not a command; "
                "stack @akter.schedule on top of @akter.command."
            )
        check_zero_arg(fn)
        entry = ScheduleEntry(
            key=key,
            command=getattr(fn, "__name__", name),
            source=source,
            zone=zone,
            cron=fields,
            every_ms=every_ms,
        )
        existing = entries_of(fn)
        check_unique([entry, *existing], name)
        # Decorators apply bottom-up; prepending keeps the entries in source order.
        setattr(fn, SCHEDULES_ATTR, [entry, *existing])
        return fn

    return mark


def entries_of(fn: object) -> list[ScheduleEntry]:
    """The schedule entries declared on a function, in source order (empty if none)."""
    entries: list[ScheduleEntry] = getattr(fn, SCHEDULES_ATTR, [])
    return list(entries)


def check_zero_arg(fn: Callable[..., Any]) -> None:
    """Refuse a scheduled command that takes parameters besides ``self``.

    Ticks carry an empty payload, so a scheduled command cannot take arguments.

    Raises:
        DefinitionError: If ``fn`` declares any parameter after ``self``.
    """
    name = getattr(fn, "__qualname__", None) or repr(fn)
    params = list(inspect.signature(fn).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    extra = params[1:] if params and params[0].kind in positional else params
    if extra:
        shown = ", ".join(repr(p.name) for p in extra)
        raise DefinitionError(
            f"Scheduled command {name!r} takes parameters ({shown}); ticks carry no arguments, "
            "so remove them or read the values from state."
        )


def check_unique(entries: Iterable[ScheduleEntry], type_name: str) -> None:
    """Refuse two schedule entries with one key on one actor type (semantics §4.2).

    Args:
        entries: Every entry declared on the type's commands.
        type_name: The actor type (or function) they belong to, for the message.

    Raises:
        DefinitionError: If two entries share a key.
    """
    seen: dict[str, ScheduleEntry] = {}
    for entry in entries:
        first = seen.setdefault(entry.key, entry)
        if first is not entry:
            raise DefinitionError(
                f"{type_name!r} declares the schedule {entry.key!r} twice "
                f"({first.source!r} on {first.command!r} and {entry.source!r} on "
                f"{entry.command!r}); they fire at the same times, so keep one."
            )


def next_fire(entry: ScheduleEntry, after_ms: int) -> int:
    """The first fire time of ``entry`` strictly after ``after_ms``.

    Args:
        entry: The schedule entry.
        after_ms: An instant in Unix epoch milliseconds.

    Returns:
        The fire time in Unix epoch milliseconds, ``> after_ms``.

    Raises:
        ValueError: If the entry does not fire again before the year 9999.
    """
    if entry.every_ms is not None:
        return (after_ms // entry.every_ms + 1) * entry.every_ms
    assert entry.cron is not None
    fields, zone = entry.cron, ZoneInfo(entry.zone)
    step = _ONE_SECOND if fields.seconds != (0,) else timedelta(minutes=1)
    # Every wall time up to the wall time of ``after_ms`` fires at or before it (the wall-to-
    # instant mapping below is monotonic), so the search starts one step past it.
    after_s = after_ms // 1000
    wall = _wall(after_s, zone)
    start = wall.replace(second=0) if step != _ONE_SECOND else wall
    for candidate in _walls(fields, start + step):
        fire_s = _instant(candidate, zone)
        if fire_s * 1000 > after_ms:
            return fire_s * 1000
    raise ValueError(f"The schedule {entry.key!r} does not fire after {after_ms} ms.")


# --- parsing ----------------------------------------------------------------------------------


def parse_cron(expression: str) -> CronFields:
    """Parse and expand a cron expression.

    Args:
        expression: Five fields (minute first), six fields (seconds first) or a ``@daily``-style
            macro.

    Returns:
        The expanded fields.

    Raises:
        DefinitionError: If the expression is malformed or can never fire.
    """
    if not isinstance(expression, str):
        raise DefinitionError(f"A cron expression must be a string, not {expression!r}.")
    text = _MACROS.get(expression.strip().lower(), expression)
    if text.startswith("@"):
        raise DefinitionError(
            f"Unknown cron macro {expression!r}; use one of {', '.join(_MACROS)}, a cron "
            "expression, or every= for a fixed period."
        )
    parts = text.split()
    if len(parts) == 5:
        parts.insert(0, "0")
    elif len(parts) != 6:
        raise DefinitionError(
            f"Cron expression {expression!r} has {len(parts)} fields; write 5 (minute hour "
            "day-of-month month day-of-week) or 6 (with seconds first)."
        )
    specs = (_SECOND, _MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY)
    seconds, minutes, hours, days, months, weekdays = (
        _parse_field(part, spec, expression) for part, spec in zip(parts, specs, strict=True)
    )
    fields = CronFields(
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=tuple(sorted({d % 7 for d in weekdays})),
    )
    restricted_weekdays = len(fields.weekdays) < 7
    # With a restricted day of week some day of every month fires; otherwise the days of the
    # month must exist in some selected month (February counts its leap day).
    if not restricted_weekdays and not any(
        fields.days[0] <= calendar.monthrange(2000, m)[1] for m in fields.months
    ):
        raise DefinitionError(
            f"Cron expression {expression!r} never fires: no selected month has the selected "
            "days of the month."
        )
    return fields


def _parse_field(text: str, spec: _Field, expression: str) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec, expression))
    return tuple(sorted(values))


def _parse_item(item: str, spec: _Field, expression: str) -> range:
    def bad(why: str) -> DefinitionError:
        return DefinitionError(
            f"Cron expression {expression!r}: {spec.name} field item {item!r} {why}."
        )

    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _is_number(step_text) or int(step_text) < 1:
            raise bad("needs a whole step of at least 1 after '/'")
        step = int(step_text)
    if base == "*":
        return range(spec.low, spec.high + 1, step)
    low_text, dash, high_text = base.partition("-")
    low = _value(low_text, spec, bad)
    if dash:
        high = _value(high_text, spec, bad)
        if spec is _WEEKDAY and high == 0 and low > 0:
            high = 7  # "fri-sun": Sunday closes the week
    else:
        # "N/S" runs from N to the field's maximum; a bare "N" is the single value.
        high = spec.high if slash else low
    if low > high:
        raise bad(f"is a reversed range; write {high}-{low}")
    return range(low, high + 1, step)


def _value(text: str, spec: _Field, bad: Callable[[str], DefinitionError]) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.names[lowered]
    if not _is_number(text):
        accepted = " or a name" if spec.names else ""
        raise bad(f"must be a number {spec.low}-{spec.high}{accepted}, '*', a range or a step")
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise bad(f"is out of range {spec.low}-{spec.high}")
    return value


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _show(values: tuple[int, ...], spec: _Field) -> str:
    if len(values) == spec.high - spec.low + 1:
        return "*"
    return ",".join(str(v) for v in values)


def _check_zone(tz: object, expression: str) -> str:
    if not isinstance(tz, str):
        raise DefinitionError(f"tz= must be an IANA zone name such as 'Europe/Paris', not {tz!r}.")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise DefinitionError(
            f"Unknown time zone {tz!r} for schedule {expression!r}; use an IANA zone name such "
            "as 'UTC' or 'Europe/Paris'."
        ) from None
    return tz


def _every_ms(every: float | timedelta) -> int:
    too_short = DefinitionError(
        f"@akter.schedule(every={every!r}) must be at least 1 second; use a longer period."
    )
    if isinstance(every, timedelta):
        if every < _ONE_SECOND:
            raise too_short
    elif isinstance(every, int | float) and not isinstance(every, bool) and every < 1:
        raise too_short
    try:
        return ms_from_duration(every, "schedule period")
    except ValueError as exc:
        raise DefinitionError(f"@akter.schedule(every=...): {exc}") from None


# --- fire times -------------------------------------------------------------------------------


def _walls(fields: CronFields, start: datetime) -> Iterator[datetime]:
    """Naive local wall times matching ``fields``, ascending, from ``start`` (inclusive)."""
    # Year 9999 is left out so that stepping past a day or month cannot overflow ``date``.
    day, limit = start.date(), min(start.year + _SEARCH_YEARS, date.max.year - 1)
    first = True
    while day.year <= limit:
        if day.month not in fields.months:
            # Jump to the first day of the next month.
            day = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
            first = False
            continue
        if fields.matches_day(day):
            floor = (start.hour, start.minute, start.second) if first else (0, 0, 0)
            for h, m, s in _times(fields, floor):
                yield datetime(day.year, day.month, day.day, h, m, s)
        first = False
        day += timedelta(days=1)


def _times(fields: CronFields, floor: tuple[int, int, int]) -> Iterator[tuple[int, int, int]]:
    """The (hour, minute, second) times of a firing day at or after ``floor``, ascending."""
    fh, fm, fs = floor
    for h in fields.hours[bisect_left(fields.hours, fh) :]:
        minutes = fields.minutes if h > fh else fields.minutes[bisect_left(fields.minutes, fm) :]
        for m in minutes:
            late = (h, m) > (fh, fm)
            seconds = fields.seconds if late else fields.seconds[bisect_left(fields.seconds, fs) :]
            for s in seconds:
                yield h, m, s


def _wall(epoch_s: int, zone: ZoneInfo) -> datetime:
    """The naive local wall time of an epoch second."""
    utc = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=epoch_s)
    return utc.astimezone(zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: ZoneInfo) -> int:
    """The epoch second a local wall time fires at (§4.7).

    An existing wall time fires at its first occurrence (``fold=0``). A wall time inside a
    forward gap fires at the transition: the first instant whose wall time passes it.
    """
    first = _epoch_s(wall, zone, fold=0)
    if _wall(first, zone) == wall:
        return first
    # In a gap, fold=0 applies the offset before the jump (an instant after the transition) and
    # fold=1 the offset after it (an instant before); search between them.
    lo, hi = _epoch_s(wall, zone, fold=1), first
    if lo > hi:  # not a forward gap after all; never expected from zoneinfo
        lo, hi = hi, lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(mid, zone) > wall:
            hi = mid
        else:
            lo = mid
    return hi


def _epoch_s(wall: datetime, zone: ZoneInfo, *, fold: int) -> int:
    offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
    assert offset is not None
    return (wall - offset - _EPOCH) // _ONE_SECOND
