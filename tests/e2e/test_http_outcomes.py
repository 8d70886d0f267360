"""The outcome route and ``Client.outcome``: a staged command's outcome read by id over HTTP.

``GET /actors/{Type}/{id}/commands/{command_id}?wait=`` answers as the command's POST would
have (200 value, 422 declared error); nothing yet is 404 ``no_outcome``, exactly as for an id
of another tenant (no oracle); a pruned receipt is 410 ``receipt_gone``.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

import akter
from tests.e2e.conftest import Account, Overdrawn, Serve, Served, assert_problem, token

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")
MALLORY = token("mallory", tenant="globex")


def stage(s: Served, command: str, cents: int) -> str:
    """Stage ``Account/a-1.<command>(cents)`` for tenant acme in a transaction of its own."""
    with psycopg.connect(s.t.database_url) as conn, conn.transaction():
        stager = akter.stage(conn, Account, "a-1", tenant="acme", schema=s.t.schema)
        return str(getattr(stager, command)(cents=cents))


async def test_outcome_over_http(served: Serve) -> None:
    async with served() as s:
        cid = stage(s, "deposit", 5)
        client = s.client(ALICE)
        assert await client.outcome(Account, "a-1", cid, timeout=10) == 5
        raw = s.http(ALICE)
        response = await raw.get(f"/actors/Account/a-1/commands/{cid}")
        assert (response.status_code, response.json()) == (200, 5)
        # Another tenant's credential: the same answer as an id nothing holds.
        theirs = await s.http(MALLORY).get(f"/actors/Account/a-1/commands/{cid}")
        nothing = await s.mint(ALICE)
        unknown = await raw.get(f"/actors/Account/a-1/commands/{nothing}")
        for refused in (theirs, unknown):
            assert_problem(refused, 404, "Timeout", "no_outcome")
        assert theirs.json()["detail"].replace(cid, "?") == unknown.json()["detail"].replace(
            nothing, "?"
        )
        with pytest.raises(akter.ActorError) as caught:
            await s.client(MALLORY).outcome(Account, "a-1", cid, timeout=0.3)
        assert caught.value.code == "no_outcome"
        bad = await raw.get(f"/actors/Account/a-1/commands/{cid}", params={"wait": "31"})
        assert_problem(bad, 400, "InvalidInput")


async def test_declared_error_and_pruned_receipt(served: Serve) -> None:
    async with served(relay=False) as s:
        cid = stage(s, "withdraw", 7)
        client = s.client(ALICE)
        with pytest.raises(akter.ActorError) as caught:
            await client.outcome(Account, "a-1", cid, timeout=0.2)
        assert caught.value.code == "no_outcome"
        await s.t.drain()
        with pytest.raises(Overdrawn) as declared:
            await client.outcome(Account, "a-1", cid, timeout=5)
        assert declared.value.asked == 7
        await s.t.advance(timedelta(days=8))
        await s.t.runtime.cleanup()
        gone = await s.http(ALICE).get(f"/actors/Account/a-1/commands/{cid}")
        assert_problem(gone, 410, "CommandExpired", "receipt_gone")
