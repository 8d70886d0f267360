"""Tables that fit the terminal, short ids, and the short ids a command accepts.

Every id column follows one rule. akter's ids read ``v1.<issued ms>.<expires ms>.<uuid4>`` (a
workflow run's adds ``~<actor digest>``); what tells two of them apart is the random part after
the third dot, so a table shows its first 8 characters and an ellipsis (``3f2a9c1b…``), more
where two ids of the same table would otherwise look alike, as git shortens hashes. An id of
another form (a signal id you chose) is shortened the same way from its start. ``--wide`` shows
every id and time in full (and lets the table be as wide as it needs); ``--json`` is always full.

Every command that takes an id accepts that short form (with or without the ellipsis, at least
:data:`MIN_SHORT` characters): it is looked up among the rows its list command shows and must
name exactly one; an ambiguous one is refused with the candidates named. A full id (``v1.…``) is
used as given.

Without ``--wide`` a table is laid out for the console's width (``$COLUMNS`` when it is not a
terminal, else 80): fixed columns (ids, times, counts, states) keep their width, the free-text
columns (actors, names, errors) are cut with an ellipsis, widest first, so that no row wraps,
and a free-text column with nothing in it is left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from akter.errors import ConfigurationError

WideOption = Annotated[
    bool, typer.Option("--wide", help="Show ids and times in full (the table may wrap).")
]

#: Characters of an id's random part a table shows at least.
SHORT = 8
#: Characters a short id given to a command must have at least.
MIN_SHORT = 4
#: Most rows a short id is looked up among.
RESOLVE_LIMIT = 100_000
#: Chrome of rich's default table: one border per column and one more, two cells of padding each.
_CHROME_PER_COLUMN = 3
#: A free-text column is cut to no less than this (or its header, or its widest cell if less).
_FLEX_FLOOR = 8

_FULL_ID = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+\.(?P<random>.+)")


def id_key(full: str) -> str:
    """The part of an id a short form is a prefix of: the random part of an akter id."""
    found = _FULL_ID.fullmatch(full)
    return found.group("random") if found else full


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """Each id's short form: ``SHORT`` characters of its key and ``…``, more where needed.

    The length is one for the whole column: the least (from ``SHORT``) at which no two distinct
    keys share their short form. A key not longer than that is shown whole.
    """
    full = list(dict.fromkeys(ids))
    keys = {i: id_key(i) for i in full}
    distinct = set(keys.values())
    longest = max((len(k) for k in distinct), default=0)
    n = SHORT
    while n < longest and len({k[:n] for k in distinct}) < len(distinct):
        n += 1
    return {i: k if len(k) <= n + 1 else k[:n] + "…" for i, k in keys.items()}


def is_full_id(given: str) -> bool:
    """Whether ``given`` has the form of a full akter id (used as given, never looked up)."""
    return _FULL_ID.fullmatch(given) is not None


def resolve_id(given: str, candidates: Iterable[str], noun: str) -> str:
    """The one id among ``candidates`` that ``given`` names, as a full id or a short form.

    Args:
        given: What the operator typed: a full id, or the start of an id's key as a table shows
            it (an ellipsis at the end is ignored).
        candidates: The ids to look among (the rows the matching list command shows).
        noun: What the ids name, for the refusal ("workflow run").

    Raises:
        ConfigurationError: No candidate matches (``No <noun> '<given>'``), the short form is
            shorter than :data:`MIN_SHORT`, or it matches more than one candidate (they are
            named).
    """
    if is_full_id(given):
        return given
    pool = list(dict.fromkeys(candidates))
    if given in pool:
        return given
    text = given.strip().removesuffix("…").removesuffix("...")
    if len(text) < MIN_SHORT:
        raise ConfigurationError(
            f"No {noun} {given!r}: give the full id or at least {MIN_SHORT} characters of its "
            "short form."
        )
    found = [c for c in pool if id_key(c).startswith(text)]
    if not found:
        raise ConfigurationError(
            f"No {noun} {given!r}: no id starts so (give the full id, or a short one as the "
            "list shows it)."
        )
    if len(found) > 1:
        named = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise ConfigurationError(
            f"The short id {given!r} matches {len(found)} {noun}s ({named}); give more of it."
        )
    return found[0]


def when(ms: int | float | datetime | None, wide: bool) -> str:
    """A time in UTC: ``MM-DD HH:MM:SS`` in a table, ISO 8601 to the second with ``--wide``."""
    if ms is None:
        return ""
    at = ms if isinstance(ms, datetime) else datetime.fromtimestamp(ms / 1000, UTC)
    at = at.astimezone(UTC)
    return at.isoformat(timespec="seconds") if wide else at.strftime("%m-%d %H:%M:%S")


Kind = Literal["id", "text", "fixed", "number"]


@dataclass(frozen=True)
class Col:
    """A column: ``id`` (shortened unless wide), ``text`` (cut to fit), ``fixed``, ``number``.

    ``floor`` is the least width a ``text`` column is cut to (default: 8, or its header).
    """

    header: str
    kind: Kind = "fixed"
    floor: int | None = None


def print_table(
    console: Console,
    title: str,
    columns: Sequence[Col],
    rows: Sequence[Sequence[str]],
    *,
    wide: bool,
) -> None:
    """Print ``rows`` under ``columns``: fitted to the console's width, or in full if ``wide``."""
    cells = [list(r) for r in rows]
    if not wide and cells:  # a free-text column with nothing in it is left out
        keep = [i for i, c in enumerate(columns) if c.kind != "text" or any(r[i] for r in cells)]
        columns = [columns[i] for i in keep]
        cells = [[r[i] for i in keep] for r in cells]
    if not wide:
        for i, col in enumerate(columns):
            if col.kind == "id":
                short = short_ids(r[i] for r in cells if r[i])
                for r in cells:
                    r[i] = short.get(r[i], r[i])
    widths = [
        max([cell_len(c.header), *(cell_len(r[i]) for r in cells)]) for i, c in enumerate(columns)
    ]
    if not wide:
        widths = _fit(columns, widths, console.width - _CHROME_PER_COLUMN * len(columns) - 1)
    table = Table(
        *(
            Column(
                c.header,
                justify="right" if c.kind == "number" else "left",
                no_wrap=True,
                overflow="ellipsis",
                max_width=None if wide else widths[i],
            )
            for i, c in enumerate(columns)
        ),
        title=title,
    )
    for r in cells:
        table.add_row(*(Text(c) for c in r))
    if wide:  # as wide as the table needs: a full id is never folded
        natural = Measurement.get(console, console.options.update(width=1_000_000), table)
        before = console.width
        console.width = max(before, natural.maximum)
        try:
            console.print(table)
        finally:
            console.width = before
    else:
        console.print(table)


def _fit(columns: Sequence[Col], widths: list[int], room: int) -> list[int]:
    """Narrow the free-text columns, widest first, until the widths fit in ``room``."""
    widths = list(widths)
    floors = [
        min(w, max(c.floor or _FLEX_FLOOR, cell_len(c.header))) if c.kind == "text" else w
        for c, w in zip(columns, widths, strict=True)
    ]
    excess = sum(widths) - room
    while excess > 0:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break  # rich's own last resort then shares the cut among every column
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


__all__ = [
    "MIN_SHORT",
    "RESOLVE_LIMIT",
    "Col",
    "WideOption",
    "id_key",
    "is_full_id",
    "print_table",
    "resolve_id",
    "short_ids",
    "when",
]
