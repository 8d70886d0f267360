"""Event records and streams: what ``handle.events()`` and ``await self.events()`` give."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from akter.errors import ActorError

_CURSOR = re.compile(r"^(0|[1-9][0-9]{0,18})$")


@dataclass(frozen=True)
class EventRecord:
    """One committed event: ``cursor`` (its sequence), the event, its command id and time.

    ``event`` is an instance of the event class that claims ``tag`` (by its tag or an alias),
    decoded through its migrations, at that class's version. A stored event this code cannot
    decode is given **raw**, as its stored JSON object (``raw`` is true): a tag no class
    claims, a payload version above the class's (written by newer code: never guessed at), or
    a payload that fails the class. ``version`` is the payload version ``event`` is at — the
    class's ``event_version`` when decoded, the stored version when raw.
    """

    cursor: str
    event: Any
    command_id: str
    emitted_at: datetime
    tag: str
    version: int = 0

    @property
    def raw(self) -> bool:
        """Whether ``event`` is the stored JSON rather than a decoded event."""
        return not isinstance(self.event, BaseModel)


def parse_cursor(after: str | int | None) -> int:
    """A cursor as an int (``None`` or ``"0"`` is the start)."""
    if after is None:
        return 0
    text = str(after)
    if not _CURSOR.match(text):
        raise ActorError(
            "UnknownCursor",
            f"Cursor {text[:40]!r} is not an event sequence number.",
            code="malformed",
        )
    return int(text)


class EventStream:
    """Events of one actor: ``await`` it for one page, ``async for`` it to follow live.

    ``await view.events(after=cursor)`` in a query returns a list of :class:`EventRecord`;
    ``async for record in handle.events(after=cursor)`` replays, then follows new commits.
    """

    def __init__(
        self,
        read: Callable[[], Awaitable[list[EventRecord]]],
        live: Callable[[], AsyncIterator[EventRecord]] | None = None,
    ) -> None:
        self._read = read
        self._live = live

    def __await__(self) -> Generator[Any, None, list[EventRecord]]:
        return self._read().__await__()

    def __aiter__(self) -> AsyncIterator[EventRecord]:
        if self._live is None:
            raise TypeError("Queries read one page of events: use 'await self.events(...)'.")
        return self._live()
