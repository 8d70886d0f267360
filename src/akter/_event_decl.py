"""The base of declared events: ``class Paid(akter.Event): ...``, and the tag registry."""

from __future__ import annotations

import logging
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from akter._evolution import (
    Chain,
    Migration,
    MigrationDecorator,
    MigrationFailed,
    build_chain,
    check_aliases,
    check_version,
    declare,
)
from akter.errors import DefinitionError

log = logging.getLogger("akter.events")


class Event(BaseModel):
    """Base of declared events: pydantic models emitted by turns with ``self.emit``.

    The tag is the class name unless given with ``class Paid(akter.Event, tag="paid"):``.
    ``aliases=("Charged",)`` names earlier tags that stored events may carry, and
    ``version=k`` the payload version, with ``@Paid.migrate(from_version=...)`` migrations
    from 0 to ``k-1`` (evolution E2, E3).
    """

    model_config = ConfigDict(frozen=True)
    event_tag: ClassVar[str] = "Event"
    event_aliases: ClassVar[tuple[str, ...]] = ()
    event_version: ClassVar[int] = 0
    _event_migrations: ClassVar[list[Migration]] = []
    #: The checked chain, built once per class (a declaration of a migration resets it).
    _event_chain: ClassVar[Chain | None] = None

    def __init_subclass__(
        cls,
        *,
        tag: str | None = None,
        aliases: tuple[str, ...] | list[str] = (),
        version: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.event_tag = cls.__name__ if tag is None else tag
        if not cls.event_tag or len(cls.event_tag) > 200:
            raise DefinitionError(f"Event tag {cls.event_tag!r} must be 1–200 characters.")
        cls.event_aliases = check_aliases(f"event {cls.event_tag}", aliases)
        if cls.event_tag in cls.event_aliases:
            raise DefinitionError(f"Event {cls.event_tag!r} lists its own tag in aliases=.")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise DefinitionError(f"event {cls.event_tag}: version= must be an integer ≥ 0.")
        cls.event_version = version
        cls._event_migrations = []
        cls._event_chain = None
        # Process-wide fallback for decoding; tags are checked for uniqueness per Runtime over
        # the events its actors declare (``events=[...]``).
        _EVENTS[cls.event_tag] = cls
        for alias in cls.event_aliases:
            _EVENTS.setdefault(alias, cls)

    @classmethod
    def migrate(cls, *, from_version: int) -> MigrationDecorator:
        """Declare the migration of this event's stored payloads from ``from_version``."""

        def record(migration: Migration) -> None:
            cls._event_migrations.append(migration)
            cls._event_chain = None

        return typing.cast(MigrationDecorator, declare(from_version, record))

    @classmethod
    def event_chain(cls) -> Chain:
        """The payload migrations, checked against ``version=`` (built once, then cached).

        Raises:
            DefinitionError: The migrations are not contiguous or disagree with ``version=``.
        """
        chain = cls.__dict__.get("_event_chain")
        if chain is None:
            owner = f"event {cls.event_tag}"
            chain = build_chain(owner, cls._event_migrations)
            check_version(owner, cls.event_version, chain)
            cls._event_chain = chain
        return chain

    @classmethod
    def decode(cls, payload: Any, version: int) -> Event:
        """A stored event's payload at ``version``, migrated and validated under this class.

        Raises:
            MigrationFailed: ``version`` is unknown to the class or a migration failed.
            ValidationError: The migrated payload fails the class.
        """
        if not isinstance(payload, dict):
            raise MigrationFailed(f"event {cls.event_tag}: the stored payload is not an object")
        return cls.model_validate(cls.event_chain().upgrade(payload, version))

    @classmethod
    def registry(cls) -> dict[str, type[Event]]:
        """Declared event classes by tag."""
        return dict(_EVENTS)


_EVENTS: dict[str, type[Event]] = {}

#: (tag, class, version, problem) already logged by :func:`decode_stored`, bounded.
_LOGGED: set[tuple[str, str, int, str]] = set()
_LOGGED_MAX = 1_000


def decode_stored(
    klass: type[Event] | None, tag: str, payload: Any, version: int
) -> tuple[Any, int]:
    """What a reader gets for a stored event: ``(event, the payload version it is at)``.

    ``klass`` is the class claiming ``tag`` (by its tag or one of its ``aliases=``), if any. A
    stored payload is migrated from ``version`` and validated under it; the result is at the
    class's ``event_version``. Anything else is returned **raw** (the stored JSON, at its stored
    ``version``) and never raises, so a row this code cannot read never wedges a feed, a page
    or a query: a tag no class claims, a version above the class's (a newer writer: not
    guessed at), a failing migration or a payload that fails the class. Each such (tag,
    version, cause) is logged once per process.
    """
    if klass is None:
        return payload, version
    if version > klass.event_version:
        _log_once(tag, klass, version, "newer")
        return payload, version
    try:
        return klass.decode(payload, version), klass.event_version
    except (MigrationFailed, ValueError, DefinitionError) as exc:
        _log_once(tag, klass, version, type(exc).__name__, str(exc))
        return payload, version


def _log_once(tag: str, klass: type[Event], version: int, problem: str, detail: str = "") -> None:
    key = (tag, klass.__qualname__, version, problem)
    if key in _LOGGED or len(_LOGGED) >= _LOGGED_MAX:
        return
    _LOGGED.add(key)
    log.warning(
        "Stored event returned raw: this code cannot decode it: event %s (class %s) at version "
        "%s, this code's is %s: %s",
        tag,
        klass.__qualname__,
        version,
        klass.event_version,
        problem,
        extra={
            "tag": tag,
            "event_class": klass.__qualname__,
            "stored_version": version,
            "code_version": klass.event_version,
            "problem": problem,
            "detail": detail[:500],
        },
    )
