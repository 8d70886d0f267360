"""A PostgreSQL wire-protocol proxy that cuts one connection around its ``COMMIT`` (TU-13).

The proxy sits between a runtime and PostgreSQL (over TCP or a Unix socket) and relays both
directions message by message. It parses just enough of the protocol to recognise a client
running ``COMMIT``: a simple ``Query`` of it, or — what akter's pipelined commit flight sends —
a ``Bind`` of a statement whose ``Parse`` was ``COMMIT``: named, as a turn prepares its
statements on a connection's first use (``akter._store.pipeline``), or unnamed (psycopg's
first uses, a connection whose turn statements are past ``MAX_PREPARED``). Armed with
:meth:`PgProxy.arm`, it acts on the next such ``COMMIT`` only:

``before``
    forward the messages ahead of the ``COMMIT``, then cut: the server never sees the
    ``COMMIT`` and rolls the transaction back when the connection ends;
``after_reply``
    forward the ``COMMIT``, wait for the server's answer to it (its ``CommandComplete``), then
    cut without relaying that answer: committed, and the client cannot know;
``race``
    forward the ``COMMIT`` up to its ``Execute`` and cut at once, without waiting: the server
    decides later, and either outcome is possible.

A cut aborts the client's socket (the client sees its connection lost) and half-closes the
server's after the bytes already forwarded, as a vanished peer would; the proxy then reads the
server's side to its end, so :attr:`PgProxy.settled` says when the backend has finished with
the transaction (committed or rolled back) and exited. Every other connection, and every later
``COMMIT``, is relayed untouched: a pool reconnects and a retry goes through normally. The
client's ``SSLRequest``/``GSSENCRequest`` is refused by the proxy itself (``N``) so that the
stream stays readable.

Like psycopg_pool's ``tests/fix_proxy.py``, but at the message level rather than the socket
level: the cut lands exactly between two protocol messages.

:meth:`PgProxy.go_down` plays a server that is gone: every open connection is aborted and new
ones are refused (accepted and reset at once) until :meth:`PgProxy.come_back`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

Cut = Literal["before", "after_reply", "race"]

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104

_COMMIT = re.compile(rb"\s*(?:COMMIT|END)(?:\s+(?:WORK|TRANSACTION))?\s*;?\s*", re.IGNORECASE)


def is_commit(query: bytes) -> bool:
    """Whether a statement's text is a plain ``COMMIT`` (or a synonym)."""
    return _COMMIT.fullmatch(query) is not None


