"""The outcome route: a command's outcome read by its id (issue 41).

Route::

    GET /actors/{Type}/{id}/commands/{command_id}?wait=<seconds>

It answers as the command's own ``POST`` would have: 200 with its JSON value, or 422 with its
declared error. ``wait`` (default 0, at most 30 s) is how long the server waits for the receipt
(``runtime.outcome``) before it answers 404 ``Timeout``/``no_outcome`` (retryable, Retry-After
1): the command is pending, was never committed, rolled back, or is another tenant's (the actor
is the credential's tenant's: another tenant's id answers exactly as an unknown one). Once the
id has expired and its receipt was pruned: 410 ``CommandExpired``/``receipt_gone``. The read
asks the actor type's access policy with kind ``events`` (a read of what the actor committed).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Protocol

from pydantic_core import to_jsonable_python
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from akter.actor import ActorDefinition
from akter.callers import as_caller
from akter.errors import ActorError, DeclaredError
from akter.http._tracing import http_span, http_status
from akter.http.auth import Identity
from akter.http.problems import from_declared

if TYPE_CHECKING:
    from akter.runtime import Runtime

#: The longest wait a request may ask for, in seconds.
MAX_WAIT = 30.0
_COMMAND_ID = re.compile(r"^[!-~]{1,200}$")


class Host(Protocol):
    """What the route uses of the app (``akter.http.app``'s ``_Api``)."""

    runtime: Runtime

    async def identity(self, request: Request) -> Identity: ...

    def refused(self, request: Request, exc: ActorError) -> Response: ...

    def resolve(self, request: Request) -> tuple[ActorDefinition, str]: ...


def outcome_route(host: Host) -> Route:
    """``GET /actors/{type}/{id}/commands/{command_id}``."""

    async def outcome(request: Request) -> Response:
        with http_span("GET", "/actors/{type}/{id}/commands/{command_id}", request.headers) as s:
            response = await _outcome(host, request)
            http_status(s, response.status_code)
            return response

    return Route("/actors/{type}/{id:path}/commands/{command_id}", outcome, methods=["GET"])


async def _outcome(host: Host, request: Request) -> Response:
    try:
        identity = await host.identity(request)
        definition, actor_id = host.resolve(request)
        ref = host.runtime.ref(definition.name, actor_id, tenant=identity.tenant)
        command_id = request.path_params["command_id"]
        if not _COMMAND_ID.match(command_id):
            raise ActorError("InvalidCommandId", "Malformed command id.", code="malformed")
        wait = _wait(request.query_params.get("wait", "0"))
        with as_caller(identity.caller):
            value = await host.runtime.outcome(command_id, timeout=wait, ref=ref)
    except ActorError as exc:
        return host.refused(request, exc)
    except DeclaredError as exc:
        return from_declared(exc)
    return JSONResponse(to_jsonable_python(value))


def _wait(raw: str) -> float:
    try:
        wait = float(raw)
    except ValueError:
        wait = -1.0
    if not math.isfinite(wait) or not 0 <= wait <= MAX_WAIT:
        raise ActorError(
            "InvalidInput",
            f"wait must be a number of seconds from 0 to {MAX_WAIT:g}, not {raw!r}.",
            field="wait",
        )
    return wait
