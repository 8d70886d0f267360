"""HTTP surface: ``akter.http.app(runtime, auth=..., console=...)``, auth providers, the console."""

from akter._extras import require_extra

try:
    from akter.http.app import app
    from akter.http.auth import ApiKeys, AuthProvider, BearerJWT, Identity, anonymous
    from akter.http.console import Console
    from akter.http.openapi import document
except ModuleNotFoundError as exc:  # starlette, pyjwt, ...: pip install 'akter[http]'
    require_extra(exc, "akter.http", "http")
    raise

__all__ = [
    "ApiKeys",
    "AuthProvider",
    "BearerJWT",
    "Console",
    "Identity",
    "anonymous",
    "app",
    "document",
]
