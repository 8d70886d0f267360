"""``self.broadcast(topic, message)``: a message to the live connections following an actor.

A command stages a broadcast like an event, but nothing is written: if the turn commits, the
runner sends it after the commit to the WebSocket connections (and in-process subscribers) that
follow the actor's topic, on this runner and, with ``notify=True``, on the others (one
``NOTIFY``, whose payload bounds its size). A rolled-back or failed command broadcasts nothing.
Delivery is best-effort: a connection that is not following at that moment, a full send queue
or a lost notification drops it; the durable path is events (docs/guides/live.md).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from akter._contexts import CommandContext, _Context
from akter._json import storable_json
from akter._staging import StagedBroadcast
from akter.errors import CapabilityEscaped, ReadOnlyError, invalid_input

#: The largest broadcast, in bytes of its JSON text: it must fit one ``NOTIFY`` payload (8000
#: bytes) with its envelope (the actor's address and topic, at most ~600 bytes).
MAX_BROADCAST_BYTES = 7000
#: A topic: 1-128 characters of letters, digits and ``._:-``.
TOPIC_RE = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")


def check_topic(topic: object) -> str:
    """A valid topic name, or ``InvalidInput`` (code ``invalid_topic``)."""
    if not isinstance(topic, str) or not TOPIC_RE.match(topic):
        raise invalid_input(
            f"Topic {topic!r} is invalid: use 1-128 characters of letters, digits and '._:-'.",
            code="invalid_topic",
        )
    return topic


class Broadcasts:
    """The ``broadcast`` capability of a command's ``self`` (mixed into ``akter.Actor``)."""

    __slots__ = ()

    def broadcast(self, topic: str, message: Any) -> None:
        """Send ``message`` to the connections following ``topic`` of this actor, after commit.

        Best-effort and never stored: use events for what must not be lost.

        Args:
            topic: The topic followers subscribed to (1-128 of ``[A-Za-z0-9._:-]``).
            message: A JSON value (a pydantic model is sent as its JSON form), at most
                :data:`MAX_BROADCAST_BYTES` bytes of JSON.

        Raises:
            ActorError: ``InvalidInput`` (``invalid_topic``, ``broadcast_too_large``) or an
                unstorable message; ``ReadOnlyError`` in a query.
        """
        ctx = self.__dict__.get("_akter_ctx") if hasattr(self, "__dict__") else None
        if not isinstance(ctx, _Context):
            raise CapabilityEscaped(
                "Turn capabilities exist only inside a command or query handler run by akter."
            )
        ctx.check()
        if not isinstance(ctx, CommandContext):
            raise ReadOnlyError("broadcast() is not available in a query: queries are read-only.")
        check_topic(topic)
        dump = getattr(message, "model_dump", None)
        text = storable_json(dump(mode="json") if callable(dump) else message, "broadcast")
        size = len(text.encode())
        if size > MAX_BROADCAST_BYTES:
            raise invalid_input(
                f"The broadcast on {topic!r} is {size} bytes of JSON, over {MAX_BROADCAST_BYTES}; "
                "send a smaller message (an id to read) or emit an event.",
                code="broadcast_too_large",
            )
        ctx.staged.broadcasts.append(StagedBroadcast(topic, text))

    async def broadcasts(self, topic: str) -> AsyncIterator[Any]:
        """On an in-process handle: follow the actor's broadcasts on ``topic`` from now on.

        ``messages = await runtime.get(Room, "r").broadcasts("chat")``, then
        ``async for message in messages`` (``aclose()`` stops); access kind ``events``.
        """
        raise TypeError("broadcasts() is a handle method; call it on runtime.get(...).")
