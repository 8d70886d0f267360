"""Security and tenancy over HTTP (semantics §9; conformance SE-01, SE-02, SE-03, SE-05, SE-06).

Bearer tokens are HS256 JWTs made with PyJWT and verified by ``akter.http.BearerJWT``; caller and
tenant come only from the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import jwt
import pytest

import akter
from tests.e2e.conftest import (
    OTHER_SECRET,
    RUNS,
    SECRET,
    Account,
    Serve,
    Served,
    SseReader,
    Vault,
    assert_problem,
    count,
    token,
)

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")
BOB = token("bob", "globex")


async def post_command(
    http: httpx.AsyncClient, s: Served, path: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    key = await s.mint(ALICE)
    return await http.post(path, json=body, headers={"Idempotency-Key": key, **headers})


async def written(s: Served) -> int:
    """Every durable row a turn can write."""
    return sum([await count(s.t, t) for t in ("actors", "receipts", "events", "outbox")])


# --- SE-01: credentials ---------------------------------------------------------------------


def _bad_tokens() -> list[tuple[str, str | None, str]]:
    now_claims = {"sub": "mallory", "tenant": "acme"}
    return [
        ("garbage", "Bearer not-a-jwt", "invalid_credentials"),
        ("wrong key", f"Bearer {token('mallory', key=OTHER_SECRET)}", "invalid_credentials"),
        ("expired", f"Bearer {token('mallory', ttl=-60)}", "expired"),
        ("basic", "Basic YWxpY2U6c2VjcmV0", "invalid_credentials"),
        ("empty bearer", "Bearer", "invalid_credentials"),
        (
            "no exp",
            f"Bearer {jwt.encode(now_claims, SECRET, algorithm='HS256')}",
            "invalid_credentials",
        ),
        (
            "alg none",
            f"Bearer {jwt.encode(now_claims, '', algorithm='none')}",
            "invalid_credentials",
        ),
        ("bad tenant", f"Bearer {token('mallory', 'a/b')}", "invalid_credentials"),
    ]


@pytest.mark.parametrize(("case", "authorization", "code"), _bad_tokens(), ids=lambda v: str(v))
async def test_SE01_missing_or_invalid_credentials_are_401_before_any_turn(
    served: Serve, case: str, authorization: str | None, code: str
) -> None:
    async with served() as s:
        headers = {} if authorization is None else {"Authorization": authorization}
        http = s.http(headers=headers)
        for method, path, body in (
            ("POST", "/actors/Account/a1/deposit", {"cents": 1}),
            ("POST", "/actors/Account/a1/queries/balance", {}),
            ("GET", "/actors/Account/a1/events", None),
            ("POST", "/command-ids", None),
        ):
            response = await http.request(
                method,
                path,
                json=body,
                headers={"Idempotency-Key": await s.mint(ALICE)} if "deposit" in path else {},
            )
            assert_problem(response, 401, "Unauthorized", code)
            assert response.headers.get("www-authenticate", "").lower().startswith("bearer")
        assert RUNS["acme/Account/a1/deposit"] == 0
        assert await written(s) == 0


async def test_SE01_no_credentials_is_anonymous_public_actors_answer_others_401(
    served: Serve,
) -> None:
    async with served() as s:
        http = s.http()
        public = await http.post(
            "/actors/Account/a1/whoami", json={}, headers={"Idempotency-Key": await s.mint()}
        )
        assert (public.status_code, public.json()) == (200, "Anonymous@default")
        query = await http.post("/actors/Account/a1/queries/balance", json={})
        assert (query.status_code, query.json()) == (200, 0)
        for method, path, body in (
            ("POST", "/actors/Vault/v1/put", {"cents": 1}),
            ("POST", "/actors/Vault/v1/queries/total", {}),
            ("GET", "/actors/Vault/v1/events", None),
        ):
            response = await http.request(
                method,
                path,
                json=body,
                headers={"Idempotency-Key": await s.mint()} if "put" in path else {},
            )
            assert_problem(response, 401, "Unauthorized", "missing_credentials")
            assert response.headers.get("www-authenticate", "").lower().startswith("bearer")
        assert RUNS["default/Vault/v1/put"] == 0
        assert await count(s.t, "receipts", "actor_type = 'Vault'") == 0


async def test_SE01_credentials_are_never_taken_from_the_url(served: Serve) -> None:
    async with served() as s:
        response = await s.http().post(
            "/actors/Vault/a1/put",
            params={"access_token": ALICE, "token": ALICE},
            json={"cents": 1},
            headers={"Idempotency-Key": await s.mint(ALICE)},
        )
        assert_problem(response, 401, "Unauthorized", "missing_credentials")
        assert await written(s) == 0


async def test_SE01_concurrent_requests_get_their_own_caller(served: Serve) -> None:
    async with served() as s:
        users = [f"user{i}" for i in range(12)]
        handles = [s.client(token(u)).get(Account, "shared") for u in users]
        # Overlapping turns on one actor (they batch) and on separate actors.
        same = await asyncio.gather(*[h.whoami(pause=0.05) for h in handles])
        assert same == [f"{u}@acme" for u in users]
        apart = await asyncio.gather(
            *[s.client(token(u)).get(Account, f"own-{u}").whoami() for u in users]
        )
        assert apart == same
        await asyncio.gather(*[h.deposit(1) for h in handles])
        purse = await handles[0].purse()
        assert sorted(purse.callers) == sorted(users)
        keys = await s.t.rows(
            "SELECT caller_key FROM {schema}.receipts WHERE actor_id = 'shared' "
            "AND command = 'deposit'"
        )
        assert sorted(r["caller_key"] for r in keys) == sorted(
            json.dumps(["User", u], separators=(",", ":")) for u in users
        )


# --- SE-02: default access ------------------------------------------------------------------


async def test_SE02_default_access_denies_http_users_and_allows_in_process_system(
    served: Serve,
) -> None:
    async with served() as s:
        http = s.http(ALICE)
        denied = await post_command(http, s, "/actors/Vault/v1/put", {"cents": 5})
        assert_problem(denied, 403, "Unauthorized", "access_denied")
        query = await http.post("/actors/Vault/v1/queries/total", json={})
        assert_problem(query, 403, "Unauthorized", "access_denied")
        feed = await http.get("/actors/Vault/v1/events")
        assert_problem(feed, 403, "Unauthorized", "access_denied")
        with pytest.raises(akter.ActorError) as typed:
            await s.client(ALICE).get(Vault, "v1").put(5)
        assert (typed.value.reason, typed.value.code) == ("Unauthorized", "access_denied")
        assert RUNS["acme/Vault/v1/put"] == 0
        assert await written(s) == 0
        # In-process code runs as System("process") and is allowed.
        assert await s.t.get(Vault, "v1", tenant="acme").put(5) == 5
        assert await s.t.get(Vault, "v1", tenant="acme").total() == 5
        # Knowing the actor exists changes nothing for the HTTP user.
        again = await post_command(http, s, "/actors/Vault/v1/put", {"cents": 5})
        assert_problem(again, 403, "Unauthorized", "access_denied")
        assert RUNS["acme/Vault/v1/put"] == 1


async def test_SE02_anonymous_app_reaches_only_public_actors(served: Serve) -> None:
    async with served(auth=None) as s:
        http = s.http()
        assert_problem(
            await post_command(http, s, "/actors/Vault/v1/put", {"cents": 5}),
            403,
            "Unauthorized",
            "access_denied",
        )
        public = await post_command(http, s, "/actors/Account/a1/whoami", {})
        assert (public.status_code, public.json()) == (200, "Anonymous@default")
        # A bearer token sent to the anonymous app grants nothing.
        as_alice = await post_command(s.http(ALICE), s, "/actors/Account/a1/whoami", {})
        assert as_alice.json() == "Anonymous@default"


# --- SE-03: tenants come only from the credential -------------------------------------------


async def test_SE03_tenant_in_path_header_query_or_body_is_ignored(served: Serve) -> None:
    async with served() as s:
        http = s.http(ALICE)
        spoofs = {
            "X-Tenant": "globex",
            "Tenant": "globex",
            "X-Akter-Tenant": "globex",
            "X-Forwarded-Tenant": "globex",
        }
        response = await http.post(
            "/actors/Account/t1/note",
            params={"tenant": "globex"},
            json={"tenant": "globex", "text": "hi"},
            headers={"Idempotency-Key": await s.mint(ALICE), **spoofs},
        )
        assert (response.status_code, response.json()) == (200, "acme")
        response = await http.post(
            "/actors/Account/t1/deposit",
            params={"tenant": "globex"},
            json={"cents": 2},
            headers={"Idempotency-Key": await s.mint(ALICE), **spoofs},
        )
        assert response.status_code == 200
        who = await http.post(
            "/actors/Account/t1/whoami",
            json={},
            headers={"Idempotency-Key": await s.mint(ALICE), **spoofs},
        )
        assert who.json() == "alice@acme"
        # A tenant-looking path prefix is not a route.
        prefixed = await http.post(
            "/tenants/globex/actors/Account/t1/deposit",
            json={"cents": 2},
            headers={"Idempotency-Key": await s.mint(ALICE)},
        )
        assert_problem(prefixed, 404, "InvalidInput")
        # Reads with a spoofed tenant see the credential's tenant.
        balance = await http.post(
            "/actors/Account/t1/queries/balance", json={}, headers=spoofs, params={"tenant": "x"}
        )
        assert balance.json() == 2
        for table in ("actors", "receipts", "events"):
            rows = await s.t.rows(f"SELECT DISTINCT tenant_id FROM {{schema}}.{table}")
            assert [r["tenant_id"] for r in rows] == ["acme"], table
        # A token without a tenant claim is in the "default" tenant.
        untenanted = token("carol", None)
        assert await s.client(untenanted).get(Account, "t1").whoami() == "carol@default"


async def test_two_tenants_same_actor_id_never_see_each_other(served: Serve) -> None:
    async with served() as s:
        alice = s.client(ALICE).get(Account, "same")
        bob = s.client(BOB).get(Account, "same")
        assert await alice.deposit(10, memo="alice's") == 10
        assert await bob.deposit(3, memo="bob's") == 3
        assert await alice.deposit(1) == 11
        assert await alice.balance() == 11
        assert await bob.balance() == 3
        assert (await bob.purse()).memos == ["bob's"]
        assert await bob.whoami() == "bob@globex"
        # Alice's command id presented by Bob addresses Bob's actor: no replay of her outcome.
        cid = await s.mint(ALICE)
        assert await alice.with_command_id(cid).deposit(100) == 111
        assert await bob.with_command_id(cid).deposit(1) == 4
        # Each tenant's feed holds only its own events.
        for auth, expected in ((ALICE, [10, 11, 111]), (BOB, [3, 4])):
            async with s.http(auth).stream("GET", "/actors/Account/same/events") as response:
                got = await SseReader(response).take(len(expected))
                assert [f.json()["event"]["balance"] for f in got] == expected
        page = await bob.events()
        assert [r.cursor for r in page] == ["1", "2"]
        rows = await s.t.rows(
            "SELECT tenant_id, state->>'balance' AS balance FROM {schema}.actors "
            "WHERE actor_id = 'same' ORDER BY tenant_id"
        )
        assert [(r["tenant_id"], r["balance"]) for r in rows] == [("acme", "111"), ("globex", "4")]
        receipts = await s.t.rows(
            "SELECT tenant_id, caller_key FROM {schema}.receipts ORDER BY tenant_id"
        )
        assert {(r["tenant_id"], r["caller_key"]) for r in receipts} == {
            ("acme", '["User","alice"]'),
            ("globex", '["User","bob"]'),
        }


# --- receipt privacy and origins ---------------------------------------------------------------


async def test_receipt_of_another_caller_is_not_revealed(served: Serve) -> None:
    async with served() as s:
        cid = await s.mint(ALICE)
        account = s.client(ALICE).get(Account, "p1")
        assert await account.with_command_id(cid).deposit(987_654) == 987_654
        mallory = token("mallory")  # same tenant, another subject
        response = await s.http(mallory).post(
            "/actors/Account/p1/deposit", json={"cents": 987_654}, headers={"Idempotency-Key": cid}
        )
        body = assert_problem(response, 403, "Unauthorized", "receipt_access_denied")
        assert "987654" not in json.dumps(body).replace(cid, "<id>")  # no outcome revealed
        assert RUNS["acme/Account/p1/deposit"] == 1
        assert await count(s.t, "receipts") == 1


async def test_foreign_browser_origin_is_refused_first(served: Serve) -> None:
    async with served(app_options={"allowed_origins": ["https://app.example"]}) as s:
        http = s.http(ALICE)
        foreign = await post_command(
            http, s, "/actors/Account/o1/deposit", {"cents": 1}, Origin="https://evil.example"
        )
        assert_problem(foreign, 403, "Unauthorized", "origin_denied")
        no_token = await s.http().post(
            "/actors/Account/o1/queries/balance",
            json={},
            headers={"Origin": "https://evil.example"},
        )
        assert_problem(no_token, 403, "Unauthorized", "origin_denied")
        assert await written(s) == 0
        allowed = await post_command(
            http, s, "/actors/Account/o1/deposit", {"cents": 1}, Origin="https://app.example"
        )
        assert allowed.status_code == 200
        own = await post_command(http, s, "/actors/Account/o1/deposit", {"cents": 1}, Origin=s.url)
        assert own.status_code == 200


# --- SE-05: internal commands ---------------------------------------------------------------


async def test_SE05_internal_commands_are_absent_from_openapi_http_and_the_client(
    served: Serve,
) -> None:
    async with served() as s:
        spec = (await s.http().get("/openapi.json")).json()
        operations = {op["operationId"] for item in spec["paths"].values() for op in item.values()}
        assert "Account.deposit" in operations
        assert not {"Account.audit", "Account.mailed"} & operations
        assert not [p for p in spec["paths"] if p.endswith(("/audit", "/mailed"))]
        http = s.http(ALICE)
        for member in ("audit", "mailed"):
            path = f"/actors/Account/a1/{member}"
            # Whatever else is wrong with the request, an internal member is simply unknown.
            variants: list[dict[str, Any]] = [
                {"json": {}, "headers": {"Idempotency-Key": await s.mint(ALICE)}},
                {"json": {"result": "x"}, "headers": {"Idempotency-Key": await s.mint(ALICE)}},
                {"json": {}},
                {"content": b"x", "headers": {"Idempotency-Key": await s.mint(ALICE)}},
            ]
            for options in variants:
                response = await http.post(path, **options)
                assert_problem(response, 404, "InvalidInput", "unknown_member")
            query = await http.post(f"/actors/Account/a1/queries/{member}", json={})
            assert_problem(query, 404, "InvalidInput", "unknown_member")
        with pytest.raises(akter.ActorError) as absent:
            await s.client(ALICE).get(Account, "a1").audit()
        assert (absent.value.reason, absent.value.code) == ("InvalidInput", "unknown_member")
        assert await written(s) == 0


# --- SE-06: no secret at rest or in logs ------------------------------------------------------


async def text_of_every_column(s: Served) -> str:
    columns = await s.t.rows(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = %(schema)s ORDER BY table_name, ordinal_position",
        {"schema": s.t.schema},
    )
    assert columns
    dump: list[str] = []
    for column in columns:
        rows = await s.t.rows(
            f'SELECT "{column["column_name"]}"::text AS v FROM {{schema}}."{column["table_name"]}"'
        )
        dump.extend(str(r["v"]) for r in rows)
    return "\n".join(dump)


async def test_SE06_no_credential_in_any_table_or_log_line(
    served: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    expired = token("alice", ttl=-5)
    forged = token("alice", key=OTHER_SECRET)
    api_key = "ak_live_e2e_0123456789abcdef"
    secrets = [ALICE, BOB, expired, forged, SECRET, api_key]
    async with served() as s:
        alice = s.client(ALICE).get(Account, "sec")
        bob = s.client(BOB).get(Account, "sec")
        await alice.deposit(5, memo="m")
        await bob.deposit(6)
        await alice.send_letter("carol")
        with pytest.raises(akter.DeclaredError):
            await alice.withdraw(1_000)
        await alice.balance()
        async with s.http(ALICE).stream("GET", "/actors/Account/sec/events") as response:
            await SseReader(response).take(1)
        for bad in (expired, forged):
            refused = await s.http(bad, headers={"x-api-key": api_key}).post(
                "/actors/Account/sec/deposit",
                json={"cents": 1},
                headers={"Idempotency-Key": await s.mint(ALICE)},
            )
            assert refused.status_code == 401
        cookie = await s.http(ALICE, cookies={"session": api_key}).post(
            "/actors/Account/sec/whoami", json={}, headers={"Idempotency-Key": await s.mint(ALICE)}
        )
        assert cookie.status_code == 200
        denied = await s.http(ALICE).post(
            "/actors/Vault/sec/put",
            json={"cents": 1},
            headers={"Idempotency-Key": await s.mint(ALICE)},
        )
        assert denied.status_code == 403
        await s.t.drain()

        dump = await text_of_every_column(s)
        assert "alice" in dump  # the dump does see the rows
        receipts = await s.t.rows("SELECT DISTINCT caller_key FROM {schema}.receipts")
        assert {r["caller_key"] for r in receipts} <= {
            '["User","alice"]',
            '["User","bob"]',
            '["System","job",["acme","Account","sec"],"alice"]',
        }
    for secret in secrets:
        for part in {secret, *secret.split(".")}:
            if len(part) >= 16:
                assert part not in dump
                for record in caplog.records:
                    line = f"{record.getMessage()} {record.__dict__!r}"
                    assert part not in line, record
