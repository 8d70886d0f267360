"""End-to-end HTTP fixtures: a real uvicorn server on loopback in the test's event loop.

``served(...)`` starts an :class:`~akter.testing.ActorTest` runtime (fresh schema), builds
``akter.http.app`` on it and serves it with uvicorn on ``127.0.0.1`` (an ephemeral port), all in
the test's own event loop, so the test can drive HTTP clients, inspect durable rows and inject
faults on the same runtime. Also here: the actors the e2e tests serve, HS256 tokens, a loopback
TCP proxy that drops one response, and small helpers for problem+json and server-sent events.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import httpx
import jwt
import pytest
import uvicorn
from pydantic import BaseModel, Field
from starlette.types import ASGIApp

import akter
import akter.http
from akter.client import Client
from akter.testing import ActorTest
from tests.e2e.browser import browser, chromium  # noqa: F401 (fixtures of the browser tests)
from tests.e2e.shelf import shelf  # noqa: F401 (the fixture of an owned table's tests)

# --- actors served over HTTP ------------------------------------------------------------------

#: Handler runs, keyed "<tenant>/<type>/<id>/<command>": proves "the handler ran once".
RUNS: collections.Counter[str] = collections.Counter()


def ran(actor: akter.Actor[Any], command: str) -> None:
    RUNS[f"{actor.tenant}/{actor.ref.type}/{actor.id}/{command}"] += 1


def who(caller: akter.Caller) -> str:
    """A caller as text: the subject of a User, else the caller's kind."""
    return caller.subject if isinstance(caller, akter.User) else type(caller).__name__


class Purse(BaseModel):
    balance: int = 0
    callers: list[str] = Field(default_factory=list)
    memos: list[str] = Field(default_factory=list)


class Letter(BaseModel):
    to: str


class Deposited(akter.Event, tag="e2e.Deposited"):
    cents: int
    balance: int


class Overdrawn(akter.DeclaredError, tag="e2e.Overdrawn"):
    balance: int
    asked: int


Cents = Annotated[int, Field(ge=-1_000_000_000, le=1_000_000_000)]


class Account(akter.Actor[Purse], access=akter.public):
    """A public actor: every HTTP caller may use it (its caller is recorded in its state)."""

    @akter.command
    async def deposit(self, cents: Cents, memo: Annotated[str, Field(max_length=64)] = "") -> int:
        """Add cents, emit Deposited, return the balance."""
        ran(self, "deposit")
        self.state.balance += cents
        self.state.callers.append(who(self.caller))
        if memo:
            self.state.memos.append(memo)
        self.emit(Deposited(cents=cents, balance=self.state.balance))
        return self.state.balance

    @akter.command(errors=[Overdrawn])
    async def withdraw(self, cents: Cents) -> int:
        """Take cents, or fail with the declared Overdrawn."""
        ran(self, "withdraw")
        if cents > self.state.balance:
            raise Overdrawn(balance=self.state.balance, asked=cents)
        self.state.balance -= cents
        return self.state.balance

    @akter.command
    async def whoami(self, pause: Annotated[float, Field(ge=0, le=0.5)] = 0.0) -> str:
        """The caller's subject and the actor's tenant, after an optional pause."""
        if pause:
            await asyncio.sleep(pause)
        return f"{who(self.caller)}@{self.tenant}"

    @akter.command
    async def note(self, tenant: str, text: Annotated[str, Field(max_length=64)] = "") -> str:
        """An argument named ``tenant`` is only an argument; returns the actor's tenant."""
        self.state.memos.append(f"{tenant}:{text}")
        return self.tenant

    @akter.command
    async def send_letter(self, to: Annotated[str, Field(max_length=64)]) -> str:
        """Enqueue the ``mail`` job; its route is internal."""
        return self.enqueue(Account.mail, Letter(to=to))

    @akter.command(internal=True)
    async def audit(self) -> int:
        """Internal: System callers only, absent from HTTP."""
        return len(self.state.callers)

    @akter.job(attempts=1, timeout=5)
    async def mail(call: akter.JobCall, payload: Letter) -> str:
        return f"sent to {payload.to}"

    @mail.on_success
    async def mailed(self, result: str) -> None:
        self.state.memos.append(result)

    @akter.query
    async def balance(self) -> int:
        """The committed balance."""
        return self.state.balance

    @akter.query
    async def purse(self) -> Purse:
        """The whole committed state."""
        return self.state

    @akter.query
    async def last_callers(self, n: Annotated[int, Field(ge=1, le=50)] = 1) -> list[str]:
        """The last ``n`` callers."""
        return self.state.callers[-n:]


