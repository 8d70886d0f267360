"""Idempotent retry through the HTTP client after a lost response (TU-04/TU-13 over HTTP).

A loopback TCP proxy forwards the command to the real server, waits until the server answers
(so the turn has committed), then closes the client's connection without relaying a byte of the
answer. The client must retry with the same Idempotency-Key and get the stored outcome replayed;
the handler ran once and one receipt exists.
"""

from __future__ import annotations

import pytest

import akter
from tests.e2e.conftest import (
    RUNS,
    Account,
    DropOneResponse,
    Overdrawn,
    Serve,
    count,
    token,
)

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")
R1 = akter.ActorRef("acme", "Account", "r1")


async def test_lost_success_is_retried_with_the_same_key_and_replayed(served: Serve) -> None:
    async with served() as s, DropOneResponse(s.url) as proxy:
        assert await s.client(ALICE).get(Account, "r1").deposit(10) == 10  # direct
        remote = s.client(ALICE, via=proxy.url)
        assert await remote.get(Account, "r1").deposit(5, memo="once") == 15
        # The server answered the first attempt (200) but the client never saw it.
        assert proxy.dropped.startswith(b"HTTP/1.1 200")
        assert len(proxy.keys) == 2
        assert proxy.keys[0] == proxy.keys[1] != ""
        # The handler ran once for the lost call; one receipt under that key; state applied once.
        assert RUNS["acme/Account/r1/deposit"] == 2
        row = await s.t.inspect(R1)
        assert row.state is not None
        assert (row.state["balance"], row.state["memos"]) == (15, ["once"])
        assert [r["command_id"] for r in row.receipts].count(proxy.keys[0]) == 1
        assert len(row.receipts) == 2
        assert row.event_seq == 2


async def test_lost_declared_failure_replays_the_same_error(served: Serve) -> None:
    async with served() as s, DropOneResponse(s.url) as proxy:
        remote = s.client(ALICE, via=proxy.url)
        with pytest.raises(Overdrawn) as declared:
            await remote.get(Account, "r1").withdraw(100)
        assert (declared.value.balance, declared.value.asked) == (0, 100)
        assert proxy.dropped.startswith(b"HTTP/1.1 422")
        assert proxy.keys[0] == proxy.keys[1]
        assert RUNS["acme/Account/r1/withdraw"] == 1
        assert await count(s.t, "receipts") == 1


async def test_lost_response_with_a_pinned_command_id(served: Serve) -> None:
    async with served() as s, DropOneResponse(s.url) as proxy:
        cid = await s.mint(ALICE)
        remote = s.client(ALICE, via=proxy.url)
        account = remote.get(Account, "r1")
        assert await account.with_command_id(cid).deposit(7) == 7
        assert proxy.keys == [cid, cid]
        assert await account.with_command_id(cid).deposit(7) == 7  # and again: a replay
        assert RUNS["acme/Account/r1/deposit"] == 1
        assert await count(s.t, "receipts") == 1


async def test_h8_a_pinned_id_far_in_the_future_is_refused_by_the_client_not_timed_out(
    served: Serve,
) -> None:
    async with served() as s:
        now = await s.t.now_ms()
        issued = now + 600_000
        expires = issued + s.t.runtime.config.window_ms
        cid = f"v1.{issued}.{expires}.0190a3b4-5c6d-4e7f-8a9b-0c1d2e3f4a5b"
        account = s.client(ALICE).get(Account, "r1")
        with pytest.raises(akter.ActorError) as raised:
            await account.with_command_id(cid).deposit(1)
        error = raised.value
        assert (error.reason, error.code, error.retryable) == ("InvalidCommandId", "future", True)
        assert error.retry_after is not None and 590 <= error.retry_after <= 600
        assert RUNS["acme/Account/r1/deposit"] == 0
        assert await count(s.t, "receipts") == 0
