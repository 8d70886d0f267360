"""The web console at ``/console`` (design §2.2): actors, events, outbox, jobs, dead letters.

The console shows every tenant's rows and can retry or discard dead letters, so it is off unless
asked for: ``akter.http.app(runtime, auth=..., console=Console(allow=...))``. Every console
request goes through the app's auth provider, then ``allow(caller, tenant)`` (or the older
``allow(caller)``): no credentials is 401, a refusal is 403. The page is static (``static/``:
HTML, vanilla JS and CSS, no build step, nothing from a CDN); its JSON and server-sent-event
routes live in :mod:`akter.http.console.api`.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

from akter.callers import Anonymous, User

#: Decides whether a caller, in the tenant the auth provider established, may use the console.
TenantRule = Callable[[User | Anonymous, str], "bool | Awaitable[bool]"]
#: The older form: decides from the caller alone (it cannot tell tenants apart).
CallerRule = Callable[[User | Anonymous], "bool | Awaitable[bool]"]
#: Either form of ``Console(allow=...)``, told apart by how many arguments it takes.
ConsoleRule = TenantRule | CallerRule


@dataclass(frozen=True)
class Console:
    """Turns the console on, for the callers ``allow`` accepts.

    Args:
        allow: Called with the caller of every console request and the caller's tenant, both
            established by the auth provider: ``allow(caller, tenant)`` returns (or awaits to)
            whether that caller may see and operate the console. The console shows every
            tenant's rows, so check the tenant too: a user named "admin" exists in any tenant
            that can sign up users. A rule of one argument, ``allow(caller)``, is still accepted
            and called with the caller alone (it cannot tell tenants apart); any other number of
            required arguments is a ``TypeError`` here.
        anonymous: Also pass the ``Anonymous`` caller to ``allow``. By default an anonymous
            console request is refused (403) before ``allow`` is called, whatever the rule says:
            on an app without an auth provider every caller is ``Anonymous``, and a console
            that admits ``Anonymous`` is open to whoever reaches the server, including a
            DNS-rebinding page in an operator's browser. The ``Host`` is not checked for a
            console built with ``allow``; set ``anonymous=True`` only when the network in
            front of the app already restricts who reaches it.
        origins: Extra origins (``"https://ops.example.com"``) trusted to call the console's
            API, for a page reached through a proxy whose ``Host`` differs from the browser's
            origin. The page's own origin needs no entry.
        loopback_only: Also refuse any request that does not come from a loopback address to a
            loopback host name (``localhost``, ``127.0.0.1``, ``[::1]``), and any request that
            carries a proxy's forwarding header (``Forwarded``, ``X-Forwarded-For``, ...).
        token: A secret every API request must carry in the ``X-Akter-Console-Token`` header
            (compared in constant time; missing or wrong is 401). ``Console.local()`` makes a
            random one per process.

    Example:
        Operators are named by tenant and subject, so tenant "acme"'s user "admin" is not one::

            OPERATORS = {("ops", "alice"), ("ops", "bob")}
            Console(
                allow=lambda caller, tenant: isinstance(caller, User)
                and (tenant, caller.subject) in OPERATORS
            )
    """

    allow: ConsoleRule
    anonymous: bool = False
    origins: Iterable[str] = ()
    loopback_only: bool = False
    token: str | None = field(default=None, repr=False)
    _with_tenant: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.allow):
            raise TypeError("Console(allow=...) needs a callable (caller, tenant) -> bool.")
        object.__setattr__(self, "_with_tenant", _takes_tenant(self.allow))
        if isinstance(self.origins, str):
            raise TypeError("Console(origins=...) needs a list of origins, not one string.")
        object.__setattr__(self, "origins", frozenset(_origin(o) for o in self.origins))
        if self.token is not None and len(self.token) < 16:
            raise ValueError("Console(token=...) needs at least 16 characters of secret.")

    async def allows(self, caller: User | Anonymous, tenant: str) -> bool:
        """Whether ``allow`` accepts ``caller`` in ``tenant`` (anything but ``True`` refuses).

        ``Anonymous`` is refused without asking ``allow`` unless ``anonymous=True``.
        """
        if isinstance(caller, Anonymous) and not self.anonymous:
            return False
        if self._with_tenant:
            verdict = cast(TenantRule, self.allow)(caller, tenant)
        else:
            verdict = cast(CallerRule, self.allow)(caller)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict is True

    @classmethod
    def local(cls) -> Console:
        """The development console (what ``akter dev`` uses).

        Any caller, ``Anonymous`` included, but only from loopback to a loopback host name,
        never through a proxy, and only with this process's random ``token``: ``akter dev``
        prints the console's URL with the token in its fragment (``#token=...``), which the
        page keeps in the tab. The token is what stops a same-host reverse proxy or tunnel
        from opening the console to the network.
        """
        return cls(
            allow=_anyone, anonymous=True, loopback_only=True, token=secrets.token_urlsafe(32)
        )


def _anyone(caller: User | Anonymous, tenant: str) -> bool:
    return True


def _takes_tenant(rule: Callable[..., object]) -> bool:
    """Whether ``rule`` is ``(caller, tenant)`` (``True``) or ``(caller)`` (``False``).

    Raises:
        TypeError: For a rule that cannot be called with one or with two arguments.
    """
    try:
        signature = inspect.signature(rule)
    except (TypeError, ValueError):
        return False  # a builtin without a signature: called with the caller, as before
    for count in (2, 1):
        try:
            signature.bind(*range(count))
        except TypeError:
            continue
        return count == 2
    raise TypeError(
        f"Console(allow={rule!r}) must take (caller, tenant) or (caller); it takes {signature}."
    )


def _origin(origin: str) -> str:
    """``origin`` as browsers send it: ``scheme://host[:port]``, lower case, no default port."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(f"Console(origins=...): {origin!r} is not an origin like https://host.")
    host = parts.netloc.lower().rsplit("@", 1)[-1]
    default = {"http": ":80", "https": ":443"}[parts.scheme]
    return f"{parts.scheme}://{host.removesuffix(default)}"


__all__ = ["CallerRule", "Console", "ConsoleRule", "TenantRule"]