class Vault(akter.Actor[Purse]):
    """No ``access=``: System callers only (HTTP users get 403 access_denied)."""

    @akter.command
    async def put(self, cents: Cents) -> int:
        ran(self, "put")
        self.state.balance += cents
        return self.state.balance

    @akter.query
    async def total(self) -> int:
        return self.state.balance


class Ledger(akter.Actor[Purse], access=akter.public):
    """A gated actor: only ``open`` creates it."""

    @akter.command(creates=True)
    async def open(self, owner: Annotated[str, Field(min_length=1, max_length=64)]) -> str:
        self.state.memos.append(owner)
        return owner

    @akter.command
    async def post(self, cents: Cents) -> int:
        self.state.balance += cents
        return self.state.balance

    @akter.query
    async def owner(self) -> str:
        return self.state.memos[0] if self.state.memos else ""


class Registry(akter.Actor[Purse], singleton=True, access=akter.public):
    """A singleton: its path id is ``_``."""

    @akter.command
    async def register(self, name: Annotated[str, Field(min_length=1, max_length=32)]) -> int:
        self.state.memos.append(name)
        return len(self.state.memos)

    @akter.query
    async def names(self) -> list[str]:
        return self.state.memos


ACTORS: list[type[akter.Actor[Any]]] = [Account, Vault, Ledger, Registry]

# --- credentials --------------------------------------------------------------------------------

SECRET = "e2e-secret-0123456789abcdef0123456789abcdef-not-for-production"
OTHER_SECRET = "e2e-other-secret-fedcba9876543210fedcba9876543210-attacker"


def token(
    subject: str, tenant: str | None = "acme", *, ttl: float = 6 * 3600, key: str = SECRET
) -> str:
    """An HS256 bearer token (``tenant=None`` leaves the tenant claim out).

    Modules mint theirs at import, so the default lifetime outlasts a whole (slow) session.
    """
    claims: dict[str, Any] = {"sub": subject, "exp": int(time.time() + ttl)}
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, key, algorithm="HS256")


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


# --- serving ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(asgi: ASGIApp, *, lifespan: Literal["on", "off"] = "off") -> AsyncIterator[str]:
    """Serve ``asgi`` with uvicorn on 127.0.0.1 (ephemeral port) in this event loop."""
    config = uvicorn.Config(
        asgi,
        host="127.0.0.1",
        port=0,
        lifespan=lifespan,
        log_level="warning",
        log_config=None,  # keep uvicorn's records flowing to the root logger (and caplog)
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(), name="e2e.uvicorn")
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()  # raises the startup failure
                    raise RuntimeError("uvicorn exited before it started")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


@dataclass
class Served:
    """A runtime under test served over HTTP."""

    t: ActorTest
    url: str
    clients: list[Client] = field(default_factory=list)
    raw: list[httpx.AsyncClient] = field(default_factory=list)
    _minters: dict[str | None, httpx.AsyncClient] = field(default_factory=dict)

    def client(self, auth: str | None = None, *, via: str | None = None, **options: Any) -> Client:
        """A typed client of the server (or of a proxy ``via`` in front of it)."""
        made = Client(via or self.url, auth=auth, **options)
        self.clients.append(made)
        return made

    def http(self, auth: str | None = None, **options: Any) -> httpx.AsyncClient:
        """A raw httpx client on the server (closed with the server)."""
        headers = dict(options.pop("headers", {}))
        if auth is not None:
            headers.update(bearer(auth))
        made = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=15, **options)
        self.raw.append(made)
        return made

    async def mint(self, auth: str | None = None) -> str:
        """A command id from the server (POST /command-ids)."""
        minter = self._minters.get(auth)
        if minter is None:
            minter = self._minters[auth] = self.http(auth)
        response = await minter.post("/command-ids")
        assert response.status_code == 200, response.text
        return str(response.json()["command_id"])

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
        for raw in self.raw:
            await raw.aclose()


