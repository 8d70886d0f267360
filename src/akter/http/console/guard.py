"""Who may use the console: the checks every console API request passes before it runs.

In order: the ``X-Akter-Console: 1`` header (a cross-site page cannot send it without a CORS
preflight this app never grants); for ``Console.local()`` no proxy forwarding header (403); the
console's own page as the sender (``Sec-Fetch-Site`` ``same-origin`` or ``none``, or, from a
browser that does not send it, an ``Origin`` whose host and port are the ``Host``'s; the scheme
is not compared, so a TLS-terminating proxy does not break it), or an origin listed in
``Console(origins=...)`` (403); for ``Console.local()`` a loopback request to a loopback host
name (403); the console's token in ``X-Akter-Console-Token`` when it has one (401); then the
app's auth provider establishes the caller (401 without credentials, unless the console takes
``Anonymous``) and the console's rule
accepts it in its tenant or not (403; ``Anonymous`` only with ``anonymous=True``). The request
then runs as a ``System`` caller on behalf of that caller's principal.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request

from akter.callers import Anonymous, System, principal_of
from akter.errors import ActorError
from akter.http.auth import AuthProvider, Identity
from akter.http.console import Console

#: The header every console API request carries (the CSRF defence of a same-origin page).
HEADER = "x-akter-console"
#: The header carrying the console's secret token (``Console.local()``, ``akter dev``).
TOKEN_HEADER = "x-akter-console-token"
#: Headers a reverse proxy adds; ``Console.local()`` refuses requests that carry one.
_FORWARDING = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})


async def operator(request: Request, auth: AuthProvider, console: Console) -> System:
    """The caller a console request runs as, once every check has passed.

    Raises:
        ActorError: ``Unauthorized`` (403, or 401 without credentials or without the
            console's token) for the first check that fails, in the order of the module
            docstring.
    """
    if request.headers.get(HEADER) != "1":
        raise ActorError(
            "Unauthorized",
            "Console requests need the 'X-Akter-Console: 1' header that the console sets.",
            code="console_header_missing",
        )
    if console.loopback_only:
        forwarded = [name for name in _FORWARDING if name in request.headers]
        if forwarded:
            raise ActorError(
                "Unauthorized",
                f"This console only answers this machine directly, not through a proxy "
                f"(the request carries {', '.join(forwarded)}).",
                code="console_proxied",
            )
    origin = request.headers.get("origin")
    if not _same_origin(request, origin, console.origins):
        raise ActorError(
            "Unauthorized",
            f"Origin {origin or request.headers.get('sec-fetch-site')!r} may not use the "
            "console; open it from this server, or list the origin in Console(origins=...).",
            code="origin_denied",
        )
    if console.loopback_only and not _loopback(request):
        raise ActorError(
            "Unauthorized",
            "This console only answers requests from this machine to localhost.",
            code="console_denied",
        )
    expected = console.token
    if expected is not None:
        given = request.headers.get(TOKEN_HEADER)
        if not given:
            raise _TokenRefused(
                "This console needs its token: open the console URL that 'akter dev' "
                "printed (it ends in #token=...).",
                code="console_token_missing",
            )
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise _TokenRefused(
                "The console token is not this server's (it changes when 'akter dev' "
                "restarts): open the console URL it printed last.",
                code="console_token_invalid",
            )
    try:
        identity = await auth(request)
    except ActorError as exc:
        # A console open to Anonymous (``Console.local()``) serves requests without credentials
        # as Anonymous under any provider, as the API serves them to public actors.
        if not (console.anonymous and exc.code == "missing_credentials"):
            raise
        identity = Identity(Anonymous(), "default")
    if not await console.allows(identity.caller, identity.tenant):
        raise ActorError(
            "Unauthorized",
            f"{_who(identity.caller)} may not use the console; ask an operator for access.",
            code="console_denied",
        )
    return System("process", on_behalf_of=principal_of(identity.caller))


class _TokenRefused(ActorError):
    """A console request without this console's token: 401 (``akter.http.problems``)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__("Unauthorized", message, code=code)


def _same_origin(request: Request, origin: str | None, trusted: Iterable[str]) -> bool:
    """Whether a browser sent this request from the console's own page (or a trusted origin).

    ``Sec-Fetch-Site`` is the browser's own verdict and ignores what a TLS-terminating proxy
    changes (scheme, port). Without it, the ``Origin``'s host and port must be the ``Host``'s
    (the scheme is not compared, for the same reason). No ``Origin`` at all is a same-origin
    ``GET`` or a non-browser client, which the custom header already vouches for.
    """
    site = request.headers.get("sec-fetch-site")
    if site in ("same-origin", "none"):
        return True
    if origin is not None and _normal_origin(origin) in trusted:
        return True
    if site is not None:
        return False  # same-site or cross-site, and not a trusted origin
    if origin is None:
        return True
    theirs = _host_port(origin.lower().partition("://")[2]) if "://" in origin else ""
    # "null" (a sandboxed frame, a file, a redirect across sites) has no host: refused.
    return theirs != "" and theirs == _host_port(request.headers.get("host", "").lower())


def _normal_origin(origin: str) -> str:
    """``origin`` as :class:`Console` stores its ``origins``: lower case, no default port."""
    scheme, _, host = origin.strip().lower().partition("://")
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return f"{scheme}://{host.removesuffix(default) if default else host}"


def _host_port(host: str) -> str:
    """``host[:port]`` without a default port (80 or 443: the scheme is not compared)."""
    return host.removesuffix(":80").removesuffix(":443")


def _loopback(request: Request) -> bool:
    client = request.client.host if request.client else ""
    try:
        from_here = ipaddress.ip_address(client).is_loopback
    except ValueError:
        return False
    host = request.headers.get("host", "").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return from_here and name in _LOOPBACK_NAMES


def _who(caller: Any) -> str:
    subject = principal_of(caller)
    return f"User {subject!r}" if subject else type(caller).__name__


__all__ = ["HEADER", "TOKEN_HEADER", "operator"]
