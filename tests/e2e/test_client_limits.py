"""The HTTP client's connection pool: many concurrent callers on one client, and a pool of one.

64 commands on 64 actors wait in their handlers on one barrier of 64 parties: it opens only
if every request reached the server at the same time, so a client that queued requests
behind a smaller pool would time out instead. A pool of one connection serializes the calls:
the handlers never overlap, and every call still succeeds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

import akter
from akter.client import DEFAULT_LIMITS
from tests.e2e.conftest import Serve, count

pytestmark = pytest.mark.timeout(90)

CALLERS = 64


class Seen(BaseModel):
    hits: int = 0


class Gate:
    """What the handlers meet at, fresh for every test."""

    def __init__(self, parties: int) -> None:
        self.barrier = asyncio.Barrier(parties)
        self.inside = 0
        self.most_inside = 0


GATE = Gate(1)


class Meeting(akter.Actor[Seen], access=akter.public):
    @akter.command
    async def meet(self) -> int:
        """Wait for all the other callers' handlers (at most 20 s), then count the hit."""
        GATE.inside += 1
        GATE.most_inside = max(GATE.most_inside, GATE.inside)
        try:
            async with asyncio.timeout(20):
                await GATE.barrier.wait()
        finally:
            GATE.inside -= 1
        self.state.hits += 1
        return self.state.hits


def setup_gate(parties: int) -> Gate:
    global GATE
    GATE = Gate(parties)
    return GATE


def test_default_limits_exceed_the_callers_we_promise() -> None:
    assert DEFAULT_LIMITS.max_connections is not None
    assert DEFAULT_LIMITS.max_connections >= CALLERS
    assert DEFAULT_LIMITS.max_keepalive_connections is not None
    assert DEFAULT_LIMITS.max_keepalive_connections >= CALLERS


async def test_64_concurrent_commands_on_one_client_all_reach_the_server(served: Serve) -> None:
    gate = setup_gate(CALLERS)
    # Each handler holds its turn's connection while it waits: give the pool room for all.
    async with served([Meeting], auth=None, pool_size=CALLERS + 8) as s:
        client = s.client(timeout=30.0)
        results = await asyncio.gather(
            *(client.get(Meeting, f"m{i}").meet() for i in range(CALLERS))
        )
        assert results == [1] * CALLERS
        assert gate.most_inside == CALLERS
        assert await count(s.t, "receipts") == CALLERS
        assert await count(s.t, "actors") == CALLERS


async def test_a_pool_of_one_connection_serializes_the_calls(served: Serve) -> None:
    gate = setup_gate(1)  # a barrier of one party: every handler passes at once
    async with served([Meeting], auth=None) as s:
        options: dict[str, Any] = {
            "limits": httpx.Limits(max_connections=1, max_keepalive_connections=1),
            "timeout": httpx.Timeout(30.0),
        }
        client = s.client(**options)
        results = await asyncio.gather(*(client.get(Meeting, f"s{i}").meet() for i in range(8)))
        assert results == [1] * 8
        assert gate.most_inside == 1
        assert await count(s.t, "receipts") == 8