Serve = Callable[..., contextlib.AbstractAsyncContextManager[Served]]


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


@pytest.fixture
def served(akter_test: Callable[..., ActorTest]) -> Serve:
    """A factory of runtimes served over HTTP (use it as an async context manager).

    Keywords: ``actors`` (default ``ACTORS``), ``auth`` (default ``BearerJWT(SECRET)``;
    ``None`` for the anonymous app), ``app_options`` for ``akter.http.app``, and runtime options.
    """

    @contextlib.asynccontextmanager
    async def make(
        actors: list[type[akter.Actor[Any]]] | None = None,
        *,
        auth: akter.http.AuthProvider | Literal["jwt"] | None = "jwt",
        app_options: Mapping[str, Any] | None = None,
        **runtime_options: Any,
    ) -> AsyncIterator[Served]:
        provider = akter.http.BearerJWT(SECRET) if auth == "jwt" else auth
        async with akter_test(actors or ACTORS, **runtime_options) as t:
            asgi = akter.http.app(t.runtime, auth=provider, **dict(app_options or {}))
            async with serving(asgi) as url:
                s = Served(t, url)
                try:
                    yield s
                finally:
                    await s.aclose()

    return make


# --- a proxy that loses one response --------------------------------------------------------

_IDEMPOTENCY_KEY = re.compile(rb"(?im)^idempotency-key:[ \t]*(\S+)")


class DropOneResponse:
    """A loopback TCP proxy in front of ``upstream``.

    It relays everything, except for the first request whose bytes contain ``marker``: that
    request is forwarded, the proxy waits for the server's response to start, then closes the
    client's connection without relaying a byte of it (the response is lost in transit).
    """

    def __init__(self, upstream: str, marker: bytes = b"POST /actors/") -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.marker = marker
        self.dropped: bytes = b""  # the first bytes of the lost response
        self.keys: list[str] = []  # Idempotency-Key of every marked request, in order
        self.url = ""
        self._armed = True
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> DropOneResponse:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        drop = asyncio.Event()

        async def client_to_server() -> None:
            while data := await reader.read(65536):
                if self.marker in data:
                    found = _IDEMPOTENCY_KEY.search(data)
                    self.keys.append(found.group(1).decode() if found else "")
                    if self._armed:
                        self._armed = False
                        drop.set()
                up_writer.write(data)
                await up_writer.drain()

        async def server_to_client() -> None:
            while data := await up_reader.read(65536):
                if drop.is_set():
                    self.dropped = data
                    return  # lose the response: close the client's connection instead
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()
            self._tasks.discard(task)


# --- assertions and readers --------------------------------------------------------------------


