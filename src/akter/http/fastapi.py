"""akter inside a FastAPI app: one OpenAPI document, one ``/docs``, akter's problem+json errors.

One call, :func:`install`, serves a runtime's routes in a FastAPI app::

    api = FastAPI(title="shop", lifespan=lifespan)  # the lifespan starts and drains the runtime
    akter.http.fastapi.install(api, runtime, auth=auth)  # akter's routes under /akter

It mounts :func:`akter.http.app` under ``prefix`` (without its own ``/openapi.json`` and
``/docs``), adds akter's paths (under the prefix), schemas and security schemes to the app's
OpenAPI document, so the app's ``/docs`` shows everything, and installs :func:`install_errors`:
an :class:`~akter.errors.ActorError` or :class:`~akter.errors.DeclaredError` raised in the app's
own routes (an in-process call refused by an actor) is answered with the same problem+json body
and status as akter's routes answer it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from akter.errors import ActorError, ConfigurationError, DeclaredError
from akter.http.app import MAX_BODY_BYTES, app
from akter.http.auth import AuthProvider
from akter.http.console import Console
from akter.http.openapi import document
from akter.http.problems import from_actor_error, from_declared
from akter.http.timeouts import BODY_TIMEOUT

if TYPE_CHECKING:
    from fastapi import FastAPI

    from akter.runtime import Runtime


def install(
    api: FastAPI,
    runtime: Runtime,
    *,
    auth: AuthProvider | None = None,
    prefix: str = "/akter",
    max_body_bytes: int = MAX_BODY_BYTES,
    allowed_origins: Sequence[str] = (),
    console: Console | None = None,
    body_timeout: float = BODY_TIMEOUT,
) -> Starlette:
    """Serve ``runtime``'s routes in ``api`` under ``prefix``, in one OpenAPI document.

    The runtime is the app's to start and drain (in its lifespan). The other arguments are
    those of :func:`akter.http.app`.

    Args:
        api: The FastAPI app.
        runtime: The runtime whose actors are served.
        auth: The auth provider of akter's routes (``None``: every caller is anonymous).
        prefix: Where akter's routes are mounted (``/akter/actors/{Type}/{id}/{command}``…).
        max_body_bytes: Largest accepted request body (413 beyond).
        allowed_origins: Browser origins allowed besides the app's own.
        console: The web console under ``{prefix}/console``, or ``None``.
        body_timeout: Seconds a request body may take to arrive.

    Returns:
        The mounted akter app.

    Raises:
        ConfigurationError: ``prefix`` is not a path such as ``/akter``; or, when the document
            is built, an akter schema has the name of a different schema of the app.
    """
    if not prefix.startswith("/") or prefix.endswith("/"):
        raise ConfigurationError(
            f"prefix={prefix!r} must start with '/' and not end with one, like '/akter'."
        )
    mounted = app(
        runtime,
        auth,
        max_body_bytes=max_body_bytes,
        allowed_origins=allowed_origins,
        title=api.title,
        console=console,
        body_timeout=body_timeout,
        openapi=False,
    )
    api.mount(prefix, mounted)
    install_errors(api)
    own = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = own()  # the app's document, which FastAPI keeps as api.openapi_schema
            try:
                merge_document(schema, document(runtime, api.title, auth), prefix)
            except ConfigurationError:
                api.openapi_schema = None
                raise
            return schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
    return mounted


def install_errors(api: Starlette) -> None:
    """Answer akter's errors raised in the app's routes as akter's routes answer them."""
    api.add_exception_handler(ActorError, _actor_error)
    api.add_exception_handler(DeclaredError, _declared_error)


def merge_document(target: dict[str, Any], akter: dict[str, Any], prefix: str) -> None:
    """Add akter's OpenAPI ``paths`` (under ``prefix``) and ``components`` to ``target``.

    Raises:
        ConfigurationError: A path or component of akter's is already in ``target``, different.
    """
    paths = target.setdefault("paths", {})
    for path, item in akter.get("paths", {}).items():
        _add(paths, prefix + path, item, "path")
    components = target.setdefault("components", {})
    for section, entries in akter.get("components", {}).items():
        into = components.setdefault(section, {})
        for name, entry in entries.items():
            _add(into, name, entry, f"components.{section} entry")


def _add(into: dict[str, Any], name: str, entry: Any, what: str) -> None:
    if name in into and into[name] != entry:
        raise ConfigurationError(
            f"The app's OpenAPI document already has a {what} {name!r} that differs from "
            "akter's; rename the app's model or route."
        )
    into[name] = entry


async def _actor_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ActorError)
    return from_actor_error(exc)


async def _declared_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, DeclaredError)
    return from_declared(exc)


__all__ = ["install", "install_errors", "merge_document"]
