"""The HTTP client: the same typed handles as in-process, over HTTP (httpx).

``await client.get(Order, "o-1").place(1200)`` type-checks exactly like the in-process handle.
Each command call takes one command id and retries retryable refusals — and dropped responses —
with that same id, honouring ``retry_after``; the server's receipt turns a retry of a committed
call into a replay.

One round trip per command: every command answer carries the server's database-clock reading
(``Akter-Clock``) and the retry window (``Akter-Retry-Window``), and the client mints its ids
from the last reading plus its own monotonic time since, :data:`CLOCK_MARGIN_MS` behind (its
wall clock is never read). Only before its first reading, after a few minutes without one, or
when an id it minted is refused as ``future`` (the database clock stepped back) does it ask the
server for one (``POST /command-ids``), once for all the calls that need it at that moment.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator, Callable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, cast
from urllib.parse import quote

from pydantic import BaseModel

from akter._extras import require_extra

try:
    import httpx
except ModuleNotFoundError as exc:  # pip install 'akter[http]'
    require_extra(exc, "akter.client", "http")
    raise

from akter._event_decl import Event, decode_stored
from akter._ids import CLOCK_HEADER, WINDOW_HEADER, mint_command_id
from akter._retry import CommandRetry
from akter.actor import Actor, ActorDefinition, Member, definition_of
from akter.callers import ActorRef
from akter.context import LoopLease
from akter.errors import ActorError, DeclaredError, Reason
from akter.events import EventRecord, EventStream, parse_cursor
from akter.handles import BaseHandle
from akter.workflows import WorkflowMember, WorkflowRun, WorkflowStatus, signal_name

A = TypeVar("A", bound=Actor[Any])

_RETRYABLE_STATUS = frozenset({502, 503, 504})
_MS = re.compile(r"[0-9]{1,15}")

#: How far behind the learned database clock the client issues its command ids (ms). The
#: reading is already a lower bound; the margin absorbs the drift between the server's and this
#: machine's monotonic clocks and small steps back of the database clock, so an id is never
#: refused as ``future``. It shortens each id's validity by as much (the window is ≥ 60 s).
CLOCK_MARGIN_MS = 1_000
#: A reading older than this (s) is not minted from: the next id comes from the server.
READING_TTL_S = 300.0


class LearnedClock:
    """The server's database clock as a client last heard it, and the ids minted from it.

    A reading ``now_ms`` that the server took before it answered, anchored at the monotonic
    time its answer arrived here, gives ``now_ms + elapsed``: a lower bound of the database
    clock (the newest reading replaces the last, so a clock that stepped back is followed).
    Ids are issued :data:`CLOCK_MARGIN_MS` behind it and span the server's retry window.
    """

    __slots__ = ("_reading",)

    def __init__(self) -> None:
        self._reading: tuple[int, int, float] | None = None

    def learn(self, now_ms: int, window_ms: int, at: float) -> None:
        """Keep a reading of the database clock, heard at monotonic time ``at`` (s)."""
        self._reading = (now_ms, window_ms, at)

    def forget(self) -> None:
        """Drop the reading (its ids were refused): the next id comes from the server."""
        self._reading = None

    def mint(self, at: float) -> str | None:
        """A command id at monotonic time ``at``, or ``None`` with no reading fresh enough."""
        if self._reading is None:
            return None
        now_ms, window_ms, heard = self._reading
        if not 0 <= at - heard <= READING_TTL_S:
            return None
        issued = now_ms + int((at - heard) * 1000) - CLOCK_MARGIN_MS
        try:
            return mint_command_id(max(issued, 0), window_ms)
        except ValueError:
            return None  # a reading out of any id's range: let the server mint


def clock_reading(headers: httpx.Headers) -> tuple[int, int] | None:
    """The ``(now_ms, window_ms)`` an answer's headers carry, if both are there and sane."""
    now, window = headers.get(CLOCK_HEADER, ""), headers.get(WINDOW_HEADER, "")
    if _MS.fullmatch(now) is None or _MS.fullmatch(window) is None:
        return None
    return int(now), int(window)


