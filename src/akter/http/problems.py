"""RFC 9457 problem details for every refusal, carrying akter's ``reason``.

The HTTP status of a refusal is decided here (:func:`status_of`), not by the error: an
:class:`~akter.errors.ActorError` names its ``reason`` and ``code``, and this module maps them.
A problem's ``type`` is a URI into the docs' error reference, one anchor per reason, spelled as
the reason is (``/reference/errors/#InvalidInput``); :func:`set_type_base` points it at where
the docs are served (``https://docs.example.com/akter/reference/errors/#``).
"""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from akter.errors import ActorError, DeclaredError

PROBLEM = "application/problem+json"

#: The default start of a problem's ``type``: the docs site's error reference, relative.
DEFAULT_TYPE_BASE = "/reference/errors/#"
_type_base = DEFAULT_TYPE_BASE

#: HTTP status per reason (semantics §2.9); :func:`status_of` refines some by their code.
HTTP_STATUS: dict[str, int] = {
    "ActorUnavailable": 503,
    "RunnerAtCapacity": 503,
    "Timeout": 504,
    "InvalidCommandId": 400,
    "CommandConflict": 409,
    "CommandExpired": 410,
    "NotCreated": 404,
    "Unauthorized": 403,
    "InvalidInput": 400,
    "Defect": 500,
    "UnknownCursor": 400,
    "RetentionGap": 410,
    "LeaseLost": 409,
    "StateTooNew": 503,
}

#: ``InvalidInput`` codes answered with a status of their own.
_INVALID_INPUT_STATUS: dict[str, int] = {
    "body_too_large": 413,
    "unsupported_media_type": 415,
    "body_timeout": 408,
    "unknown_type": 404,
    "unknown_member": 404,
    "unknown_job": 404,
    "unknown_table": 404,
    "unknown_workflow_run": 404,
    "workflow_finished": 409,
}

#: ``Unauthorized`` codes that mean "no valid credentials" (401) rather than "not allowed" (403).
#: ``Unauthorized`` codes of a request that lacks a credential (401; the others are 403): a
#: caller's, or the local console's own token (the page cannot sign in for it).
_UNAUTHENTICATED = frozenset(
    {
        "missing_credentials",
        "invalid_credentials",
        "expired",
        "console_token_missing",
        "console_token_invalid",
    }
)


def status_of(error: ActorError) -> int:
    """The HTTP status a framework refusal is answered with."""
    if error.reason == "Unauthorized":
        return 401 if error.code in _UNAUTHENTICATED else 403
    if error.reason == "Timeout" and error.code == "no_outcome":
        return 404  # an outcome read: nothing holds the id yet (or it is another tenant's)
    if error.reason == "InvalidInput" and error.code in _INVALID_INPUT_STATUS:
        return _INVALID_INPUT_STATUS[error.code]
    return HTTP_STATUS[error.reason]


def set_type_base(base: str) -> None:
    """Start every problem's ``type`` with ``base`` (then the reason, in lower case).

    Example: ``set_type_base("https://docs.example.com/akter/reference/errors/#")``. The default
    is :data:`DEFAULT_TYPE_BASE`, the error reference of the docs site, relative.
    """
    global _type_base
    _type_base = base


def type_uri(reason: str) -> str:
    """The ``type`` URI of a problem with ``reason``: its entry in the docs' error reference."""
    return f"{_type_base}{reason}"


def problem(
    status: int,
    reason: str,
    detail: str,
    *,
    code: str | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A problem+json response."""
    body: dict[str, Any] = {
        "type": type_uri(reason),
        "title": reason,
        "status": status,
        "detail": detail,
        "reason": reason,
    }
    if code is not None:
        body["code"] = code
    body.update(extra or {})
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def from_actor_error(error: ActorError) -> JSONResponse:
    """The problem for a framework refusal; retryable ones carry ``Retry-After``."""
    extra: dict[str, Any] = {"retryable": error.retryable}
    headers: dict[str, str] = {}
    if error.command_id is not None:
        extra["command_id"] = error.command_id
    if error.field is not None:
        extra["field"] = error.field
    if error.retry_after is not None:
        extra["retry_after"] = error.retry_after
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    status = status_of(error)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem(
        status, error.reason, error.message, code=error.code, extra=extra, headers=headers
    )


def from_declared(error: DeclaredError) -> JSONResponse:
    """A declared business error: 422 with its tag and fields."""
    return problem(
        422,
        "DeclaredError",
        str(error),
        extra={"error": type(error).tag, "fields": error.fields},
    )


__all__ = [
    "DEFAULT_TYPE_BASE",
    "HTTP_STATUS",
    "PROBLEM",
    "from_actor_error",
    "from_declared",
    "problem",
    "set_type_base",
    "status_of",
    "type_uri",
]
