"""The console's overview charts and its workflows tab: runs across actors and their actions.

Routes, behind the same guard as every console API route (:mod:`akter.http.console.guard`)::

    GET  /console/api/series?minutes=      the overview's chart points of the last hour
    GET  /console/api/runs?status=&workflow=&type=&tenant=&limit=   runs, newest first
    POST /console/api/workflows/{run_id}/signal   body {"name": ..., "payload": {...}}
    POST /console/api/workflows/{run_id}/cancel   as ``akter workflows cancel``
    POST /console/api/workflows/{run_id}/retry    as ``akter workflows retry`` (a diverged run)

The series are this runner's own (``runtime.history``: commands committed per second, job
outcomes and ended runs per interval) and the deployment's sampled gauges (relay lag, outbox
backlog, runs running and suspended), which only the ``$maintenance`` owner reports: on another
runner they are ``null`` and the page says so.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, get_args

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from akter.callers import System
from akter.errors import ActorError
from akter.http.console.workflows import summary_json
from akter.http.problems import from_actor_error
from akter.workflows import RunStatus

if TYPE_CHECKING:
    from akter.runtime import Runtime

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
#: Runs listed unless ``limit`` says otherwise, and at most.
DEFAULT_RUNS, MAX_RUNS = 100, 500
#: The longest window of chart points (the history keeps an hour).
MAX_MINUTES = 60


class RunsApi:
    """The overview's series and the workflows tab's routes on ``runtime``.

    Args:
        runtime: The runtime whose history and runs are shown.
        guard: Admits a request as an operator (or raises the refusal).
    """

    def __init__(self, runtime: Runtime, guard: Callable[[Request], Awaitable[System]]) -> None:
        self.runtime = runtime
        self.guard = guard

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the console's."""
        return [
            Route("/console/api/series", self.series, methods=["GET"]),
            Route("/console/api/runs", self.runs, methods=["GET"]),
            Route("/console/api/workflows/{run_id}/signal", self.signal, methods=["POST"]),
            Route("/console/api/workflows/{run_id}/cancel", self.cancel, methods=["POST"]),
            Route("/console/api/workflows/{run_id}/retry", self.retry, methods=["POST"]),
        ]

    async def series(self, request: Request) -> Response:
        """``GET /console/api/series``: the chart points of the last ``minutes`` (default 60)."""
        try:
            await self.guard(request)
            minutes = _int(request, "minutes", 60, MAX_MINUTES)
            history = self.runtime.history
            points = history.series()
            if points:
                since = points[-1]["at_ms"] - minutes * 60_000
                points = [p for p in points if p["at_ms"] > since]
            sampled = any(p["outbox_rows"] is not None for p in points)
            return _json({"every_s": history.every_s, "sampled": sampled, "points": points})
        except ActorError as exc:
            return from_actor_error(exc)

    async def runs(self, request: Request) -> Response:
        """``GET /console/api/runs``: runs across actors, newest first, filtered."""
        try:
            await self.guard(request)
            status = request.query_params.get("status") or None
            if status is not None and status not in get_args(RunStatus):
                raise ActorError(
                    "InvalidInput",
                    f"status takes one of {', '.join(get_args(RunStatus))}, not {status!r}.",
                    field="status",
                )
            runs = await self.runtime.workflows.runs(
                status=status,
                actor_type=request.query_params.get("type") or None,
                workflow=request.query_params.get("workflow") or None,
                tenant=request.query_params.get("tenant") or None,
                limit=_int(request, "limit", DEFAULT_RUNS, MAX_RUNS),
            )
            return _json({"runs": [summary_json(r) for r in runs]})
        except ActorError as exc:
            return from_actor_error(exc)

    async def signal(self, request: Request) -> Response:
        """``POST .../{run_id}/signal``: keep a signal for the run (validated by its wait)."""
        try:
            await self.guard(request)
            run_id = request.path_params["run_id"]
            name, payload = await _signal(request)
            await self.runtime.workflows.signal_json(run_id, name, payload)
            return _json({"run_id": run_id, "signal": name})
        except ActorError as exc:
            return from_actor_error(exc)

    async def cancel(self, request: Request) -> Response:
        """``POST .../{run_id}/cancel``: ``requested``, or ``cancelled`` for a diverged run."""
        try:
            await self.guard(request)
            run_id = request.path_params["run_id"]
            outcome = await self.runtime.workflows.operator_cancel(run_id)
            return _json({"run_id": run_id, "cancel": outcome})
        except ActorError as exc:
            return from_actor_error(exc)

    async def retry(self, request: Request) -> Response:
        """``POST .../{run_id}/retry``: make a diverged run runnable again."""
        try:
            await self.guard(request)
            run_id = request.path_params["run_id"]
            retried = await self.runtime.workflows.retry(run_id)
            return _json({"run_id": run_id, "retried": retried})
        except ActorError as exc:
            return from_actor_error(exc)


async def _signal(request: Request) -> tuple[str, dict[str, Any]]:
    try:
        body: Any = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    name = body.get("name") if isinstance(body, dict) else None
    payload = body.get("payload", {}) if isinstance(body, dict) else None
    if not isinstance(name, str) or not isinstance(payload, dict):
        raise ActorError(
            "InvalidInput",
            'A signal is sent as {"name": "Shipped", "payload": {...}}.',
            field="name",
            code="invalid_signal",
        )
    return name, payload


def _int(request: Request, name: str, default: int, most: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ActorError("InvalidInput", f"{name} must be an integer from 1 to {most}.", field=name)
    return int(raw)


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=_HEADERS)
