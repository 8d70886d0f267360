"""RFC 9457 problem details for every refusal, carrying akter's ``reason``."""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from akter.errors import ActorError, DeclaredError

PROBLEM = "application/problem+json"


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
        "type": f"https://akter.dev/problems/{reason}",
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
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem(
        error.status, error.reason, error.message, code=error.code, extra=extra, headers=headers
    )


def from_declared(error: DeclaredError) -> JSONResponse:
    """A declared business error: 422 with its tag and fields."""
    return problem(
        422,
        "DeclaredError",
        str(error),
        extra={"error": type(error).tag, "fields": error.fields},
    )
