"""``akter serve --workers N``: N runner processes behind one HTTP port.

One Python process runs one event loop on one core; a second core needs a second process. The
parent binds the HTTP address once and starts N children (``sys.executable -m akter.cli serve
TARGET --worker-fd FD``), each a full runner sharing the database, that inherit the listening
socket and accept on it (a shared accept queue: no connection is left on a socket nobody
accepts). The parent runs no runtime and opens no database connection.

- SIGTERM or SIGINT to the parent is forwarded to every child, each drains as ``akter serve``
  does, and the parent exits once all have (status 0 when every child drained cleanly).
- A child that exits while the parent is not stopping is reported on stderr and restarted,
  after a wait that doubles from ``RESTART_FIRST_S`` to ``RESTART_MAX_S`` (reset once a child
  has lived ``RESTART_RESET_S``), so a child that cannot start does not spin.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from akter.cli._common import stderr
from akter.errors import ConfigurationError

RESTART_FIRST_S, RESTART_MAX_S, RESTART_RESET_S = 0.5, 30.0, 60.0


def bind(http: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT``, inheritable by the children."""
    host, _, port = http.rpartition(":")
    try:
        infos = socket.getaddrinfo(host or "127.0.0.1", int(port), type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"Cannot listen on {http!r}: {exc}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def adopt(fd: int) -> socket.socket:
    """The listening socket a worker inherited from its parent (``--worker-fd``)."""
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return sock


@dataclass
class _Slot:
    """One worker position: its current process and restart state."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    wait: float = RESTART_FIRST_S
    restarts: int = 0
    codes: list[int] = field(default_factory=list)


class Workers:
    """The parent of ``--workers N`` (module docstring)."""

    def __init__(self, argv: list[str], count: int, sock: socket.socket | None) -> None:
        self._argv = argv
        self._sock = sock
        self._slots = [_Slot(i) for i in range(count)]
        self._stopping = asyncio.Event()

    def _command(self) -> list[str]:
        extra = ["--worker-fd", str(self._sock.fileno())] if self._sock is not None else []
        return [sys.executable, "-m", "akter.cli", "serve", *self._argv, *extra]

    async def _spawn(self, slot: _Slot) -> None:
        fds = (self._sock.fileno(),) if self._sock is not None else ()
        slot.proc = await asyncio.create_subprocess_exec(*self._command(), pass_fds=fds)
        slot.started = time.monotonic()
        stderr.print(f"akter serve: worker {slot.index + 1} started (pid {slot.proc.pid})")

    async def run(self) -> int:
        """Start the workers, keep them running until a signal, then drain them all."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        try:
            for slot in self._slots:
                await self._spawn(slot)
            if self._stopping.is_set():  # a signal during the spawns
                self._signal_all()
            await asyncio.gather(*(self._keep(slot) for slot in self._slots))
        finally:
            for slot in self._slots:
                if slot.proc is not None and slot.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        slot.proc.kill()
                    await slot.proc.wait()
        clean = all(s.codes[-1:] in ([0], [-signal.SIGTERM]) for s in self._slots)
        stderr.print("akter serve: all workers stopped" + ("" if clean else " (not all cleanly)"))
        return 0 if clean else 1

    def _stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        stderr.print("akter serve: stopping the workers…")
        self._signal_all()

    def _signal_all(self) -> None:
        for slot in self._slots:
            if slot.proc is not None and slot.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGTERM)

    async def _keep(self, slot: _Slot) -> None:
        """Wait for the slot's process; restart it unless the parent is stopping."""
        while True:
            assert slot.proc is not None
            code = await slot.proc.wait()
            slot.codes.append(code)
            if self._stopping.is_set():
                return
            lived = time.monotonic() - slot.started
            if lived >= RESTART_RESET_S:
                slot.wait = RESTART_FIRST_S
            stderr.print(
                f"akter serve: worker {slot.index + 1} (pid {slot.proc.pid}) exited with "
                f"status {code} after {lived:.1f} s; restarting in {slot.wait:g} s"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), slot.wait)
            if self._stopping.is_set():
                return
            slot.wait = min(slot.wait * 2, RESTART_MAX_S)
            slot.restarts += 1
            await self._spawn(slot)
            if self._stopping.is_set():  # a signal that came during the spawn
                slot.proc.send_signal(signal.SIGTERM)
