"""The base of declared events: ``class Paid(akter.Event): ...``, and the tag registry."""

from __future__ import annotations

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
        # Process-wide fallback for decoding; tags are checked for uniqueness per Runtime over
        # the events its actors declare (``events=[...]``).
        _EVENTS[cls.event_tag] = cls
        for alias in cls.event_aliases:
            _EVENTS.setdefault(alias, cls)

    @classmethod
    def migrate(cls, *, from_version: int) -> MigrationDecorator:
        """Declare the migration of this event's stored payloads from ``from_version``."""
        return typing.cast(MigrationDecorator, declare(from_version, cls._event_migrations.append))

    @classmethod
    def event_chain(cls) -> Chain:
        """The payload migrations, checked against ``version=``.

        Raises:
            DefinitionError: The migrations are not contiguous or disagree with ``version=``.
        """
        owner = f"event {cls.event_tag}"
        chain = build_chain(owner, cls._event_migrations)
        check_version(owner, cls.event_version, chain)
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
