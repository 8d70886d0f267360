"""The console's routes: the static page, its JSON reads, live feeds and dead-letter operations.

Routes (present only when the app was built with ``console=``)::

    GET  /console/                         the page; /console redirects here
    GET  /console/static/{name}            console.js, console.css
    GET  /console/api/overview             actor types with counts; outbox, job and letter totals
    GET  /console/api/actors?type=&tenant=&after=&limit=     one page of a type's actors
    GET  /console/api/actor?type=&id=&tenant=                state, version, events, outbox
    GET  /console/api/actor/events?type=&id=&tenant=&after=  server-sent events, live
    GET  /console/api/outbox?limit=        pending intents, timers and ticks, oldest due first
    GET  /console/api/jobs?limit=          job rows and their status
    GET  /console/api/jobs/progress?type=&id=&tenant=&job_id=  server-sent progress frames
    GET  /console/api/dead-letters?limit=  dead letters, newest first
    POST /console/api/dead-letters/{job_id}/retry    as ``akter dead-letters retry``
    POST /console/api/dead-letters/{job_id}/discard  as ``akter dead-letters discard``

Every API request must carry ``X-Akter-Console: 1`` (the page sets it; a cross-site page cannot
send it without a CORS preflight this app never grants) and must come from the console's own page:
``Sec-Fetch-Site`` ``same-origin`` or ``none``, or, from a browser that does not send it, an
``Origin`` whose host and port are the ``Host``'s (the scheme is not compared, so a TLS-terminating
proxy does not break it), or an origin listed in ``Console(origins=...)``; a refusal is 403. For
``Console.local()`` the request must also be a loopback request to a loopback host name, carry no
proxy forwarding header (403), and carry the process's token in ``X-Akter-Console-Token`` (401).
Then the app's auth provider establishes the caller (401 without credentials) and the console's
rule accepts it or not (403; ``Anonymous`` only with ``anonymous=True``). Reads and feeds then run
as a ``System`` caller: the console sees every tenant and every actor type. Every console statement
runs under a transaction-local ``statement_timeout`` (``STATEMENT_TIMEOUT_MS``; 504 past it) and
the overview's counts stop at ``COUNT_CAP``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from psycopg.errors import QueryCanceled
from psycopg.rows import dict_row
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from akter._engine.progress import open_progress
from akter.callers import ActorRef, System, as_caller, principal_of
from akter.dead_letters import Letter
from akter.errors import ActorError
from akter.http._sse import MEDIA_TYPE, event_stream, gap, once, progress_stream
from akter.http.auth import AuthProvider
from akter.http.console import Console
from akter.http.problems import from_actor_error

if TYPE_CHECKING:
    from akter.runtime import Runtime

#: The header every console API request carries (the CSRF defence of a same-origin page).
HEADER = "x-akter-console"
#: The header carrying the console's secret token (``Console.local()``, ``akter dev``).
TOKEN_HEADER = "x-akter-console-token"
#: Headers a reverse proxy adds; ``Console.local()`` refuses requests that carry one.
_FORWARDING = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip")
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
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
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
        ]

    # --- the guard ----------------------------------------------------------------------------

    async def _operator(self, request: Request) -> System:
        """The caller a console request runs as, once every check has passed."""
        if request.headers.get(HEADER) != "1":
            raise ActorError(
                "Unauthorized",
                "Console requests need the 'X-Akter-Console: 1' header that the console sets.",
                code="console_header_missing",
            )
        if self.console.loopback_only:
            forwarded = [name for name in _FORWARDING if name in request.headers]
            if forwarded:
                raise ActorError(
                    "Unauthorized",
                    f"This console only answers this machine directly, not through a proxy "
                    f"(the request carries {', '.join(forwarded)}).",
                    code="console_proxied",
                )
        origin = request.headers.get("origin")
        if not _same_origin(request, origin, self.console.origins):
            raise ActorError(
                "Unauthorized",
                f"Origin {origin or request.headers.get('sec-fetch-site')!r} may not use the "
                "console; open it from this server, or list the origin in Console(origins=...).",
                code="origin_denied",
            )
        if self.console.loopback_only and not _loopback(request):
            raise ActorError(
                "Unauthorized",
                "This console only answers requests from this machine to localhost.",
                code="console_denied",
            )
        expected = self.console.token
        if expected is not None:
            given = request.headers.get(TOKEN_HEADER)
            if not given:
                raise _TokenRefused(
                    "This console needs its token: open the console URL that 'akter dev' "
                    "printed (it ends in #token=...).",
                    code="console_token_missing",
                )
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise _TokenRefused(
                    "The console token is not this server's (it changes when 'akter dev' "
                    "restarts): open the console URL it printed last.",
                    code="console_token_invalid",
                )
        identity = await self.auth(request)
        if not await self.console.allows(identity.caller):
            raise ActorError(
                "Unauthorized",
                f"{_who(identity.caller)} may not use the console; ask an operator for access.",
                code="console_denied",
            )
        return System("process", on_behalf_of=principal_of(identity.caller))

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
            cap = {"cap": COUNT_CAP + 1}
            rows = await self._rows("console_types", cap)
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
            (totals,) = await self._rows("console_totals", cap)
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

    async def actors(self, request: Request) -> Response:
        """``GET /console/api/actors``: one page of a type's actors, by (tenant, id)."""
        try:
            await self._operator(request)
            definition = self.runtime.definition(_param(request, "type"))
            tenant = request.query_params.get("tenant") or None
            after_tenant, after_id = _decode_cursor(request.query_params.get("after"))
            limit = _limit(request)
            rows = await self._rows(
                "console_actors",
                {
                    "type": definition.name,
                    "tenant": tenant,
                    "after_tenant": after_tenant,
                    "after_id": after_id,
                    "limit": limit + 1,
                },
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
            key = self._key(ref)
            rows = await self._rows("console_actor", key)
            events = await self._rows("console_recent_events", {**key, "limit": RECENT_EVENTS})
            outbox = await self._rows("console_actor_outbox", key)
            row = rows[0] if rows else None
            body: dict[str, Any] = {
                "ref": ref.to_json(),
                "exists": row is not None,
                "version": row["version"] if row else 0,
                "created": row["created"] if row else False,
                "event_seq": row["event_seq"] if row else 0,
                "state": row["state"] if row else None,
                "state_version": row["state_version"] if row else None,
                "updated_at": _iso(row["updated_at_ms"]) if row else None,
                "receipts": row["receipts"] if row else 0,
                "events": [
                    {
                        "cursor": str(e["seq"]),
                        "tag": e["tag"],
                        "event": e["payload"],
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
            rows = await self._rows("console_outbox", {"limit": _limit(request)})
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
            rows = await self._rows("console_jobs", {"limit": _limit(request)})
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
            letters = await self.runtime.dead_letters.list(_limit(request))
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
                messages = await open_progress(self.runtime, ref, _param(request, "job_id"))
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
            new_id = await self.runtime.dead_letters.retry(job_id)
            return _json({"job_id": job_id, "new_job_id": new_id})
        except ActorError as exc:
            return from_actor_error(exc)

    async def discard(self, request: Request) -> Response:
        """``POST .../{job_id}/discard``: delete the letter (as the CLI does)."""
        try:
            await self._operator(request)
            letter = await self.runtime.dead_letters.discard(request.path_params["job_id"])
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

    def _key(self, ref: ActorRef) -> dict[str, Any]:
        return {
            "rk": self.runtime.routing_key(ref),
            "tenant": ref.tenant,
            "type": ref.type,
            "id": ref.id,
        }

    async def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a console statement under a transaction-local ``statement_timeout``."""
        store = self.runtime.store
        try:
            async with store.pool.connection() as conn, conn.transaction():
                await conn.execute(
                    store.queries["console_statement_timeout"],
                    {"timeout": str(STATEMENT_TIMEOUT_MS)},
                )
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(store.queries[name], params)
                return await cur.fetchall()
        except QueryCanceled:
            raise ActorError(
                "Timeout",
                f"The console's query took longer than {STATEMENT_TIMEOUT_MS} ms and was "
                "cancelled; try again, or use the inspection views (v_actors, v_outbox, v_jobs).",
                code="console_query_timeout",
                retryable=True,
            ) from None


class _TokenRefused(ActorError):
    """A console request without this console's token: 401 (the page cannot sign in for it)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__("Unauthorized", message, code=code)

    @property
    def status(self) -> int:
        """Always 401: the request lacks the console's own credential."""
        return 401


def _same_origin(request: Request, origin: str | None, trusted: Iterable[str]) -> bool:
    """Whether a browser sent this request from the console's own page (or a trusted origin).

    ``Sec-Fetch-Site`` is the browser's own verdict and ignores what a TLS-terminating proxy
    changes (scheme, port). Without it, the ``Origin``'s host and port must be the ``Host``'s
    (the scheme is not compared, for the same reason). No ``Origin`` at all is a same-origin
    ``GET`` or a non-browser client, which the custom header already vouches for.
    """
    site = request.headers.get("sec-fetch-site")
    if site in ("same-origin", "none"):
        return True
    if origin is not None and _normal_origin(origin) in trusted:
        return True
    if site is not None:
        return False  # same-site or cross-site, and not a trusted origin
    if origin is None:
        return True
    theirs = _host_port(origin.lower().partition("://")[2]) if "://" in origin else ""
    # "null" (a sandboxed frame, a file, a redirect across sites) has no host: refused.
    return theirs != "" and theirs == _host_port(request.headers.get("host", "").lower())


def _normal_origin(origin: str) -> str:
    """``origin`` as :class:`Console` stores its ``origins``: lower case, no default port."""
    scheme, _, host = origin.strip().lower().partition("://")
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return f"{scheme}://{host.removesuffix(default) if default else host}"


def _host_port(host: str) -> str:
    """``host[:port]`` without a default port (80 or 443: the scheme is not compared)."""
    return host.removesuffix(":80").removesuffix(":443")


def _loopback(request: Request) -> bool:
    client = request.client.host if request.client else ""
    try:
        from_here = ipaddress.ip_address(client).is_loopback
    except ValueError:
        return False
    host = request.headers.get("host", "").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return from_here and name in _LOOPBACK_NAMES


def _who(caller: Any) -> str:
    subject = principal_of(caller)
    return f"User {subject!r}" if subject else type(caller).__name__


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
