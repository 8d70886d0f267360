"""A database that is down is reported as unreachable, not as a full pool (issue 38, finding 12).

The runtime reaches PostgreSQL through :class:`~tests.faults.pg_proxy.PgProxy`; the test takes
the "server" away (every connection aborted, new ones refused) and back. While it is gone,
callers must hear ``ActorUnavailable`` coded ``database_unreachable`` (retryable, with
``retry_after``), never ``pool_exhausted`` ("all N pooled connections of this runner are busy":
they are not); a log line says so, and ``/ready`` answers 503 naming it. Once it is back, the
same commands go through and ``/ready`` is 200 again. A pool whose connections are all really
taken, with the database up, still says ``pool_exhausted``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from pydantic import BaseModel

import akter
import akter.http
from akter.testing import ActorTest
from tests._support import until
from tests.faults.pg_proxy import PgProxy

pytestmark = pytest.mark.timeout(90)

POOL_WAIT = 0.5


class Total(BaseModel):
    total: int = 0


class Till(akter.Actor[Total], access=akter.public):
    @akter.command
    async def add(self, n: int) -> int:
        self.state.total += n
        return self.state.total

    @akter.query
    async def total(self) -> int:
        return self.state.total


@asynccontextmanager
async def proxied(akter_db: str) -> AsyncIterator[tuple[ActorTest, PgProxy]]:
    async with (
        PgProxy(akter_db) as proxy,
        ActorTest(
            [Till],
            database_url=proxy.url,
            pool_size=3,
            pool_wait=POOL_WAIT,
            query_pool_wait=POOL_WAIT,
            maintenance=False,
        ) as t,
    ):
        t.database_url = akter_db  # inspection and the schema's drop go direct
        yield t, proxy


async def refusal(call: object) -> akter.ActorError:
    try:
        await call  # type: ignore[misc]
    except akter.ActorError as exc:
        return exc
    raise AssertionError("the call went through while the database was down")


async def test_database_down_is_not_reported_as_a_full_pool(
    akter_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="akter")
    async with proxied(akter_db) as (t, proxy):
        till = t.get(Till, "t-1")
        assert await till.add(1) == 1
        transport = httpx.ASGITransport(akter.http.app(t.runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            assert (await http.get("/ready")).status_code == 200
            command_id = await t.runtime.mint_command_id()

            proxy.go_down()
            # The first calls may meet a pooled connection that just died (an honest
            # "not committed"); once the pool has to connect, every refusal names the outage.
            refusals = []

            async def outage_named() -> bool:
                error = await refusal(till.add(1))
                refusals.append(error)
                return error.code is not None

            await until(outage_named, within=30, what="a coded refusal while down")
            error = refusals[-1]
            assert [e.code for e in refusals if e.code == "pool_exhausted"] == []
            assert (error.reason, error.code, error.retryable) == (
                "ActorUnavailable",
                "database_unreachable",
                True,
            )
            assert error.retry_after is not None and error.retry_after > 0
            assert "busy" not in error.message and "database" in error.message
            query = await refusal(till.total())
            assert (query.reason, query.code) == ("ActorUnavailable", "database_unreachable")
            assert proxy.refused > 0

            ready = await http.get("/ready")
            assert ready.status_code == 503
            assert ready.json()["code"] == "database_unreachable"
            over_http = await http.post(
                "/actors/Till/t-1/add",
                json={"n": 1},
                headers={"Idempotency-Key": command_id},
            )
            assert over_http.status_code == 503, over_http.text
            assert over_http.json()["code"] == "database_unreachable"
            lines = [r for r in caplog.records if "database_unreachable" in r.getMessage()]
            assert lines and all(r.levelno == logging.WARNING for r in lines)
            assert not any("pool_exhausted" in r.getMessage() for r in caplog.records)

            proxy.come_back()
            await until(
                lambda: http.get("/ready"),
                holds=lambda r: r.status_code == 200,
                within=30,
                what="/ready after the database came back",
            )
            assert await till.add(10) == 11


async def test_a_genuinely_full_pool_still_says_pool_exhausted(akter_db: str) -> None:
    async with proxied(akter_db) as (t, _):
        till = t.get(Till, "t-2")
        assert await till.add(1) == 1
        pool = t.runtime._store.pool
        held = [await pool.getconn() for _ in range(pool.max_size)]
        try:
            error = await refusal(till.add(1))
            assert (error.reason, error.code, error.retryable) == (
                "ActorUnavailable",
                "pool_exhausted",
                True,
            )
            transport = httpx.ASGITransport(akter.http.app(t.runtime))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                assert (await http.get("/ready")).status_code == 200
        finally:
            for conn in held:
                await pool.putconn(conn)
        assert await till.add(1) == 2
