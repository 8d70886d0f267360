"""Ownership of a data directory: one :class:`EmbeddedPostgres` per directory, across processes.

Ownership is an exclusive ``flock`` on ``owner.lock``, held from :meth:`EmbeddedPostgres.start`
to :meth:`EmbeddedPostgres.stop`; the operating system drops it when the owner dies, even by
SIGKILL, and a child made by ``fork()`` closes its copy. While a server runs, ``url`` holds its
libpq URL; a ``detached`` marker says that no owner stops it (``akter db start``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from types import TracebackType

from akter._store.embedded.server import Postmaster, accepts_connections, ensure_server, stop_server
from akter.errors import ConfigurationError

logger = logging.getLogger(__name__)

# Lock descriptors held by this process; a child made by fork() must not keep them (see below).
_held_lock_fds: set[int] = set()


def default_data_dir() -> Path:
    """The data directory used when none is given: ``$AKTER_DATA_DIR``, else ``./.akter``.

    Returns:
        An absolute path; it may not exist yet.
    """
    configured = os.environ.get("AKTER_DATA_DIR")
    return Path(configured).expanduser().absolute() if configured else Path(".akter").absolute()


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
    postmaster = Postmaster.read(_resolve(data_dir) / "pgdata")
    if postmaster is None or not postmaster.alive() or not accepts_connections(postmaster.url):
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
        was_running = stop_server(data_dir / "pgdata")
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
                url, adopted = ensure_server(self.data_dir)
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
                    stop_server(self.pgdata)
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


# --- small helpers ----------------------------------------------------------------------------


def _resolve(data_dir: Path) -> Path:
    return data_dir.expanduser().resolve()


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    staging.replace(path)


__all__ = ["EmbeddedPostgres", "default_data_dir", "is_running", "running_url", "shutdown"]
