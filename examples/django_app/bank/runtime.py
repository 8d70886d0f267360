"""The process's ``akter.SyncRuntime``: started on first use, one per process.

A gunicorn worker forked from a ``--preload`` master must not use the master's runtime (its
thread and connections are the master's; akter refuses it with ``SyncRuntimeError`` reason
``forked``): the fork hook below forgets it in the child, which starts its own on first use.
"""

from __future__ import annotations

import os
import threading

from django.conf import settings  # type: ignore[import-untyped]

import akter
from examples.django_app.bank.actors import Account

_lock = threading.Lock()
_runtime: akter.SyncRuntime | None = None


def runtime() -> akter.SyncRuntime:
    """The started SyncRuntime of this process (shared by every request thread)."""
    global _runtime
    with _lock:
        if _runtime is None:
            started = akter.SyncRuntime(
                actors=[Account],
                database_url=settings.AKTER_DATABASE_URL,
                schema=settings.AKTER_SCHEMA,
                # The web process calls actors; deliveries are the runner's (manage.py
                # akter_runner), so request workers do not each run a relay.
                relay=False,
            )
            started.start()
            _runtime = started
        return _runtime


def shutdown() -> None:
    """Drain and stop this process's runtime, if it started one (also done at exit)."""
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.stop()
            _runtime = None


def _forget_in_child() -> None:
    global _lock, _runtime
    _lock = threading.Lock()  # another thread may have held it at the fork
    _runtime = None


os.register_at_fork(after_in_child=_forget_in_child)
