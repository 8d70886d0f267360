"""The console's routes: the static page, its JSON reads, live feeds and dead-letter operations.

Routes (present only when the app was built with ``console=``)::

    GET  /console/                         the page; /console redirects here
    GET  /console/static/{name}            console.js, console.css
    GET  /console/api/overview             actor types with counts; outbox, job and letter totals
    GET  /console/api/actors?type=&tenant=&after=&limit=     one page of a type's actors
    GET  /console/api/actor?type=&id=&tenant=                state, version, events, outbox
    GET  /console/api/actor/events?type=&id=&tenant=&after=  server-sent events, live
    GET  /console/api/actor/state?type=&id=&tenant=  the actor's row after each commit, live
    GET  /console/api/outbox?limit=        pending intents, timers and ticks, oldest due first
    GET  /console/api/jobs?limit=          job rows and their status
    GET  /console/api/jobs/progress?type=&id=&tenant=&job_id=  server-sent progress frames
    GET  /console/api/jobs/stream?type=&id=&tenant=&job_id=&after=  a job's output, live
    GET  /console/api/dead-letters?limit=  dead letters, newest first
    POST /console/api/dead-letters/{job_id}/retry    as ``akter dead-letters retry``
    POST /console/api/dead-letters/{job_id}/discard  as ``akter dead-letters discard``
    GET  /console/api/actor/workflows?type=&id=&tenant=  one actor's workflow runs
    GET  /console/api/workflows/{run_id}   one run: wake condition, step timeline, signals
    GET  /console/api/series?minutes=      the overview's charts (:mod:`.runs`)
    GET  /console/api/runs?status=&workflow=&type=&tenant=   runs across actors
    POST /console/api/workflows/{run_id}/signal|cancel|retry  operate a run
    GET  /console/api/tables, /console/api/table?table=&tenant=...  owned rows (:mod:`.tables`)

Every API request first passes :func:`akter.http.console.guard.operator` (the console header,
its own page as the sender, loopback and token for ``Console.local()``, then the auth provider and
the console's rule: 401 or 403 otherwise). Reads and feeds then run as a ``System`` caller: the
console sees every tenant and every actor type. Every console statement runs under a
transaction-local ``statement_timeout`` (``STATEMENT_TIMEOUT_MS``; 504 past it, see
:mod:`akter.operators.actors`) and the overview's counts stop at ``COUNT_CAP``.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from akter.callers import ActorRef, System, as_caller
from akter.errors import ActorError
from akter.http._sse import MEDIA_TYPE, event_stream, gap, once, progress_stream
from akter.http.auth import AuthProvider
from akter.http.console import Console
from akter.http.console.guard import operator
from akter.http.console.live import LiveApi, row_json
from akter.http.console.parked import ParkedApi
from akter.http.console.runs import RunsApi
from akter.http.console.tables import TablesApi
from akter.http.console.workflows import WorkflowsApi
from akter.http.problems import from_actor_error
from akter.operators.dead_letters import Letter

if TYPE_CHECKING:
    from akter.runtime import Runtime

DEFAULT_LIMIT = 100
#: Counts shown by the overview stop here (the page shows "10,000+").
COUNT_CAP = 10_000
#: Every console statement runs under this transaction-local ``statement_timeout``.
STATEMENT_TIMEOUT_MS = 2_000
MAX_LIMIT = 500
#: Events shown with an actor; newer ones arrive on the live feed.
RECENT_EVENTS = 50

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_API_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_SSE_HEADERS = {**_API_HEADERS, "X-Accel-Buffering": "no"}


@cache
def _asset(name: str) -> bytes:
    return resources.files("akter.http.console").joinpath("static", name).read_bytes()


class ConsoleApi:
    """The console's routes on ``runtime``, guarded by ``auth`` and ``console``."""

    def __init__(self, runtime: Runtime, auth: AuthProvider, console: Console) -> None:
        self.runtime = runtime
        self.auth = auth
        self.console = console

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes, to add to the app's router."""
        return [
            Route("/console", self.redirect, methods=["GET"]),
            Route("/console/", self.page, methods=["GET"]),
            Route("/console/static/{name}", self.static, methods=["GET"]),
            Route("/console/api/overview", self.overview, methods=["GET"]),
            Route("/console/api/actors", self.actors, methods=["GET"]),
            Route("/console/api/actor", self.actor, methods=["GET"]),
            Route("/console/api/actor/events", self.events, methods=["GET"]),
            Route("/console/api/outbox", self.outbox, methods=["GET"]),
            Route("/console/api/jobs", self.jobs, methods=["GET"]),
            Route("/console/api/jobs/progress", self.progress, methods=["GET"]),
            Route("/console/api/dead-letters", self.letters, methods=["GET"]),
            Route("/console/api/dead-letters/{job_id}/retry", self.retry, methods=["POST"]),
            Route("/console/api/dead-letters/{job_id}/discard", self.discard, methods=["POST"]),
            *ParkedApi(self.runtime, self._operator).routes(),
            Route("/console/api/subscriptions", self.subscriptions, methods=["GET"]),
            *WorkflowsApi(self.runtime, self._operator, self._ref).routes(),
            *RunsApi(self.runtime, self._operator).routes(),
            *LiveApi(self.runtime, self._operator, self._ref).routes(),
            *TablesApi(self.runtime, self._operator).routes(),
        ]

    # --- the guard ----------------------------------------------------------------------------

    async def _operator(self, request: Request) -> System:
        """The caller a console request runs as, once every check has passed (:mod:`.guard`)."""
        return await operator(request, self.auth, self.console)

    # --- the page -----------------------------------------------------------------------------

    async def redirect(self, request: Request) -> Response:
        """``GET /console``: to ``/console/``."""
        # Relative, so the page's relative URLs work wherever the app is mounted.
        return RedirectResponse("console/", status_code=308)

    async def page(self, request: Request) -> Response:
        """``GET /console/``: the page."""
        return Response(
            _asset("index.html"), media_type=_ASSETS["index.html"], headers=_PAGE_HEADERS
        )

    async def static(self, request: Request) -> Response:
        """``GET /console/static/{name}``: the page's script and style sheet."""
        name = request.path_params["name"]
        if name not in _ASSETS or name == "index.html":
            return Response(status_code=404, headers=_API_HEADERS)
        return Response(_asset(name), media_type=_ASSETS[name], headers=_PAGE_HEADERS)

    # --- reads --------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        """``GET /console/api/overview``: actor types with counts, and the totals.

        Counts are bounded (``COUNT_CAP``): the per-type counts come from at most that many
        rows of the actors table, and each total counts at most that many rows; a count that
        reached the cap is reported as the cap with ``capped`` true (the page shows "10,000+").
        """
        try:
            await self._operator(request)
            actors, cap = self.runtime.operators.actors, COUNT_CAP + 1
            rows = await actors.types(cap, STATEMENT_TIMEOUT_MS)
            sampled = sum(row["actors"] for row in rows) > COUNT_CAP
            types: dict[str, dict[str, Any]] = {
                name: {
                    "type": name,
                    "hosted": True,
                    "singleton": d.singleton,
                    "actors": 0,
                    "capped": sampled,
                }
                for name, d in self.runtime.definitions.items()
            }
            for row in rows:
                entry = types.setdefault(
                    row["actor_type"],
                    {"type": row["actor_type"], "hosted": False, "singleton": False},
                )
                entry.update(
                    actors=min(row["actors"], COUNT_CAP), tenants=row["tenants"], capped=sampled
                )
            totals = await actors.totals(cap, STATEMENT_TIMEOUT_MS)
            return _json(
                {
                    "types": sorted(types.values(), key=lambda t: t["type"]),
                    **{name: min(n, COUNT_CAP) for name, n in totals.items()},
                    "capped": {name: n > COUNT_CAP for name, n in totals.items()},
                    "count_cap": COUNT_CAP,
                }
            )
        except ActorError as exc:
            return from_actor_error(exc)

    async def subscriptions(self, request: Request) -> Response:
        """``GET /console/api/subscriptions``: per subscription, its feeds with work and lag."""
        try:
            await self._operator(request)
            return _json({"subscriptions": await self.runtime.operators.actors.subscriptions()})
        except ActorError as exc:
            return from_actor_error(exc)

    async def actors(self, request: Request) -> Response:
        """``GET /console/api/actors``: one page of a type's actors, by (tenant, id)."""
        try:
            await self._operator(request)
            definition = self.runtime.definition(_param(request, "type"))
            tenant = request.query_params.get("tenant") or None
            after_tenant, after_id = _decode_cursor(request.query_params.get("after"))
            limit = _limit(request)
            rows = await self.runtime.operators.actors.page(
                definition.name,
                tenant,
                (after_tenant, after_id),
                limit + 1,
                STATEMENT_TIMEOUT_MS,
            )
            page = rows[:limit]
            actors = [
                {
                    "tenant": r["tenant_id"],
                    "id": r["actor_id"],
                    "version": r["version"],
                    "created": r["created"],
                    "event_seq": r["event_seq"],
                    "updated_at": _iso(r["updated_at_ms"]),
                }
                for r in page
            ]
            more = len(rows) > limit
            last = page[-1] if page else None
            cursor = _encode_cursor(last["tenant_id"], last["actor_id"]) if more and last else None
            return _json({"type": definition.name, "actors": actors, "next": cursor})
        except ActorError as exc:
            return from_actor_error(exc)

    async def actor(self, request: Request) -> Response:
        """``GET /console/api/actor``: one actor's row, newest events and outbox rows."""
        try:
            await self._operator(request)
            ref = self._ref(request)
            actors, timeout = self.runtime.operators.actors, STATEMENT_TIMEOUT_MS
            row = await actors.row(ref, timeout)
            events = await actors.recent_events(ref, RECENT_EVENTS, timeout)
            outbox = await actors.outbox(ref, timeout)
            body: dict[str, Any] = {
                "ref": ref.to_json(),
                **row_json(row),
                "code_state_version": self.runtime.definition(ref.type).state_version,
                "events": [
                    {
                        "cursor": str(e["seq"]),
                        "tag": e["tag"],
                        "event": e["payload"],  # as stored: the operator sees the row
                        "version": e["payload_version"],
                        "command_id": e["command_id"],
                        "emitted_at": _iso(e["emitted_at_ms"]),
                    }
                    for e in events
                ],
                "outbox": [
                    {
                        "id": o["intent_id"],
                        "role": o["role"],
                        "target": {"type": o["target_type"], "id": o["target_id"]},
                        "command": o["command"],
                        "attempts": o["attempts"],
                        "last_error": o["last_error"],
                        "running": o["running"],
                        "cancelled": o["cancelled_at_ms"] is not None,
                        "due_at": _iso(o["due_at_ms"]),
                    }
                    for o in outbox
                ],
            }
            return _json(body)
        except ActorError as exc:
            return from_actor_error(exc)

    async def outbox(self, request: Request) -> Response:
        """``GET /console/api/outbox``: pending intents, timers and ticks."""
        try:
            await self._operator(request)
            rows = await self.runtime.operators.outbox.pending(
                _limit(request), STATEMENT_TIMEOUT_MS
            )
            return _json(
                {
                    "outbox": [
                        {
                            "id": r["intent_id"],
                            "role": r["role"],
                            "sender": _ref_json(r["tenant_id"], r["actor_type"], r["actor_id"]),
                            "target": {"type": r["target_type"], "id": r["target_id"]},
                            "command": r["command"],
                            "attempts": r["attempts"],
                            "last_error": r["last_error"],
                            "timer_key": r["timer_key"],
                            "due_at": _iso(r["due_at_ms"]),
                            "scheduled_at": _iso(r["scheduled_at_ms"]),
                        }
                        for r in rows
                    ]
                }
            )
        except ActorError as exc:
            return from_actor_error(exc)

    async def jobs(self, request: Request) -> Response:
        """``GET /console/api/jobs``: job rows and their status."""
        try:
            await self._operator(request)
            rows = await self.runtime.operators.jobs.recent(_limit(request), STATEMENT_TIMEOUT_MS)
            return _json(
                {
                    "jobs": [
                        {
                            "job_id": r["job_id"],
                            "ref": _ref_json(r["tenant_id"], r["actor_type"], r["actor_id"]),
                            "job": r["job"],
                            "status": r["status"],
                            "attempts": r["attempts"],
                            "ambiguous": r["ambiguous"],
                            "maybe_applied": r["maybe_applied"],
                            "last_error": r["last_error"],
                            "due_at": _iso(r["due_at_ms"]),
                            "scheduled_at": _iso(r["scheduled_at_ms"]),
                        }
                        for r in rows
                    ]
                }
            )
        except ActorError as exc:
            return from_actor_error(exc)

    async def letters(self, request: Request) -> Response:
        """``GET /console/api/dead-letters``: dead letters, newest first."""
        try:
            await self._operator(request)
            letters = await self.runtime.operators.dead_letters.list(_limit(request))
            return _json({"dead_letters": [_letter(letter) for letter in letters]})
        except ActorError as exc:
            return from_actor_error(exc)

    # --- live feeds ---------------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        """``GET /console/api/actor/events``: the actor's events, live (SSE)."""
        try:
            caller = await self._operator(request)
            ref = self._ref(request)
            after = request.headers.get("last-event-id") or request.query_params.get("after")
            with as_caller(caller):
                # Validate the cursor before the stream starts: refusals stay 4xx.
                try:
                    await self.runtime.read_events(ref, after, 1)
                except ActorError as exc:
                    if exc.reason != "RetentionGap":
                        raise
                    return once([gap(exc)], _SSE_HEADERS)
        except ActorError as exc:
            return from_actor_error(exc)
        return StreamingResponse(
            event_stream(self.runtime, ref, after, caller),
            media_type=MEDIA_TYPE,
            headers=_SSE_HEADERS,
        )

    async def progress(self, request: Request) -> Response:
        """``GET /console/api/jobs/progress``: a job's progress frames, then its close (SSE)."""
        try:
            caller = await self._operator(request)
            ref = self._ref(request)
            with as_caller(caller):
                jobs = self.runtime.operators.jobs
                messages = await jobs.progress(ref, _param(request, "job_id"))
        except ActorError as exc:
            return from_actor_error(exc)
        return StreamingResponse(
            progress_stream(messages), media_type=MEDIA_TYPE, headers=_SSE_HEADERS
        )

    # --- operations ---------------------------------------------------------------------------

    async def retry(self, request: Request) -> Response:
        """``POST .../{job_id}/retry``: re-enqueue the letter as a new job (as the CLI does)."""
        try:
            await self._operator(request)
            job_id = request.path_params["job_id"]
            new_id = await self.runtime.operators.dead_letters.retry(job_id)
            return _json({"job_id": job_id, "new_job_id": new_id})
        except ActorError as exc:
            return from_actor_error(exc)

    async def discard(self, request: Request) -> Response:
        """``POST .../{job_id}/discard``: delete the letter (as the CLI does)."""
        try:
            await self._operator(request)
            letter = await self.runtime.operators.dead_letters.discard(
                request.path_params["job_id"]
            )
            return _json({"discarded": _letter(letter)})
        except ActorError as exc:
            return from_actor_error(exc)

    # --- helpers ------------------------------------------------------------------------------

    def _ref(self, request: Request) -> ActorRef:
        definition = self.runtime.definition(_param(request, "type"))
        raw = request.query_params.get("id", "")
        actor_id = "" if definition.singleton and raw in ("", "_") else raw
        tenant = request.query_params.get("tenant") or "default"
        return self.runtime.ref(definition.name, actor_id, tenant=tenant)


def _param(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise ActorError("InvalidInput", f"The {name!r} query parameter is required.", field=name)
    return value


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ActorError(
            "InvalidInput", f"limit must be an integer from 1 to {MAX_LIMIT}.", field="limit"
        )
    return int(raw)


def _encode_cursor(tenant: str, actor_id: str) -> str:
    raw = json.dumps([tenant, actor_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> tuple[str, str]:
    if not cursor:
        return "", ""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tenant, actor_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise ActorError(
            "InvalidInput", "The 'after' cursor is not one this console made.", field="after"
        ) from None
    if not isinstance(tenant, str) or not isinstance(actor_id, str):
        raise ActorError(
            "InvalidInput", "The 'after' cursor is not one this console made.", field="after"
        )
    return tenant, actor_id


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _ref_json(tenant: str, actor_type: str, actor_id: str) -> dict[str, str]:
    return ActorRef(tenant, actor_type, actor_id).to_json()


def _letter(letter: Letter) -> dict[str, Any]:
    # The same fields as 'akter dead-letters show'.
    return {**letter.to_json(), "dead_at": _iso(letter.dead_at_ms)}


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers=_API_HEADERS)
