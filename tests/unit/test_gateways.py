"""The store gateways' pure parts: notification statements per schema, and ``wrap_errors``."""

from __future__ import annotations

import pytest
from psycopg_pool import PoolTimeout

from akter._store.gateway.errors import wrap_errors
from akter._store.pool import Store
from akter._store.queries import Queries
from akter.errors import ActorError


def test_notification_statements_name_the_schemas_channels() -> None:
    queries = Queries("shop_1")
    assert queries["listen_wake"] == 'LISTEN "shop_1_wake"'
    assert queries["notify_wake"] == 'NOTIFY "shop_1_wake"'
    assert queries["listen_progress"] == 'LISTEN "shop_1_progress"'
    assert queries.channel("progress_channel") == "shop_1_progress"
    assert "%(channel)s" in queries["notify_progress"]


def test_wrap_errors_turns_a_pool_wait_into_pool_exhausted() -> None:
    store = Store("", "akter", max_size=3)
    with pytest.raises(ActorError) as caught, wrap_errors(store, wait_s=0.25, what="the read"):
        raise PoolTimeout("couldn't get a connection after 0.25 sec")
    error = caught.value
    assert (error.reason, error.code, error.retryable) == (
        "ActorUnavailable",
        "pool_exhausted",
        True,
    )
    assert "the read within 0.25 s" in error.message and "all 3 pooled" in error.message
    assert error.__cause__ is None and error.__suppress_context__


def test_wrap_errors_leaves_other_errors_alone() -> None:
    store = Store("", "akter")
    with (
        pytest.raises(ValueError, match="not a pool wait"),
        wrap_errors(store, wait_s=1.0, what="the read"),
    ):
        raise ValueError("not a pool wait")