def _cstring(body: bytes, start: int = 0) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` and the offset after it."""
    end = body.index(b"\0", start)
    return body[start:end], end + 1


def _take(buf: bytearray, typed: bool) -> tuple[int, bytes, bytes] | None:
    """Pop one whole message off ``buf``: (type byte, raw bytes, body); ``None`` while partial.

    Startup-phase frontend messages carry no type byte (0 is returned), only a length.
    """
    head = 5 if typed else 4
    if len(buf) < head:
        return None
    (length,) = struct.unpack_from("!i", buf, head - 4)
    total = length + (1 if typed else 0)
    if len(buf) < total:
        return None
    raw = bytes(buf[:total])
    del buf[:total]
    return (raw[0] if typed else 0), raw, raw[head:]


@dataclass(eq=False)
class _Link:
    """One client connection and its server connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    statements: dict[bytes, bool] = field(default_factory=dict)  # name -> is COMMIT
    window: bytearray = field(default_factory=bytearray)  # client bytes since the last Sync
    # ReadyForQuery the server still owes: one for the startup, one per Sync or Query sent.
    owed: int = 1
    earlier: int = 0  # of those, owed to pipelines sent before the cut COMMIT's
    mode: Cut | None = None  # set once this link's COMMIT took the armed cut
    await_execute: bool = False  # race: cut right after the COMMIT's Execute
    cut: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    sent: Counter[str] = field(default_factory=Counter)  # client messages by type ("P", "S")


class PgProxy:
    """A loopback TCP proxy in front of PostgreSQL that can cut a connection around ``COMMIT``.

    Example:
        ``async with PgProxy(db_url) as proxy:`` give ``proxy.url`` to the runtime, then
        ``proxy.arm("after_reply", match=command_id)`` before the call.
    """

    def __init__(self, upstream: str) -> None:
        params = conninfo_to_dict(upstream)
        self.upstream = upstream
        host = str(params.get("host") or "/tmp").split(",")[0]
        port = int(str(params.get("port") or 5432).split(",")[0])
        self._unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._tcp = (host, port)
        self.url = ""
        #: How each COMMIT seen so far was sent: ``"Query"`` or ``"Bind <statement name>"``.
        self.commits: list[str] = []
        #: How the cut COMMIT was sent (an entry of :attr:`commits`).
        self.cut_commit: str | None = None
        #: The server's answer to the cut COMMIT, never relayed (``after_reply`` only).
        self.swallowed: bytes | None = None
        #: Set once the armed cut has happened.
        self.fired = asyncio.Event()
        #: Set once the server ended the cut connection: its transaction is decided.
        self.settled = asyncio.Event()
        #: Client connections accepted so far.
        self.connections = 0
        #: While set, the server is "down": new connections are reset at once.
        self.down = False
        #: Connections refused while down.
        self.refused = 0
        self._armed: tuple[Cut, bytes | None, bool | None] | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = make_conninfo(self.upstream, host="127.0.0.1", port=str(port), hostaddr=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for link in list(self._links):
            link.done.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def arm(
        self, mode: Cut, *, match: bytes | str | None = None, prepared: bool | None = None
    ) -> None:
        """Cut around the next ``COMMIT`` that qualifies; every other one passes untouched.

        Args:
            mode: ``before``, ``after_reply`` or ``race`` (see the module docstring).
            match: bytes (an actor id, a command id) that the client must have sent in the
                same pipeline (since its last Sync) before the ``COMMIT``: keeps the runtime's
                background transactions from taking the cut meant for a turn.
            prepared: ``True`` for a ``COMMIT`` bound to a named (prepared) statement only,
                ``False`` for an unnamed one or a simple query only, ``None`` for either.
        """
        if isinstance(match, str):
            match = match.encode()
        self.fired.clear()
        self.settled.clear()
        self.cut_commit = None
        self.swallowed = None
        self._armed = (mode, match, prepared)

    @property
    def armed(self) -> bool:
        """Whether the armed cut is still waiting for its ``COMMIT``."""
        return self._armed is not None

    def go_down(self) -> None:
        """Play a server that is gone: abort every open connection and refuse new ones."""
        self.down = True
        for link in list(self._links):
            link.client.transport.abort()
            link.server.transport.abort()
            link.done.set()

    def come_back(self) -> None:
        """Accept and relay connections again (after :meth:`go_down`)."""
        self.down = False

    # --- relaying -----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.refused += 1
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            if self._unix is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._tcp)
        except OSError:
            writer.transport.abort()
            self._tasks.discard(task)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        upstream = asyncio.create_task(self._server_to_client(link, up_reader))
        pumps = [
            asyncio.create_task(self._client_to_server(link, reader)),
            upstream,
            asyncio.create_task(link.done.wait()),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if link.cut and not link.done.is_set():
                # Read the server's side to its end: the backend has decided the transaction.
                await asyncio.wait([upstream, pumps[2]], return_when=asyncio.FIRST_COMPLETED)
                if upstream.done():
                    self.settled.set()
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError):
                    await w.wait_closed()
            self._links.discard(link)
            self._tasks.discard(task)

    def _cut(self, link: _Link) -> None:
        # The client's side is aborted: whatever it was owed is lost. The server's side is
        # half-closed after the bytes already written, like a peer that vanished after them.
        link.cut = True
        link.client.transport.abort()
        link.server.write_eof()
        self.fired.set()

    async def _client_to_server(self, link: _Link, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        startup = True
        while data := await reader.read(65536):
            buf += data
            out = bytearray()
            while (msg := _take(buf, typed=not startup)) is not None:
                kind, raw, body = msg
                if startup:
                    (code,) = struct.unpack_from("!i", body)
                    if code in (SSL_REQUEST, GSSENC_REQUEST):
                        link.client.write(b"N")  # plaintext only: the proxy must read it
                        continue
                    startup = False  # a StartupMessage (or a CancelRequest: nothing follows)
                    out += raw
                    continue
                cut = self._frontend(link, kind, body)
                if cut == "after":
                    out += raw
                if cut is not None:
                    link.server.write(out)
                    self._cut(link)
                    return
                out += raw
            link.server.write(out)
            await link.server.drain()

    def sent(self, statement_prefix: bytes) -> Counter[str]:
        """Client messages by type, summed over some links.

        The links counted prepared a statement named ``statement_prefix...`` (a runtime's turn
        connections: ``b"akter_turn_"``).
        """
        total: Counter[str] = Counter()
        for link in self._links:
            if any(name.startswith(statement_prefix) for name in link.statements):
                total.update(link.sent)
        return total

    def _frontend(self, link: _Link, kind: int, body: bytes) -> Literal["before", "after"] | None:
        """Track one client message; say whether to cut before or after forwarding it."""
        link.sent[chr(kind)] += 1
        commit: str | None = None
        if kind == ord("P"):
            name, at = _cstring(body)
            link.statements[name] = is_commit(_cstring(body, at)[0])
        elif kind == ord("C") and body[:1] == b"S":
            link.statements.pop(_cstring(body, 1)[0], None)
        elif kind == ord("B"):
            _portal, at = _cstring(body)
            statement, _ = _cstring(body, at)
            if link.statements.get(statement):
                commit = f"Bind {statement.decode()!r}"
        elif kind == ord("Q") and is_commit(_cstring(body)[0]):
            commit = "Query"
        elif kind == ord("E") and link.await_execute:
            link.await_execute = False
            return "after"  # race: the COMMIT's Execute goes out, then the cut
        if commit is None:
            if kind in (ord("S"), ord("Q")):
                link.owed += 1
            if kind == ord("S"):
                link.window.clear()
            else:
                link.window += body
            return None
        self.commits.append(commit)
        earlier = link.owed
        if commit == "Query":
            link.owed += 1
        armed = self._armed
        window = bytes(link.window)
        link.window.clear()
        if armed is None:
            return None
        mode, match, prepared = armed
        if match is not None and match not in window:
            return None
        if prepared is not None and prepared != (commit not in ("Query", "Bind ''")):
            return None
        self._armed = None
        self.cut_commit = commit
        link.mode = mode
        link.earlier = earlier
        if mode == "before":
            return "before"
        if mode == "race":
            if commit == "Query":
                return "after"
            link.await_execute = True
        return None

    async def _server_to_client(self, link: _Link, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        while data := await reader.read(65536):
            if link.cut:
                continue  # the client is gone: drain the server's side until it ends
            buf += data
            out = bytearray()
            while (msg := _take(buf, typed=True)) is not None:
                kind, raw, body = msg
                if kind == ord("Z"):
                    link.owed -= 1
                    if link.earlier > 0:
                        link.earlier -= 1  # the end of a pipeline sent before the COMMIT's
                        out += raw
                        continue
                if link.mode == "after_reply" and not link.earlier and _answers_commit(kind, body):
                    # The server has answered the COMMIT: lose that answer and all after it.
                    self.swallowed = raw
                    link.client.write(out)
                    self._cut(link)
                    break
                out += raw
            else:
                link.client.write(out)
                await link.client.drain()


def _answers_commit(kind: int, body: bytes) -> bool:
    """Whether a server message settles a pending ``COMMIT``.

    ``CommandComplete`` says ``COMMIT`` (or ``ROLLBACK`` for an aborted transaction); an error,
    or ``ReadyForQuery`` when an earlier failure made the server skip it, ends the wait too.
    """
    if kind == ord("C"):
        return _cstring(body)[0] in (b"COMMIT", b"ROLLBACK")
    return kind in (ord("E"), ord("Z"))
