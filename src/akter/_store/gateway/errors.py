"""The one mapping of driver errors to what a caller of the store sees (``wrap_errors``).

Callers' reads (queries, event reads) wait at most their pool bound for a connection; past it
the caller gets the store's retryable ``ActorError`` ``ActorUnavailable`` (code
``pool_exhausted``), never ``psycopg_pool.PoolTimeout``. The framework's own statements keep the
driver's errors: their loops log an outage and retry at the next pass, poll or heartbeat.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from psycopg_pool import PoolTimeout

if TYPE_CHECKING:
    from akter._store.pool import Store


@contextlib.contextmanager
def wrap_errors(
    store: Store, *, wait_s: float, what: str, command_id: str | None = None
) -> Iterator[None]:
    """Map a pool wait past ``wait_s`` inside the block to ``store.exhausted(wait_s, what)``.

    Use it around the ``async with store.pool.connection(timeout=wait_s)`` of a caller's read;
    every other error passes through unchanged.
    """
    try:
        yield
    except PoolTimeout:
        raise store.exhausted(wait_s, what, command_id) from None
