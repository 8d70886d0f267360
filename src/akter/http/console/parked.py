"""The console's "Parked" view (evolution E3): parked outbox rows, with retry and discard.

Routes, behind the same guard as every console API route (:mod:`akter.http.console.guard`)::

    GET  /console/api/parked                 parked rows, oldest parking first
    POST /console/api/parked/{id}/retry      as ``akter outbox retry ID``
    POST /console/api/parked/{id}/discard    as ``akter outbox discard ID``; body {"reason": ...}

A discard is audited under the operator's principal (``v_operator_audit``); it needs a reason.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from akter.callers import System, as_caller
from akter.errors import ActorError
from akter.http.problems import from_actor_error

if TYPE_CHECKING:
    from akter.runtime import Runtime

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class ParkedApi:
    """The parked-row routes on ``runtime``; ``guard`` admits a request as an operator."""

    def __init__(self, runtime: Runtime, guard: Callable[[Request], Awaitable[System]]) -> None:
        self.runtime = runtime
        self.guard = guard

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the console's."""
        return [
            Route("/console/api/parked", self.parked, methods=["GET"]),
            Route("/console/api/parked/{row_id}/retry", self.retry, methods=["POST"]),
            Route("/console/api/parked/{row_id}/discard", self.discard, methods=["POST"]),
        ]

    async def parked(self, request: Request) -> Response:
        """``GET /console/api/parked``: parked rows, oldest parking first."""
        try:
            await self.guard(request)
            rows = await self.runtime.operators.outbox.parked()
            return _json({"parked": [r.to_json() for r in rows]})
        except ActorError as exc:
            return from_actor_error(exc)

    async def retry(self, request: Request) -> Response:
        """``POST .../{row_id}/retry``: make the row due now."""
        try:
            await self.guard(request)
            row_id = request.path_params["row_id"]
            done = await self.runtime.operators.outbox.retry([row_id])
            return _json({"id": row_id, "retried": done})
        except ActorError as exc:
            return from_actor_error(exc)

    async def discard(self, request: Request) -> Response:
        """``POST .../{row_id}/discard``: delete the row, audited with the reason given."""
        try:
            caller = await self.guard(request)
            row_id = request.path_params["row_id"]
            reason = await _reason(request)
            # Audited as the operator the guard admitted (its principal), not as the console.
            with as_caller(caller):
                done = await self.runtime.operators.outbox.discard([row_id], reason=reason)
            return _json({"id": row_id, "discarded": done})
        except ActorError as exc:
            return from_actor_error(exc)


async def _reason(request: Request) -> str:
    raw = await request.body()
    try:
        body: Any = json.loads(raw or b"{}")
    except ValueError:
        body = None
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip():
        raise ActorError(
            "InvalidInput",
            'Discarding a parked row needs a reason: send {"reason": "..."}.',
            field="reason",
        )
    return reason


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=_HEADERS)