#: The default connection pool: wide enough that many concurrent callers on one client (a web
#: handler fanning out, a load test) never queue behind httpx's default of 20 kept-alive
#: connections, or hit its pool timeout.
DEFAULT_LIMITS = httpx.Limits(
    max_connections=512, max_keepalive_connections=256, keepalive_expiry=30.0
)


class Client:
    """An HTTP client of an akter app.

    Args:
        base_url: Where the app is served (``http://host:port`` or a mount prefix).
        auth: A bearer token string, an ``httpx.Auth``, or ``None``.
        headers: Extra headers (for example an API key header).
        delivery_timeout: How long one call keeps retrying, in seconds.
        timeout: One request's timeout, in seconds, or an ``httpx.Timeout``; event streams
            have none.
        limits: The connection pool's limits (default :data:`DEFAULT_LIMITS`: 512
            connections, 256 kept alive). Requests beyond ``max_connections`` wait for a free
            connection, at most the pool timeout.
        transport: An httpx transport (tests: ``httpx.ASGITransport(app)``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        auth: str | httpx.Auth | None = None,
        headers: dict[str, str] | None = None,
        delivery_timeout: float = 30.0,
        timeout: float | httpx.Timeout = 30.0,
        limits: httpx.Limits = DEFAULT_LIMITS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        extra = dict(headers or {})
        if isinstance(auth, str):
            extra["Authorization"] = f"Bearer {auth}"
            auth = None
        self.delivery_timeout = delivery_timeout
        self._clock = LearnedClock()
        self._asking: asyncio.Lock | None = None
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            auth=auth,
            headers=extra,
            timeout=timeout,
            limits=limits,
            transport=transport,
            event_hooks={"response": [self._hear_clock]},
        )

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def get(self, actor: type[A], id: str = "", *, tenant: str | None = None) -> A:
        """A typed remote handle (the tenant comes from the credentials, not from here)."""
        definition = definition_of(actor)
        definition.resolve()
        return cast(A, remote_handle(self, definition, id))

    async def mint_command_id(self) -> str:
        """A new command id, minted here from the database clock learned from the server.

        No request once a reading is known (every command answer carries one); before the
        first, or when the last is older than :data:`READING_TTL_S`, one ``POST /command-ids``
        (shared by every call waiting for it) returns the server's id and a reading.
        """
        return (await self._new_id())[0]

    async def server_command_id(self) -> str:
        """A command id minted by the server (``POST /command-ids``): always one round trip.

        For an id to hand to another process or to pin with ``with_command_id``, exactly as
        the server mints it; the answer also refreshes the learned clock.
        """
        response = await self._http.post("/command-ids")
        _raise_for(response)
        return str(response.json()["command_id"])

    async def _new_id(self) -> tuple[str, bool]:
        """A command id and whether it was minted here (not by the server)."""
        local = self._clock.mint(time.monotonic())
        if local is not None:
            return local, True
        if self._asking is None:
            self._asking = asyncio.Lock()
        async with self._asking:
            # Calls that waited here mint from the reading the first one brought back.
            local = self._clock.mint(time.monotonic())
            if local is not None:
                return local, True
            return await self.server_command_id(), False

    async def _hear_clock(self, response: httpx.Response) -> None:
        """Learn the database clock from an answer's headers (an httpx response hook)."""
        reading = clock_reading(response.headers)
        if reading is not None:
            self._clock.learn(*reading, time.monotonic())

    async def _post(
        self, path: str, body: dict[str, Any], command_id: str | None
    ) -> httpx.Response:
        headers = {"Idempotency-Key": command_id} if command_id else {}
        return await self._http.post(path, json=body, headers=headers)

    async def call_command(
        self,
        definition: ActorDefinition,
        actor_id: str,
        member: Member,
        body: dict[str, Any],
        pinned: str | None,
    ) -> Any:
        """POST a command, retrying with one id until the delivery timeout."""
        path = f"/actors/{definition.name}/{_path_id(definition, actor_id)}/{member.name}"
        what = f"{definition.name}/{actor_id!r}.{member.name}"
        response = await self._post_retrying(path, body, pinned, what)
        return member.result.validate_python(response.json())

    async def _post_retrying(
        self, path: str, body: dict[str, Any], pinned: str | None, what: str
    ) -> httpx.Response:
        """POST under one command id, retrying retryable failures until the delivery timeout.

        Returns the 200 response; raises the declared error or the non-retryable ``ActorError``.
        """
        command_id, minted_here = (pinned, False) if pinned else await self._new_id()
        deadline = time.monotonic() + self.delivery_timeout
        retries = _command_retry(what, command_id, deadline)
        while True:
            try:
                response = await self._post(path, body, command_id)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                # The request may have been applied: retry with the same id (it will replay).
                error: ActorError = ActorError(
                    "ActorUnavailable",
                    f"The request failed in transit ({type(exc).__name__}); retrying.",
                    code="outcome_unknown",
                    command_id=command_id,
                )
            else:
                if response.status_code == 200:
                    return response
                error_or_declared = _error_of(response)
                if isinstance(error_or_declared, DeclaredError):
                    raise error_or_declared
                error = error_or_declared
                future = error.reason == "InvalidCommandId" and error.code == "future"
                if future and minted_here and not retries.in_doubt:
                    # The learned clock ran ahead of the database's (it stepped back). The id
                    # was refused before anything ran (semantics §2.3 rule 1) and no attempt
                    # is in doubt: a server-minted id replaces it.
                    self._clock.forget()
                    command_id, minted_here = await self.server_command_id(), False
                    retries = _command_retry(what, command_id, deadline)
                    continue
                if not error.retryable:
                    raise error
            await asyncio.sleep(retries.wait_after(error))

    async def outcome(
        self,
        actor: type[Any],
        id: str,
        command_id: str,
        *,
        timeout: float = 30,  # noqa: ASYNC109 (a durable wait's bound, as WorkflowRun.result's)
    ) -> Any:
        """A command's outcome by id (a staged one's): its JSON value, or its declared error.

        Polls ``GET .../commands/{id}?wait=`` until the receipt is there or ``timeout`` passes
        (then ``ActorError`` ``Timeout``/``no_outcome``); ``CommandExpired`` once it was pruned.
        """
        definition = definition_of(actor)
        path = f"/actors/{definition.name}/{_path_id(definition, id)}/commands/{command_id}"
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, min(30.0, deadline - time.monotonic()))
            response = await self._http.get(path, params={"wait": f"{wait:.3f}"}, timeout=wait + 30)
            if response.status_code == 200:
                return response.json()
            error = _error_of(response)
            if not (isinstance(error, ActorError) and error.code == "no_outcome" and wait > 0):
                raise error

    # --- workflows ----------------------------------------------------------------------------

    async def start_workflow(
        self,
        definition: ActorDefinition,
        actor_id: str,
        flow: WorkflowMember[Any, Any],
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """POST a workflow start (idempotent by its command id): a handle to the run."""
        path = f"/actors/{definition.name}/{_path_id(definition, actor_id)}/workflows/{flow.name}"
        what = f"{definition.name}/{actor_id!r}.{flow.name}"
        response = await self._post_retrying(path, body, pinned, what)
        return WorkflowRun(str(response.json()["run_id"]), _RemoteRuns(self), flow.result)

    def workflow_run(self, run_id: str) -> WorkflowRun[Any]:
        """A handle to a workflow run by id (``result``, ``status``, ``signal``, ``cancel``)."""
        return WorkflowRun(run_id, _RemoteRuns(self))

    async def call_query(
        self, definition: ActorDefinition, actor_id: str, member: Member, body: dict[str, Any]
    ) -> Any:
        """POST a query."""
        path = f"/actors/{definition.name}/{_path_id(definition, actor_id)}/queries/{member.name}"
        response = await self._post(path, body, None)
        if response.status_code == 200:
            return member.result.validate_python(response.json())
        error = _error_of(response)
        raise error

    async def read_events(
        self, definition: ActorDefinition, actor_id: str, after: str | None, limit: int
    ) -> list[EventRecord]:
        """One page of events (replayed from the SSE stream until it goes quiet)."""
        records: list[EventRecord] = []
        stream = self.follow_events(definition, actor_id, after)
        try:
            while len(records) < limit:
                try:
                    records.append(await asyncio.wait_for(anext(stream), 0.5))
                except (TimeoutError, StopAsyncIteration):
                    break
        finally:
            await stream.aclose()
        return records

    async def follow_events(
        self, definition: ActorDefinition, actor_id: str, after: str | None
    ) -> AsyncGenerator[EventRecord, None]:
        """Replay after ``after`` and follow live over SSE, resuming with Last-Event-ID."""
        cursor = str(parse_cursor(after))
        path = f"/actors/{definition.name}/{_path_id(definition, actor_id)}/events"
        while True:
            headers = {"Last-Event-ID": cursor, "Accept": "text/event-stream"}
            try:
                async with self._http.stream("GET", path, headers=headers, timeout=None) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        error = _error_of(resp)
                        raise error
                    event: dict[str, str] = {}
                    async for line in resp.aiter_lines():
                        if line:
                            field, _, value = line.partition(": ")
                            event[field] = value
                            continue
                        if event.get("event") == "retention_gap":
                            detail = json.loads(event.get("data", "{}"))
                            raise ActorError("RetentionGap", str(detail.get("detail", "")))
                        if "data" in event:
                            data = json.loads(event["data"])
                            cursor = str(data["cursor"])
                            yield _event_record(definition, data)
                        event = {}
            except (httpx.TransportError, httpx.TimeoutException):
                await asyncio.sleep(0.5)  # reconnect and resume after the last cursor


def _command_retry(what: str, command_id: str, deadline: float) -> CommandRetry:
    return CommandRetry(what, command_id, deadline, first_wait=0.25, floor=0.05, fixed_first=False)


def _event_record(definition: ActorDefinition, data: dict[str, Any]) -> EventRecord:
    """An SSE frame as a record, decoded by this code's class for the tag or alias.

    The server sends the event at ``version`` (its class's version, or the stored one when it
    could not decode it); this side decodes it under its own class the same way, raw when it
    cannot (:func:`akter._event_decl.decode_stored`).
    """
    tag = str(data["tag"])
    classes = {t: e for e in definition.events for t in (e.event_tag, *e.event_aliases)}
    klass = classes.get(tag) or Event.registry().get(tag)
    event, version = decode_stored(klass, tag, data["event"], int(data.get("version", 0)))
    return EventRecord(
        cursor=str(data["cursor"]),
        event=event,
        command_id=data["command_id"],
        emitted_at=datetime.fromisoformat(data["emitted_at"]),
        tag=tag,
        version=version,
    )


class _RemoteTransport:
    """A remote handle's calls: HTTP requests through the client."""

    __slots__ = ("_client", "_definition")
    calls_internal = False

    def __init__(self, client: Client, definition: ActorDefinition) -> None:
        self._client = client
        self._definition = definition

    async def command(
        self,
        member: Member,
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
        fence: LoopLease | None,
    ) -> Any:
        """POST a command (with retries under one id)."""
        return await self._client.call_command(self._definition, ref.id, member, body, pinned)

    async def query(self, member: Member, ref: ActorRef, body: dict[str, Any]) -> Any:
        """POST a query."""
        return await self._client.call_query(self._definition, ref.id, member, body)

    def events(self, ref: ActorRef, after: str | None, limit: int) -> EventStream:
        """Replay and follow over SSE."""
        client, definition = self._client, self._definition
        return EventStream(
            lambda: client.read_events(definition, ref.id, after, limit),
            lambda: client.follow_events(definition, ref.id, after),
        )

    async def start_workflow(
        self,
        flow: WorkflowMember[Any, Any],
        ref: ActorRef,
        body: dict[str, Any],
        pinned: str | None,
    ) -> WorkflowRun[Any]:
        """POST a workflow start."""
        return await self._client.start_workflow(self._definition, ref.id, flow, body, pinned)


class _RemoteRuns:
    """A remote run handle's calls: ``/workflows/{run_id}`` requests through the client."""

    __slots__ = ("_client",)

    def __init__(self, client: Client) -> None:
        self._client = client

    async def status(self, run_id: str, *, steps: bool = True) -> WorkflowStatus:
        """GET the run's status and journal (the journal comes with it, ``steps`` or not)."""
        response = await self._client._http.get(f"/workflows/{quote(run_id, safe='')}")
        _raise_for(response)
        return WorkflowStatus.model_validate(response.json())

    async def settled(self, run_id: str, within: float) -> None:
        """Over HTTP there is no end notification: wait ``within`` before the next read."""
        await asyncio.sleep(within)

    async def signal(self, run_id: str, signal: BaseModel) -> None:
        """POST a signal to the run under one Idempotency-Key (a retry keeps it once)."""
        path = f"/workflows/{quote(run_id, safe='')}/signals/{signal_name(signal)}"
        what = f"signal {signal_name(signal)} to workflow run {run_id!r}"
        await self._client._post_retrying(path, signal.model_dump(mode="json"), None, what)

    async def cancel(self, run_id: str) -> None:
        """POST a cancel of the run."""
        response = await self._client._http.post(f"/workflows/{quote(run_id, safe='')}/cancel")
        _raise_for(response)


class RemoteHandle(BaseHandle):
    """A handle over HTTP; at type-check time it is the actor class itself.

    Its ``ref`` shows the tenant as ``"?"``: the tenant is the credential's.
    """

    __slots__ = ()


def remote_handle(client: Client, definition: ActorDefinition, actor_id: str) -> RemoteHandle:
    """A handle to ``actor_id`` of a type served at the client's base URL."""
    ref = ActorRef("?", definition.name, actor_id)
    return RemoteHandle(_RemoteTransport(client, definition), definition, ref)


def _path_id(definition: ActorDefinition, actor_id: str) -> str:
    from urllib.parse import quote

    return "_" if definition.singleton else quote(actor_id, safe="")


def _error_of(response: httpx.Response) -> ActorError | DeclaredError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    if response.status_code == 422 and "error" in body:
        return DeclaredError.from_receipt(
            str(body["error"]), dict(body.get("fields") or {}), body.get("detail")
        )
    reason = body.get("reason") or (
        "ActorUnavailable" if response.status_code >= 500 else "InvalidInput"
    )
    retry_after = body.get("retry_after")
    if retry_after is None and response.headers.get("retry-after", "").isdigit():
        retry_after = float(response.headers["retry-after"])
    retryable = body.get("retryable")
    if retryable is None:
        retryable = response.status_code in _RETRYABLE_STATUS
    return ActorError(
        cast(Reason, reason),
        str(body.get("detail") or f"HTTP {response.status_code}"),
        code=body.get("code"),
        retryable=bool(retryable),
        retry_after=retry_after,
        command_id=body.get("command_id"),
        field=body.get("field"),
    )


def _raise_for(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise _error_of(response)


class SyncClient:
    """A blocking wrapper of :class:`Client`, generated over the async one (no duplicate code).

    ``SyncClient(url).get(Order, "o-1").place(1200)`` runs the async call on a private loop.
    ``options`` are :class:`Client`'s keywords (``auth``, ``timeout``, ``limits``, ...).
    """

    def __init__(self, base_url: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = Client(base_url, **options)

    def close(self) -> None:
        """Close the client and its loop."""
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, actor: type[A], id: str = "") -> Any:
        """A blocking handle: its calls return values, not awaitables (so it is typed ``Any``)."""
        handle = self._client.get(actor, id)
        return _SyncHandle(self._loop, handle)

    def mint_command_id(self) -> str:
        """A new command id minted here (see :meth:`Client.mint_command_id`)."""
        return self._loop.run_until_complete(self._client.mint_command_id())

    def server_command_id(self) -> str:
        """A command id minted by the server (see :meth:`Client.server_command_id`)."""
        return self._loop.run_until_complete(self._client.server_command_id())

    def outcome(self, actor: type[Any], id: str, command_id: str, *, timeout: float = 30) -> Any:
        """A command's outcome by id (see :meth:`Client.outcome`)."""
        return self._loop.run_until_complete(
            self._client.outcome(actor, id, command_id, timeout=timeout)
        )


class _SyncHandle:
    def __init__(self, loop: asyncio.AbstractEventLoop, handle: Any) -> None:
        self._loop = loop
        self._handle = handle

    def with_command_id(self, command_id: str) -> _SyncHandle:
        return _SyncHandle(self._loop, self._handle.with_command_id(command_id))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        target = getattr(self._handle, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(target(*args, **kwargs))

        return call
