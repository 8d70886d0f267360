"""The base of declared events: ``class Paid(akter.Event): ...``, and the tag registry."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from akter.errors import DefinitionError


class Event(BaseModel):
    """Base of declared events: pydantic models emitted by turns with ``self.emit``.

    The tag is the class name unless given with ``class Paid(akter.Event, tag="paid"):``.
    """

    model_config = ConfigDict(frozen=True)
    event_tag: ClassVar[str] = "Event"

    def __init_subclass__(cls, *, tag: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.event_tag = cls.__name__ if tag is None else tag
        if not cls.event_tag or len(cls.event_tag) > 200:
            raise DefinitionError(f"Event tag {cls.event_tag!r} must be 1–200 characters.")
        # Process-wide fallback for decoding; tags are checked for uniqueness per Runtime over
        # the events its actors declare (``events=[...]``).
        _EVENTS[cls.event_tag] = cls

    @classmethod
    def registry(cls) -> dict[str, type[Event]]:
        """Declared event classes by tag."""
        return dict(_EVENTS)


_EVENTS: dict[str, type[Event]] = {}
