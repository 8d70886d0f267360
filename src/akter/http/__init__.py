"""HTTP surface: ``akter.http.app(runtime, auth=..., console=...)``, auth providers, the console."""

from akter.http.app import app
from akter.http.auth import ApiKeys, AuthProvider, BearerJWT, Identity, anonymous
from akter.http.console import Console
from akter.http.openapi import document

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
