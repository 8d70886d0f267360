"""The web console at ``/console`` (design §2.2): actors, events, outbox, jobs, dead letters.

The console shows every tenant's rows and can retry or discard dead letters, so it is off unless
asked for: ``akter.http.app(runtime, auth=..., console=Console(allow=...))``. Every console
request goes through the app's auth provider, then ``allow(caller)``: no credentials is 401, a
refusal is 403. The page is static (``static/``: HTML, vanilla JS and CSS, no build step, nothing
from a CDN); its JSON and server-sent-event routes live in :mod:`akter.http.console.api`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from akter.callers import Anonymous, User

#: Decides whether a caller established by the auth provider may use the console.
ConsoleRule = Callable[[User | Anonymous], "bool | Awaitable[bool]"]


@dataclass(frozen=True)
class Console:
    """Turns the console on, for the callers ``allow`` accepts.

    Args:
        allow: Called with the caller of every console request (after the auth provider);
            returns (or awaits to) whether that caller may see and operate the console.
        loopback_only: Also refuse any request that does not come from a loopback address to a
            loopback host name (``localhost``, ``127.0.0.1``, ``[::1]``); ``akter dev`` sets it.

    Example:
        ``Console(allow=lambda caller: isinstance(caller, User) and caller.subject in ADMINS)``
    """

    allow: ConsoleRule
    loopback_only: bool = False

    def __post_init__(self) -> None:
        if not callable(self.allow):
            raise TypeError("Console(allow=...) needs a callable (caller) -> bool.")

    async def allows(self, caller: User | Anonymous) -> bool:
        """Whether ``allow`` accepts ``caller`` (anything but ``True`` refuses)."""
        verdict = self.allow(caller)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    @classmethod
    def local(cls) -> Console:
        """The development console: any caller, from loopback only (what ``akter dev`` uses)."""
        return cls(allow=_anyone, loopback_only=True)


def _anyone(caller: User | Anonymous) -> bool:
    return True


__all__ = ["Console", "ConsoleRule"]
