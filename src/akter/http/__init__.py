"""HTTP surface: ``akter.http.app(runtime, auth=...)`` and the ready-made auth providers."""

from akter.http.app import app
from akter.http.auth import ApiKeys, AuthProvider, BearerJWT, Identity, anonymous
from akter.http.openapi import document

__all__ = ["ApiKeys", "AuthProvider", "BearerJWT", "Identity", "anonymous", "app", "document"]
