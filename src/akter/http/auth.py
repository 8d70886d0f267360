"""Auth providers: who is calling, and in which tenant (semantics §9).

A provider is an async callable ``(request) -> Identity`` that returns a ``User`` or
``Anonymous`` caller and a tenant, or raises ``ActorError("Unauthorized", code=...)``. Caller and
tenant come only from the provider — never from the path, headers or body of the request.
Credentials are never stored or logged.

A request without credentials is refused with the code ``missing_credentials``; the app then
serves it as ``Anonymous`` in the tenant "default", so actors with ``access=akter.public``
answer it under any provider (the others still answer 401 ``missing_credentials``). Presented
but invalid credentials are always refused. A provider may describe its scheme for the OpenAPI
document with an ``openapi_security()`` method returning ``{name: security scheme object}``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from starlette.requests import Request

from akter._ids import validate_tenant
from akter.callers import Anonymous, User
from akter.errors import ActorError


@dataclass(frozen=True)
class Identity:
    """What an auth provider established."""

    caller: User | Anonymous
    tenant: str = "default"


AuthProvider = Callable[[Request], Awaitable[Identity]]


def security_schemes(provider: AuthProvider) -> dict[str, dict[str, Any]]:
    """The OpenAPI security schemes a provider declares (none for one that declares none)."""
    describe = getattr(provider, "openapi_security", None)
    return dict(describe()) if callable(describe) else {}


def _refuse(code: str, message: str) -> ActorError:
    return ActorError("Unauthorized", message, code=code)


async def anonymous(request: Request) -> Identity:
    """No authentication: every request is ``Anonymous`` in the default tenant."""
    return Identity(Anonymous(), "default")


class BearerJWT:
    """Bearer tokens (JWT, HS256 or RS256 ...) verified with PyJWT.

    Args:
        key: The HMAC secret or the PEM public key.
        algorithms: Accepted algorithms (never ``none``).
        subject_claim: Claim holding the user's subject.
        tenant_claim: Claim holding the tenant; tokens without it use ``default_tenant``.
        audience: Required ``aud``, if any.
        issuer: Required ``iss``, if any.
        default_tenant: The tenant of tokens without a tenant claim, or ``None`` to refuse them.
    """

    def __init__(
        self,
        key: str | bytes,
        *,
        algorithms: Sequence[str] = ("HS256",),
        subject_claim: str = "sub",
        tenant_claim: str = "tenant",
        audience: str | None = None,
        issuer: str | None = None,
        default_tenant: str | None = "default",
    ) -> None:
        if any(a.lower() == "none" for a in algorithms):
            raise ValueError("The 'none' algorithm is never accepted.")
        self._key = key
        self._algorithms = list(algorithms)
        self._subject_claim = subject_claim
        self._tenant_claim = tenant_claim
        self._audience = audience
        self._issuer = issuer
        self._default_tenant = default_tenant

    async def __call__(self, request: Request) -> Identity:
        """Verify the request's bearer token."""
        header = request.headers.get("authorization")
        if not header:
            raise _refuse("missing_credentials", "This endpoint needs a bearer token.")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _refuse("invalid_credentials", "Use 'Authorization: Bearer <token>'.")
        try:
            claims: dict[str, Any] = jwt.decode(
                token.strip(),
                self._key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                options={"require": ["exp", self._subject_claim]},
            )
        except jwt.ExpiredSignatureError:
            raise _refuse("expired", "The bearer token has expired.") from None
        except jwt.PyJWTError:
            raise _refuse("invalid_credentials", "The bearer token is not valid.") from None
        subject = claims.get(self._subject_claim)
        tenant = claims.get(self._tenant_claim, self._default_tenant)
        if not isinstance(subject, str) or not subject or tenant is None:
            raise _refuse("invalid_credentials", "The bearer token lacks a subject or tenant.")
        try:
            return Identity(User(subject), validate_tenant(tenant))
        except ActorError:
            raise _refuse("invalid_credentials", "The token's tenant is invalid.") from None

    def openapi_security(self) -> dict[str, dict[str, Any]]:
        """The OpenAPI security scheme: an HTTP bearer token in JWT format."""
        return {"BearerJWT": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}


class ApiKeys:
    """Static API keys: ``ApiKeys({"key-1": ("service-a", "acme")})`` (subject, tenant)."""

    def __init__(self, keys: Mapping[str, tuple[str, str]], *, header: str = "x-api-key") -> None:
        self._keys = [(k.encode(), User(s), validate_tenant(t)) for k, (s, t) in keys.items()]
        self._header = header.lower()

    async def __call__(self, request: Request) -> Identity:
        """Match the request's key in constant time."""
        presented = request.headers.get(self._header)
        if not presented:
            raise _refuse("missing_credentials", f"This endpoint needs the {self._header} header.")
        found: Identity | None = None
        for key, user, tenant in self._keys:
            if hmac.compare_digest(key, presented.encode()):
                found = Identity(user, tenant)
        if found is None:
            raise _refuse("invalid_credentials", "The API key is not valid.")
        return found

    def openapi_security(self) -> dict[str, dict[str, Any]]:
        """The OpenAPI security scheme: an API key in the provider's header."""
        return {"ApiKeys": {"type": "apiKey", "in": "header", "name": self._header}}
