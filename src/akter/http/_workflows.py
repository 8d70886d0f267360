"""Workflow routes: start a run on an actor, then read, signal, cancel and follow it by run id.

Routes (the workflows spec, W1)::

    POST /actors/{Type}/{id}/workflows/{name}   body = the workflow's arguments; Idempotency-Key
    GET  /workflows/{run_id}                    status, result or error, and the step journal
    POST /workflows/{run_id}/signals/{Signal}   body = the signal's fields (a JSON object)
    POST /workflows/{run_id}/cancel             ask the run to cancel
    GET  /workflows/{run_id}/steps              server-sent step records, then the final status

A start is a command of the actor type's access policy (kind ``command``, the workflow's name as
member) and is idempotent by its command id: the run id derives from it, the same id and body
answer the same run, the same id with another body is a ``CommandConflict``. The run routes ask
the policy of the run's actor: reads are kind ``query``, signals and cancels kind ``command``,
the member always the workflow's name. A run of another tenant is an unknown run (404); to a
caller without credentials, a run it cannot see (unknown, or of a tenant other than "default")
is the provider's 401 ``missing_credentials``, the same answer either way. A signal sent with
an ``Idempotency-Key`` (any key of at most 200 characters) is kept once per key, however often
it is sent.

The steps feed sends one ``step`` frame per journal record in ``seq`` order. A done record's
frame carries its ``seq`` as the frame ``id`` (``Last-Event-ID`` resumes after it); a pending
record's frame has no ``id``, so a resumed feed sends it again, and sends its done frame once it
is recorded. The feed polls the journal (50 ms, doubling to 1 s while nothing changes) until the
run ends, then sends one ``closed`` frame with the run's final status (without its steps).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from akter._engine.calls import check_access
from akter._engine.workflows.ops import status_of
from akter._members import refuse_internal
from akter._store.gateway.workflows import RunKey
from akter.actor import AccessKind, ActorDefinition
from akter.callers import ActorRef
from akter.errors import ActorError
from akter.http._openapi_parts import CURSOR_PATTERN
from akter.http._sse import MEDIA_TYPE, keep_alive
from akter.http._tracing import http_span, http_status
from akter.http.auth import Identity

if TYPE_CHECKING:
    from akter._engine.workflows.ops import WorkflowOps
    from akter.runtime import Runtime

#: A run id as the routes take it: printable ASCII without spaces (command ids, intent ids).
RUN_ID_PATTERN = r"^[!-~]{1,200}$"
#: A signal's name: its class name.
SIGNAL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,199}$"
#: The longest Idempotency-Key of a signal (an opaque key: the client sends a command id).
MAX_SIGNAL_KEY = 200
#: The steps feed's first and longest pause between two reads of the journal, in seconds.
POLL_FIRST = 0.05
POLL_MOST = 1.0

_RUN_ID = re.compile(RUN_ID_PATTERN)
_CURSOR = re.compile(CURSOR_PATTERN)
_FINISHED = ("completed", "failed", "cancelled")
_STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class Host(Protocol):
    """What the routes use of the app (``akter.http.app``'s ``_Api``)."""

    runtime: Runtime

    async def _identity(self, request: Request) -> Identity: ...

    def _refused(self, request: Request, exc: ActorError) -> Response: ...

    async def _json_object(self, request: Request) -> tuple[bytes, dict[str, Any]]: ...

    def _resolve(self, request: Request) -> tuple[ActorDefinition, str]: ...

    async def command(self, request: Request) -> Response: ...


class WorkflowRoutes:
    """The workflow routes of one app (module docstring)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.runtime = host.runtime

    @property
    def engine(self) -> WorkflowOps:
        """The runtime's workflow runs by id."""
        return self.runtime.workflows

    def start_route(self) -> Route:
        """The start route; it must precede the command route, whose ``{id}`` it would match."""
        return Route("/actors/{type}/{id:path}/workflows/{workflow}", self.start, methods=["POST"])

    def run_routes(self) -> list[Route]:
        """The routes of runs by id."""
        return [
            Route("/workflows/{run_id}", self.status, methods=["GET"]),
            Route("/workflows/{run_id}/signals/{signal}", self.signal, methods=["POST"]),
            Route("/workflows/{run_id}/cancel", self.cancel, methods=["POST"]),
            Route("/workflows/{run_id}/steps", self.steps, methods=["GET"]),
        ]

    # --- starting ---------------------------------------------------------------------------

    async def start(self, request: Request) -> Response:
        """``POST /actors/{Type}/{id}/workflows/{name}``: start a run; ``{"run_id": ...}``."""
        with http_span("POST", "/actors/{type}/{id}/workflows/{workflow}", request.headers) as span:
            response = await self._start(request)
            http_status(span, response.status_code)
            return response

    async def _start(self, request: Request) -> Response:
        host = self.host
        try:
            identity = await host._identity(request)
            definition, actor_id = host._resolve(request)
            name = str(request.path_params["workflow"])
            flow = definition.workflows.get(name)
            if flow is None:
                member = definition.members.get(name)
                if member is not None and member.kind == "command" and not member.internal:
                    # The path names a command of an actor whose id ends in "/workflows".
                    request.scope["path_params"] = {
                        "type": request.path_params["type"],
                        "id": f"{request.path_params['id']}/workflows",
                        "member": name,
                    }
                    return await host.command(request)
                raise ActorError(
                    "InvalidInput",
                    f"Actor type {definition.name!r} has no workflow {name!r}.",
                    code="unknown_member",
                )
            if flow.internal:  # refused before anything else about the request
                raise refuse_internal(definition.name, flow.name, "workflow", "HTTP callers")
            command_id = request.headers.get("idempotency-key")
            if not command_id:
                raise ActorError(
                    "InvalidInput",
                    "Workflow starts need an Idempotency-Key header holding a command id "
                    "(mint one with POST /command-ids); the run id derives from it.",
                    code="missing_idempotency_key",
                )
            raw, body = await host._json_object(request)
            flow.validate_json_body(raw, body)
            stored = flow.validate_input(body)
            ref = self.runtime.ref(definition.name, actor_id, tenant=identity.tenant)
            run = await self.runtime.start_workflow(flow, ref, stored, command_id, identity.caller)
            return JSONResponse({"run_id": run.id})
        except ActorError as exc:
            return host._refused(request, exc)

    # --- runs by id -------------------------------------------------------------------------

    async def _run(self, request: Request, kind: AccessKind) -> tuple[Identity, RunKey]:
        """The run the path names, after the caller's tenant and access are checked."""
        identity = await self.host._identity(request)
        self.runtime.supervisor.require_started()
        run_id = str(request.path_params["run_id"])
        row = await self.engine.gateway.locate(run_id) if _RUN_ID.fullmatch(run_id) else None
        if row is None or row.tenant_id != identity.tenant:
            missing = getattr(request.state, "missing_credentials", None)
            if isinstance(missing, ActorError):
                raise missing  # no run of the tenant "default": logging in may find it
            raise ActorError(
                "InvalidInput", f"No workflow run {run_id[:200]!r}.", code="unknown_workflow_run"
            )
        definition = self.runtime.definition(row.actor_type)
        ref = ActorRef(row.tenant_id, row.actor_type, row.actor_id)
        await check_access(definition, ref, identity.caller, kind, row.workflow)
        return identity, RunKey(row.routing_key, row.run_id)

    async def status(self, request: Request) -> Response:
        """``GET /workflows/{run_id}``: the run's status, result or error, and journal."""
        try:
            _, run = await self._run(request, "query")
            status = await self.engine.status(run.run_id)
            return JSONResponse(status.model_dump(mode="json"))
        except ActorError as exc:
            return self.host._refused(request, exc)

    async def signal(self, request: Request) -> Response:
        """``POST /workflows/{run_id}/signals/{Signal}``: keep a signal for the run."""
        try:
            await self.host._identity(request)
            signal_id = request.headers.get("idempotency-key") or None  # empty: none given
            if signal_id is not None and len(signal_id) > MAX_SIGNAL_KEY:
                raise ActorError(
                    "InvalidInput",
                    f"A signal's Idempotency-Key holds at most {MAX_SIGNAL_KEY} characters.",
                    code="invalid_idempotency_key",
                )
            _, body = await self.host._json_object(request)
            _, run = await self._run(request, "command")
            name = str(request.path_params["signal"])
            await self.engine.signal_json(run.run_id, name, body, signal_id)
            return JSONResponse({"run_id": run.run_id, "signal": name})
        except ActorError as exc:
            return self.host._refused(request, exc)

    async def cancel(self, request: Request) -> Response:
        """``POST /workflows/{run_id}/cancel``: ask the run to cancel (an ended run stays)."""
        try:
            _, run = await self._run(request, "command")
            await self.engine.cancel(run.run_id)
            row = await self.engine.gateway.get(run)
            assert row is not None
            return JSONResponse(
                {
                    "run_id": run.run_id,
                    "status": row.status,
                    "cancel_requested": row.cancel_requested,
                }
            )
        except ActorError as exc:
            return self.host._refused(request, exc)

    async def steps(self, request: Request) -> Response:
        """``GET /workflows/{run_id}/steps``: the journal as server-sent events, live."""
        try:
            after = _after(request)
            _, run = await self._run(request, "query")
        except ActorError as exc:
            return self.host._refused(request, exc)
        return StreamingResponse(
            keep_alive(step_frames(self.engine, run, after, self._running)),
            media_type=MEDIA_TYPE,
            headers=_STREAM_HEADERS,
        )

    def _running(self) -> bool:
        supervisor = self.runtime.supervisor
        return supervisor.started and not supervisor.stopping and supervisor.fatal is None


def _after(request: Request) -> int:
    """The feed's cursor: ``Last-Event-ID``, else ``?after=``, else ``-1`` (the whole journal)."""
    header = request.headers.get("last-event-id")
    query = request.query_params.get("after")
    for given in (header, query):
        if given is not None and not _CURSOR.fullmatch(given):
            raise ActorError(
                "InvalidInput",
                f"A steps cursor is the seq of the last step seen, not {given[:40]!r}.",
                code="invalid_cursor",
            )
    chosen = header if header is not None else query
    return -1 if chosen is None else int(chosen)


async def step_frames(
    engine: WorkflowOps, run: RunKey, after: int, running: Callable[[], bool]
) -> AsyncIterator[str]:
    """The run's step records after ``after`` as frames, live, then the ``closed`` frame.

    Each pass reads the run's row before the journal, so a pass that sees the run ended has
    read every record. A runtime that stops (``running()`` turns false) ends the feed without
    a ``closed`` frame: the client resumes elsewhere with its ``Last-Event-ID``.
    """
    pause = POLL_FIRST
    announced: set[int] = set()  # pending records already sent on this connection
    while running():
        row = await engine.gateway.get(run)
        if row is None:
            return  # pruned
        records = await engine.gateway.steps(run, after)
        ended = row.status in _FINISHED
        sent = False
        for view in status_of(row, records).steps:
            if view.status == "pending":
                if not ended and view.seq in announced:
                    break
                announced.add(view.seq)
                yield _frame(None, view.model_dump_json())
                sent = True
                if not ended:
                    break  # later records wait until this one is done
                continue
            yield _frame(view.seq, view.model_dump_json())
            after = view.seq
            sent = True
        if ended:
            final = status_of(row, []).model_dump(mode="json", exclude={"steps"})
            yield f"event: closed\ndata: {json.dumps(final, separators=(',', ':'))}\n\n"
            return
        pause = POLL_FIRST if sent else min(pause * 2, POLL_MOST)
        await asyncio.sleep(pause)


def _frame(seq: int | None, data: str) -> str:
    head = "" if seq is None else f"id: {seq}\n"
    return f"{head}event: step\ndata: {data}\n\n"


__all__ = ["POLL_FIRST", "POLL_MOST", "RUN_ID_PATTERN", "SIGNAL_PATTERN", "WorkflowRoutes"]
