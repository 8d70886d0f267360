"""The console's workflow runs (the workflows spec W4): an actor's runs and one run's timeline.

Routes, behind the same guard as every console API route (:mod:`akter.http.console.guard`)::

    GET  /console/api/actor/workflows?type=&id=&tenant=&limit=   one actor's runs, newest first
    GET  /console/api/workflows/{run_id}     one run: status, wake condition, steps, signals

A run's ``wake`` tells what a suspended run waits for (``waiting``: a signal's name, a job, a
sleep) and until when it waits by itself (``until``: the end of its sleep, wait timeout or
deadline; ``null`` while only a signal, a job outcome or a cancel wakes it). Times are ISO 8601.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from akter.callers import ActorRef, System
from akter.errors import ActorError
from akter.http.problems import from_actor_error
from akter.operators.workflows import RunDetail, RunSummary

if TYPE_CHECKING:
    from akter.runtime import Runtime

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
#: Runs shown per actor (newest first) unless ``limit`` says otherwise, and at most.
DEFAULT_RUNS, MAX_RUNS = 50, 500


class WorkflowsApi:
    """The workflow routes on ``runtime``.

    Args:
        runtime: The runtime whose runs are shown.
        guard: Admits a request as an operator (or raises the refusal).
        ref_of: The actor a request's ``type``, ``id`` and ``tenant`` parameters name.
    """

    def __init__(
        self,
        runtime: Runtime,
        guard: Callable[[Request], Awaitable[System]],
        ref_of: Callable[[Request], ActorRef],
    ) -> None:
        self.runtime = runtime
        self.guard = guard
        self.ref_of = ref_of

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the console's."""
        return [
            Route("/console/api/actor/workflows", self.actor_runs, methods=["GET"]),
            Route("/console/api/workflows/{run_id}", self.run, methods=["GET"]),
        ]

    async def actor_runs(self, request: Request) -> Response:
        """``GET /console/api/actor/workflows``: one actor's runs, newest first."""
        try:
            await self.guard(request)
            ref = self.ref_of(request)
            runs = await self.runtime.operators.workflows.actor_runs(ref, _limit(request))
            return _json({"ref": ref.to_json(), "runs": [summary_json(r) for r in runs]})
        except ActorError as exc:
            return from_actor_error(exc)

    async def run(self, request: Request) -> Response:
        """``GET /console/api/workflows/{run_id}``: the run, its step timeline and signals."""
        try:
            await self.guard(request)
            detail = await self.runtime.operators.workflows.detail(request.path_params["run_id"])
            return _json(detail_json(detail))
        except ActorError as exc:
            return from_actor_error(exc)


def wake_json(status: str, waiting: str | None, wake_at_ms: int | None) -> dict[str, Any] | None:
    """What a suspended run waits for and until when; ``None`` for other statuses."""
    if status != "suspended":
        return None
    return {"waiting": waiting, "until": _iso(wake_at_ms)}


def summary_json(r: RunSummary) -> dict[str, Any]:
    """A listed run as the console shows it."""
    return {
        "run_id": r.run_id,
        "ref": r.actor.to_json(),
        "workflow": r.workflow,
        "key": r.key,
        "status": r.status,
        "wake": wake_json(r.status, r.waiting, r.wake_at_ms),
        "cancel_requested": r.cancel_requested,
        "attempts": r.attempts,
        "started_at": _iso(r.started_at_ms),
        "updated_at": _iso(r.updated_at_ms),
        "finished_at": _iso(r.finished_at_ms),
        "error": None if r.error is None else r.error.model_dump(mode="json"),
    }


def detail_json(d: RunDetail) -> dict[str, Any]:
    """One run as the console shows it: the summary's fields, its steps and signals."""
    s = d.status
    return {
        "run_id": s.run_id,
        "ref": s.actor.to_json(),
        "workflow": s.workflow,
        "key": s.key,
        "status": s.status,
        "wake": wake_json(s.status, s.waiting, d.wake_at_ms),
        "deadline": None if s.finished else _iso(d.deadline_ms),
        "cancel_requested": s.cancel_requested,
        "attempts": s.attempts,
        "result": s.result,
        "error": None if s.error is None else s.error.model_dump(mode="json"),
        "started_at": _iso(s.started_at_ms),
        "updated_at": _iso(s.updated_at_ms),
        "finished_at": _iso(s.finished_at_ms),
        "steps": [
            {
                "seq": step.seq,
                "kind": step.kind,
                "name": step.name,
                "status": step.status,
                "detail": step.detail,
                "outcome": step.outcome,
                "started_at": _iso(step.started_at_ms),
                "recorded_at": _iso(step.recorded_at_ms),
            }
            for step in s.steps
        ],
        "signals": [
            {
                "signal_id": g.signal_id,
                "name": g.name,
                "payload": g.payload,
                "state": g.state,
                "consumed_seq": g.consumed_seq,
                "sent_at": _iso(g.sent_at_ms),
            }
            for g in d.signals
        ],
    }


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_RUNS
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_RUNS:
        raise ActorError(
            "InvalidInput", f"limit must be an integer from 1 to {MAX_RUNS}.", field="limit"
        )
    return int(raw)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=_HEADERS)