def assert_problem(
    response: httpx.Response, status: int, reason: str, code: str | None = None
) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status, reason (and code); returns it."""
    assert response.status_code == status, (response.status_code, response.text)
    media = response.headers.get("content-type", "").split(";")[0].strip()
    assert media == "application/problem+json", media
    body = response.json()
    assert isinstance(body, dict)
    assert body["status"] == status
    assert body["reason"] == reason, body
    assert body["title"] == reason
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["detail"], str) and body["detail"]
    if code is not None:
        assert body.get("code") == code, body
    return body


async def count(t: ActorTest, table: str, where: str = "true") -> int:
    rows = await t.rows(f"SELECT count(*) AS n FROM {{schema}}.{table} WHERE {where}")
    return int(rows[0]["n"])


@dataclass
class SseFrame:
    """One server-sent event."""

    event: str | None
    id: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_frames(response: httpx.Response) -> AsyncIterator[SseFrame]:
    """Parse a ``text/event-stream`` body into frames (comments and retries skipped)."""
    fields: dict[str, list[str]] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields or "event" in fields:
                yield SseFrame(
                    event=fields["event"][-1] if "event" in fields else None,
                    id=fields["id"][-1] if "id" in fields else None,
                    data="\n".join(fields.get("data", [])),
                )
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value.removeprefix(" "))


class SseReader:
    """Reads one open event stream frame by frame."""

    def __init__(self, response: httpx.Response) -> None:
        self._frames = sse_frames(response)

    async def take(self, n: int, within: float = 5.0) -> list[SseFrame]:
        """The next ``n`` frames (fails if they do not arrive in time)."""
        got: list[SseFrame] = []
        async with asyncio.timeout(within):
            while len(got) < n:
                got.append(await anext(self._frames))
        return got

    async def rest(self, within: float = 5.0) -> list[SseFrame]:
        """Every frame until the server closes the stream (fails if it stays open)."""
        async with asyncio.timeout(within):
            return [frame async for frame in self._frames]


# --- the console's actor and operators ---------------------------------------------------------


class Parcel(BaseModel):
    to: Annotated[str, Field(max_length=64)]
    steps: int = 0


class Leg(BaseModel):
    done: int
    total: int
    message: str = ""


class Delivered(akter.Event, tag="e2e.Delivered"):
    to: str


@dataclass
class CourierControl:
    """What the Courier's jobs obey, fresh for every test (see the ``courier`` fixture)."""

    fail: bool = True
    #: One permit per reported step of ``trek``: the test hands them out one by one.
    permits: asyncio.Queue[None] = field(default_factory=asyncio.Queue)


COURIER = CourierControl()


class Courier(akter.Actor[Purse], access=akter.public):
    """An actor with a job that dead-letters while ``COURIER.fail`` and a gated progress job."""

    @akter.command
    async def ship(self, to: Annotated[str, Field(max_length=64)]) -> str:
        """Enqueue ``deliver``; returns the job id."""
        return self.enqueue(Courier.deliver, Parcel(to=to))

    @akter.job(attempts=1, timeout=30)
    async def deliver(call: akter.JobCall, payload: Parcel) -> str:
        if COURIER.fail:
            raise akter.JobFailure("the depot is closed", final=True)
        return payload.to

    @deliver.on_success
    async def delivered(self, to: str) -> None:
        self.state.memos.append(f"delivered to {to}")
        self.emit(Delivered(to=to))

    @akter.command
    async def remind(self) -> None:
        """Leave one pending timer (an hour away) and one intent (to the Account of this id)."""
        self.later(after=3600, key="reminder").send(Courier.ship, self.id, "reminder")
        self.send(Account.deposit, self.id, 1)

    @akter.command
    async def haul(self, steps: Annotated[int, Field(ge=1, le=10)]) -> str:
        """Enqueue ``trek`` with ``steps`` gated steps; returns the job id."""
        return self.enqueue(Courier.trek, Parcel(to="far away", steps=steps))

    @akter.job(attempts=1, timeout=60, progress=Leg, progress_every=0.05)
    async def trek(call: akter.JobCall, payload: Parcel) -> int:
        for i in range(1, payload.steps + 1):
            await COURIER.permits.get()
            call.report(Leg(done=i, total=payload.steps, message=f"leg {i}"))
            call.stream(f"leg {i} of {payload.steps}")  # the console's job output shows these
        return payload.steps

    @trek.on_success
    async def trekked(self, steps: int) -> None:
        self.state.balance += steps


@pytest.fixture
def courier() -> CourierControl:
    """A fresh :data:`COURIER` for this test (its queue belongs to this test's loop)."""
    global COURIER
    COURIER = CourierControl()
    return COURIER


#: The subject the console tests' ``allow`` rule accepts.
OPERATOR = "ops-admin"


def operators_only(caller: akter.User | akter.Anonymous) -> bool:
    """The console tests' rule: only the user ``OPERATOR``."""
    return isinstance(caller, akter.User) and caller.subject == OPERATOR
