"""The ASGI app (Starlette): commands, queries, event feeds and operations over HTTP.

Routes (design §2.2)::

    POST /actors/{Type}/{id}/{command}         body = arguments by name; Idempotency-Key = id
    POST /actors/{Type}/{id}/queries/{query}   body = arguments by name
    GET  /actors/{Type}/{id}/events            server-sent events; resumes with Last-Event-ID
    GET  /actors/{Type}/{id}/jobs/{job_id}/progress   server-sent progress frames, then the close
    GET  /actors/{Type}/{id}/jobs/{job_id}/stream     a job's output, resumable by Last-Event-ID
    POST /actors/{Type}/{id}/workflows/{name}  start a workflow run; Idempotency-Key = command id
    POST /actors/{Type}/{id}/{query}/watch     a query watch, as server-sent events (live.md)
    GET  /ws                                   the WebSocket: commands, watches, feeds, broadcasts
    GET  /workflows/{run_id}                   a run's status; also .../signals/{Signal},
                                               .../cancel (POST) and .../steps (SSE)
    GET  /tables/{table}                       a tenant's rows of an owned table (access kind rows)
    POST /command-ids                          mints a command id from the database clock
                                               (command answers carry the clock: Akter-Clock)
    GET  /ready, /metrics                      readiness for probes; Prometheus text exposition
    GET  /openapi.json, /docs                  the OpenAPI 3.1 document and a docs page
    /console/...                               the web console, only with ``console=``

Caller and tenant come only from the auth provider; a request without credentials is served as
``Anonymous`` in the tenant "default" (public actors answer it; the others refuse it with the
provider's 401 ``missing_credentials``). Every refusal is problem+json with the
``reason``; declared errors are 422 with their tag and fields. A singleton's id in a path is ``_``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from akter._ids import CLOCK_HEADER, WINDOW_HEADER
from akter._members import refuse_internal
from akter._prometheus import CONTENT_TYPE as PROMETHEUS_TEXT
from akter.actor import ActorDefinition, Member
from akter.callers import ActorRef, Anonymous, as_caller
from akter.errors import ActorError, ConfigurationError, DeclaredError
from akter.events import parse_cursor
from akter.http._docs import docs_page
from akter.http._live import LiveRoutes
from akter.http._outcomes import outcome_route
from akter.http._sse import (
    MEDIA_TYPE,
    event_stream,
    gap,
    job_stream_frames,
    once,
    progress_stream,
    stream_cursor,
)
from akter.http._tables import TableRoutes
from akter.http._tracing import http_span, http_status
from akter.http._workflows import WorkflowRoutes
from akter.http.auth import AuthProvider, Identity, anonymous
from akter.http.console import Console
from akter.http.console.api import ConsoleApi
from akter.http.openapi import document
from akter.http.problems import from_actor_error, from_declared, problem
from akter.http.timeouts import BODY_TIMEOUT, check_timeout

if TYPE_CHECKING:
    from akter.runtime import Runtime

log = logging.getLogger("akter.http")

MAX_BODY_BYTES = 1_048_576
_MIN_HTTP_WINDOW_MS = 60_000


def app(
    runtime: Runtime,
    auth: AuthProvider | None = None,
    *,
    lifespan: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
    allowed_origins: Sequence[str] = (),
    title: str = "akter",
    console: Console | None = None,
    body_timeout: float = BODY_TIMEOUT,
    openapi: bool = True,
) -> Starlette:
    """Build the ASGI app serving ``runtime`` (mount it in FastAPI/Starlette, or serve it).

    Args:
        runtime: The runtime whose actors are served.
        auth: The auth provider; ``None`` makes every request ``Anonymous`` in tenant "default",
            so only actors with ``access=akter.public`` answer. Under a provider, requests
            without credentials are ``Anonymous`` too: public actors answer them.
        lifespan: Start the runtime when the ASGI server starts the app and drain it when the
            server stops, so ``uvicorn module:app`` just works. Leave it off (the default) when
            something else owns the runtime: ``akter serve``, a test, or a FastAPI app that
            mounts this one (a mounted app's lifespan never runs; start the runtime in yours).
        max_body_bytes: Largest accepted request body (413 beyond).
        allowed_origins: Browser origins allowed besides the app's own.
        title: The OpenAPI title.
        console: Serve the web console at ``/console`` for the callers its ``allow`` rule
            accepts (see :class:`akter.http.console.Console`); ``None`` (the default) leaves
            every ``/console`` path a 404. It shows every tenant's rows: never ``allow`` more
            than operators.
        body_timeout: Seconds a request body may take to arrive once the app starts reading
            it (default 30); past it the client gets a 408 problem (code ``body_timeout``) and
            its connection is closed. The request's head is the server's to bound:
            ``akter serve --headers-timeout``, or :func:`akter.http.timeouts.
            headers_timeout_protocol` for your own uvicorn.
        openapi: Serve ``/openapi.json`` and ``/docs``. :func:`akter.http.fastapi.install`
            turns them off: the host app's document then describes akter's routes too.
    """
    if runtime.config.window_ms < _MIN_HTTP_WINDOW_MS:
        raise ConfigurationError("Serving HTTP needs a retry window of at least 60 s.")
    if console is not None and not isinstance(console, Console):
        raise ConfigurationError(
            f"console={console!r} is not a Console; pass akter.http.console.Console(allow=...) "
            "with the rule that says who may operate it."
        )
    api = _Api(
        runtime, auth or anonymous, max_body_bytes, frozenset(allowed_origins), title, openapi
    )
    api.body_timeout = check_timeout(body_timeout, "body_timeout")
    if lifespan:
        api.app.router.lifespan_context = _owning(runtime)
    if console is not None:
        api.app.router.routes.extend(ConsoleApi(runtime, api.auth, console).routes())
    return api.app


def _owning(runtime: Runtime) -> Any:
    """A lifespan that starts ``runtime`` with the server and drains it on shutdown."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with runtime:
            yield

    return lifespan


class _Api:
    #: Seconds a request body may take to arrive (``app(body_timeout=...)``).
    body_timeout = BODY_TIMEOUT

    def __init__(
        self,
        runtime: Runtime,
        auth: AuthProvider,
        max_body: int,
        origins: frozenset[str],
        title: str,
        openapi: bool = True,
    ) -> None:
        self.runtime = runtime
        self.auth = auth
        self.max_body = max_body
        self.origins = origins
        self.title = title
        workflows = WorkflowRoutes(self)
        self.app = Starlette(
            routes=[
                Route("/actors/{type}/{id:path}/queries/{member}", self.query, methods=["POST"]),
                Route("/actors/{type}/{id:path}/events", self.events, methods=["GET"]),
                Route(
                    "/actors/{type}/{id:path}/jobs/{job_id}/progress",
                    self.progress,
                    methods=["GET"],
                ),
                workflows.start_route(),
                Route(
                    "/actors/{type}/{id:path}/jobs/{job_id}/stream",
                    self.job_stream,
                    methods=["GET"],
                ),
                *LiveRoutes(self).routes(),
                *TableRoutes(self).routes(),
                outcome_route(self),
                Route("/actors/{type}/{id:path}/{member}", self.command, methods=["POST"]),
                *workflows.run_routes(),
                Route("/command-ids", self.command_ids, methods=["POST"]),
                Route("/ready", self.ready, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                *(
                    [
                        Route("/openapi.json", self.openapi, methods=["GET"]),
                        Route("/docs", self.docs, methods=["GET"]),
                    ]
                    if openapi
                    else []
                ),
            ],
            exception_handlers={HTTPException: self._http_error, Exception: self._crash},
        )

    # --- plumbing ---------------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        # A 405 carries Starlette's Allow header (RFC 9110 §15.5.6).
        code = "method_not_allowed" if exc.status_code == 405 else "no_route"
        return problem(
            exc.status_code,
            "InvalidInput",
            str(exc.detail),
            code=code,
            headers=dict(exc.headers or {}),
        )

    async def _crash(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, ConfigurationError):
            # A failed or stopped runtime: another runner may serve the request.
            return problem(503, "ActorUnavailable", str(exc), extra={"retryable": True})
        log.error("HTTP request failed", exc_info=exc, extra={"path": request.url.path})
        return problem(500, "Defect", "The server failed to handle the request.")

    def _check_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if not origin:
            return
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin != own and origin not in self.origins:
            raise ActorError(
                "Unauthorized", f"Origin {origin!r} is not allowed.", code="origin_denied"
            )

    async def identity(self, request: Request) -> Identity:
        self._check_origin(request)
        try:
            return await self.auth(request)
        except ActorError as exc:
            if exc.reason != "Unauthorized" or exc.code != "missing_credentials":
                raise
            # No credentials at all: an anonymous caller, whom public actors answer.
            request.state.missing_credentials = exc
            return Identity(Anonymous(), "default")

    def refused(self, request: Request, exc: ActorError) -> Response:
        """The problem for ``exc``; an anonymous caller denied access hears "log in" (401)."""
        missing = getattr(request.state, "missing_credentials", None)
        if isinstance(missing, ActorError) and exc.code == "access_denied":
            exc = missing
        response = from_actor_error(exc)
        if exc.code == "body_timeout":
            # The rest of the body is unread: the connection cannot carry another request.
            response.headers["Connection"] = "close"
        return response

    async def _body(self, request: Request, member: Member) -> dict[str, Any]:
        raw, body = await self.json_object(request)
        # Strict JSON: `true` or "5" is no int over HTTP (in-process calls keep Python's rules).
        member.validate_json_body(raw, body)
        return body

    async def json_object(self, request: Request) -> tuple[bytes, dict[str, Any]]:
        """The body as a JSON object (``{}`` when empty), within the limits; raw and parsed.

        The raw bytes are re-encoded when integral numbers (``1.0``) were read as ints.
        """
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise ActorError(
                "InvalidInput",
                "Send the arguments as a JSON object with Content-Type: application/json.",
                code="unsupported_media_type",
            )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise _too_large(self.max_body)
        raw = await self._read_body(request)
        integral: list[str] = []
        try:
            body = json.loads(
                raw or b"{}", parse_int=_parse_int, parse_float=_float_reader(integral)
            )
        except RecursionError:
            raise ActorError(
                "InvalidInput", "The body nests too deeply to parse.", code="malformed_json"
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise ActorError(
                "InvalidInput", "The body is not valid JSON.", code="malformed_json"
            ) from None
        if not isinstance(body, dict):
            raise ActorError("InvalidInput", "The body must be a JSON object of arguments.")
        if integral:
            # JSON Schema's integer includes 1.0: read such numbers as the ints they are.
            raw = json.dumps(body).encode()  # NaN stays NaN, refused as before
        return raw, body

    async def _read_body(self, request: Request) -> bytes:
        """The body, within ``max_body`` bytes and ``body_timeout`` seconds."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self.max_body:
                        raise _too_large(self.max_body)
                    chunks.append(chunk)
        except TimeoutError:
            raise ActorError(
                "InvalidInput",
                f"The request body did not arrive within {self.body_timeout:g} s "
                f"({size} bytes came); nothing ran: send it again, faster.",
                code="body_timeout",
                retryable=True,
            ) from None
        except ClientDisconnect:
            # An ordinary event (a closed tab, a client's own timeout): not a server error.
            log.debug(
                "Client disconnected in the middle of its request body to %s (%d bytes came)",
                request.url.path,
                size,
                extra={"path": request.url.path},
            )
            raise ActorError(
                "InvalidInput",
                "The client disconnected before its request body arrived.",
                code="client_disconnected",
            ) from None
        return b"".join(chunks)

    def resolve(self, request: Request) -> tuple[ActorDefinition, str]:
        definition = self.runtime.definition(request.path_params["type"])
        raw = request.path_params["id"]
        return definition, ("" if definition.singleton and raw == "_" else raw)

    # --- routes -----------------------------------------------------------------------------

    async def command(self, request: Request) -> Response:
        with http_span("POST", "/actors/{type}/{id}/{member}", request.headers) as span:
            response = await self._command(request)
            http_status(span, response.status_code)
            return self._with_clock(response)

    async def query(self, request: Request) -> Response:
        with http_span("POST", "/actors/{type}/{id}/queries/{member}", request.headers) as span:
            response = await self._query(request)
            http_status(span, response.status_code)
            return response

    async def _command(self, request: Request) -> Response:
        try:
            identity = await self.identity(request)
            definition, actor_id = self.resolve(request)
            member = _public(definition.member(request.path_params["member"], "command"))
            command_id = request.headers.get("idempotency-key")
            if not command_id:
                raise ActorError(
                    "InvalidInput",
                    "Commands need an Idempotency-Key header holding a command id "
                    "(mint one with POST /command-ids).",
                    code="missing_idempotency_key",
                )
            body = await self._body(request, member)
            with as_caller(identity.caller):
                value = await self.runtime.call(
                    definition.name,
                    actor_id,
                    member.name,
                    body,
                    tenant=identity.tenant,
                    command_id=command_id,
                    retry=False,
                )
            return JSONResponse(member.result.dump_python(value, mode="json"))
        except ActorError as exc:
            if exc.code == "unknown_member" and _feed_path(request):
                # The path is a feed's (GET only), not a command's: 405, as Starlette would.
                return problem(
                    405,
                    "InvalidInput",
                    "Method Not Allowed",
                    code="method_not_allowed",
                    headers={"Allow": "GET"},
                )
            return self.refused(request, exc)
        except DeclaredError as exc:
            return from_declared(exc)

    async def _query(self, request: Request) -> Response:
        try:
            identity = await self.identity(request)
            definition, actor_id = self.resolve(request)
            member = _public(definition.member(request.path_params["member"], "query"))
            body = await self._body(request, member)
            with as_caller(identity.caller):
                value = await self.runtime.call(
                    definition.name, actor_id, member.name, body, tenant=identity.tenant
                )
            return JSONResponse(member.result.dump_python(value, mode="json"))
        except ActorError as exc:
            return self.refused(request, exc)

    async def events(self, request: Request) -> Response:
        try:
            identity = await self.identity(request)
            definition, actor_id = self.resolve(request)
            ref = self.runtime.ref(definition.name, actor_id, tenant=identity.tenant)
            after = _cursor(request)
            with as_caller(identity.caller):
                # Validate access and the cursor before the stream starts: refusals stay 4xx.
                try:
                    await self.runtime.read_events(ref, after, 1)
                except ActorError as exc:
                    if exc.reason != "RetentionGap":
                        raise
                    return once([gap(exc)])
        except ActorError as exc:
            return self.refused(request, exc)
        return StreamingResponse(
            self._stream(ref, after, identity),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def _stream(self, ref: ActorRef, after: str | None, identity: Identity) -> AsyncIterator[str]:
        return event_stream(self.runtime, ref, after, identity.caller)

    async def progress(self, request: Request) -> Response:
        try:
            identity = await self.identity(request)
            definition, actor_id = self.resolve(request)
            ref = self.runtime.ref(definition.name, actor_id, tenant=identity.tenant)
            with as_caller(identity.caller):
                # Access is checked and the subscription taken before the stream starts.
                messages = await self.runtime.operators.jobs.progress(
                    ref, request.path_params["job_id"]
                )
        except ActorError as exc:
            return self.refused(request, exc)
        return StreamingResponse(
            progress_stream(messages),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def job_stream(self, request: Request) -> Response:
        try:
            identity = await self.identity(request)
            definition, actor_id = self.resolve(request)
            ref = self.runtime.ref(definition.name, actor_id, tenant=identity.tenant)
            stream = self.runtime.job_stream(
                ref, request.path_params["job_id"], stream_cursor(request)
            )
            with as_caller(identity.caller):
                await stream.open()  # access, the job and the cursor: refusals stay 4xx
        except ActorError as exc:
            return self.refused(request, exc)
        return StreamingResponse(
            job_stream_frames(stream),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def command_ids(self, request: Request) -> Response:
        try:
            await self.identity(request)
            minted = JSONResponse({"command_id": await self.runtime.mint_command_id()})
            return self._with_clock(minted)
        except ActorError as exc:
            return self.refused(request, exc)

    def _with_clock(self, response: Response) -> Response:
        """``response`` with headers for the database clock and the retry window (in ms).

        The reading is the runner's estimate, a lower bound of the framework clock now: a
        client mints its next command ids from it (behind it) without asking for one.
        """
        try:
            now_ms = self.runtime.clock_estimate_ms()
        except RuntimeError:
            return response  # not started: no reading to give (the answer is a 503 anyway)
        response.headers[CLOCK_HEADER] = str(now_ms)
        response.headers[WINDOW_HEADER] = str(self.runtime.config.window_ms)
        return response

    async def ready(self, request: Request) -> Response:
        status = self.runtime.readiness
        if status == "storage":
            # The store's statements fail or callers are refused database_unreachable.
            return JSONResponse(
                {
                    "status": status,
                    "code": "database_unreachable",
                    "detail": "This runner cannot reach PostgreSQL; it serves again once it "
                    "connects.",
                },
                status_code=503,
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"status": status}, status_code=200 if status == "ready" else 503)

    async def metrics(self, request: Request) -> Response:
        # prometheus_client's exposition of the collector an application may also register in
        # its own registry: the same page either way.
        page = generate_latest(self.runtime.metrics.collector())
        return Response(page, media_type=PROMETHEUS_TEXT)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(document(self.runtime, self.title, self.auth))

    async def docs(self, request: Request) -> Response:
        return HTMLResponse(docs_page(self.title))


def _public(member: Member) -> Member:
    """Internal commands do not exist for HTTP callers (semantics §9.4)."""
    if member.internal:
        raise refuse_internal(member.owner.name, member.name, "command", "HTTP")
    return member


def _cursor(request: Request) -> str | None:
    """The feed's cursor: ``Last-Event-ID``, else ``?after=``; each one given must be valid."""
    header = request.headers.get("last-event-id")
    query = request.query_params.get("after")
    for given in (header, query):
        if given is not None:
            parse_cursor(given)  # UnknownCursor/malformed, even for the one that loses
    return header if header is not None else query


def _parse_int(digits: str) -> int:
    # Python refuses to read an int of more than 4,300 digits (a ValueError that would read as
    # "not valid JSON"); arguments hold signed 64-bit integers anyway.
    if len(digits.lstrip("-")) > 19:
        raise ActorError(
            "InvalidInput",
            f"The body holds an integer of {len(digits.lstrip('-'))} digits; integers in "
            "arguments must fit in a signed 64-bit integer.",
        )
    return int(digits)


def _float_reader(integral: list[str]) -> Any:
    """A ``parse_float`` that reads a number with no fraction (``1.0``, ``2e3``) as an int.

    JSON Schema counts such numbers as integers; they are kept as ints only within the signed
    64-bit range (``integral`` records each conversion).
    """

    def read(text: str) -> float | int:
        value = float(text)
        if value.is_integer() and -(2**63) <= value < 2**63:
            integral.append(text)
            return int(value)
        return value

    return read


def _too_large(limit: int) -> ActorError:
    return ActorError(
        "InvalidInput", f"The body is larger than {limit} bytes.", code="body_too_large"
    )


def _feed_path(request: Request) -> bool:
    """Whether a command path is also a GET route's (a feed's, or an outcome read's).

    ``.../events``, ``.../jobs/{job_id}/progress``, ``.../jobs/{job_id}/stream`` and
    ``.../commands/{command_id}``.
    """
    member = request.path_params["member"]
    raw_id = str(request.path_params["id"])
    return (
        member == "events"
        or (member in ("progress", "stream") and re.fullmatch(r".+/jobs/[^/]+", raw_id) is not None)
        or re.fullmatch(r".+/commands", raw_id) is not None
    )
