"""Refusals over HTTP: status, RFC 9457 problem+json body and ``reason`` (semantics §2.9).

Every refused request must leave no durable row behind and must not run a handler.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import akter
from tests.e2e.conftest import (
    RUNS,
    Account,
    Serve,
    Served,
    assert_problem,
    count,
    token,
)

pytestmark = pytest.mark.timeout(60)

ALICE = token("alice")
WINDOW = 86_400_000


async def written(s: Served) -> int:
    return sum([await count(s.t, t) for t in ("actors", "receipts", "events", "outbox")])


async def send(
    s: Served,
    path: str,
    body: Any = None,
    *,
    key: str | bool | None = True,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> httpx.Response:
    """One request as alice; ``key=True`` mints a fresh Idempotency-Key."""
    extra = dict(headers or {})
    if key is True:
        extra["Idempotency-Key"] = await s.mint(ALICE)
    elif isinstance(key, str):
        extra["Idempotency-Key"] = key
    http = s.http(ALICE)
    if content is not None:
        return await http.request(method, path, content=content, headers=extra)
    return await http.request(method, path, json=body, headers=extra)


async def test_400_invalid_input_and_command_ids(served: Serve) -> None:
    async with served() as s:
        now = await s.t.now_ms()
        deposit = "/actors/Account/a1/deposit"
        cases: list[tuple[str, httpx.Response, str, str | None]] = [
            (
                "no key",
                await send(s, deposit, {"cents": 1}, key=None),
                "InvalidInput",
                "missing_idempotency_key",
            ),
            (
                "malformed id",
                await send(s, deposit, {"cents": 1}, key="nonsense"),
                "InvalidCommandId",
                "malformed",
            ),
            (
                "version",
                await send(s, deposit, {"cents": 1}, key=f"v2.1.{WINDOW + 1}.{uuid.uuid4()}"),
                "InvalidCommandId",
                "version",
            ),
            (
                "window",
                await send(s, deposit, {"cents": 1}, key=f"v1.{now}.{now + 1}.{uuid.uuid4()}"),
                "InvalidCommandId",
                "window",
            ),
            (
                "bad json",
                await send(s, deposit, content=b'{"cents":', headers=JSON),
                "InvalidInput",
                "malformed_json",
            ),
            (
                "not utf-8",
                await send(s, deposit, content=b"\xff\xfe{}", headers=JSON),
                "InvalidInput",
                "malformed_json",
            ),
            ("array body", await send(s, deposit, [1]), "InvalidInput", None),
            ("string body", await send(s, deposit, "cents"), "InvalidInput", None),
            ("missing arg", await send(s, deposit, {}), "InvalidInput", None),
            ("wrong type", await send(s, deposit, {"cents": "lots"}), "InvalidInput", None),
            ("out of range", await send(s, deposit, {"cents": 10**12}), "InvalidInput", None),
            ("unknown arg", await send(s, deposit, {"cents": 1, "tip": 2}), "InvalidInput", None),
            (
                "control char id",
                await send(s, "/actors/Account/a%01b/deposit", {"cents": 1}),
                "InvalidInput",
                None,
            ),
            (
                "long id",
                await send(s, f"/actors/Account/{'x' * 257}/deposit", {"cents": 1}),
                "InvalidInput",
                None,
            ),
            (
                "singleton id",
                await send(s, "/actors/Registry/r1/register", {"name": "n"}),
                "InvalidInput",
                None,
            ),
            (
                "query arg",
                await send(s, "/actors/Account/a1/queries/last_callers", {"n": 0}, key=None),
                "InvalidInput",
                None,
            ),
        ]
        for case, response, reason, code in cases:
            body = assert_problem(response, 400, reason, code)
            assert body["retryable"] is False, case
        fields = {case: r.json().get("field") for case, r, _, _ in cases}
        assert fields["missing arg"] == fields["wrong type"] == fields["out of range"] == "cents"
        assert fields["unknown arg"] == "tip"
        assert fields["control char id"] == fields["long id"] == "id"
        assert RUNS["acme/Account/a1/deposit"] == 0
        assert await written(s) == 0


async def test_400_future_command_id_is_retryable_with_retry_after(served: Serve) -> None:
    async with served() as s:
        issued = await s.t.now_ms() + 600_000
        response = await send(
            s,
            "/actors/Account/a1/deposit",
            {"cents": 1},
            key=f"v1.{issued}.{issued + WINDOW}.{uuid.uuid4()}",
        )
        body = assert_problem(response, 400, "InvalidCommandId", "future")
        assert body["retryable"] is True
        assert 590 <= body["retry_after"] <= 610
        assert 590 <= int(response.headers["retry-after"]) <= 611
        assert await written(s) == 0


async def test_404_unknown_routes_types_members_and_uncreated_actors(served: Serve) -> None:
    async with served() as s:
        unknown = [
            (await send(s, "/actors/Nope/a1/deposit", {"cents": 1}), "unknown_type"),
            (await send(s, "/actors/Account/a1/nope", {}), "unknown_member"),
            (await send(s, "/actors/Account/a1/balance", {}), "unknown_member"),  # a query
            (
                await send(s, "/actors/Account/a1/queries/deposit", {"cents": 1}, key=None),
                "unknown_member",
            ),  # a command
            (await send(s, "/actors/Nope/a1/queries/x", {}, key=None), "unknown_type"),
            (await send(s, "/nowhere", {}), "no_route"),
            (await send(s, "/actors/Account/a1", {}), "no_route"),
        ]
        for response, code in unknown:
            assert_problem(response, 404, "InvalidInput", code)
        not_created = await send(s, "/actors/Ledger/l1/post", {"cents": 1})
        assert_problem(not_created, 404, "NotCreated")
        query = await send(s, "/actors/Ledger/l1/queries/owner", {}, key=None)
        assert_problem(query, 404, "NotCreated")
        assert await written(s) == 0
        wrong_method = await send(s, "/actors/Account/a1/deposit", method="GET", key=None)
        assert wrong_method.status_code == 405
        assert wrong_method.headers["content-type"].startswith("application/problem+json")


async def test_409_conflict_and_410_expired(served: Serve) -> None:
    async with served() as s:
        cid = await s.mint(ALICE)
        ok = await send(s, "/actors/Account/a1/deposit", {"cents": 5}, key=cid)
        assert ok.json() == 5
        other_payload = await send(s, "/actors/Account/a1/deposit", {"cents": 6}, key=cid)
        assert_problem(other_payload, 409, "CommandConflict")
        other_command = await send(s, "/actors/Account/a1/withdraw", {"cents": 5}, key=cid)
        assert_problem(other_command, 409, "CommandConflict")
        replay = await send(s, "/actors/Account/a1/deposit", {"cents": 5}, key=cid)
        assert replay.json() == 5
        assert RUNS["acme/Account/a1/deposit"] == 1
        assert RUNS["acme/Account/a1/withdraw"] == 0

        issued = await s.t.now_ms() - WINDOW - 3_600_000
        expired_id = f"v1.{issued}.{issued + WINDOW}.{uuid.uuid4()}"
        expired = await send(s, "/actors/Account/a1/deposit", {"cents": 5}, key=expired_id)
        assert_problem(expired, 410, "CommandExpired")
        assert RUNS["acme/Account/a1/deposit"] == 1
        assert await count(s.t, "receipts") == 1


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


JSON = {"Content-Type": "application/json"}


async def test_413_and_415_body_refusals(served: Serve) -> None:
    async with served(app_options={"max_body_bytes": 2_048}) as s:
        big = b'{"cents": 1, "memo": "' + b"x" * 4_000 + b'"}'
        declared = await send(s, "/actors/Account/a1/deposit", content=big, headers=JSON)
        assert_problem(declared, 413, "InvalidInput", "body_too_large")
        # Chunked: no Content-Length, the limit is enforced while reading.
        http = s.http(ALICE)
        chunked = await http.post(
            "/actors/Account/a1/deposit",
            content=_chunks(big, 512),
            headers={**JSON, "Idempotency-Key": await s.mint(ALICE)},
        )
        assert "content-length" not in chunked.request.headers
        assert_problem(chunked, 413, "InvalidInput", "body_too_large")
        query = await send(
            s, "/actors/Account/a1/queries/balance", content=big, headers=JSON, key=None
        )
        assert_problem(query, 413, "InvalidInput", "body_too_large")
        for media in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
            response = await send(
                s,
                "/actors/Account/a1/deposit",
                content=b'{"cents":1}',
                headers={"Content-Type": media},
            )
            assert_problem(response, 415, "InvalidInput", "unsupported_media_type")
        no_type = await send(s, "/actors/Account/a1/deposit", content=b'{"cents":1}')
        assert_problem(no_type, 415, "InvalidInput", "unsupported_media_type")
        # A JSON media type with parameters is fine.
        ok = await send(
            s,
            "/actors/Account/a1/deposit",
            content=b'{"cents":1}',
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert ok.json() == 1
        assert RUNS["acme/Account/a1/deposit"] == 1
        assert await count(s.t, "receipts") == 1


async def test_422_declared_error_commits_only_its_receipt(served: Serve) -> None:
    async with served() as s:
        await send(s, "/actors/Account/a1/deposit", {"cents": 3})
        cid = await s.mint(ALICE)
        response = await send(s, "/actors/Account/a1/withdraw", {"cents": 9}, key=cid)
        body = assert_problem(response, 422, "DeclaredError")
        assert (body["error"], body["fields"]) == ("e2e.Overdrawn", {"balance": 3, "asked": 9})
        replay = await send(s, "/actors/Account/a1/withdraw", {"cents": 9}, key=cid)
        assert replay.json() == body
        assert RUNS["acme/Account/a1/withdraw"] == 1
        row = await s.t.inspect(akter.ActorRef("acme", "Account", "a1"))
        assert row.state is not None and row.state["balance"] == 3
        assert len(row.receipts) == 2


# --- inputs a JSON body can carry that PostgreSQL or UTF-8 cannot ---------------------------


@pytest.mark.parametrize(
    ("case", "command", "raw"),
    [
        pytest.param(
            "NUL in a string argument",
            "deposit",
            b'{"cents": 1, "memo": "a\\u0000b"}',
            id="nul-constrained-str",
        ),
        pytest.param("NUL in a str argument", "note", b'{"tenant": "\\u0000"}', id="nul-str"),
        pytest.param(
            "lone surrogate in a str argument", "note", b'{"tenant": "\\ud800"}', id="surrogate"
        ),
        pytest.param(
            "deeply nested body",
            "deposit",
            b'{"cents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            id="deep-nesting",
        ),
    ],
)
async def test_unstorable_or_hostile_bodies_are_terminal_4xx(
    served: Serve, case: str, command: str, raw: bytes
) -> None:
    async with served() as s:
        response = await send(s, f"/actors/Account/a1/{command}", content=raw, headers=JSON)
        assert 400 <= response.status_code < 500, (case, response.status_code, response.text)
        body = assert_problem(response, response.status_code, "InvalidInput")
        assert body["retryable"] is False
        assert RUNS[f"acme/Account/a1/{command}"] == 0
        assert await written(s) == 0


async def test_actor_ids_with_a_slash_are_reachable(served: Serve) -> None:
    # Named ids are 1–256 UTF-8 bytes without control characters (semantics §1.1): "/" is valid.
    async with served() as s:
        assert await s.t.get(Account, "team/7", tenant="acme").deposit(1) == 1  # in-process: fine
        raw = await send(s, "/actors/Account/team%2F7/deposit", {"cents": 1})
        assert (raw.status_code, raw.json()) == (200, 2), raw.text
        assert await s.client(ALICE).get(Account, "team/7").deposit(1) == 3


# --- strict JSON over HTTP (hardening finding 10) ---------------------------------------------


@pytest.mark.parametrize(
    ("command", "raw", "field"),
    [
        pytest.param("deposit", b'{"cents": true}', "cents", id="true-for-int"),
        pytest.param("deposit", b'{"cents": "5"}', "cents", id="string-for-int"),
        pytest.param("deposit", b'{"cents": 5.5}', "cents", id="fraction-for-int"),
        pytest.param("deposit", b'{"cents": 1e300}', "cents", id="huge-float-for-int"),
        pytest.param("deposit", b'{"cents": NaN}', "cents", id="nan-for-int"),
        pytest.param("deposit", b'{"cents": 1, "memo": 7}', "memo", id="int-for-str"),
        pytest.param("whoami", b'{"pause": NaN}', "pause", id="nan-for-float"),
        pytest.param("whoami", b'{"pause": "0.1"}', "pause", id="string-for-float"),
        pytest.param(
            "note", b'{"tenant": "t", "text": ' + b"[" * 70 + b"]" * 70 + b"}", "text", id="deep"
        ),
        pytest.param("deposit", b'{"cents": 1' + b"0" * 5000 + b"}", None, id="int-5000-digits"),
    ],
)
async def test_h10_http_bodies_are_validated_in_strict_json_mode(
    served: Serve, command: str, raw: bytes, field: str | None
) -> None:
    async with served() as s:
        response = await send(s, f"/actors/Account/a1/{command}", content=raw, headers=JSON)
        body = assert_problem(response, 400, "InvalidInput")
        assert body.get("field") == field and body["retryable"] is False, body
        assert RUNS[f"acme/Account/a1/{command}"] == 0
        assert await written(s) == 0
        # Queries are strict too; in-process calls keep Python's (lax) rules.
        query = await send(s, "/actors/Account/a1/queries/last_callers", {"n": "2"}, key=None)
        assert assert_problem(query, 400, "InvalidInput")["field"] == "n"
        assert (
            await s.t.get(Account, "a1", tenant="acme").deposit(True) == 1
        )  # bool is an int in Python
        ok = await send(s, "/actors/Account/a1/deposit", {"cents": 5})
        assert (ok.status_code, ok.json()) == (200, 6), ok.text


async def test_an_integral_number_is_an_integer_as_json_schema_says(served: Serve) -> None:
    async with served() as s:
        for raw, balance in ((b'{"cents": 5.0}', 5), (b'{"cents": 2e1}', 25)):
            response = await send(s, "/actors/Account/a1/deposit", content=raw, headers=JSON)
            assert (response.status_code, response.json()) == (200, balance), response.text
        purse = await s.t.get(Account, "a1", tenant="acme").purse()
        assert purse.balance == 25


async def test_h10_405_carries_an_allow_header(served: Serve) -> None:
    async with served() as s:
        for path, allow in (("/actors/Account/a1/deposit", "POST"), ("/command-ids", "POST")):
            response = await send(s, path, method="GET", key=None)
            assert_problem(response, 405, "InvalidInput", "method_not_allowed")
            assert response.headers["allow"] == allow
        ready = await send(s, "/ready", method="POST", key=None)
        assert ready.status_code == 405
        # Starlette lists a route's methods from a set: their order differs between processes.
        assert sorted(m.strip() for m in ready.headers["allow"].split(",")) == ["GET", "HEAD"]
